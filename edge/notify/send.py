"""The notification sender: a short-lived child of the daemon, and the only part of qledge
that loads an HTTP client, `ssl` or `smtplib`.

Started by the notifier (edge.notify.dispatch) as `python -I -c …`, it reads one Job (JSON)
on stdin, delivers the messages through their channels' APIs, writes one Result per line on
stdout and exits 0. Each channel has a thread of its own, so a slow one delays no other;
within a channel, messages go in order. Each attempt has a total deadline (`timeout_s`,
from the first connect to the last byte of the last reply, whatever the server trickles):
when it passes, the attempt's sockets are shut down and it is reported as timed out at
once, and the channel's later messages in this job are reported not tried (`tried` false:
the notifier charges them nothing). A line `started` tells the notifier an attempt began,
so a sender killed meanwhile charges only that one. Requests go to the channel's host
only (or through its HTTP proxy, tunnelled): redirects are refused, the environment's proxy
variables are never read, TLS is verified against the system's trust store or the
channel's `ca_file`, and a reply is read at most MAX_REPLY_BYTES. Secret values never
appear in what it reports.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import http.client
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

import edge
from edge.core.tasks import SecretRef
from edge.notify.channels import (
    DEFAULT_BASE,
    Bark,
    DingTalk,
    Feishu,
    Gotify,
    Delivery,
    Ntfy,
    PushPlus,
    Result,
    ServerChan,
    Smtp,
    Telegram,
    WeCom,
    WeComApp,
    Webhook,
    job_decoder,
    result_encoder,
    webhook_body,
)

if TYPE_CHECKING:
    import smtplib

    _Mail = TypeVar("_Mail", bound=smtplib.SMTP)

JOB_MAX_BYTES = 4 << 20
MAX_REPLY_BYTES = 64 * 1024
DETAIL_MAX = 300
TRANSIENT_STATUS = frozenset({408, 425, 429})  # and every 5xx
WECOM_BOT_TEXT_BYTES = 2048  # a WeCom group bot's text (developer.work.weixin.qq.com/document/path/91770)
_json = msgspec.json.Encoder()
_any = msgspec.json.Decoder()


class SendError(Exception):
    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


# -- the deadline of one attempt ------------------------------------------------------


class TimedOut(Exception):
    """The attempt's deadline passed."""


class Deadline:
    """One attempt's time, connect to last byte, for every request it makes. When it passes,
    the sockets it watches are shut down (what blocks on them returns at once, whatever a
    server trickles) and `on_expiry` runs (the attempt is reported then, even if its thread
    is stuck where no socket is, as in a name lookup)."""

    def __init__(self, seconds: float, on_expiry: Callable[[], None] | None = None) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.doing = "starting"  # what the attempt was doing: for the message that says why it stopped
        self.expired = False
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._on_expiry = on_expiry
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def passed(self) -> bool:
        """The deadline has passed (a socket's own timeout, set to what was left, may say so
        a moment before the timer does)."""
        return self.expired or time.monotonic() >= self.at - 0.05

    def left(self) -> float:
        left = self.at - time.monotonic()
        if self.expired or left <= 0:
            raise TimedOut
        return left

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock` down at the deadline (a duplicate of it: a TLS wrapper may replace the
        object, never the connection)."""
        dup = socket.socket(fileno=os.dup(sock.fileno()))
        with self._lock:
            self._watched.append(dup)
            if not self.expired:
                return
        self._shut(dup)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            watched = list(self._watched)
        for sock in watched:
            self._shut(sock)
        if self._on_expiry is not None:
            self._on_expiry()

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            watched, self._watched = self._watched, []
        for sock in watched:
            sock.close()

    def why(self) -> str:
        return f"timed out after {self.seconds:g} s {self.doing}"


def _connector(deadline: Deadline, then: str) -> Callable[..., socket.socket]:
    """What a connection opens its socket with: within the deadline, watched by it."""

    def connect(address: tuple[str, int], timeout: object = None, source: object = None) -> socket.socket:
        deadline.doing = f"connecting to {address[0]}:{address[1]}"
        sock = socket.create_connection(address, deadline.left())
        deadline.watch(sock)
        deadline.doing = then
        return sock

    return connect


# -- HTTP ----------------------------------------------------------------------------


class Reply(msgspec.Struct):
    status: int
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            value = _any.decode(self.body)
        except msgspec.DecodeError:
            raise SendError(f"the reply is not JSON: {_snippet(self.body)}") from None
        if not isinstance(value, dict):
            raise SendError(f"the reply is not a JSON object: {_snippet(self.body)}")
        return value


def _snippet(body: bytes) -> str:
    return " ".join(body[:200].decode("utf-8", "replace").split())


def request(method: str, url: str, headers: dict[str, str], body: bytes | None, deadline: Deadline,
            proxy: str | None = None, ca_file: str | None = None) -> Reply:
    """One request within the attempt's `deadline`; a 2xx reply is returned, anything else
    raises SendError (TimedOut when the deadline passed)."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{host}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection
    via = urllib.parse.urlsplit(proxy) if proxy else None
    timeout = deadline.left()
    if parts.scheme == "https":
        import ssl  # the one place qledge loads TLS: here, in the sender, for an https channel

        context = ssl.create_default_context(cafile=ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if via is not None:
            conn = http.client.HTTPSConnection(via.hostname or "", via.port or 80, timeout=timeout, context=context)
            conn.set_tunnel(host, port)
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    elif via is not None:
        conn = http.client.HTTPConnection(via.hostname or "", via.port or 80, timeout=timeout)
        target = f"http://{where}{target}"  # a plain proxy is given the absolute URL
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    # The connection's own socket factory, replaced: so the deadline reaches the connect and
    # every read and write after it, a TLS handshake and a proxy's tunnel included.
    then = f"in the TLS handshake with {where}" if parts.scheme == "https" else f"sending the request to {where}"
    setattr(conn, "_create_connection", _connector(deadline, then))  # noqa: B010 - not in the type stubs
    sent = {"User-Agent": f"qledge/{edge.__version__}", "Accept": "application/json", **headers}
    try:
        conn.connect()
        deadline.doing = f"sending the request to {where}"
        conn.request(method, target, body=body, headers=sent)
        deadline.doing = f"waiting for {where}'s answer"
        response = conn.getresponse()
        deadline.doing = f"reading {where}'s answer"
        data = response.read(MAX_REPLY_BYTES + 1)
    except TimedOut:
        raise
    except (TimeoutError, http.client.HTTPException, OSError) as exc:
        if deadline.passed():
            raise TimedOut from None
        if isinstance(exc, TimeoutError):
            raise SendError(f"{where} did not answer within {deadline.seconds:g} s") from None
        if isinstance(exc, (http.client.HTTPException, ConnectionError)):
            raise SendError(f"the connection to {where} failed: {exc or type(exc).__name__}") from None
        if type(exc).__name__.startswith("SSL"):  # a certificate or handshake problem: retrying cannot help
            raise SendError(f"TLS with {where} failed: {exc}", permanent=True) from None
        raise SendError(f"cannot reach {where}: {exc.strerror or exc}") from None
    finally:
        conn.close()
    status = response.status
    if 300 <= status < 400:
        raise SendError(f"{where} answered HTTP {status} (a redirect); redirects are not followed: check the"
                        " channel's address", permanent=True)
    if status >= 400:
        permanent = status < 500 and status not in TRANSIENT_STATUS
        raise SendError(f"HTTP {status} from {where}: {_snippet(data) or response.reason}", permanent=permanent)
    return Reply(status=status, body=data[:MAX_REPLY_BYTES])


def _post_json(url: str, payload: Any, deadline: Deadline, spec: Any, headers: dict[str, str] | None = None,
               method: str = "POST") -> Reply:
    return request(method, url, {"Content-Type": "application/json; charset=utf-8", **(headers or {})},
                   _json.encode(payload), deadline, spec.proxy, spec.ca_file)


def _api_ok(reply: Reply, field: str, good: object, message: str) -> None:
    """The service's own status in its JSON reply (errcode 0, code 200, ok true, …)."""
    data = reply.json()
    if data.get(field) != good:
        raise SendError(f"the service refused it: {field} {data.get(field)!r}: {data.get(message) or ''}".rstrip())


# -- the channels ----------------------------------------------------------------------


class Sender:
    """Delivers one message through its channel."""

    def __init__(self, delivery: Delivery, deadline: Deadline) -> None:
        self.d = delivery
        self.deadline = deadline
        self.title = delivery.message.title
        self.text = delivery.message.text
        self.plain = f"{self.title}\n\n{self.text}"  # for the APIs with one text field

    def secret(self, ref: SecretRef | str) -> str:
        if isinstance(ref, str):
            return ref
        value = self.d.secrets.get(ref.secret)
        if not value:
            raise SendError(f"secret {ref.secret!r} is not set", permanent=True)
        return value

    def base(self, kind: str, configured: str | None) -> str:
        return (configured or DEFAULT_BASE[kind]).rstrip("/")

    def send(self) -> None:
        spec = self.d.spec
        handler: Callable[[Any], None] = getattr(self, "_" + spec.__struct_config__.tag)  # type: ignore[operator]
        handler(spec)

    def _webhook(self, spec: Webhook) -> None:
        headers = {name: self.secret(value) for name, value in spec.headers.items()}
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json; charset=utf-8"
        body = _json.encode(webhook_body(spec.body, self.d.message.fields))
        request(spec.method, self.secret(spec.url), headers, body, self.deadline, spec.proxy, spec.ca_file)

    def _ntfy(self, spec: Ntfy) -> None:
        payload: dict[str, Any] = {"topic": self.secret(spec.topic), "title": self.title, "message": self.text}
        if spec.priority is not None:
            payload["priority"] = spec.priority
        if spec.tags:
            payload["tags"] = spec.tags
        headers = {"Authorization": f"Bearer {self.secret(spec.token)}"} if spec.token else {}
        _post_json(self.base("ntfy", spec.base_url) + "/", payload, self.deadline, spec, headers)

    def _telegram(self, spec: Telegram) -> None:
        url = f"{self.base('telegram', spec.base_url)}/bot{self.secret(spec.token)}/sendMessage"
        reply = _post_json(url, {"chat_id": spec.chat_id, "text": self.plain, "disable_web_page_preview": True},
                           self.deadline, spec)
        _api_ok(reply, "ok", True, "description")

    def _bark(self, spec: Bark) -> None:
        key = self.secret(spec.device_key)
        base = spec.base_url
        if key.startswith(("http://", "https://")):  # qinglong's BARK_PUSH: the whole push URL
            head, _, key = key.rstrip("/").rpartition("/")
            base = base or head
        payload: dict[str, Any] = {"device_key": key, "title": self.title, "body": self.text}
        for name in ("group", "sound", "level", "icon"):
            if getattr(spec, name) is not None:
                payload[name] = getattr(spec, name)
        _api_ok(_post_json(self.base("bark", base) + "/push", payload, self.deadline, spec), "code", 200, "message")

    def _wecom(self, spec: WeCom) -> None:
        url = f"{self.base('wecom', spec.base_url)}/cgi-bin/webhook/send?key={_q(self.secret(spec.key))}"
        content = _fit(self.plain, WECOM_BOT_TEXT_BYTES)  # the bot refuses a longer text (errcode 40058)
        reply = _post_json(url, {"msgtype": "text", "text": {"content": content}}, self.deadline, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _wecom_app(self, spec: WeComApp) -> None:
        base = self.base("wecom_app", spec.base_url)
        query = f"corpid={_q(spec.corp_id)}&corpsecret={_q(self.secret(spec.corp_secret))}"
        got = request("GET", f"{base}/cgi-bin/gettoken?{query}", {}, None, self.deadline, spec.proxy, spec.ca_file)
        _api_ok(got, "errcode", 0, "errmsg")
        token = got.json().get("access_token")
        if not isinstance(token, str) or not token:
            raise SendError("gettoken answered without an access_token")
        self.d.secrets["\0wecom_app_token"] = token  # scrubbed from what is reported, like the secrets
        payload = {"touser": spec.to_user, "msgtype": "text", "agentid": spec.agent_id,
                   "text": {"content": self.plain}}
        reply = _post_json(f"{base}/cgi-bin/message/send?access_token={_q(token)}", payload, self.deadline, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _pushplus(self, spec: PushPlus) -> None:
        payload: dict[str, Any] = {"token": self.secret(spec.token), "title": self.title, "content": self.text,
                                   "template": spec.template}
        if spec.topic:
            payload["topic"] = spec.topic
        reply = _post_json(self.base("pushplus", spec.base_url) + "/send", payload, self.deadline, spec)
        _api_ok(reply, "code", 200, "msg")

    def _serverchan(self, spec: ServerChan) -> None:
        key = self.secret(spec.send_key)
        sc3 = re.match(r"^sctp(\d+)t", key)
        if sc3:  # Server酱³: the key names its own host
            base = spec.base_url.rstrip("/") if spec.base_url else f"https://{sc3.group(1)}.push.ft07.com"
            url = f"{base}/send/{_q(key)}.send"
        else:
            url = f"{(spec.base_url or 'https://sctapi.ftqq.com').rstrip('/')}/{_q(key)}.send"
        reply = _post_json(url, {"title": self.title, "desp": self.text}, self.deadline, spec)
        _api_ok(reply, "code", 0, "message")

    def _dingtalk(self, spec: DingTalk) -> None:
        url = f"{self.base('dingtalk', spec.base_url)}/robot/send?access_token={_q(self.secret(spec.access_token))}"
        if spec.sign_secret is not None:
            timestamp, sign = dingtalk_sign(self.secret(spec.sign_secret), self.d.now_ms)
            url += f"&timestamp={timestamp}&sign={sign}"
        reply = _post_json(url, {"msgtype": "text", "text": {"content": self.plain}}, self.deadline, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _feishu(self, spec: Feishu) -> None:
        url = f"{self.base('feishu', spec.base_url)}/open-apis/bot/v2/hook/{_q(self.secret(spec.hook))}"
        payload: dict[str, Any] = {"msg_type": "text", "content": {"text": self.plain}}
        if spec.sign_secret is not None:
            payload["timestamp"], payload["sign"] = feishu_sign(self.secret(spec.sign_secret), self.d.now_ms)
        data = _post_json(url, payload, self.deadline, spec).json()
        code = data.get("code", data.get("StatusCode"))
        if code != 0:
            raise SendError(f"the service refused it: code {code!r}: {data.get('msg') or data.get('StatusMessage')}")

    def _gotify(self, spec: Gotify) -> None:
        if spec.base_url is None:
            raise SendError("gotify needs baseUrl", permanent=True)
        payload = {"title": self.title, "message": self.text, "priority": spec.priority}
        _post_json(spec.base_url.rstrip("/") + "/message", payload, self.deadline, spec,
                   {"X-Gotify-Key": self.secret(spec.token)})

    def _smtp(self, spec: Smtp) -> None:
        send_mail(spec, self.title, self.text, self.secret(spec.password) if spec.password else None, self.deadline)


def _fit(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, cut at a character and marked with an ellipsis."""
    if len(text.encode()) <= limit:
        return text
    return text.encode()[: limit - 3].decode("utf-8", "ignore") + "…"


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def dingtalk_sign(secret: str, now_ms: int) -> tuple[str, str]:
    """DingTalk's 加签: HMAC-SHA256 keyed with the secret over "<ms>\\n<secret>", base64,
    URL-encoded; returns (timestamp in ms, sign)."""
    timestamp = str(now_ms)
    digest = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return timestamp, urllib.parse.quote_plus(base64.b64encode(digest).decode())


def feishu_sign(secret: str, now_ms: int) -> tuple[str, str]:
    """Feishu/Lark's signature: HMAC-SHA256 keyed with "<s>\\n<secret>" over nothing, base64;
    returns (timestamp in seconds, sign)."""
    timestamp = str(now_ms // 1000)
    digest = hmac.new(f"{timestamp}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode()


def _mail_client(base: type[_Mail], deadline: Deadline) -> type[_Mail]:
    """`base` connecting within `deadline`, its socket shut down at its end: the plain
    socket is watched before SMTP_SSL wraps it, so a TLS handshake is cut too."""
    import smtplib

    class Watched(smtplib.SMTP):
        def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
            deadline.doing = f"connecting to {host}:{port}"
            sock = super()._get_socket(host, port, deadline.left())  # type: ignore[misc]
            deadline.watch(sock)
            deadline.doing = f"talking to {host}:{port}"
            return sock

    if base is smtplib.SMTP:
        return Watched  # type: ignore[return-value]

    class Client(base, Watched):  # type: ignore[valid-type,misc]
        pass

    return Client


def send_mail(spec: Smtp, subject: str, text: str, password: str | None, deadline: Deadline) -> None:
    import smtplib
    import ssl
    from email.message import EmailMessage
    from email.utils import formatdate, make_msgid

    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = spec.sender
    message["To"] = ", ".join(spec.to)
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid("qledge")
    message.set_content(text)
    port = spec.port or {"ssl": 465, "starttls": 587, "none": 25}[spec.security]
    where = f"{spec.host}:{port}"
    context = ssl.create_default_context(cafile=spec.ca_file)
    try:
        client: smtplib.SMTP
        if spec.security == "ssl":
            client = _mail_client(smtplib.SMTP_SSL, deadline)(spec.host, port, timeout=deadline.left(),
                                                               context=context)
        else:
            client = _mail_client(smtplib.SMTP, deadline)(spec.host, port, timeout=deadline.left())
        with client:
            if spec.security == "starttls":
                client.starttls(context=context)
            if spec.username and password is not None:
                client.login(spec.username, password)
            refused = client.send_message(message)
    except smtplib.SMTPAuthenticationError as exc:
        raise SendError(f"{where} refused the login: {exc.smtp_code}", permanent=True) from None
    except smtplib.SMTPResponseException as exc:
        raise SendError(f"{where} answered {exc.smtp_code}: {_text(exc.smtp_error)}",
                        permanent=500 <= exc.smtp_code < 600) from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise SendError(f"{where} refused every recipient: {', '.join(exc.recipients)}", permanent=True) from None
    except (smtplib.SMTPException, OSError) as exc:
        if deadline.passed():
            raise TimedOut from None
        if type(exc).__name__.startswith("SSL"):
            raise SendError(f"TLS with {where} failed: {exc}", permanent=True) from None
        raise SendError(f"mail through {where} failed: {exc or type(exc).__name__}") from None
    if refused:
        raise SendError(f"{where} refused {', '.join(sorted(refused))}", permanent=True)


def _text(value: bytes | str) -> str:
    return " ".join((value.decode("utf-8", "replace") if isinstance(value, bytes) else value).split())[:200]


# -- the child's main ------------------------------------------------------------------


def scrub(text: str, secrets: dict[str, str]) -> str:
    """`text` without any secret value in it, one line, bounded."""
    for value in sorted(secrets.values(), key=len, reverse=True):
        if len(value) >= 3:
            text = text.replace(value, "***")
            text = text.replace(_q(value), "***")
    return " ".join(text.split())[:DETAIL_MAX]


class Reporter:
    """Writes each delivery's outcome once, as a line on stdout, from whichever thread
    knows it first (the channel's, or a deadline's timer)."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._done: set[int] = set()
        self.all_done = threading.Event()
        self.expected = 0

    def started(self, delivery: Delivery) -> None:
        self._write(Result(id=delivery.id, ok=False, started=True))

    def report(self, result: Result) -> bool:
        """False when the delivery was reported already."""
        with self._lock:
            if result.id in self._done:
                return False
            self._done.add(result.id)
            self._write_locked(result)
            if len(self._done) >= self.expected:
                self.all_done.set()
        return True

    def _write(self, result: Result) -> None:
        with self._lock:
            if result.id not in self._done:
                self._write_locked(result)

    def _write_locked(self, result: Result) -> None:
        self._out.write(result_encoder.encode(result) + b"\n")
        self._out.flush()


def deliver(delivery: Delivery, timeout_s: float, reporter: Reporter | None = None,
            then: Callable[[], None] | None = None) -> Result:
    """One attempt within `timeout_s`, connect to last byte. With a reporter, a deadline that
    passes reports the attempt at once (its thread may be stuck on no socket, as in a name
    lookup), then calls `then`; its later outcome is dropped."""
    started = time.monotonic()

    def expired() -> None:
        if reporter is not None:
            reporter.report(_timed_out(delivery, deadline, started))
        if then is not None:
            then()

    deadline = Deadline(timeout_s, expired)
    try:
        Sender(delivery, deadline).send()
        outcome = Result(id=delivery.id, ok=True)
    except TimedOut:
        outcome = _timed_out(delivery, deadline, started)
    except SendError as exc:
        outcome = Result(id=delivery.id, ok=False, detail=scrub(exc.message, delivery.secrets), permanent=exc.permanent)
    except Exception as exc:  # one message's surprise is its own failure, not the batch's
        outcome = (_timed_out(delivery, deadline, started) if deadline.passed() else
                   Result(id=delivery.id, ok=False, detail=scrub(f"sender error: {type(exc).__name__}: {exc}",
                                                                  delivery.secrets)))
    finally:
        deadline.close()
    outcome.elapsed_ms = int((time.monotonic() - started) * 1000)
    return outcome


def _timed_out(delivery: Delivery, deadline: Deadline, started: float) -> Result:
    return Result(id=delivery.id, ok=False, detail=scrub(deadline.why(), delivery.secrets), timed_out=True,
                  elapsed_ms=int((time.monotonic() - started) * 1000))


def _lane(deliveries: list[Delivery], timeout_s: float, reporter: Reporter) -> None:
    """One channel's messages, in order; after a timeout, the rest are not tried (they would
    wait for a channel that is not answering, and are charged nothing). They are reported
    so from the deadline's timer too, so the job can end while this thread is stuck."""

    def not_tried(rest: list[Delivery]) -> None:
        for delivery in rest:
            reporter.report(Result(id=delivery.id, ok=False, tried=False,
                                   detail="not tried: the channel timed out on the message before it"))

    for at, delivery in enumerate(deliveries):
        reporter.started(delivery)
        rest = deliveries[at + 1:]
        result = deliver(delivery, timeout_s, reporter, functools.partial(not_tried, rest))
        reporter.report(result)
        if result.timed_out:
            not_tried(rest)
            return


def main() -> int:
    raw = sys.stdin.buffer.read(JOB_MAX_BYTES + 1)
    try:
        if len(raw) > JOB_MAX_BYTES:
            raise ValueError("the job is too large")
        job = job_decoder.decode(raw)
    except (ValueError, msgspec.DecodeError) as exc:
        print(f"qledge notify: cannot read the job: {exc}", file=sys.stderr)
        return 2
    lanes: dict[str, list[Delivery]] = {}
    for delivery in job.deliveries:
        lanes.setdefault(delivery.channel, []).append(delivery)
    reporter = Reporter(sys.stdout.buffer)
    reporter.expected = len(job.deliveries)
    if not job.deliveries:
        return 0
    for name, deliveries in lanes.items():
        # Daemon threads: one stuck where no deadline reaches (a name lookup) does not keep the
        # sender alive once every delivery is reported.
        threading.Thread(target=_lane, args=(deliveries, job.timeout_s, reporter), name=f"lane-{name}",
                         daemon=True).start()
    longest = max(len(d) for d in lanes.values())
    reporter.all_done.wait(job.timeout_s * longest + 5)
    sys.stdout.flush()
    os._exit(0)  # not waiting for a thread stuck in a name lookup: everything is reported
