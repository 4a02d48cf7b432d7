"""Trigger management tools: full cron specs, for owners and operators.

A trigger makes the task revision it is pinned to runnable on a schedule: creating one,
repinning one and enabling one are checked against what that revision runs
(ToolContext.may_run), like writing the task itself."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import invalid, not_found
from edge.core.reads import keyset
from edge.core.schedule import Misfire, ScheduleError, normalize
from edge.core.text import Limit, Name, NonNegative
from edge.core.tasks import Task
from edge.core.triggers import MAX_JITTER_S, CronSpec, Trigger, TriggerEvent
from edge.tools.context import ToolContext
from edge.tools.definition import tool

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


async def _pinned(ctx: ToolContext, task_id: str, revision: int | None, what: str) -> Task:
    """The task revision a trigger will run (None: the head), once the caller may make it runnable."""
    task = await ctx.services.tasks.get(ctx.project, task_id, revision)
    if task is None:
        raise not_found(f"task {task_id!r} not found" if revision is None else
                        f"task {task_id!r} has no revision {revision}")
    ctx.may_run(f"{what} task {task_id} revision {task.revision}", task.spec)
    return task


async def create(ctx: ToolContext, args: CreateArgs) -> Trigger:
    triggers = ctx.services.triggers
    try:
        spec = CronSpec(
            expression=normalize(args.expression), timezone=args.timezone or triggers.default_timezone,
            misfire=args.misfire, jitter_s=args.jitter_s,
        )
        spec.schedule()  # the zone must load here, not at the first fire
    except ScheduleError as exc:
        raise invalid(str(exc)) from None
    task = await _pinned(ctx, args.task_id, args.task_revision, "a trigger for")
    return await triggers.create(ctx.project, args.trigger_id, args.task_id, task.revision, spec, ctx.now_ms())


async def get(ctx: ToolContext, args: TriggerId) -> Trigger:
    trigger = await ctx.services.triggers.get(ctx.project, args.trigger_id)
    if trigger is None:
        raise not_found(f"trigger {args.trigger_id!r} not found")
    return trigger


async def list_triggers(ctx: ToolContext, args: ListArgs) -> TriggerPage:
    page, last = keyset(await ctx.services.triggers.page(ctx.project, args.after, args.limit + 1), args.limit)
    return TriggerPage(triggers=page, next=last.id if last else None)


async def enable(ctx: ToolContext, args: TriggerRef) -> Trigger:
    triggers = ctx.services.triggers
    trigger = await get(ctx, TriggerId(trigger_id=args.trigger_id))
    if not trigger.enabled:
        await _pinned(ctx, trigger.task_id, trigger.task_revision, "a trigger of")
    expected = trigger.revision if args.expected_revision is None else args.expected_revision
    return await triggers.set_enabled(ctx.project, args.trigger_id, True, expected, ctx.now_ms())


async def disable(ctx: ToolContext, args: TriggerRef) -> Trigger:
    triggers = ctx.services.triggers
    return await triggers.set_enabled(ctx.project, args.trigger_id, False, args.expected_revision, ctx.now_ms())


async def repin(ctx: ToolContext, args: RepinArgs) -> Trigger:
    trigger = await get(ctx, TriggerId(trigger_id=args.trigger_id))
    task = await _pinned(ctx, trigger.task_id, args.task_revision, "a trigger of")
    expected = trigger.revision if args.expected_revision is None else args.expected_revision
    return await ctx.services.triggers.repin(ctx.project, args.trigger_id, task.revision, expected, ctx.now_ms())


async def delete(ctx: ToolContext, args: TriggerRef) -> Deleted:
    await ctx.services.triggers.delete(ctx.project, args.trigger_id, args.expected_revision)
    return Deleted(trigger_id=args.trigger_id)


async def events(ctx: ToolContext, args: EventArgs) -> EventPage:
    rows = await ctx.services.triggers.events(ctx.project, args.trigger_id, args.before, args.limit + 1)
    page, last = keyset(rows, args.limit)
    return EventPage(events=page, next=last.id if last else None)


TOOLS = [
    tool("qledge.trigger.create", create, CreateArgs, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Create a cron trigger for a task"),
    tool("qledge.trigger.enable", enable, TriggerRef, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Enable a trigger"),
    tool("qledge.trigger.disable", disable, TriggerRef, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Disable a trigger"),
    tool("qledge.trigger.repin", repin, RepinArgs, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Pin a trigger to a task revision"),
    tool("qledge.trigger.delete", delete, TriggerRef, Deleted, effect="write", risk="medium",
         permission="trigger.write", title="Delete a trigger"),
    tool("qledge.trigger.get", get, TriggerId, Trigger, effect="read", risk="medium",
         permission="trigger.inspect", title="A trigger with its full spec"),
    tool("qledge.trigger.list", list_triggers, ListArgs, TriggerPage, effect="read", risk="medium",
         permission="trigger.inspect", title="Triggers with their full specs"),
    tool("qledge.trigger.events", events, EventArgs, EventPage, effect="read", risk="medium",
         permission="trigger.inspect", title="Fires that were skipped or refused"),
]
