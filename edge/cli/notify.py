"""`qledge notify …`: channels, the default rules, test messages and the delivery log. Ships
with the notification capability (packaging/build.py `OPTIONAL["notify"]`): a build without
it has no `qledge notify`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from edge.cli import shared
from edge.cli.shared import EXIT_OK, EXIT_TOOL, UsageError, Verb, show, show_list
from edge.core.tasks import DEFAULT_NOTIFY_ON, NotifyRule
from edge.notify.channels import KINDS, ChannelSpec
from edge.tools.definition import Empty

if TYPE_CHECKING:
    import argparse

    from edge.notify.tools import ChannelInfo
    from edge.transports.client import Client

# The tools' Structs are loaded by the verbs that use them: every other command only builds
# this parser.

_any = msgspec.json.Decoder()


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _value(text: str) -> Any:
    """A JSON value when it reads as one (42, true, ["a"], {…}), else the text itself."""
    try:
        return _any.decode(text)
    except msgspec.DecodeError:
        return text


def _text_fields(kind: str) -> set[str]:
    """The keys of this kind of channel whose value may be text: `--set` takes those as typed
    (a Telegram chat id -1001234567890 is text, not a number)."""
    import msgspec.inspect as mi

    found: set[str] = set()
    for cls in ChannelSpec.__args__:
        if cls.__struct_config__.tag == kind:
            for field in mi.type_info(cls).fields:  # type: ignore[attr-defined]
                kinds = field.type.types if isinstance(field.type, mi.UnionType) else (field.type,)
                if any(isinstance(k, mi.StrType) for k in kinds):
                    found.add(field.encode_name)
    return found


def channel_spec(kind: str, sets: list[str], secrets: list[str], language: str | None) -> ChannelSpec:
    """A spec from `--set key=value` and `--secret key=SECRET_NAME` (keys as in the docs'
    examples: chatId or chat_id)."""
    data: dict[str, Any] = {"kind": kind}
    text = _text_fields(kind)
    for flag, pairs in (("--set", sets), ("--secret", secrets)):
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise UsageError(f"{flag} expects KEY=VALUE, got {pair!r}")
            name = _camel(key)
            data[name] = {"secret": value} if flag == "--secret" else value if name in text else _value(value)
    if language:
        data["language"] = language
    try:
        return msgspec.convert(data, ChannelSpec)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{kind} channel: {exc}") from None


def notify_add(c: Client, a: argparse.Namespace) -> int:
    from edge.notify.tools import ChannelInfo, SetArgs

    spec = channel_spec(a.kind, a.set, a.secret, a.language)
    info = c.typed("qledge.notify.channel.set", SetArgs(name=a.name, spec=msgspec.to_builtins(spec)), ChannelInfo)
    return show(a, info, lambda i: print(f"channel {i.name} ({i.kind}) {i.status};"
                                         f" try it: qledge notify test {i.name}"))


def _health(info: ChannelInfo) -> str:
    h = info.health
    if h is None:
        return "-"
    if not h.failures:
        return "ok"
    return f"failing ×{h.failures}: {h.last_error or ''}"[:80]


def notify_channels(c: Client, a: argparse.Namespace) -> int:
    from edge.notify.tools import ChannelList

    channels = c.typed("qledge.notify.channel.list", Empty(), ChannelList).channels
    return show_list(a, channels, "no channels", lambda i: [i.name, i.kind, shared.when(i.updated_at_ms), _health(i)],
                     ["CHANNEL", "KIND", "UPDATED", "LAST ATTEMPTS"])


def notify_rm(c: Client, a: argparse.Namespace) -> int:
    from edge.notify.tools import Deleted, NameArgs

    gone = c.typed("qledge.notify.channel.delete", NameArgs(name=a.name), Deleted)
    return show(a, gone, lambda d: print(f"channel {d.name} deleted"))


def notify_rules(c: Client, a: argparse.Namespace) -> int:
    from edge.notify.tools import Rules

    channels = [x for value in a.channel or [] for x in value.split(",") if x]
    on = [x for x in (a.on or "").split(",") if x]
    if a.clear:
        if channels or on:
            raise UsageError("--clear takes no --channel or --on")
        result = c.typed("qledge.notify.rules.set", Rules(rules=None), Rules)
    elif channels:
        try:
            rule = msgspec.convert({"channels": channels, "on": on or list(DEFAULT_NOTIFY_ON)}, NotifyRule)
        except msgspec.ValidationError as exc:
            raise UsageError(f"rule: {exc}") from None
        result = c.typed("qledge.notify.rules.set", Rules(rules=[rule]), Rules)
    elif on:
        raise UsageError("--on needs --channel CHANNEL")
    else:
        result = c.typed("qledge.notify.rules.get", Empty(), Rules)

    def human(r: Any) -> None:
        if not r.rules:
            print("no default rules: only tasks with their own (--notify) send messages")
        for rule in r.rules or []:
            print(f"on {','.join(rule.on)}: {', '.join(rule.channels)}")

    return show(a, result, human)


def notify_test(c: Client, a: argparse.Namespace) -> int:
    from edge.core.ports.notify import TestOutcome
    from edge.notify.tools import TestArgs

    outcome = c.typed("qledge.notify.test", TestArgs(channel=a.channel), TestOutcome)
    show(a, outcome, lambda o: print(f"sent through {a.channel}" if o.ok else f"not sent: {o.detail}"))
    return EXIT_OK if outcome.ok else EXIT_TOOL


def notify_log(c: Client, a: argparse.Namespace) -> int:
    from edge.notify.tools import LogArgs, LogPage

    page = c.typed("qledge.notify.log", LogArgs(limit=a.limit), LogPage)

    def row(r: Any) -> list[str]:
        what = r.task_id or "-"
        if r.count > 1:
            what += f" ×{r.count}"
        note = r.last_error or (f"into #{r.merged_into}" if r.merged_into else "")
        return [str(r.id), shared.when(r.created_at_ms), r.channel,
                r.event, what, r.state, str(r.attempts), note[:70]]

    return show_list(a, page.records, "no notifications yet", row,
                     ["ID", "QUEUED", "CHANNEL", "EVENT", "TASK", "STATE", "TRIES", "NOTE"])


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=", ".join(KINDS))
    p.add_argument("--set", action="append", default=[], metavar="K=V",
                   help='a setting: text for a text field, else JSON (42, true, ["a"])')
    p.add_argument("--secret", action="append", default=[], metavar="K=SECRET",
                   help="a setting taken from a stored secret (tokens, keys, passwords)")
    p.add_argument("--language", choices=("en", "zh"), help="the message language (default [notify] language)")


def _rm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")


def _rules_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--channel", action="append", metavar="CHANNEL[,…]")
    p.add_argument("--on", metavar="EVENT[,…]",
                   help="failure, recovery, success, lost, skipped, every (default failure,recovery)")
    p.add_argument("--clear", action="store_true", help="no default rules")


def _test_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("channel", metavar="CHANNEL")


def _log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=20, choices=range(1, 65), metavar="N", help="1..64 (default 20)")


VERBS = {"notify": (
    Verb("add", notify_add, "create or replace a channel: qledge notify add NAME KIND --set K=V --secret K=SECRET",
         _add_options),
    Verb("channels", notify_channels, "list channels and how their last attempts went"),
    Verb("rm", notify_rm, "delete a channel", _rm_options),
    Verb("rules", notify_rules, "show or set the default rules (tasks without --notify use them)", _rules_options),
    Verb("test", notify_test, "send a test message through a channel", _test_options),
    Verb("log", notify_log, "recent notifications and their delivery, newest first", _log_options),
)}
