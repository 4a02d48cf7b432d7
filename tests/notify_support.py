"""Real loopback servers standing in for the notification services, and a way to run the
real sender child on a job."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import msgspec

from edge.notify.channels import Delivery, Facts, Job, Result, job_encoder, render, result_decoder, spec_decoder
from edge.notify.dispatch import _BOOT, _ROOT


class Recorded(msgspec.Struct):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Loopback:
    """An HTTP(S) server on 127.0.0.1 that records every request and answers with the next
    queued reply (status, JSON body), else 200 with `default`; `refuse`, when set, answers
    first what the real service would refuse (see TelegramApi, NtfyApi)."""

    def __init__(self, default: Any = None, tls: tuple[str, str] | None = None) -> None:
        self.requests: list[Recorded] = []
        self.replies: list[tuple[int, Any, dict[str, str]]] = []
        self.default = default if default is not None else {}
        self.arrived = threading.Event()
        self.received = threading.Event()  # a request came in (before it is answered)
        self.delay = 0.0  # seconds before each answer
        self.received_at: list[float] = []  # time.monotonic() of each request
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                recorded = Recorded(self.command, self.path, dict(self.headers.items()), body)
                server.requests.append(recorded)
                server.received_at.append(time.monotonic())
                server.received.set()
                time.sleep(server.delay)
                refused = server.refuse(recorded)
                status, payload, headers = refused or (
                    server.replies.pop(0) if server.replies else (200, server.answer(recorded), {}))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                server.arrived.set()

            do_POST = do_GET = do_PUT = do_PATCH = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def refuse(self, request: Recorded) -> tuple[int, Any, dict[str, str]] | None:
        """What the real service answers a request it refuses; None: accepted."""
        return None

    def answer(self, request: Recorded) -> Any:
        """The body of a 200 to an accepted request."""
        return self.default

    def wait(self, count: int = 1, timeout: float = 20.0) -> list[Recorded]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.requests

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TelegramApi(Loopback):
    """The Telegram Bot API's sendMessage, as strict as the real one
    (https://core.telegram.org/bots/api#making-requests and #sendmessage): requests go to
    /bot<token>/METHOD (methods are case-insensitive); a token it does not know is 401
    `{"ok": false, "error_code": 401, "description": "Unauthorized"}`, a method it does not
    know 404 "Not Found"; the body is JSON (UTF-8) whose chat_id must be set ("Bad Request:
    chat_id is empty") and whose text must be 1-4096 characters ("Bad Request: message text
    is empty", "Bad Request: message is too long"), each a 400 with ok false, the
    description and error_code. An accepted message answers ok true with the Message."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token
        self.sent = 0

    @staticmethod
    def _error(code: int, description: str) -> tuple[int, Any, dict[str, str]]:
        return code, {"ok": False, "error_code": code, "description": description}, {}

    def refuse(self, request: Recorded) -> tuple[int, Any, dict[str, str]] | None:
        path = request.path.split("?", 1)[0]
        head, _, method = path.rpartition("/")
        if not head.startswith("/bot") or head[4:] != self.token:
            return self._error(401, "Unauthorized")
        if method.lower() != "sendmessage" or request.method not in ("GET", "POST"):
            return self._error(404, "Not Found")
        if not request.headers.get("Content-Type", "").startswith("application/json"):
            return self._error(400, "Bad Request: message text is empty")
        try:
            body = request.json()
        except ValueError:
            return self._error(400, "Bad Request: can't parse JSON")
        if not isinstance(body, dict) or body.get("chat_id") in (None, ""):
            return self._error(400, "Bad Request: chat_id is empty")
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            return self._error(400, "Bad Request: message text is empty")
        if len(text) > 4096:
            return self._error(400, "Bad Request: message is too long")
        return None

    def answer(self, request: Recorded) -> Any:
        self.sent += 1
        body = request.json()
        return {"ok": True, "result": {"message_id": self.sent, "date": int(time.time()),
                                       "chat": {"id": body["chat_id"]}, "text": body["text"]}}


class NtfyApi(Loopback):
    """ntfy's JSON publishing, as strict as the server (https://docs.ntfy.sh/publish/#publish-as-json;
    the codes are those of ntfy's server/errors.go): a JSON publish goes to the root, its
    body must be a JSON object (400 `{"code": 40017, "http": 400, "error": "invalid
    request: request body must be message JSON", "link": "https://ntfy.sh/docs/publish/#publish-as-json"}`),
    its topic 1-64 of `[-_A-Za-z0-9]` (400, code 40009, "invalid request: topic invalid"),
    its priority 1-5 (400, code 40007, "invalid priority"); with `token` set, anything
    without `Authorization: Bearer <token>` is 403 (code 40301, "forbidden"). An accepted
    message answers with the message as stored."""

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.token = token

    @staticmethod
    def _error(status: int, code: int, error: str, link: str = "") -> tuple[int, Any, dict[str, str]]:
        return status, {"code": code, "http": status, "error": error, "link": link}, {}

    def refuse(self, request: Recorded) -> tuple[int, Any, dict[str, str]] | None:
        import re

        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(403, 40301, "forbidden", "https://ntfy.sh/docs/publish/#authentication")
        try:
            body = request.json()
        except ValueError:
            body = None
        if request.method != "POST" or request.path != "/" or not isinstance(body, dict):
            return self._error(400, 40017, "invalid request: request body must be message JSON",
                               "https://ntfy.sh/docs/publish/#publish-as-json")
        if not isinstance(body.get("topic"), str) or not re.fullmatch(r"[-_A-Za-z0-9]{1,64}", body["topic"]):
            return self._error(400, 40009, "invalid request: topic invalid")
        if "priority" in body and body["priority"] not in (1, 2, 3, 4, 5):
            return self._error(400, 40007, "invalid priority", "https://ntfy.sh/docs/publish/#message-priority")
        return None

    def answer(self, request: Recorded) -> Any:
        body = request.json()
        return {"id": f"m{len(self.requests)}", "time": int(time.time()), "event": "message", "topic": body["topic"],
                "title": body.get("title"), "message": body.get("message", "triggered")}


class WeComBot(Loopback):
    """A WeCom group bot's webhook, as strict as the real one (the bot's document,
    https://developer.work.weixin.qq.com/document/path/91770; error codes as it answers
    them, each with HTTP 200): a key it does not know is `{"errcode": 93000, "errmsg":
    "invalid webhook url, …"}`; the body is JSON with a known `msgtype` (40008 "invalid
    message type"); a text message's `text.content` is at most 2048 bytes of UTF-8
    (40058 "text.content exceed max length 2048"). Accepted: `{"errcode": 0, "errmsg": "ok"}`."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    @staticmethod
    def _error(code: int, message: str) -> tuple[int, Any, dict[str, str]]:
        hint = f"{message}, hint: [1709280001123456789012], more info at https://open.work.weixin.qq.com/devtool/query?e={code}"
        return 200, {"errcode": code, "errmsg": hint}, {}

    def refuse(self, request: Recorded) -> tuple[int, Any, dict[str, str]] | None:
        import urllib.parse

        parts = urllib.parse.urlsplit(request.path)
        key = dict(urllib.parse.parse_qsl(parts.query)).get("key")
        if request.method != "POST" or parts.path != "/cgi-bin/webhook/send" or key != self.key:
            return self._error(93000, "invalid webhook url")
        try:
            body = request.json()
        except ValueError:
            return self._error(40008, "invalid message type")
        if not isinstance(body, dict) or body.get("msgtype") not in ("text", "markdown", "image", "news", "file"):
            return self._error(40008, "invalid message type")
        if body["msgtype"] == "text":
            content = (body.get("text") or {}).get("content")
            if not isinstance(content, str) or not content:
                return self._error(44004, "empty content")
            if len(content.encode()) > 2048:
                return self._error(40058, "text.content exceed max length 2048")
        return None

    def answer(self, request: Recorded) -> Any:
        return {"errcode": 0, "errmsg": "ok"}


class Drip:
    """A webhook that accepts a request, then answers one byte of its status line and
    headers every `interval` seconds and never finishes: no single read waits long, so
    only a deadline on the whole attempt stops it. Records when each connection came and
    when the client cut it."""

    def __init__(self, interval: float = 0.5) -> None:
        import socket

        self.interval = interval
        self.connected: list[float] = []
        self.cut: list[float] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: Any) -> None:
        self.connected.append(time.monotonic())
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    break
                head += chunk
            answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Drip: " + b"." * 100_000
            for i in range(len(answer)):
                client.sendall(answer[i : i + 1])
                time.sleep(self.interval)
        self.cut.append(time.monotonic())
        client.close()

    def close(self) -> None:
        self.sock.close()


def self_signed(directory: str) -> tuple[str, str] | None:
    """A certificate for 127.0.0.1 and its key, made by the openssl command (None without it)."""
    if shutil.which("openssl") is None:
        return None
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def message(event: str = "failure", **kw: Any) -> Any:
    facts: dict[str, Any] = {
        "channel": "c", "event": event, "device": "router", "task": "backup", "task_id": "backup",
        "run_id": "01a2b3c4-d5e6-7000-8000-000000000000", "status": "failed", "exit_code": 3, "duration_ms": 1500,
        "detail": "exited with code 3", "log": "line 1\nline 2"}
    return render(Facts(**(facts | kw)), "en")


def run_sender(specs: list[dict[str, Any]], secrets: dict[str, str] | None = None, timeout_s: float = 5.0,
               now_ms: int = 1_700_000_000_000, msg: Any = None, channel: str | None = None) -> list[Result]:
    """The real sender child (as the notifier starts it) on one delivery per spec, each its
    own channel's (they go at once), or all `channel`'s (they go in order)."""
    deliveries = [Delivery(id=i + 1, channel=channel or f"c{i}", spec=spec_decoder.decode(json.dumps(spec)),
                           secrets=dict(secrets or {}), message=msg or message(), now_ms=now_ms)
                  for i, spec in enumerate(specs)]
    job = job_encoder.encode(Job(timeout_s=timeout_s, deliveries=deliveries))
    done = subprocess.run([sys.executable, "-I", "-c", _BOOT.format(root=_ROOT)], input=job, capture_output=True,
                          timeout=60, env={})
    assert done.returncode == 0, done.stderr
    lines = [result_decoder.decode(line) for line in done.stdout.splitlines()]
    started = [r.id for r in lines if r.started]
    results = [r for r in lines if not r.started]
    assert sorted(started) == sorted(r.id for r in results if r.tried)  # each attempt said it began
    return sorted(results, key=lambda r: r.id)


def tmpdir() -> str:
    return tempfile.mkdtemp(prefix="qln", dir="/tmp")


class TunnelProxy:
    """An HTTP proxy on 127.0.0.1 that knows CONNECT only: it records each request line and
    then relays bytes both ways, as a proxy in front of an HTTPS service does."""

    def __init__(self) -> None:
        import socket

        self.lines: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: Any) -> None:
        import socket

        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        self.lines.append(line)
        method, target, _ = line.split(" ", 2)
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pump(src: Any, dst: Any) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    def close(self) -> None:
        self.sock.close()
