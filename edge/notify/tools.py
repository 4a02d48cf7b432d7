"""Notification tools: channels, the project's default rules, test messages and the delivery log.

Who may do what: setting a channel needs `notify.write` and `secret.export`, because a
channel sends the values of the secrets it names to the place it names: configuring one is
as strong as exporting those secrets (owners hold it; operators do not). Deleting a
channel, setting the default rules and sending a test need `notify.write`; reading
channels (names of secrets, never values), rules and the log needs `notify.read`.
Operators hold both. A task's own rules are part of its spec (`task.write`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import invalid, not_found
from edge.core.ports.stores import ChannelHealth, ChannelRow, NoticeRecord, NotifyStore, SecretStore
from edge.core.tasks import NotifyRule
from edge.core.text import Limit, Name, NonNegative
from edge.notify.channels import ChannelSpec, problems, secret_names, spec_decoder, spec_encoder
from edge.notify.dispatch import Notifier, TestOutcome
from edge.tools.context import ToolContext
from edge.tools.definition import Empty, Tool, tool


class SetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name
    spec: ChannelSpec
    create_only: bool = False  # an existing channel is left as it is (imports)


class NameArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name


class ChannelInfo(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str
    kind: str
    spec: ChannelSpec
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


class LogArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    before: NonNegative | None = None  # a message id from a previous page
    limit: Limit = 20


class LogPage(msgspec.Struct, rename="camel", omit_defaults=True):
    records: list[NoticeRecord]
    next: int | None = None


class TestArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    channel: Name


TEST_WAIT_S = 25.0


def _info(row: ChannelRow, health: ChannelHealth | None = None, status: str | None = None) -> ChannelInfo:
    return ChannelInfo(name=row.name, kind=row.kind, spec=spec_decoder.decode(row.spec),
                       created_at_ms=row.created_at_ms, updated_at_ms=row.updated_at_ms, status=status, health=health)


def notify_tools(notifier: Notifier, store: NotifyStore, secrets: SecretStore) -> list[Tool]:
    """The tools, bound to the daemon's notifier and stores (edge.app.graph)."""

    async def set_channel(ctx: ToolContext, args: SetArgs) -> ChannelInfo:
        wrong = problems(args.spec)
        if wrong:
            raise invalid(wrong[0])
        known = {s.name for s in await secrets.for_project(ctx.project)}
        missing = [name for name in secret_names(args.spec) if name not in known]
        if missing:
            raise invalid(f"secret {missing[0]!r} is not set: qledge secret set {missing[0]} first")
        kind = args.spec.__struct_config__.tag
        assert isinstance(kind, str)
        row, status = await store.set_channel(ctx.project, args.name, kind, spec_encoder.encode(args.spec).decode(),
                                              ctx.now_ms(), args.create_only)
        if status == "updated":
            notifier.forget(args.name)
        return _info(row, status=status)

    async def list_channels(ctx: ToolContext, args: Empty) -> ChannelList:
        health = notifier.health()
        return ChannelList(channels=[_info(row, health.get(row.name)) for row in await store.channels(ctx.project)])

    async def delete_channel(ctx: ToolContext, args: NameArgs) -> Deleted:
        if not await store.delete_channel(ctx.project, args.name):
            raise not_found(f"no channel named {args.name!r}")
        notifier.forget(args.name)
        return Deleted(name=args.name)

    async def get_rules(ctx: ToolContext, args: Empty) -> Rules:
        return Rules(rules=await store.rules(ctx.project))

    async def set_rules(ctx: ToolContext, args: Rules) -> Rules:
        if args.rules is not None:
            names = {row.name for row in await store.channels(ctx.project)}
            for rule in args.rules:
                for channel in rule.channels:
                    if channel not in names:
                        raise invalid(f"no channel named {channel!r}")
        await store.set_rules(ctx.project, args.rules, ctx.now_ms())
        return Rules(rules=args.rules)

    async def test(ctx: ToolContext, args: TestArgs) -> TestOutcome:
        return await notifier.test(args.channel, TEST_WAIT_S)

    async def delivery_log(ctx: ToolContext, args: LogArgs) -> LogPage:
        found = await store.log(ctx.project, args.before, args.limit + 1)
        more = len(found) > args.limit
        page = found[: args.limit]
        return LogPage(records=page, next=page[-1].id if more and page else None)

    return [
        tool("qledge.notify.channel.set", set_channel, SetArgs, ChannelInfo, effect="write", risk="high",
             permission=("notify.write", "secret.export"),
             title="Create or replace a notification channel (it names secrets, never holds them)"),
        tool("qledge.notify.channel.list", list_channels, Empty, ChannelList, effect="read", risk="medium",
             permission="notify.read", title="Notification channels with their health"),
        tool("qledge.notify.channel.delete", delete_channel, NameArgs, Deleted, effect="write", risk="medium",
             permission="notify.write", title="Delete a notification channel"),
        tool("qledge.notify.rules.get", get_rules, Empty, Rules, effect="read", risk="low", permission="notify.read",
             title="The project's default notification rules"),
        tool("qledge.notify.rules.set", set_rules, Rules, Rules, effect="write", risk="medium",
             permission="notify.write", title="Replace the project's default notification rules"),
        tool("qledge.notify.test", test, TestArgs, TestOutcome, effect="write", risk="medium",
             permission="notify.write", title="Send a test message through a channel and wait for the outcome",
             deadline_s=TEST_WAIT_S + 5),
        tool("qledge.notify.log", delivery_log, LogArgs, LogPage, effect="read", risk="medium",
             permission="notify.read", title="Recent notifications and every attempt's outcome, newest first"),
    ]
