"""`qledge cron next` (offline: no daemon, no event loop, no database) and `qledge trigger …`."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING

import msgspec

from edge.app.config import default_zone
from edge.cli import render
from edge.cli.client import CallFailed, UsageError
from edge.cli.commands import all_pages, show, show_list
from edge.cli.edit import bounded_int
from edge.core.schedule import REBOOT, Schedule, ScheduleError, days_ored, format_local, load_zone, local_time
from edge.core.triggers import Trigger, TriggerEvent
from edge.tools.builtin import triggers as trigger_tools

if TYPE_CHECKING:
    import argparse

    from edge.cli.client import Client
    from edge.tools.ai.projections import TriggerView

OK = 0


class Fire(msgspec.Struct, rename="camel"):
    """One line of `qledge cron next --json`."""

    at_ms: int
    local: str
    timezone: str


def _after_ms(text: str | None, schedule: Schedule) -> int:
    if text is None:
        return time.time_ns() // 1_000_000
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"--after {text!r} is not an ISO 8601 time (e.g. 2024-03-10T01:30:00-05:00)") from None
    if when.tzinfo is None:  # a local time in the schedule's zone
        when = when.replace(tzinfo=schedule.zone)
    try:
        ms = int(when.timestamp() * 1000)
        datetime.fromtimestamp(ms // 1000, schedule.zone)  # the zone's calendar must reach it too
        return ms
    except (OverflowError, ValueError):
        raise ScheduleError(f"--after {text!r} is outside the calendar this system can compute with") from None


def cron_next(a: argparse.Namespace) -> int:
    try:
        schedule = Schedule(a.expression, a.tz or default_zone(None))
        after = _after_ms(a.after, schedule)
    except ScheduleError as exc:
        raise UsageError(str(exc)) from None
    if schedule.event is not None:
        print(f"note: {schedule.expression} is not a time: it fires "
              + ("once per boot of the device" if schedule.event == REBOOT else "once, when the trigger is armed"),
              file=sys.stderr)
    elif days_ored(schedule.expression):
        print("note: day-of-month and day-of-week are both restricted, so a day matching either fires"
              " (as in busybox crond and qinglong)", file=sys.stderr)
    fires = list(islice(schedule.fires_after(after), a.count))
    if len(fires) < a.count:  # the calendar ends in 9999
        print(f"note: {'no' if not fires else 'no more'} fire times before the year 10000", file=sys.stderr)
    if a.json:
        render.json_out([
            Fire(at_ms=ms, local=local_time(ms, schedule.zone).isoformat(), timezone=schedule.zone_name)
            for ms in fires
        ])
    else:
        for ms in fires:
            print(format_local(ms, schedule.zone))
    return OK


count = bounded_int("--count", 1, 1000)


# -- triggers (through the daemon) ------------------------------------------------


def _fire(ms: int | None, zone_name: str, expression: str = "") -> str:
    if ms is None:
        return "at the next boot" if expression == REBOOT else "-"
    try:
        return format_local(ms, load_zone(zone_name))
    except ScheduleError:  # this machine lacks the zone data: the local time instead
        return render.when(ms)


def next_fire(t: Trigger) -> str:
    """When the trigger fires next, in its own zone (`-`: disabled or never again; an
    enabled @reboot not yet armed: at the next boot)."""
    return _fire(t.next_fire_at_ms, t.spec.timezone, t.spec.expression if t.enabled else "")


def _fields(t: Trigger) -> None:
    spec = t.spec
    render.fields([
        ("trigger", t.id), ("revision", t.revision),
        ("task", f"{t.task_id} (revision {t.task_revision})"), ("enabled", "yes" if t.enabled else "no"),
        ("cron", spec.expression), ("timezone", spec.timezone), ("misfire", spec.misfire),
        ("jitter", render.span(spec.jitter_s)), ("next fire", next_fire(t)),
        ("last run for", _fire(t.last_scheduled_at_ms, spec.timezone)), ("digest", t.content_digest),
        ("updated", render.when(t.updated_at_ms)),
    ])


def trigger_add(c: Client, a: argparse.Namespace) -> int:
    args = trigger_tools.CreateArgs(
        task_id=a.task, expression=a.cron, misfire=a.misfire, jitter_s=a.jitter, timezone=a.tz or None,
        trigger_id=a.id or None,
    )
    trigger = c.typed("qledge.trigger.create", args, Trigger)
    return show(a, trigger, lambda t: print(
        f"trigger {t.id} created for task {t.task_id} (revision {t.task_revision}); next fire {next_fire(t)}"))


def _trigger_page(c: Client, after: str | None) -> tuple[list[Trigger], str | None]:
    page = c.typed("qledge.trigger.list", trigger_tools.ListArgs(after=after), trigger_tools.TriggerPage)
    return page.triggers, page.next


def _head_page(c: Client, after: str | None) -> tuple[list[TriggerView], str | None]:
    from edge.tools.ai.projections import TriggerCursor, TriggerListArgs, TriggerPage

    args = TriggerListArgs(after=TriggerCursor(trigger_id=after) if after else None, limit=64)
    page = c.typed("qinglong.trigger.list", args, TriggerPage)
    return page.triggers, page.next.trigger_id if isinstance(page.next, TriggerCursor) else None


def _viewer_fields(t: TriggerView) -> None:
    render.fields([
        ("trigger", t.trigger_id), ("revision", t.revision), ("task", f"{t.task_id} (revision {t.task_revision})"),
        ("enabled", "yes" if t.enabled else "no"), ("updated", render.when(t.updated_at_ms)),
        ("schedule", "not shown: it needs trigger.inspect (qledge next shows the coming fires)"),
    ])


def trigger_list(c: Client, a: argparse.Namespace) -> int:
    if not c.may_call("qledge.trigger.list"):  # a viewer: the projection, without the schedule
        return show_list(
            a, all_pages(lambda after: _head_page(c, after)), "no triggers yet",
            lambda t: [t.trigger_id, f"{t.task_id}@{t.task_revision}", "yes" if t.enabled else "no",
                       render.when(t.updated_at_ms)],
            ["TRIGGER", "TASK@REV", "ENABLED", "UPDATED"],
        )
    return show_list(
        a, all_pages(lambda after: _trigger_page(c, after)), "no triggers yet: qledge trigger add TASK --cron EXPR",
        lambda t: [t.id, f"{t.task_id}@{t.task_revision}", "yes" if t.enabled else "no",
                   t.spec.expression, t.spec.timezone, next_fire(t)],
        ["TRIGGER", "TASK@REV", "ENABLED", "CRON", "TIMEZONE", "NEXT FIRE"],
    )


def _just_before(name: str) -> str:
    """The greatest string below `name` that no Name can fall between (Names never hold
    U+10FFFF): a keyset page after it starts at `name` itself."""
    return name[:-1] + chr(ord(name[-1]) - 1) + "\U0010ffff"


def trigger_get(c: Client, a: argparse.Namespace) -> int:
    if not c.may_call("qledge.trigger.get"):
        from edge.tools.ai.projections import TriggerCursor, TriggerListArgs, TriggerPage

        args = TriggerListArgs(after=TriggerCursor(trigger_id=_just_before(a.trigger)), limit=1)
        found = c.typed("qinglong.trigger.list", args, TriggerPage).triggers
        if not found or found[0].trigger_id != a.trigger:
            raise CallFailed("not_found", f"trigger {a.trigger!r} not found")
        return show(a, found[0], _viewer_fields)
    return show(a, c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger), _fields)


def trigger_toggle(c: Client, a: argparse.Namespace) -> int:
    trigger = c.typed(f"qledge.trigger.{a.action}", trigger_tools.TriggerRef(trigger_id=a.trigger), Trigger)
    return show(a, trigger, lambda t: print(f"trigger {t.id} {a.action}d (revision {t.revision})"))


def trigger_repin(c: Client, a: argparse.Namespace) -> int:
    args = trigger_tools.RepinArgs(trigger_id=a.trigger, task_revision=a.task_revision)
    trigger = c.typed("qledge.trigger.repin", args, Trigger)
    return show(a, trigger, lambda t: print(f"trigger {t.id} runs task {t.task_id} revision {t.task_revision}"))


def trigger_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.typed("qledge.trigger.delete", trigger_tools.TriggerRef(trigger_id=a.trigger), trigger_tools.Deleted)
    return show(a, done, lambda d: print(f"trigger {d.trigger_id} deleted"))


def trigger_events(c: Client, a: argparse.Namespace) -> int:
    args = trigger_tools.EventArgs(trigger_id=a.trigger or None, limit=a.limit)
    return show_list(
        a, c.typed("qledge.trigger.events", args, trigger_tools.EventPage).events, "no skipped or refused fires",
        lambda e: [render.when(e.created_at_ms), e.trigger_id, e.type, e.reason,
                   "many" if e.fires is None else str(e.fires), _span(e)],
        ["RECORDED", "TRIGGER", "OUTCOME", "REASON", "FIRES", "SCHEDULED FOR"],
    )


def _span(e: TriggerEvent) -> str:
    first, last = e.scheduled_for_ms, e.last_scheduled_for_ms
    text = render.when(first)
    if last is not None and last != first:
        text += f" .. {render.when(last)}"
    elif last is None and e.fires is None:
        text += " .."
    return text
