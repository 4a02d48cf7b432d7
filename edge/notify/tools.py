"""Notification tools: channels, the project's default rules, test messages and the delivery log.

Who may do what: setting a channel needs `notify.write` and `secret.export`, because a
channel sends the values of the secrets it names to the place it names: configuring one is
as strong as exporting those secrets (owners hold it; operators do not). Deleting a
channel, setting the default rules and sending a test need `notify.write`; reading
channels (names of secrets, never values), rules and the log needs `notify.read`.
Operators hold both. A task's own rules are part of its spec (`task.write`).

A channel's spec crosses the socket as a plain object and is checked against its kind
(edge.notify.channels) when it is set: the channel shapes are loaded by the first call
that needs them, not by an idle daemon.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from edge.core.errors import invalid, not_found
from edge.core.ports.notify import ChannelHealth, ChannelRow, NoticeRecord, NotifyStore, TestOutcome
from edge.core.ports.stores import SecretStore
from edge.core.tasks import NotifyRule
from edge.core.text import Limit, Name, NonNegative
from edge.tools.context import ToolContext
from edge.notify.handle import TEST_WAIT_S, TOOL_INFOS, NotifierHandle
from edge.tools.definition import Empty, Handler, Tool, declared

class SetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name
    spec: dict[str, Any]  # a channel spec (edge.notify.channels.ChannelSpec), checked by the tool
    create_only: bool = False  # an existing channel is left as it is (imports)
    # Check the spec (and, through the call's chain, the caller's permissions), write nothing;
    # the secrets it names are not looked up: an import checks them itself, as it brings them.
    dry_run: bool = False


class NameArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name


class ChannelInfo(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str
    kind: str
    spec: dict[str, Any]  # as stored: secrets by name, never their values
    created_at_ms: int
    updated_at_ms: int
    status: str | None = None  # set: created, updated or exists
    health: ChannelHealth | None = None


class ChannelList(msgspec.Struct, rename="camel"):
    channels: list[ChannelInfo]


class Deleted(msgspec.Struct, rename="camel"):
    name: str


class Rules(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    rules: Annotated[list[NotifyRule], msgspec.Meta(max_length=8)] | None = None  # None: no default


class RulesArgs(Rules, forbid_unknown_fields=True):
    dry_run: bool = False  # check the caller's permissions and the channels named, write nothing


class LogArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    before: NonNegative | None = None  # a message id from a previous page
    limit: Limit = 20


class LogPage(msgspec.Struct, rename="camel", omit_defaults=True):
    records: list[NoticeRecord]
    next: int | None = None


class TestArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    channel: Name


_stored = msgspec.json.Decoder(dict[str, Any])


def _info(row: ChannelRow, health: ChannelHealth | None = None, status: str | None = None) -> ChannelInfo:
    return ChannelInfo(name=row.name, kind=row.kind, spec=_stored.decode(row.spec),
                       created_at_ms=row.created_at_ms, updated_at_ms=row.updated_at_ms, status=status, health=health)


def notify_tools(notifier: NotifierHandle, store: NotifyStore, secrets: SecretStore) -> list[Tool]:
    """The tools, bound to the daemon's notifier and stores (edge.app.graph), as TOOL_INFOS
    (edge.notify.handle) declares them."""

    async def set_channel(ctx: ToolContext, args: SetArgs) -> ChannelInfo:
        from edge.notify.channels import ChannelSpec, problems, secret_names, spec_encoder

        try:
            spec: ChannelSpec = msgspec.convert(args.spec, ChannelSpec)
        except msgspec.ValidationError as exc:
            raise invalid(f"channel spec: {exc}") from None
        wrong = problems(spec)
        if wrong:
            raise invalid(wrong[0])
        kind = spec.__struct_config__.tag
        assert isinstance(kind, str)
        if args.dry_run:
            return ChannelInfo(name=args.name, kind=kind, spec=args.spec, created_at_ms=0, updated_at_ms=0,
                               status="checked")
        known = {s.name for s in await secrets.for_project(ctx.project)}
        missing = [name for name in secret_names(spec) if name not in known]
        if missing:
            raise invalid(f"secret {missing[0]!r} is not set: qledge secret set {missing[0]} first")
        row, status = await store.set_channel(ctx.project, args.name, kind, spec_encoder.encode(spec).decode(),
                                              ctx.now_ms(), args.create_only)
        if status == "updated":
            notifier.forget(args.name)
        return _info(row, status=status)

    async def list_channels(ctx: ToolContext, args: Empty) -> ChannelList:
        health = await notifier.health()
        return ChannelList(channels=[_info(row, health.get(row.name)) for row in await store.channels(ctx.project)])

    async def delete_channel(ctx: ToolContext, args: NameArgs) -> Deleted:
        if not await store.delete_channel(ctx.project, args.name):
            raise not_found(f"no channel named {args.name!r}")
        notifier.forget(args.name)
        return Deleted(name=args.name)

    async def get_rules(ctx: ToolContext, args: Empty) -> Rules:
        return Rules(rules=await store.rules(ctx.project))

    async def set_rules(ctx: ToolContext, args: RulesArgs) -> Rules:
        if args.rules is not None:
            names = {row.name for row in await store.channels(ctx.project)}
            for rule in args.rules:
                for channel in rule.channels:
                    if channel not in names:
                        raise invalid(f"no channel named {channel!r}")
        if not args.dry_run:
            await store.set_rules(ctx.project, args.rules, ctx.now_ms())
        return Rules(rules=args.rules)

    async def test(ctx: ToolContext, args: TestArgs) -> TestOutcome:
        return await (await notifier.ready()).test(args.channel, TEST_WAIT_S)

    async def delivery_log(ctx: ToolContext, args: LogArgs) -> LogPage:
        found = await store.log(ctx.project, args.before, args.limit + 1)
        more = len(found) > args.limit
        page = found[: args.limit]
        return LogPage(records=page, next=page[-1].id if more and page else None)

    handlers: dict[str, tuple[Handler, type, type]] = {
        "qledge.notify.channel.set": (set_channel, SetArgs, ChannelInfo),
        "qledge.notify.channel.list": (list_channels, Empty, ChannelList),
        "qledge.notify.channel.delete": (delete_channel, NameArgs, Deleted),
        "qledge.notify.rules.get": (get_rules, Empty, Rules),
        "qledge.notify.rules.set": (set_rules, RulesArgs, Rules),
        "qledge.notify.test": (test, TestArgs, TestOutcome),
        "qledge.notify.log": (delivery_log, LogArgs, LogPage),
    }
    return declared(TOOL_INFOS, handlers)
