"""Notification channels and messages: what a channel is (one Struct per kind, secrets
named, never held), what a message says (English and Chinese templates, or the channel's
own), and the job the sender child is given. Pure: no I/O. Both the daemon (tools,
notifier) and the sender child (edge.notify.send) load it; it imports nothing heavier
than msgspec and the core shapes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from edge.core.tasks import SecretRef
from edge import duration_text, moment
from edge.core.text import Name

Language = Literal["en", "zh"]
_Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2048, pattern=r"^https?://[^\s/?#@]+(/[^\s]*)?$")]
_Proxy = Annotated[str, msgspec.Meta(max_length=512, pattern=r"^http://[^\s/?#@]+/?$")]
_Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$")]
_Text = Annotated[str, msgspec.Meta(max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")]
_Template = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")]
_Header = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")]
_HeaderValue = Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")]
_Address = Annotated[str, msgspec.Meta(min_length=3, max_length=320, pattern=r"^[^\s<>@,;]+@[^\s<>@,;]+$")]
_Host = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:_\[\]-]+$")]

LOG_MAX_BYTES = 1024  # of a run's log in a message, after redaction
TEXT_MAX_CHARS = 3500  # a message's text: under every channel's limit (Telegram's is 4096)


class _Channel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, rename="camel"):
    """What every channel may set: its language and its own title and text templates
    (`{task}`, `{status}`, `{log}`, … see FIELDS)."""

    language: Language | None = None  # None: [notify] language
    title: _Template | None = None
    text: _Template | None = None


class _Http(_Channel, kw_only=True):
    """An HTTP API: its base URL can be replaced (a self-hosted server, a mirror, a test),
    requests can go through an HTTP proxy, and TLS is verified against the system's trust
    store or `ca_file`."""

    base_url: _Url | None = None
    proxy: _Proxy | None = None
    ca_file: _Path | None = None


class Webhook(_Http, tag="webhook", tag_field="kind"):
    url: _Url | SecretRef
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    headers: Annotated[dict[_Header, _HeaderValue | SecretRef], msgspec.Meta(max_length=32)] = {}
    body: Any = None  # a JSON template: every string's {field}s filled in; None: every field


class Ntfy(_Http, tag="ntfy", tag_field="kind"):
    topic: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[-_A-Za-z0-9]+$")] | SecretRef
    token: SecretRef | None = None  # an access token (Authorization: Bearer)
    priority: Annotated[int, msgspec.Meta(ge=1, le=5)] | None = None
    tags: Annotated[list[_Text], msgspec.Meta(max_length=8)] = []


class Telegram(_Http, tag="telegram", tag_field="kind"):
    token: SecretRef  # the bot token
    chat_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^(-?[0-9]+|@[A-Za-z0-9_]+)$")]


class Bark(_Http, tag="bark", tag_field="kind"):
    device_key: SecretRef  # the key, or the whole push URL qinglong's BARK_PUSH holds
    group: _Text | None = "qledge"
    sound: _Text | None = None
    level: Literal["active", "timeSensitive", "passive", "critical"] | None = None
    icon: _Url | None = None


class WeCom(_Http, tag="wecom", tag_field="kind"):
    key: SecretRef  # the group bot's webhook key


class WeComApp(_Http, tag="wecom_app", tag_field="kind"):
    corp_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    corp_secret: SecretRef
    agent_id: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
    to_user: _Text = "@all"


class PushPlus(_Http, tag="pushplus", tag_field="kind"):
    token: SecretRef
    topic: _Text | None = None
    template: Literal["txt", "html", "markdown"] = "txt"


class ServerChan(_Http, tag="serverchan", tag_field="kind"):
    send_key: SecretRef  # SCT… (sctapi.ftqq.com) or sctp<uid>t… (Server酱³)


class DingTalk(_Http, tag="dingtalk", tag_field="kind"):
    access_token: SecretRef
    sign_secret: SecretRef | None = None  # the bot's "加签" secret (SEC…)


class Feishu(_Http, tag="feishu", tag_field="kind"):
    hook: SecretRef  # the token at the end of the bot's webhook URL
    sign_secret: SecretRef | None = None


class Gotify(_Http, tag="gotify", tag_field="kind"):
    token: SecretRef  # an application token
    priority: Annotated[int, msgspec.Meta(ge=0, le=10)] = 5


class Smtp(_Channel, tag="smtp", tag_field="kind"):
    host: _Host
    to: Annotated[list[_Address], msgspec.Meta(min_length=1, max_length=16)]
    sender: _Address
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None  # None: 465 (ssl), 587 (starttls), 25
    security: Literal["ssl", "starttls", "none"] = "ssl"
    username: _Text | None = None
    password: SecretRef | None = None
    ca_file: _Path | None = None


ChannelSpec = (Webhook | Ntfy | Telegram | Bark | WeCom | WeComApp | PushPlus | ServerChan | DingTalk | Feishu
               | Gotify | Smtp)
KINDS: tuple[str, ...] = tuple(t.__struct_config__.tag for t in ChannelSpec.__args__)
DEFAULT_BASE: dict[str, str] = {
    "ntfy": "https://ntfy.sh", "telegram": "https://api.telegram.org", "bark": "https://api.day.app",
    "wecom": "https://qyapi.weixin.qq.com", "wecom_app": "https://qyapi.weixin.qq.com",
    "pushplus": "https://www.pushplus.plus", "dingtalk": "https://oapi.dingtalk.com",
    "feishu": "https://open.feishu.cn",
}

spec_decoder = msgspec.json.Decoder(ChannelSpec)
spec_encoder = msgspec.json.Encoder(order="deterministic")


def secret_names(spec: ChannelSpec) -> list[str]:
    """Every secret a channel names (to resolve them for the sender, and to check them)."""
    found: list[str] = []
    for name in spec.__struct_fields__:
        value = getattr(spec, name)
        values = value.values() if isinstance(value, dict) else (value,)
        found += [v.secret for v in values if isinstance(v, SecretRef)]
    return sorted(set(found))


def problems(spec: ChannelSpec) -> list[str]:
    """What a decoded spec still gets wrong (one line each)."""
    found = []
    if isinstance(spec, Gotify) and spec.base_url is None:
        found.append("gotify needs baseUrl: the address of your Gotify server")
    if isinstance(spec, Smtp) and spec.security == "none" and spec.password is not None:
        found.append("smtp: a password is never sent over security = none")
    for name in ("title", "text"):
        template = getattr(spec, name)
        unknown = sorted({m for m in _PLACEHOLDER.findall(template or "") if m not in FIELDS})
        if unknown:
            found.append(f"{name} template: unknown field {{{unknown[0]}}} (fields: {', '.join(FIELDS)})")
    return found


# -- messages -----------------------------------------------------------------------

FIELDS = ("task", "taskId", "event", "status", "exitCode", "duration", "durationMs", "runId", "device", "count",
          "since", "detail", "log", "title", "text", "channel", "outcome", "failures", "nextReminder")
_PLACEHOLDER = re.compile(r"\{([A-Za-z]+)\}")

_WORDS: dict[str, dict[str, str]] = {
    "en": {"failure": "failed", "recovery": "recovered", "success": "succeeded", "lost": "was lost",
           "skipped": "was skipped", "finished": "finished", "test": "test message", "summary": "held back",
           "failed": "failed", "timed_out": "timed out", "succeeded": "succeeded", "cancelled": "cancelled",
           "task": "Task", "status": "Status", "exit": "exit", "duration": "Duration", "run": "Run",
           "device": "Device", "times": "{count} times since {since}", "log": "Last lines of the log:",
           "nolog": "(no log kept)", "reason": "Reason",
           "test_text": "A test message from qledge on {device} through channel {channel}. If you can read"
                        " this, the channel works.",
           "summary_title": "{count} notifications held back by the rate limit",
           "still": "still failing", "still_line": "Still failing: {failures} times since {since}",
           "next": "Next reminder in {nextReminder} if it still fails",
           "recovered_line": "Recovered after {failures} failures since {since}",
           "timed_out_after": "timed out after {secs} s", "stopped_with": "stopped with {signal}",
           "stopped_exit": "it exited with code {code} when stopped", "killed_by": "killed by {signal}",
           "then": ", ", "colon": ": "},
    "zh": {"failure": "执行失败", "recovery": "已恢复", "success": "执行成功", "lost": "运行中断",
           "skipped": "被跳过", "finished": "已结束", "test": "测试消息", "summary": "已合并",
           "failed": "失败", "timed_out": "超时", "succeeded": "成功", "cancelled": "已取消",
           "task": "任务", "status": "状态", "exit": "退出码", "duration": "耗时", "run": "运行",
           "device": "设备", "times": "自 {since} 起共 {count} 次", "log": "日志末尾：",
           "nolog": "（没有保留日志）", "reason": "原因",
           "test_text": "这是 qledge（{device}）通过渠道 {channel} 发送的测试消息。收到即表示渠道可用。",
           "summary_title": "{count} 条通知因频率限制合并",
           "still": "仍在失败", "still_line": "仍在失败：自 {since} 起共 {failures} 次",
           "next": "若仍失败，{nextReminder}后再次提醒",  # {nextReminder}: "20 分钟"
           "recovered_line": "已恢复：自 {since} 起失败 {failures} 次",
           "timed_out_after": "超时（{secs} 秒）", "stopped_with": "已用 {signal} 终止",
           "stopped_exit": "终止时退出码 {code}", "killed_by": "被 {signal} 终止",
           "then": "，", "colon": "："},
}


class Facts(msgspec.Struct, kw_only=True):
    """What one message is about, as the notifier read it."""

    channel: str
    event: str
    device: str
    task: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    detail: str | None = None
    count: int = 1
    first_at_ms: int | None = None
    log: str | None = None  # the redacted end of the log; None: none kept
    # A reminder of a task that keeps failing, or the recovery that ends its streak: the
    # failures so far and since when; for a reminder, how long until the next one.
    failures: int | None = None
    failing_since_ms: int | None = None
    next_reminder_ms: int | None = None


class Message(msgspec.Struct, kw_only=True):
    title: str
    text: str
    fields: dict[str, str | int | None]


def fill(template: str, fields: dict[str, str | int | None]) -> str:
    """`{name}` replaced by the field's value (empty when None); nothing else is expanded."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fields:
            return match.group(0)
        value = fields[name]
        return "" if value is None else str(value)

    return _PLACEHOLDER.sub(one, template)


_RUNNER_TIMEOUT = re.compile(r"timed out after ([0-9.]+)s")


def _signal(code: int) -> str:
    import signal  # only for a message about a run a signal ended

    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def outcome(f: Facts, language: Language = "en") -> str:
    """What happened to the run, in words: `timed out after 3 s, stopped with SIGTERM`,
    `failed: killed by SIGSEGV`, `failed (exit 3)`."""
    w = _WORDS[language]
    status = w.get(f.status or "", f.status or "")
    code = f.exit_code
    if f.status == "timed_out":
        match = _RUNNER_TIMEOUT.fullmatch(f.detail or "")
        secs = match.group(1) if match else (f"{f.duration_ms / 1000:g}" if f.duration_ms is not None else None)
        text = w["timed_out_after"].format(secs=secs) if secs is not None else status
        if code is not None and code < 0:
            return text + w["then"] + w["stopped_with"].format(signal=_signal(code))
        if code is not None:
            return text + w["then"] + w["stopped_exit"].format(code=code)
        return text
    if code is not None and code < 0:
        return status + w["colon"] + w["killed_by"].format(signal=_signal(code))
    if code is not None:
        return f"{status} ({w['exit']} {code})"
    return status


def _said(f: Facts) -> bool:
    """The detail only repeats what `outcome` says (the runner's own words for it)."""
    detail = f.detail or ""
    if f.status == "timed_out":
        return _RUNNER_TIMEOUT.fullmatch(detail) is not None
    return f.exit_code is not None and f.exit_code < 0 and detail.startswith("killed by ")


def _span(ms: int, language: Language = "en") -> str:
    minutes = max(1, round(ms / 60_000))
    if minutes < 90:
        return f"{minutes} min" if language == "en" else f"{minutes} 分钟"
    hours = f"{ms / 3_600_000:.1f}".removesuffix(".0")
    return f"{hours} h" if language == "en" else f"{hours} 小时"


def render(f: Facts, language: Language, title: str | None = None, text: str | None = None) -> Message:
    """The message for `f`: the channel's templates when it has them, else the language's."""
    w = _WORDS[language]
    reminder = f.event == "failure" and f.failures is not None
    since_ms = f.failing_since_ms if f.failures is not None else f.first_at_ms
    fields: dict[str, str | int | None] = {
        "task": f.task or f.task_id, "taskId": f.task_id, "event": f.event, "status": f.status,
        "exitCode": f.exit_code, "durationMs": f.duration_ms,
        "duration": duration_text(f.duration_ms) if f.duration_ms is not None else None,
        "runId": f.run_id[:13] if f.run_id else None, "device": f.device, "count": f.count,
        "since": moment(since_ms) if since_ms else None, "detail": f.detail, "log": f.log,
        "channel": f.channel, "outcome": outcome(f, language) if f.status else None, "failures": f.failures,
        "nextReminder": _span(f.next_reminder_ms, language) if f.next_reminder_ms is not None else None,
    }
    if f.event == "test":
        default_title, lines = f"[qledge] {w['test']}", [fill(w["test_text"], fields)]
    elif f.event == "summary":
        default_title = "[qledge] " + fill(w["summary_title"], fields)
        lines = [f.detail or "", f"{w['device']}: {f.device}"]
    else:
        what = w["still"] if reminder else w.get(f.event, f.event)
        default_title = f"[qledge] {fields['task']} {what}"
        lines = [f"{w['task']}: {fields['task']}"]
        if f.status:
            lines.append(f"{w['status']}: {fields['outcome']}")
        if f.detail and f.event == "skipped":
            lines.append(f"{w['reason']}: {f.detail}")
        elif f.detail and f.status not in ("succeeded", None) and not _said(f):
            lines.append(f.detail)
        if f.duration_ms is not None:
            lines.append(f"{w['duration']}: {fields['duration']}")
        if f.run_id:
            lines.append(f"{w['run']}: {fields['runId']}")
        lines.append(f"{w['device']}: {f.device}")
        if reminder:
            lines.append(fill(w["still_line"], fields))
            if f.next_reminder_ms is not None:
                lines.append(fill(w["next"], fields))
        elif f.event == "recovery" and f.failures is not None:
            lines.append(fill(w["recovered_line"], fields))
        elif f.count > 1:
            lines.append(fill(w["times"], fields))
        if f.run_id:
            lines += ["", w["log"], f.log if f.log is not None else w["nolog"]]
    fields["title"] = fill(title, fields) if title else default_title
    body = fill(text, fields) if text else "\n".join(lines)
    fields["text"] = body[:TEXT_MAX_CHARS]
    return Message(title=str(fields["title"])[:256], text=str(fields["text"]), fields=fields)


def webhook_body(template: Any, fields: dict[str, str | int | None]) -> Any:
    """The webhook's JSON template with its strings filled in; a string that is exactly one
    `{field}` becomes the field's value with its type (a number, null)."""
    if template is None:
        return dict(fields)
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole and whole.group(1) in fields:
            return fields[whole.group(1)]
        return fill(template, fields)
    if isinstance(template, list):
        return [webhook_body(item, fields) for item in template]
    if isinstance(template, dict):
        return {key: webhook_body(value, fields) for key, value in template.items()}
    return template


def log_tail(text: str, limit: int = LOG_MAX_BYTES) -> str:
    """The last whole lines of (already redacted) `text` within `limit` UTF-8 bytes."""
    text = text.rstrip("\n")
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = data[-limit:].decode("utf-8", "ignore")
    newline = cut.find("\n")
    return cut[newline + 1:] if 0 <= newline < len(cut) - 1 else cut


# -- the sender's job -------------------------------------------------------------------


class Delivery(msgspec.Struct, kw_only=True):
    """One message for the sender: the channel, the values of the secrets it names, and
    the rendered message."""

    id: int
    channel: Name
    spec: ChannelSpec
    secrets: dict[str, str]
    message: Message
    now_ms: int


class Job(msgspec.Struct, kw_only=True):
    timeout_s: float
    deliveries: list[Delivery]


class Result(msgspec.Struct, kw_only=True):
    """What the sender reports per delivery: ok, or why not; `permanent` when trying the
    same request again cannot help (a 4xx other than 408/429, a configuration error);
    `timed_out` when its deadline passed; `tried` false when it was not attempted (charged
    nothing). A line with `started` says an attempt began (its outcome follows)."""

    id: int
    ok: bool
    detail: str | None = None
    permanent: bool = False
    elapsed_ms: int = 0
    timed_out: bool = False
    tried: bool = True
    started: bool = False


job_encoder = msgspec.json.Encoder()
job_decoder = msgspec.json.Decoder(Job)
result_encoder = msgspec.json.Encoder()
result_decoder = msgspec.json.Decoder(Result)
