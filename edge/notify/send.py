"""The notification sender: a short-lived child of the daemon, and the only part of qledge
that loads an HTTP client, `ssl` or `smtplib`.

Started by the notifier (edge.notify.dispatch) as `python -I -c …`, it reads one Job (JSON)
on stdin, delivers each message in turn through its channel's API, writes one Result per
line on stdout and exits 0. Requests go to the channel's host only (or through its HTTP
proxy, tunnelled): redirects are refused, the environment's proxy variables are never
read, TLS is verified against the system's trust store or the channel's `ca_file`, and a
reply is read within the timeout and at most MAX_REPLY_BYTES. Secret values never appear
in what it reports.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import re
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

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

JOB_MAX_BYTES = 4 << 20
MAX_REPLY_BYTES = 64 * 1024
DETAIL_MAX = 300
TRANSIENT_STATUS = frozenset({408, 425, 429})  # and every 5xx
_json = msgspec.json.Encoder()
_any = msgspec.json.Decoder()


class SendError(Exception):
    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


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


def request(method: str, url: str, headers: dict[str, str], body: bytes | None, timeout_s: float,
            proxy: str | None = None, ca_file: str | None = None) -> Reply:
    """One request; a 2xx reply is returned, anything else raises SendError."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{host}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection
    via = urllib.parse.urlsplit(proxy) if proxy else None
    if parts.scheme == "https":
        import ssl  # the one place qledge loads TLS: here, in the sender, for an https channel

        context = ssl.create_default_context(cafile=ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if via is not None:
            conn = http.client.HTTPSConnection(via.hostname or "", via.port or 80, timeout=timeout_s, context=context)
            conn.set_tunnel(host, port)
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    elif via is not None:
        conn = http.client.HTTPConnection(via.hostname or "", via.port or 80, timeout=timeout_s)
        target = f"http://{where}{target}"  # a plain proxy is given the absolute URL
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    sent = {"User-Agent": f"qledge/{edge.__version__}", "Accept": "application/json", **headers}
    try:
        conn.request(method, target, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read(MAX_REPLY_BYTES + 1)
    except TimeoutError:
        raise SendError(f"{where} did not answer within {timeout_s:g}s") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise SendError(f"the connection to {where} failed: {exc or type(exc).__name__}") from None
    except OSError as exc:
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


def _post_json(url: str, payload: Any, timeout_s: float, spec: Any, headers: dict[str, str] | None = None,
               method: str = "POST") -> Reply:
    return request(method, url, {"Content-Type": "application/json; charset=utf-8", **(headers or {})},
                   _json.encode(payload), timeout_s, spec.proxy, spec.ca_file)


def _api_ok(reply: Reply, field: str, good: object, message: str) -> None:
    """The service's own status in its JSON reply (errcode 0, code 200, ok true, …)."""
    data = reply.json()
    if data.get(field) != good:
        raise SendError(f"the service refused it: {field} {data.get(field)!r}: {data.get(message) or ''}".rstrip())


# -- the channels ----------------------------------------------------------------------


class Sender:
    """Delivers one message through its channel."""

    def __init__(self, delivery: Delivery, timeout_s: float) -> None:
        self.d = delivery
        self.timeout = timeout_s
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
        request(spec.method, self.secret(spec.url), headers, body, self.timeout, spec.proxy, spec.ca_file)

    def _ntfy(self, spec: Ntfy) -> None:
        payload: dict[str, Any] = {"topic": self.secret(spec.topic), "title": self.title, "message": self.text}
        if spec.priority is not None:
            payload["priority"] = spec.priority
        if spec.tags:
            payload["tags"] = spec.tags
        headers = {"Authorization": f"Bearer {self.secret(spec.token)}"} if spec.token else {}
        _post_json(self.base("ntfy", spec.base_url) + "/", payload, self.timeout, spec, headers)

    def _telegram(self, spec: Telegram) -> None:
        url = f"{self.base('telegram', spec.base_url)}/bot{self.secret(spec.token)}/sendMessage"
        reply = _post_json(url, {"chat_id": spec.chat_id, "text": self.plain, "disable_web_page_preview": True},
                           self.timeout, spec)
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
        _api_ok(_post_json(self.base("bark", base) + "/push", payload, self.timeout, spec), "code", 200, "message")

    def _wecom(self, spec: WeCom) -> None:
        url = f"{self.base('wecom', spec.base_url)}/cgi-bin/webhook/send?key={_q(self.secret(spec.key))}"
        reply = _post_json(url, {"msgtype": "text", "text": {"content": self.plain}}, self.timeout, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _wecom_app(self, spec: WeComApp) -> None:
        base = self.base("wecom_app", spec.base_url)
        query = f"corpid={_q(spec.corp_id)}&corpsecret={_q(self.secret(spec.corp_secret))}"
        got = request("GET", f"{base}/cgi-bin/gettoken?{query}", {}, None, self.timeout, spec.proxy, spec.ca_file)
        _api_ok(got, "errcode", 0, "errmsg")
        token = got.json().get("access_token")
        if not isinstance(token, str) or not token:
            raise SendError("gettoken answered without an access_token")
        self.d.secrets["\0wecom_app_token"] = token  # scrubbed from what is reported, like the secrets
        payload = {"touser": spec.to_user, "msgtype": "text", "agentid": spec.agent_id,
                   "text": {"content": self.plain}}
        reply = _post_json(f"{base}/cgi-bin/message/send?access_token={_q(token)}", payload, self.timeout, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _pushplus(self, spec: PushPlus) -> None:
        payload: dict[str, Any] = {"token": self.secret(spec.token), "title": self.title, "content": self.text,
                                   "template": spec.template}
        if spec.topic:
            payload["topic"] = spec.topic
        reply = _post_json(self.base("pushplus", spec.base_url) + "/send", payload, self.timeout, spec)
        _api_ok(reply, "code", 200, "msg")

    def _serverchan(self, spec: ServerChan) -> None:
        key = self.secret(spec.send_key)
        sc3 = re.match(r"^sctp(\d+)t", key)
        if sc3:  # Server酱³: the key names its own host
            base = spec.base_url.rstrip("/") if spec.base_url else f"https://{sc3.group(1)}.push.ft07.com"
            url = f"{base}/send/{_q(key)}.send"
        else:
            url = f"{(spec.base_url or 'https://sctapi.ftqq.com').rstrip('/')}/{_q(key)}.send"
        reply = _post_json(url, {"title": self.title, "desp": self.text}, self.timeout, spec)
        _api_ok(reply, "code", 0, "message")

    def _dingtalk(self, spec: DingTalk) -> None:
        url = f"{self.base('dingtalk', spec.base_url)}/robot/send?access_token={_q(self.secret(spec.access_token))}"
        if spec.sign_secret is not None:
            timestamp, sign = dingtalk_sign(self.secret(spec.sign_secret), self.d.now_ms)
            url += f"&timestamp={timestamp}&sign={sign}"
        reply = _post_json(url, {"msgtype": "text", "text": {"content": self.plain}}, self.timeout, spec)
        _api_ok(reply, "errcode", 0, "errmsg")

    def _feishu(self, spec: Feishu) -> None:
        url = f"{self.base('feishu', spec.base_url)}/open-apis/bot/v2/hook/{_q(self.secret(spec.hook))}"
        payload: dict[str, Any] = {"msg_type": "text", "content": {"text": self.plain}}
        if spec.sign_secret is not None:
            payload["timestamp"], payload["sign"] = feishu_sign(self.secret(spec.sign_secret), self.d.now_ms)
        data = _post_json(url, payload, self.timeout, spec).json()
        code = data.get("code", data.get("StatusCode"))
        if code != 0:
            raise SendError(f"the service refused it: code {code!r}: {data.get('msg') or data.get('StatusMessage')}")

    def _gotify(self, spec: Gotify) -> None:
        if spec.base_url is None:
            raise SendError("gotify needs baseUrl", permanent=True)
        payload = {"title": self.title, "message": self.text, "priority": spec.priority}
        _post_json(spec.base_url.rstrip("/") + "/message", payload, self.timeout, spec,
                   {"X-Gotify-Key": self.secret(spec.token)})

    def _smtp(self, spec: Smtp) -> None:
        send_mail(spec, self.title, self.text, self.secret(spec.password) if spec.password else None, self.timeout)


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


def send_mail(spec: Smtp, subject: str, text: str, password: str | None, timeout_s: float) -> None:
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
            client = smtplib.SMTP_SSL(spec.host, port, timeout=timeout_s, context=context)
        else:
            client = smtplib.SMTP(spec.host, port, timeout=timeout_s)
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


def deliver(delivery: Delivery, timeout_s: float) -> Result:
    started = time.monotonic()
    try:
        Sender(delivery, timeout_s).send()
        outcome = Result(id=delivery.id, ok=True)
    except SendError as exc:
        outcome = Result(id=delivery.id, ok=False, detail=scrub(exc.message, delivery.secrets), permanent=exc.permanent)
    except Exception as exc:  # one message's surprise is its own failure, not the batch's
        outcome = Result(id=delivery.id, ok=False, detail=scrub(f"sender error: {type(exc).__name__}: {exc}",
                                                                delivery.secrets))
    outcome.elapsed_ms = int((time.monotonic() - started) * 1000)
    return outcome


def main() -> int:
    raw = sys.stdin.buffer.read(JOB_MAX_BYTES + 1)
    try:
        if len(raw) > JOB_MAX_BYTES:
            raise ValueError("the job is too large")
        job = job_decoder.decode(raw)
    except (ValueError, msgspec.DecodeError) as exc:
        print(f"qledge notify: cannot read the job: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + job.timeout_s * max(1, len(job.deliveries))
    out = sys.stdout.buffer
    for delivery in job.deliveries:
        left = deadline - time.monotonic()
        if left <= 0.5:
            result = Result(id=delivery.id, ok=False, detail="not tried: the batch ran out of time")
        else:
            result = deliver(delivery, min(job.timeout_s, left))
        out.write(result_encoder.encode(result) + b"\n")
        out.flush()
    return 0
