"""The panel's HTTP application: what each request gets, and the headers every answer carries.

Every action is a tool call made with the signed-in user's token (edge.web.wire), so the
daemon's chain authorizes and audits it; the panel's own checks (session, CSRF token,
Origin, Host, the tools it offers) only ever refuse more. Routes:

  GET  /                    the page (lang from the `qledge_lang` cookie or Accept-Language)
  GET  /static/NAME         a static asset (gzip when accepted; ETag)
  GET  /api/session         who is signed in: CSRF token, tools, limits; 401 when nobody
  POST /api/login           {"token": …}: a new session (rate-limited per client address)
  POST /api/logout          ends the session
  POST /api/call/TOOL       {args}: one tool call; {"result": …} or {"error": {code, message}}
  GET  /api/log?run=ID      a run's log as Server-Sent Events, resuming at Last-Event-ID
"""

from __future__ import annotations

import json
import select
import threading
import time
import zlib

from edge.web import http
from edge.web.sessions import LoginLimit, Session, Sessions, same
from edge.web.wire import CallFailed, ToolClient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    import socket

# The tools the panel offers, and nothing else: no credentials, exports or imports (a
# script in a hijacked page could mint a token with them), no secret values.
TOOLS = frozenset({
    "qledge.status", "qledge.tools.list",
    "qledge.task.list", "qledge.task.get", "qledge.task.create", "qledge.task.update", "qledge.task.enable",
    "qledge.task.disable", "qledge.task.delete", "qinglong.task.list",
    "qledge.run.start", "qledge.run.cancel", "qledge.run.get", "qledge.run.list", "qledge.run.events",
    "qledge.run.log.read",
    "qledge.trigger.list", "qledge.trigger.get", "qledge.trigger.create", "qledge.trigger.update",
    "qledge.trigger.enable", "qledge.trigger.disable", "qledge.trigger.delete", "qledge.trigger.upcoming",
    "qledge.trigger.events", "qinglong.trigger.list", "qledge.cron.preview",
    "qledge.secret.list", "qledge.secret.set", "qledge.secret.delete",
    "qledge.notify.channel.list", "qledge.notify.channel.set", "qledge.notify.channel.delete",
    "qledge.notify.rules.get", "qledge.notify.rules.set", "qledge.notify.test", "qledge.notify.log",
    "qledge.agent.ask", "qinglong.agent.history.list", "qinglong.agent.history.get",
    "qledge.audit.list",
})
LOG_WAIT_MS = 15_000  # one long-poll of a live log on the daemon (qledge.run.log.read's waitMs)
LOG_CHUNK = 16 * 1024
MAX_FOLLOWERS = 8  # live logs open at once, in all
MAX_FOLLOWERS_PER_SESSION = 4
# When the caps are full, how long a newcomer waits for a browser that has just left a run's
# page to be seen gone (its closed connection is what gives its place back).
REAP_WAIT_S = 1.0
ASSETS = ("index.html", "app.css", "app.js", "api.js", "dom.js", "i18n.js", "strings.js", "format.js",
          "chart.js", "forms.js", "overview.js", "tasks.js", "schedules.js", "runs.js", "secrets.js",
          "notify.js", "ai.js", "audit.js", "icon.svg")
TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
         "css": "text/css; charset=utf-8", "svg": "image/svg+xml"}
LANGS = ("en", "zh-CN")
STATUS = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403, "not_found": 404,
          "conflict": 409, "resource_exhausted": 429, "unavailable": 503, "deadline_exceeded": 504,
          "internal": 500}


class Settings:
    """What `qledge web` was told (edge.web.command builds it)."""

    def __init__(self, *, tls: bool = False, origin: str | None = None, frame_origin: str | None = None,
                 hosts: frozenset[str] = frozenset({"localhost"}), max_followers: int = MAX_FOLLOWERS) -> None:
        self.tls = tls
        self.origin = origin  # the origin browsers use, when a reverse proxy stands in front
        self.frame_origin = frame_origin  # LuCI's origin, which may frame the panel
        self.hosts = hosts  # host names (besides IP addresses) the panel answers to
        self.max_followers = max_followers

    @property
    def secure(self) -> bool:
        return self.tls or (self.origin or "").startswith("https://")


class Asset:
    __slots__ = ("type", "raw", "gzip", "etag")

    def __init__(self, name: str, raw: bytes) -> None:
        self.type = TYPES[name.rpartition(".")[2]]
        self.raw = raw
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
        self.gzip = packer.compress(raw) + packer.flush()
        self.etag = f'"{zlib.crc32(raw):08x}{len(raw):x}"'


def load_assets(read: Callable[[str], bytes]) -> dict[str, Asset]:
    return {name: Asset(name, read(name)) for name in ASSETS}


def security_headers(settings: Settings) -> list[tuple[str, str]]:
    """What every answer carries: a CSP that allows this origin's own scripts, styles and
    images and nothing else (no inline script, no other origin), framing by LuCI's origin
    only when one is configured, no sniffing, no referrer."""
    frames = f"'self' {settings.frame_origin}" if settings.frame_origin else "'none'"
    csp = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
           f"form-action 'self'; base-uri 'none'; frame-ancestors {frames}")
    headers = [("Content-Security-Policy", csp), ("X-Content-Type-Options", "nosniff"),
               ("Referrer-Policy", "no-referrer"), ("Cross-Origin-Opener-Policy", "same-origin"),
               ("Cross-Origin-Resource-Policy", "same-origin"),
               ("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()")]
    if not settings.frame_origin:
        headers.append(("X-Frame-Options", "DENY"))
    return headers


def pick_language(request: http.Request) -> str:
    """The `qledge_lang` cookie, else the first of Accept-Language's languages we speak."""
    chosen = request.cookies().get("qledge_lang", "")
    if chosen in LANGS:
        return chosen
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate(request.header("accept-language").split(",")[:32]):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        ranked.append((-q, i, tag.strip().lower()))
    for _, _, tag in sorted(ranked):
        if tag.startswith("zh"):
            return "zh-CN"
        if tag.startswith("en"):
            return "en"
    return "en"


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_text).encode()


def _text(value: object) -> str:
    """Bytes in a result (a log chunk's data) as text: UTF-8, anything else replaced."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    raise TypeError(f"cannot encode {type(value).__name__}")


def _error(code: str, message: str) -> tuple[int, bytes]:
    return STATUS.get(code, 500), _json({"error": {"code": code, "message": message}})


def role_of(tools: frozenset[str]) -> str:
    """A label for the header: what the credential can do, not what it is called."""
    if "qledge.audit.list" in tools:
        return "owner"
    if "qledge.task.create" in tools or "qledge.run.start" in tools:
        return "operator"
    return "viewer"


def utf8_prefix(data: bytes) -> int:
    """How many bytes of `data` end on a character boundary (a chunk may stop inside a
    character; the rest of it comes with the next chunk)."""
    end = len(data)
    i = end - 1
    while i >= 0 and end - i <= 4 and data[i] & 0xC0 == 0x80:  # continuation bytes
        i -= 1
    if i < 0 or data[i] < 0x80:
        return end
    lead = data[i]
    need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    return end if end - i >= need else i


class Panel:
    def __init__(self, settings: Settings, client: ToolClient, sessions: Sessions, limit: LoginLimit,
                 assets: dict[str, Asset], memory: Callable[[], int], version: str) -> None:
        self.settings = settings
        self.client = client
        self.sessions = sessions
        self.limit = limit
        self.assets = assets
        self.memory = memory
        self.version = version
        self.followers = 0
        self._following: dict[socket.socket, Session] = {}  # open live logs, by their browser's socket
        self._lock = threading.Lock()  # the follower counts and the table above
        self.headers = security_headers(settings)
        self._cookie = "__Host-qledge" if settings.secure else "qledge_session"

    # -- entry ------------------------------------------------------------------------

    def handle(self, request: http.Request, sock: socket.socket) -> bytes | None:
        """The whole response to `request`, or None when it was streamed on `sock` (a live log)."""
        problem = self._host_problem(request)
        if problem is not None:
            return self._answer(request, 421, _json({"error": {"code": "permission_denied", "message": problem}}))
        path = request.path
        if request.method == "POST":
            return self._post(request, path)
        if path == "/api/log":
            return self._follow(request, sock)
        if path == "/api/session":
            session = self._session(request)
            if session is None:
                return self._answer(request, *_error("unauthenticated", "not signed in"))
            return self._answer(request, 200, _json(self._about(session)))
        if path in ("/", "/index.html"):
            return self._page(request)
        if path.startswith("/static/") and path[8:] in self.assets:
            return self._asset(request, self.assets[path[8:]])
        return self._answer(request, 404, _json({"error": {"code": "not_found", "message": "no such page"}}))

    def _post(self, request: http.Request, path: str) -> bytes:
        problem = self._origin_problem(request)
        if problem is not None:
            return self._answer(request, *_error("permission_denied", problem))
        if path == "/api/login":
            return self._login(request)
        session = self._session(request)
        if session is None:
            return self._answer(request, *_error("unauthenticated", "not signed in, or the session has ended"))
        if not same(request.header("x-csrf-token"), session.csrf):
            return self._answer(request, *_error("permission_denied", "missing or wrong CSRF token"))
        if path == "/api/logout":
            self.sessions.end(session)
            return self._answer(request, 200, b"{}", [("Set-Cookie", self._set_cookie("", 0))])
        if path.startswith("/api/call/"):
            return self._call(request, session, path[len("/api/call/"):])
        return self._answer(request, 404, _json({"error": {"code": "not_found", "message": "no such action"}}))

    # -- checks -----------------------------------------------------------------------

    def _host_problem(self, request: http.Request) -> str | None:
        """A Host the panel does not answer to: a name that is not an IP address, localhost or
        one given with --allow-host (a page on another site whose name was pointed at this
        address, DNS rebinding, would otherwise be same-origin with the panel)."""
        host = request.header("host")
        name = host[1 : host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
        if ":" in host and not host.startswith("[") and not host.rpartition(":")[2].isdigit():
            return "malformed Host header"
        if name.lower() in self.settings.hosts or _ip_literal(name):
            return None
        return f"this panel does not answer to the host name {name[:64]!r}; start it with --allow-host {name[:64]}"

    def _origin_problem(self, request: http.Request) -> str | None:
        origin = request.header("origin")
        expected = self.settings.origin or ("https://" if self.settings.tls else "http://") + request.header("host")
        if not origin or origin != expected:
            return "cross-origin request refused"
        if request.header("sec-fetch-site") not in ("", "same-origin"):
            return "cross-origin request refused"
        return None

    def _session(self, request: http.Request) -> Session | None:
        return self.sessions.get(request.cookies().get(self._cookie))

    # -- actions ----------------------------------------------------------------------

    def _login(self, request: http.Request) -> bytes:
        wait = self.limit.wait_s(request.client)
        if wait > 0:
            return self._answer(request, *_error("resource_exhausted", f"too many failed sign-ins; try again in"
                                                 f" {int(wait) + 1} s"), [("Retry-After", str(int(wait) + 1))])
        body = _parse_json(request)
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token.strip() or len(token) > 256:
            self.limit.failed(request.client)
            return self._answer(request, *_error("invalid_argument", "paste an API token (qle_…)"))
        token = token.strip()
        try:
            listed = self.client.call("qledge.tools.list", {}, token)
            names = frozenset(t["name"] for t in listed["tools"])  # type: ignore[index]
        except CallFailed as exc:
            if exc.code == "unauthenticated":
                self.limit.failed(request.client)
                return self._answer(request, *_error("unauthenticated", "that token is not valid (or was revoked)"))
            if exc.code != "permission_denied":
                return self._answer(request, *_error(exc.code, exc.message))
            names = frozenset()  # a credential without status.read: valid, and may do little here
        except (KeyError, TypeError):
            return self._answer(request, *_error("unavailable", "the daemon's tool list is not in the expected shape"))
        session = self.sessions.create(token, names & TOOLS, role_of(names))
        return self._answer(request, 200, _json(self._about(session)),
                            [("Set-Cookie", self._set_cookie(session.id, int(self.sessions.max_s)))])

    def _about(self, session: Session) -> dict[str, object]:
        return {"csrf": session.csrf, "role": session.role, "tools": sorted(session.tools), "version": self.version,
                "idleS": int(self.sessions.idle_s), "panelRssBytes": self.memory(), "tls": self.settings.secure}

    def _call(self, request: http.Request, session: Session, tool: str) -> bytes:
        if tool not in TOOLS:
            return self._answer(request, *_error("not_found", f"the panel offers no tool {tool[:128]!r}"))
        if "json" not in request.header("content-type"):
            return self._answer(request, 415, _json({"error": {"code": "invalid_argument",
                                                              "message": "send the arguments as application/json"}}))
        args = _parse_json(request)
        if not isinstance(args, dict):
            return self._answer(request, *_error("invalid_argument", "the arguments must be a JSON object"))
        if tool == "qledge.run.log.read":
            args.pop("waitMs", None)  # live logs are followed through /api/log, within its cap
        try:
            result = self.client.call(tool, args, session.token)
        except CallFailed as exc:
            if exc.code == "unauthenticated":
                self.sessions.end(session)  # revoked since sign-in: the session goes with it
            return self._answer(request, *_error(exc.code, exc.message))
        return self._answer(request, 200, _json({"result": result}))

    def _follow(self, request: http.Request, sock: socket.socket) -> bytes | None:
        session = self._session(request)
        if session is None:
            return self._answer(request, *_error("unauthenticated", "not signed in"))
        run = request.param("run") or ""
        start = request.header("last-event-id") or request.param("offset") or "0"
        if not run or len(run) > 128 or not start.isdigit() or len(start) > 15:
            return self._answer(request, *_error("invalid_argument", "give ?run=ID (and a byte offset)"))
        if not self._admit(session, sock):
            return self._answer(request, *_error("resource_exhausted", "too many live logs are open; close one"))
        try:
            headers = [*self.headers, ("Content-Type", "text/event-stream; charset=utf-8"),
                       ("Cache-Control", "no-store"), ("X-Accel-Buffering", "no")]
            sock.settimeout(http.WRITE_TIMEOUT_S)
            sock.sendall(http.stream_head(headers) + b"retry: 2000\n\n")
            LogStream(self, session, run, int(start), sock).run()
        except OSError:
            pass  # the browser went away; it resumes from its last event when it comes back
        finally:
            self._release(sock)
        return None

    def following(self, sock: socket.socket) -> bool:
        """Whether the live log on `sock` still holds its place (it is given back when its
        browser is seen gone)."""
        return sock in self._following

    def _admit(self, session: Session, sock: socket.socket) -> bool:
        """A place for one more live log within both caps. A browser that left a run's page
        closed that log's connection, but its stream may be inside a daemon long-poll and
        not yet know: when the caps are full, closed connections are looked for first (a
        live log's browser sends nothing, so a readable socket is one that went away)."""
        deadline = time.monotonic() + REAP_WAIT_S
        while True:
            with self._lock:
                if self.followers < self.settings.max_followers and session.followers < MAX_FOLLOWERS_PER_SESSION:
                    self.followers += 1
                    session.followers += 1
                    self._following[sock] = session
                    return True
                watched = list(self._following)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                gone, _, _ = select.select(watched, [], [], left)
            except (OSError, ValueError):  # one was closed meanwhile: its stream has ended
                gone = []
            for other in gone:
                self._release(other)

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            session = self._following.pop(sock, None)
            if session is not None:
                self.followers -= 1
                session.followers -= 1

    # -- answers ----------------------------------------------------------------------

    def _page(self, request: http.Request) -> bytes:
        lang = pick_language(request)
        body = self.assets["index.html"].raw.replace(b"{{lang}}", lang.encode())
        return self._answer(request, 200, body, [("Content-Type", TYPES["html"]), ("Vary", "Accept-Language, Cookie")])

    def _asset(self, request: http.Request, asset: Asset) -> bytes:
        headers = [("Content-Type", asset.type), ("ETag", asset.etag), ("Cache-Control", "no-cache"),
                   ("Vary", "Accept-Encoding")]
        if request.header("if-none-match") == asset.etag:
            return self._answer(request, 304, b"", headers)
        if "gzip" in request.header("accept-encoding"):
            return self._answer(request, 200, asset.gzip, [*headers, ("Content-Encoding", "gzip")])
        return self._answer(request, 200, asset.raw, headers)

    def _answer(self, request: http.Request, status: int, body: bytes,
                extra: list[tuple[str, str]] | None = None) -> bytes:
        headers = [*self.headers, *(extra or [])]
        if not any(name == "Content-Type" for name, _ in headers):
            headers.append(("Content-Type", "application/json; charset=utf-8"))
        if not any(name == "Cache-Control" for name, _ in headers):
            headers.append(("Cache-Control", "no-store"))
        return http.response(status, headers, body, request.keep_alive, request.method == "HEAD")

    def _set_cookie(self, value: str, max_age: int) -> str:
        secure = "; Secure" if self.settings.secure else ""
        return f"{self._cookie}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"


class LogStream:
    """One live log: long-polls of qledge.run.log.read with the user's token, each new part
    sent as an event whose id is the byte offset after it (so a browser that reconnects
    resumes exactly there), and an `end` event with the run when it has finished."""

    def __init__(self, panel: Panel, session: Session, run: str, offset: int, sock: socket.socket) -> None:
        self.panel = panel
        self.session = session
        self.run_ref = run
        self.offset = offset
        self.sock = sock

    def run(self) -> None:
        client, token = self.panel.client, self.session.token
        while self.panel.sessions.alive(self.session) and self.panel.following(self.sock):
            asked = time.monotonic()
            try:
                chunk = client.call("qledge.run.log.read", {"runId": self.run_ref, "offset": self.offset,
                                                            "length": LOG_CHUNK, "waitMs": LOG_WAIT_MS}, token)
            except CallFailed as exc:
                self._send("problem", {"code": exc.code, "message": exc.message})
                return
            if not isinstance(chunk, dict) or not isinstance(chunk.get("data", b""), bytes):
                self._send("problem", {"code": "unavailable", "message": "the daemon's answer is not a log chunk"})
                return
            data: bytes = chunk.get("data") or b""
            final, eof = bool(chunk.get("final")), bool(chunk.get("eof"))
            whole = len(data) if final and eof else utf8_prefix(data)
            if whole:
                self.offset += whole
                self._send("log", {"text": data[:whole].decode("utf-8", "replace")}, self.offset)
            if final and eof:
                self._send("end", {"runId": chunk.get("runId"), "truncated": bool(chunk.get("truncated"))})
                return
            if not whole:
                self.sock.sendall(b": waiting\n\n")  # finds a browser that went away
                if time.monotonic() - asked < 1:
                    time.sleep(0.5)  # answered at once with nothing new (the daemon's own cap on follows)

    def _send(self, event: str, value: object, event_id: int | None = None) -> None:
        head = f"id: {event_id}\n" if event_id is not None else ""
        self.sock.sendall(f"{head}event: {event}\ndata: ".encode() + _json(value) + b"\n\n")


def _parse_json(request: http.Request) -> object:
    try:
        return json.loads(request.body or b"{}")
    except (ValueError, RecursionError):
        return None


def _ip_literal(name: str) -> bool:
    parts = name.split(".")
    if len(parts) == 4 and all(p.isdigit() and len(p) <= 3 and int(p) < 256 for p in parts):
        return True
    return ":" in name and all(c in "0123456789abcdefABCDEF:." for c in name)
