"""qinglong's notification settings as qledge channels, for `qledge import qinglong
--with-notifications`: what its environment's keys (what its notify.js and notify.py read)
and the panel's own failure notification map to, and their import; and the channels and
rules an export carries. Ships with the notification capability (a build without it
imports those keys as secrets only); edge.cli.main hands it to edge.cli.import_commands.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from edge.cli.import_commands import ImportedChannel, PlannedSecret, QlData, Report, Undo, json_obj
from edge.core.imports import NOTIFY_NAMES, import_key, is_notification_key
from edge.core.tasks import ImportRecord, NotifyRule
from edge.tools.builtin import backup as backup_tools
from edge.tools.builtin import credentials as secret_tools
from edge.transports.client import CallFailed

if TYPE_CHECKING:
    from edge.transports.client import Client


def maps(info: Mapping[str, object]) -> bool:
    """Whether qledge has a channel for the panel's notification `info`."""
    return ql_panel_channel(info) is not None


# (what it becomes, the keys it needs, key → (channel field, how the value is used)). A
# `secret` field names the secret the key was imported as; `text`, `url` and `int` carry
# the value itself (settings, not credentials).
_FieldMap = dict[str, tuple[str, str]]
_ENV_CHANNELS: tuple[tuple[str, tuple[str, ...], _FieldMap], ...] = (
    ("bark", ("BARK_PUSH",), {"BARK_PUSH": ("deviceKey", "secret"), "BARK_SOUND": ("sound", "text"),
                              "BARK_GROUP": ("group", "text"), "BARK_ICON": ("icon", "url")}),
    ("telegram", ("TG_BOT_TOKEN", "TG_USER_ID"), {"TG_BOT_TOKEN": ("token", "secret"), "TG_USER_ID": ("chatId", "text"),
                                                  "TG_API_HOST": ("baseUrl", "url")}),
    ("dingtalk", ("DD_BOT_TOKEN",), {"DD_BOT_TOKEN": ("accessToken", "secret"),
                                     "DD_BOT_SECRET": ("signSecret", "secret")}),
    ("wecom", ("QYWX_KEY",), {"QYWX_KEY": ("key", "secret"), "QYWX_ORIGIN": ("baseUrl", "url")}),
    ("pushplus", ("PUSH_PLUS_TOKEN",), {"PUSH_PLUS_TOKEN": ("token", "secret"), "PUSH_PLUS_USER": ("topic", "text")}),
    ("serverchan", ("PUSH_KEY",), {"PUSH_KEY": ("sendKey", "secret")}),
    ("feishu", ("FSKEY",), {"FSKEY": ("hook", "secret"), "FSSECRET": ("signSecret", "secret")}),
    ("gotify", ("GOTIFY_URL", "GOTIFY_TOKEN"), {"GOTIFY_URL": ("baseUrl", "url"), "GOTIFY_TOKEN": ("token", "secret"),
                                                "GOTIFY_PRIORITY": ("priority", "int")}),
    ("ntfy", ("NTFY_TOPIC",), {"NTFY_TOPIC": ("topic", "secret"), "NTFY_URL": ("baseUrl", "url"),
                               "NTFY_PRIORITY": ("priority", "int"), "NTFY_TOKEN": ("token", "secret")}),
)
# The panel's own failure notification (Auths, type "notification"): its `info.type` and fields.
_PANEL_CHANNELS: dict[str, tuple[str, tuple[str, ...], _FieldMap]] = {
    "telegramBot": ("telegram", ("telegramBotToken", "telegramBotUserId"), {
        "telegramBotToken": ("token", "secret"), "telegramBotUserId": ("chatId", "text"),
        "telegramBotApiHost": ("baseUrl", "url")}),
    "bark": ("bark", ("barkPush",), {"barkPush": ("deviceKey", "secret"), "barkSound": ("sound", "text"),
                                     "barkGroup": ("group", "text"), "barkIcon": ("icon", "url")}),
    "dingtalkBot": ("dingtalk", ("dingtalkBotToken",), {"dingtalkBotToken": ("accessToken", "secret"),
                                                        "dingtalkBotSecret": ("signSecret", "secret")}),
    "weWorkBot": ("wecom", ("weWorkBotKey",), {"weWorkBotKey": ("key", "secret"), "weWorkOrigin": ("baseUrl", "url")}),
    "pushPlus": ("pushplus", ("pushPlusToken",), {"pushPlusToken": ("token", "secret"),
                                                  "pushPlusUser": ("topic", "text")}),
    "serverChan": ("serverchan", ("serverChanKey",), {"serverChanKey": ("sendKey", "secret")}),
    "gotify": ("gotify", ("gotifyUrl", "gotifyToken"), {"gotifyUrl": ("baseUrl", "url"),
                                                         "gotifyToken": ("token", "secret"),
                                                         "gotifyPriority": ("priority", "int")}),
    "ntfy": ("ntfy", ("ntfyTopic",), {"ntfyTopic": ("topic", "secret"), "ntfyUrl": ("baseUrl", "url"),
                                      "ntfyPriority": ("priority", "int")}),
}


class PlannedChannel(msgspec.Struct, rename="camel"):
    """A channel an import would create: its name, its spec as the tool takes it (secrets
    by name), and the qinglong keys it comes from."""

    name: str
    spec: dict[str, object]
    keys: list[str]


def _setting(value: str, how: str) -> object | None:
    value = value.strip()
    if how == "int":
        return int(value) if value.isdigit() else None
    if how == "url":
        url = value if value.startswith(("http://", "https://")) else f"https://{value}"
        return url.rstrip("/") if re.match(r"^https?://[^\s/?#@]+(/[^\s]*)?$", url) else None
    return value or None


def _channel(name: str, kind: str, fields: _FieldMap, values: Mapping[str, str],
             secret_of: Mapping[str, str]) -> PlannedChannel:
    spec: dict[str, object] = {"kind": kind}
    used = []
    for key, (field, how) in fields.items():
        if key not in values:
            continue
        if how == "secret":
            if key in secret_of:
                spec[field] = {"secret": secret_of[key]}
                used.append(key)
            continue
        setting = _setting(values[key], how)
        if setting is not None:
            spec[field] = setting
            used.append(key)
    return PlannedChannel(name=name, spec=spec, keys=used)


def ql_env_channels(values: Mapping[str, str], secret_of: Mapping[str, str]) -> tuple[list[PlannedChannel], list[str]]:
    """Channels for the notification keys of qinglong's environment (what its notify.js and
    notify.py read), each credential referencing the secret its key became; and the keys
    of services qledge has no channel for."""
    planned = []
    mapped: set[str] = set()
    for kind, needed, fields in _ENV_CHANNELS:
        mapped.update(fields)
        if all(key in values and (fields[key][1] != "secret" or key in secret_of) for key in needed):
            planned.append(_channel(f"ql-{kind}", kind, fields, values, secret_of))
    if "SMTP_SERVER" in values and "SMTP_EMAIL" in values:
        host, _, port = values["SMTP_SERVER"].strip().partition(":")
        email = values["SMTP_EMAIL"].strip()
        spec: dict[str, object] = {"kind": "smtp", "host": host, "sender": email, "to": [email], "username": email,
                                   "security": "ssl" if values.get("SMTP_SSL", "").lower() == "true" else "starttls"}
        if port.isdigit():
            spec["port"] = int(port)
        if "SMTP_PASSWORD" in secret_of:
            spec["password"] = {"secret": secret_of["SMTP_PASSWORD"]}
        planned.append(PlannedChannel(name="ql-smtp", spec=spec, keys=["SMTP_SERVER", "SMTP_EMAIL", "SMTP_PASSWORD"]))
    mapped.update({"SMTP_SERVER", "SMTP_EMAIL", "SMTP_PASSWORD", "SMTP_SSL", "SMTP_NAME"} | NOTIFY_NAMES)
    unmapped = sorted(key for key in values if is_notification_key(key) and key not in mapped)
    return planned, unmapped


def ql_panel_channel(info: Mapping[str, object]) -> tuple[str, _FieldMap, tuple[str, ...]] | None:
    """What qinglong's own failure notification (its Auths `info`) maps to: the channel kind,
    its fields and the ones it needs; None for a service qledge has no channel for."""
    found = _PANEL_CHANNELS.get(str(info.get("type")))
    return (found[0], found[2], found[1]) if found else None


def ql_panel_plan(name: str, info: Mapping[str, object], secret_of: Mapping[str, str]) -> PlannedChannel | None:
    """The channel for the panel's notification, its credentials by the secret names in
    `secret_of` (field → secret)."""
    mapped = ql_panel_channel(info)
    if mapped is None:
        return None
    kind, fields, needed = mapped
    values = {k: str(v) for k, v in info.items() if isinstance(v, str | int) and str(v)}
    if not all(key in values for key in needed):
        return None
    return _channel(name, kind, fields, values, secret_of)


def _set_channel(c: Client, report: Report, plan: PlannedChannel, dry_run: bool) -> bool:
    """Create the channel unless one of that name exists; False when this daemon has no
    notification channels (a build without them)."""
    kind = str(plan.spec["kind"])
    if dry_run:
        report.channels.append(ImportedChannel(name=plan.name, kind=kind, keys=plan.keys, status="create"))
        return True
    try:
        got = c.call("qledge.notify.channel.set", {"name": plan.name, "spec": plan.spec, "createOnly": True})
    except CallFailed as exc:
        if exc.code == "invalid_argument" and exc.message.startswith("unknown tool"):
            return False
        report.channels.append(ImportedChannel(name=plan.name, kind=kind, keys=plan.keys, status="failed",
                                               note=f"{exc.code}: {exc.message}"))
        return True
    report.channels.append(ImportedChannel(name=plan.name, kind=kind, keys=plan.keys, status=str(got["status"])))
    return True


def _panel_secrets(c: Client, report: Report, info: dict[str, object], records: dict[str, ImportRecord],
                   dry_run: bool) -> dict[str, str]:
    """The credentials of qinglong's own notification setting, stored as secrets
    (`ql_panel_<field>`); field → secret name."""
    mapped = ql_panel_channel(info)
    stored: dict[str, str] = {}
    for field, (_, how) in (mapped[1].items() if mapped else ()):
        value = info.get(field)
        if how != "secret" or not isinstance(value, str | int) or not str(value):
            continue
        name, key = f"ql_panel_{field}", import_key("qinglong-panel", field)
        if key in records:
            status = "exists"
        elif dry_run:
            status = "create"
        else:
            status = c.typed("qledge.import.secret", secret_tools.ImportArgs(key=key, name=name, value=str(value)),
                             secret_tools.Imported).status
        report.secrets.append(PlannedSecret(name=name, env=f"panel {field}", status=status))
        if status != "taken":
            stored[field] = name
    return stored


def ql_channels(c: Client, report: Report, data: QlData, wanted: dict[str, str], usable: dict[str, str],
                 records: dict[str, ImportRecord], dry_run: bool) -> None:
    """--with-notifications: qinglong's notification settings become qledge channels that
    reference the imported secrets, and, when the project has no default rules yet, its
    default rule (failure and recovery, to every channel made here)."""
    values = {k: v for k, v in wanted.items() if is_notification_key(k)}
    planned, unmapped = ql_env_channels(values, usable)
    for auth in data.auths:
        info = json_obj(auth.get("info"))
        if auth.get("type") != "notification" or not info.get("type"):
            continue
        plan = ql_panel_plan(f"ql-panel-{info.get('type')}".lower(), info,
                             _panel_secrets(c, report, info, records, dry_run))
        if plan is None:
            report.notices.append(f"qinglong's own failure notification ({info['type']}): qledge has no channel for"
                                  " this service; set one up with qledge notify add")
        else:
            planned.append(plan)
    if unmapped:
        report.notices.append(f"notification keys without a qledge channel: {', '.join(unmapped)} (still imported as"
                              " secrets, for the scripts that send their own messages)")
    for plan in planned:
        if not _set_channel(c, report, plan, dry_run):
            report.notices.append("qinglong's notification settings are imported as secrets only: this qledge has"
                                  " no notification channels to take them over (a build without edge/notify)")
            return
    made = [ch.name for ch in report.channels if ch.status in ("create", "created", "exists")]
    if not made:
        return
    if dry_run:
        report.notices.append(f"notifications: would send failures and recoveries to {', '.join(made)} unless the"
                              " project has default rules (qledge notify rules)")
        return
    if c.call("qledge.notify.rules.get", {}).get("rules") is None:
        c.call("qledge.notify.rules.set", {"rules": [{"channels": made, "on": ["failure", "recovery"]}]})
        report.notices.append(f"notifications: failures and recoveries of every task now go to {', '.join(made)}"
                              " (qledge notify rules; qledge notify test CHANNEL tries one)")
    else:
        report.notices.append("notifications: the project's default rules were kept; add the new channels with"
                              " qledge notify rules --channel …")


# -- moving a device: the channels and default rules travel with an export ----------------


def export(c: Client, with_secrets: bool) -> tuple[backup_tools.ExportedNotify | None, list[str]]:
    """The channels (secrets by name) and the default rules; what is not exported, and why."""
    try:
        channels = [backup_tools.ExportedChannel(name=ch["name"], spec=ch["spec"])
                    for ch in c.call("qledge.notify.channel.list", {})["channels"]]
        rules = c.call("qledge.notify.rules.get", {}).get("rules")
    except CallFailed as exc:
        if exc.code == "permission_denied":
            return None, [f"notification channels and rules: not exported ({exc.message})"]
        if exc.message.startswith("unknown tool"):
            return None, []  # a build without notifications
        raise
    if not channels and rules is None:
        return None, []
    notes = ["notification channels: the secrets they use are not in this file (export --with-secrets carries"
             " them; or set them on the new device first)"] if channels and not with_secrets else []
    return backup_tools.ExportedNotify(channels=channels, rules=msgspec.convert(rules, list[NotifyRule] | None)), notes


def _secret_refs(value: object) -> set[str]:
    """The secrets a channel spec names (`{"secret": NAME}` anywhere in it)."""
    if isinstance(value, dict) and set(value) == {"secret"} and isinstance(value["secret"], str):
        return {value["secret"]}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return {name for item in items for name in _secret_refs(item)}


def check(c: Client, doc: backup_tools.Document, replace: bool) -> list[str]:
    """Before an import writes anything: each channel and the rules as the daemon would take
    them (a dry set: their specs and the caller's permissions), the channels' secrets (in
    the file, or here) and the channels the rules name; every refusal, in lines."""
    if doc.notify is None:
        return []
    refused: list[str] = []
    for ch in doc.notify.channels:
        try:
            c.call("qledge.notify.channel.set", {"name": ch.name, "spec": ch.spec, "createOnly": not replace,
                                                 "dryRun": True})
        except CallFailed as exc:
            refused.append(f"channel {ch.name}: {exc.code}: {exc.message}")
    if doc.notify.rules is not None:
        try:
            c.call("qledge.notify.rules.set", {"dryRun": True})  # the permission; the channels named below
        except CallFailed as exc:
            refused.append(f"notification rules: {exc.code}: {exc.message}")
    have = {s.name for s in doc.secrets or []}
    need = {(ch.name, s) for ch in doc.notify.channels for s in _secret_refs(ch.spec)}
    if any(s not in have for _, s in need):
        have |= {s["name"] for s in c.call("qledge.secret.list", {})["secrets"]}
    refused += [f"channel {ch}: secret {s!r} is neither in the file nor here (export --with-secrets, or"
                " qledge secret set it first)" for ch, s in sorted(need) if s not in have]
    wanted = {ch for rule in doc.notify.rules or [] for ch in rule.channels} - {ch.name for ch in doc.notify.channels}
    if wanted:
        wanted -= {ch["name"] for ch in c.call("qledge.notify.channel.list", {})["channels"]}
    return refused + [f"notification rules: no channel named {ch!r}" for ch in sorted(wanted)]


def apply(c: Client, doc: backup_tools.Document, replace: bool, dry_run: bool, undo: Undo) -> list[str]:
    """The channels (one that exists is kept, unless `replace`) and the default rules (kept
    when the device has others, unless `replace`); what each write changed goes to `undo`."""
    notes: list[str] = []
    before = {} if dry_run or not doc.notify else {
        ch["name"]: ch["spec"] for ch in c.call("qledge.notify.channel.list", {})["channels"]}
    for ch in doc.notify.channels if doc.notify else []:
        if dry_run:
            notes.append(f"notifications: channel {ch.name} would be created")
            continue
        status = c.call("qledge.notify.channel.set", {"name": ch.name, "spec": ch.spec,
                                                      "createOnly": not replace})["status"]
        if status == "created":
            undo.add(f"channel {ch.name}", functools.partial(c.call, "qledge.notify.channel.delete", {"name": ch.name}))
        elif status == "updated":
            undo.add(f"channel {ch.name} (its spec before)", functools.partial(
                c.call, "qledge.notify.channel.set", {"name": ch.name, "spec": before[ch.name]}))
        notes.append(f"notifications: channel {ch.name} {status}")
    if doc.notify is not None and doc.notify.rules is not None:
        rules = [msgspec.to_builtins(r) for r in doc.notify.rules]
        had = c.call("qledge.notify.rules.get", {}).get("rules")
        if had not in (None, rules) and not replace:
            notes.append("notifications: this device's default rules were kept (--replace takes the file's)")
        elif not dry_run:
            c.call("qledge.notify.rules.set", {"rules": rules})
            undo.add("the default rules", functools.partial(c.call, "qledge.notify.rules.set", {"rules": had}))
            notes.append("notifications: default rules set")
    return notes
