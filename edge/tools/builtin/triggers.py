"""Trigger management tools: full cron specs, for owners and operators.

A trigger makes the task revision it is pinned to runnable on a schedule: creating one,
repinning one, enabling one and giving an enabled one a new schedule are checked against
what that revision runs (ToolContext.may_run), like writing the task itself."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Annotated

import msgspec

from edge.core.errors import conflict, invalid, not_found
from edge.core.reads import keyset
from edge.core.schedule import REBOOT, Misfire, Schedule, ScheduleError, days_ored, normalize
from edge.core.text import Limit, Name, NonNegative
from edge.core.tasks import Task
from edge.core.triggers import MAX_JITTER_S, CronSpec, Trigger, TriggerEvent
from edge.tools.context import ToolContext
from edge.tools.definition import tool

_Revision = Annotated[int, msgspec.Meta(ge=1)]
_Expression = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
_Jitter = Annotated[int, msgspec.Meta(ge=0, le=MAX_JITTER_S)]
MAX_UPCOMING = 100


class CreateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    expression: _Expression
    timezone: _Zone | None = None
    misfire: Misfire = "skip"
    jitter_s: _Jitter = 0
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


class UpdateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A new schedule for a trigger: the fields given replace the head's; its task, pin,
    enabled flag and events stay. Compare-and-set on `expected_revision` when given."""

    trigger_id: Name
    expected_revision: NonNegative | None = None
    expression: _Expression | None = None
    timezone: _Zone | None = None
    misfire: Misfire | None = None
    jitter_s: _Jitter | None = None


class UpcomingArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_UPCOMING)] = 10


class UpcomingFire(msgspec.Struct, rename="camel"):
    at_ms: int
    trigger_id: str
    task_id: str
    timezone: str
    jitter_s: int = 0


class Upcoming(msgspec.Struct, rename="camel"):
    fires: list[UpcomingFire]


class PreviewArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """An expression to try before a trigger is made of it (nothing is stored)."""

    expression: _Expression
    timezone: _Zone | None = None  # default: the daemon's zone
    count: Annotated[int, msgspec.Meta(ge=1, le=10)] = 5
    after_ms: NonNegative | None = None  # default: now


class Preview(msgspec.Struct, rename="camel", omit_defaults=True):
    """The next fires of an expression as the scheduler would plan them; `daysOred`: both
    day fields are restricted, so a day matching either fires (busybox crond's rule);
    `event`: `@reboot` or `@once`, which fire on an event, never at a time."""

    expression: str
    timezone: str
    fires: list[int]
    days_ored: bool = False
    event: str | None = None


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


def _checked(expression: str, timezone: str, misfire: Misfire, jitter_s: int) -> CronSpec:
    try:
        spec = CronSpec(expression=normalize(expression), timezone=timezone, misfire=misfire, jitter_s=jitter_s)
        spec.schedule()  # the zone must load here, not at the first fire
    except ScheduleError as exc:
        raise invalid(str(exc)) from None
    return spec


async def create(ctx: ToolContext, args: CreateArgs) -> Trigger:
    triggers = ctx.services.triggers
    spec = _checked(args.expression, args.timezone or triggers.default_timezone, args.misfire, args.jitter_s)
    task = await _pinned(ctx, args.task_id, args.task_revision, "a trigger for")
    return await triggers.create(ctx.project, args.trigger_id, args.task_id, task.revision, spec, ctx.now_ms())


async def update(ctx: ToolContext, args: UpdateArgs) -> Trigger:
    head = await get(ctx, TriggerId(trigger_id=args.trigger_id))
    if args.expected_revision is not None and head.revision != args.expected_revision:
        raise conflict(f"trigger {head.id!r} is at revision {head.revision}, not {args.expected_revision}")
    old = head.spec
    spec = _checked(
        old.expression if args.expression is None else args.expression, args.timezone or old.timezone,
        old.misfire if args.misfire is None else args.misfire, old.jitter_s if args.jitter_s is None else args.jitter_s,
    )
    if head.enabled and spec != old:
        # A new schedule re-arms the trigger: it decides anew when its revision runs, so it
        # is checked like making that revision runnable (a disabled one is, when enabled).
        await _pinned(ctx, head.task_id, head.task_revision, "a trigger of")
    # The store checks the revision again, in the transaction that writes.
    return await ctx.services.triggers.update(ctx.project, head.id, spec, head.revision, ctx.now_ms())


def _fires(t: Trigger) -> Iterator[tuple[int, str]]:
    """The trigger's cursor, then every fire after it: what it will do, in order."""
    assert t.next_fire_at_ms is not None
    yield t.next_fire_at_ms, t.id
    try:
        schedule = t.spec.schedule()
    except ScheduleError:  # its zone data is gone: the cursor is all that is known
        return
    for ms in schedule.fires_after(t.next_fire_at_ms):
        yield ms, t.id


async def upcoming(ctx: ToolContext, args: UpcomingArgs) -> Upcoming:
    armed: dict[str, Trigger] = {}
    after: str | None = None
    while True:  # every trigger; a router has tens of them
        page = await ctx.services.triggers.page(ctx.project, after, 64)
        armed.update((t.id, t) for t in page if t.enabled and t.next_fire_at_ms is not None)
        if len(page) < 64:
            break
        after = page[-1].id
    merged = heapq.merge(*(_fires(t) for t in armed.values()))
    return Upcoming(fires=[
        UpcomingFire(at_ms=ms, trigger_id=tid, task_id=armed[tid].task_id, timezone=armed[tid].spec.timezone,
                     jitter_s=armed[tid].spec.jitter_s)
        for ms, tid in itertools.islice(merged, args.count)
    ])


async def preview(ctx: ToolContext, args: PreviewArgs) -> Preview:
    zone = args.timezone or ctx.services.triggers.default_timezone
    try:
        schedule = Schedule(normalize(args.expression), zone)
    except ScheduleError as exc:
        raise invalid(str(exc)) from None
    after = ctx.now_ms() if args.after_ms is None else args.after_ms
    fires = [] if schedule.event is not None else list(itertools.islice(schedule.fires_after(after), args.count))
    return Preview(expression=schedule.expression, timezone=schedule.zone_name, fires=fires,
                   days_ored=schedule.event is None and days_ored(schedule.expression),
                   event=("reboot" if schedule.event == REBOOT else "once") if schedule.event else None)


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
    tool("qledge.trigger.update", update, UpdateArgs, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Change a trigger's schedule (a new revision; events kept)"),
    tool("qledge.trigger.repin", repin, RepinArgs, Trigger, effect="write", risk="medium",
         permission="trigger.write", title="Pin a trigger to a task revision"),
    tool("qledge.trigger.delete", delete, TriggerRef, Deleted, effect="write", risk="medium",
         permission="trigger.write", title="Delete a trigger"),
    tool("qledge.trigger.get", get, TriggerId, Trigger, effect="read", risk="medium",
         permission="trigger.inspect", title="A trigger with its full spec"),
    tool("qledge.trigger.list", list_triggers, ListArgs, TriggerPage, effect="read", risk="medium",
         permission="trigger.inspect", title="Triggers with their full specs"),
    # Fire times, outcomes and reasons, never an expression: what viewers (trigger.read)
    # may see, like the scheduled times of runs (run.read).
    tool("qledge.trigger.events", events, EventArgs, EventPage, effect="read", risk="low",
         permission="trigger.read", title="Fires that were skipped or refused"),
    tool("qledge.trigger.upcoming", upcoming, UpcomingArgs, Upcoming, effect="read", risk="low",
         permission="trigger.read", title="The next fires of every enabled trigger, in time order"),
    tool("qledge.cron.preview", preview, PreviewArgs, Preview, effect="read", risk="low",
         permission="trigger.read", title="The next fires of a cron expression, in the daemon's zone or one given"),
]
