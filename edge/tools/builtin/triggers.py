"""Trigger management tools: full cron specs, for owners and operators."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import invalid, not_found, unavailable
from edge.core.schedule import Misfire, ScheduleError, normalize
from edge.core.text import Limit, Name, NonNegative
from edge.core.triggers import MAX_JITTER_S, CronSpec, Trigger, TriggerEvent
from edge.tools.context import ToolContext
from edge.tools.definition import READ_DEADLINE_S, WRITE_DEADLINE_S, Tool

_Revision = Annotated[int, msgspec.Meta(ge=1)]


class CreateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    expression: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    misfire: Misfire = "skip"
    jitter_s: Annotated[int, msgspec.Meta(ge=0, le=MAX_JITTER_S)] = 0
    trigger_id: Name | None = None
    task_revision: _Revision | None = None  # default: the task's current revision


class TriggerId(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    trigger_id: Name


class TriggerRef(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    trigger_id: Name
    expected_revision: NonNegative | None = None


class RepinArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    trigger_id: Name
    task_revision: _Revision | None = None  # default: the task's current revision
    expected_revision: NonNegative | None = None


class ListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: Name | None = None
    limit: Limit = 64


class TriggerPage(msgspec.Struct, rename="camel", omit_defaults=True):
    triggers: list[Trigger]
    next: str | None = None


class EventArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    trigger_id: Name | None = None  # None: every trigger of the project
    before: NonNegative | None = None  # an event id from a previous page
    limit: Limit = 32


class EventPage(msgspec.Struct, rename="camel", omit_defaults=True):
    events: list[TriggerEvent]
    next: int | None = None


class Deleted(msgspec.Struct, rename="camel"):
    trigger_id: str


def _triggers(ctx: ToolContext):
    triggers = ctx.services.triggers
    if triggers is None:
        raise unavailable("this daemon has no scheduler")
    return triggers


async def create(ctx: ToolContext, args: CreateArgs) -> Trigger:
    triggers = _triggers(ctx)
    try:
        spec = CronSpec(
            expression=normalize(args.expression), timezone=args.timezone or triggers.default_timezone,
            misfire=args.misfire, jitter_s=args.jitter_s,
        )
        spec.schedule()  # the zone must load here, not at the first fire
    except ScheduleError as exc:
        raise invalid(str(exc)) from None
    return await triggers.create(ctx.project, args.trigger_id, args.task_id, args.task_revision, spec, ctx.now_ms())


async def get(ctx: ToolContext, args: TriggerId) -> Trigger:
    trigger = await _triggers(ctx).get(ctx.project, args.trigger_id)
    if trigger is None:
        raise not_found(f"trigger {args.trigger_id!r} not found")
    return trigger


async def list_triggers(ctx: ToolContext, args: ListArgs) -> TriggerPage:
    rows = await _triggers(ctx).list(ctx.project, args.after, args.limit + 1)
    page = rows[: args.limit]
    return TriggerPage(triggers=page, next=page[-1].id if len(rows) > args.limit else None)


async def enable(ctx: ToolContext, args: TriggerRef) -> Trigger:
    return await _triggers(ctx).set_enabled(ctx.project, args.trigger_id, True, args.expected_revision, ctx.now_ms())


async def disable(ctx: ToolContext, args: TriggerRef) -> Trigger:
    return await _triggers(ctx).set_enabled(ctx.project, args.trigger_id, False, args.expected_revision, ctx.now_ms())


async def repin(ctx: ToolContext, args: RepinArgs) -> Trigger:
    return await _triggers(ctx).repin(
        ctx.project, args.trigger_id, args.task_revision, args.expected_revision, ctx.now_ms()
    )


async def delete(ctx: ToolContext, args: TriggerRef) -> Deleted:
    await _triggers(ctx).delete(ctx.project, args.trigger_id, args.expected_revision)
    return Deleted(trigger_id=args.trigger_id)


async def events(ctx: ToolContext, args: EventArgs) -> EventPage:
    rows = await _triggers(ctx).events(ctx.project, args.trigger_id, args.before, args.limit + 1)
    page = rows[: args.limit]
    return EventPage(events=page, next=page[-1].id if len(rows) > args.limit else None)


def _tool(name: str, handler, args_type, result_type, title: str, write: bool) -> Tool:
    return Tool(
        name=name, version="1.0.0", effect="write" if write else "read", risk="medium",
        permissions=("trigger.write" if write else "trigger.inspect",), args_type=args_type,
        result_type=result_type, handler=handler, deadline_s=WRITE_DEADLINE_S if write else READ_DEADLINE_S,
        title=title,
    )


TOOLS = [
    _tool("qledge.trigger.create", create, CreateArgs, Trigger, "Create a cron trigger for a task", True),
    _tool("qledge.trigger.enable", enable, TriggerRef, Trigger, "Enable a trigger", True),
    _tool("qledge.trigger.disable", disable, TriggerRef, Trigger, "Disable a trigger", True),
    _tool("qledge.trigger.repin", repin, RepinArgs, Trigger, "Pin a trigger to a task revision", True),
    _tool("qledge.trigger.delete", delete, TriggerRef, Deleted, "Delete a trigger", True),
    _tool("qledge.trigger.get", get, TriggerId, Trigger, "A trigger with its full spec", False),
    _tool("qledge.trigger.list", list_triggers, ListArgs, TriggerPage, "Triggers with their full specs", False),
    _tool("qledge.trigger.events", events, EventArgs, EventPage, "Fires that were skipped or refused", False),
]
