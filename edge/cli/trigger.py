"""`qledge trigger …` (cron triggers through the daemon: add, update, list, get, enable,
disable, rm, repin, events), `qledge next` (the coming fires of every enabled trigger) and
`qledge cron next` (offline: no daemon, no event loop, no database)."""

from __future__ import annotations

import sys
import time

from edge.cli import shared
from edge.cli.shared import EXIT_OK, UsageError, Verb, show, show_list, yes

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from edge.core.schedule import Schedule
    from edge.core.triggers import Trigger, TriggerEvent
    from edge.tools.ai.projections import TriggerView
    from edge.transports.client import Client

TRIGGER_LIMITS = """\
limits:
  --cron    5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, or
            @hourly/@daily/@weekly/@monthly/@yearly, @reboot (once per boot), @once (one shot);
            at most 256 characters; day-of-month and day-of-week both restricted: either matches
  --tz      an IANA zone name (Europe/Berlin), at most 64 characters
  --jitter  0 to 3600 seconds (S: seconds, or 90s, 5m, 1h)"""


# -- qledge cron next (offline) ---------------------------------------------------------


def _after_ms(text: str | None, schedule: Schedule) -> int:
    from datetime import datetime

    from edge.core.schedule import ScheduleError

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
    from itertools import islice

    import msgspec

    from edge.app.config import default_zone
    from edge.core.schedule import REBOOT, Schedule, ScheduleError, days_ored, format_local, local_time

    class Fire(msgspec.Struct, rename="camel"):
        """One line of `qledge cron next --json`."""

        at_ms: int
        local: str
        timezone: str

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
        shared.json_out([
            Fire(at_ms=ms, local=local_time(ms, schedule.zone).isoformat(), timezone=schedule.zone_name)
            for ms in fires
        ])
    else:
        for ms in fires:
            print(format_local(ms, schedule.zone))
    return EXIT_OK


def _cron_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("expression", metavar="EXPR", help="5 fields, or 6 with seconds first; or @daily etc.")
    p.add_argument("--tz", type=shared.zone_arg, metavar="TZ", help="IANA time zone (default: the device's, else UTC)")
    p.add_argument("--after", metavar="ISO8601", help="list fires after this time (default: now)")
    p.add_argument("--count", type=shared.bounded_int("--count", 1, 1000), default=5, metavar="N",
                   help="how many (1..1000, default 5)")


# -- qledge next ------------------------------------------------------------------------


def _in(ms: int, now: int) -> str:
    return "due now" if ms - now < 500 else "in " + shared.duration(now, ms)


def upcoming(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import triggers as trigger_tools

    found = c.typed("qledge.trigger.upcoming", trigger_tools.UpcomingArgs(count=a.count), trigger_tools.Upcoming)
    if a.json:
        shared.json_out(found.fires)
        return EXIT_OK
    if not found.fires:
        print("nothing is scheduled: no enabled trigger fires (qledge trigger list)")
        return EXIT_OK
    now = int(time.time() * 1000)
    names = shared.other_names(c, (f.task_id for f in found.fires))
    shared.table(
        [[shared.when(f.at_ms), _in(f.at_ms, now), f.trigger_id, f.task_id, *shared.named(names, f.task_id),
          f.timezone, shared.span(f.jitter_s) if f.jitter_s else "-"] for f in found.fires],
        ["WHEN", "", "TRIGGER", "TASK", *(["NAME"] if names else []), "TIMEZONE", "JITTER"],
    )
    return EXIT_OK


def _next_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count", type=shared.bounded_int("--count", 1, 100), default=10, metavar="N",
                   help="how many (1..100, default 10)")


# -- triggers (through the daemon) ------------------------------------------------


def _fire(ms: int | None, zone_name: str, expression: str = "") -> str:
    from edge.core.schedule import REBOOT, ScheduleError, format_local, load_zone

    if ms is None:
        return "at the next boot" if expression == REBOOT else "-"
    try:
        return format_local(ms, load_zone(zone_name))
    except ScheduleError:  # this machine lacks the zone data: the local time instead
        return shared.when(ms)


def next_fire(t: Trigger) -> str:
    """When the trigger fires next, in its own zone (`-`: disabled or never again; an
    enabled @reboot not yet armed: at the next boot)."""
    return _fire(t.next_fire_at_ms, t.spec.timezone, t.spec.expression if t.enabled else "")


# What a trigger of a disabled task shows in place of its next fire: the scheduler keeps it
# armed, and records each fire as skipped (`qledge trigger events`) until the task is enabled.
TASK_DISABLED = "task is disabled: fires will be skipped"


def _disabled_tasks(c: Client, task_id: str | None = None) -> set[str]:
    """The disabled tasks among the triggers' (all of them, or `task_id`'s); empty for a
    caller who may not inspect tasks."""
    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools
    from edge.transports.client import all_pages

    if not c.may_call("qledge.task.list" if task_id is None else "qledge.task.get"):
        return set()
    if task_id is not None:
        task = c.typed("qledge.task.get", task_tools.TaskId(task_id=task_id), Task)
        return set() if task.enabled else {task.id}

    def page(after: str | None) -> tuple[list[Task], str | None]:
        found = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
        return found.tasks, found.next

    return {t.id for t in all_pages(page) if not t.enabled}


def _next_or_why(t: Trigger, disabled: set[str]) -> str:
    return TASK_DISABLED if t.enabled and t.task_id in disabled else next_fire(t)


def _fields(t: Trigger, disabled: set[str]) -> None:
    spec = t.spec
    shared.fields([
        ("trigger", t.id), ("revision", t.revision),
        ("task", f"{t.task_id} (revision {t.task_revision})"), ("enabled", yes(t.enabled)),
        ("cron", spec.expression), ("timezone", spec.timezone), ("misfire", spec.misfire),
        ("jitter", shared.span(spec.jitter_s)), ("next fire", _next_or_why(t, disabled)),
        ("last run for", _fire(t.last_scheduled_at_ms, spec.timezone)), ("digest", t.content_digest),
        ("updated", shared.when(t.updated_at_ms)),
    ])


def trigger_add(c: Client, a: argparse.Namespace) -> int:
    from edge.core.triggers import Trigger
    from edge.tools.builtin import triggers as trigger_tools

    args = trigger_tools.CreateArgs(
        task_id=shared.task_id(c, a.task), expression=a.cron, misfire=a.misfire, jitter_s=a.jitter,
        timezone=a.tz or None, trigger_id=a.id or None,
    )
    trigger = c.typed("qledge.trigger.create", args, Trigger)
    disabled = set() if a.json else _disabled_tasks(c, trigger.task_id)
    return show(a, trigger, lambda t: print(
        f"trigger {t.id} created for task {t.task_id} (revision {t.task_revision}); "
        + (TASK_DISABLED if t.task_id in disabled else f"next fire {next_fire(t)}")))


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", metavar="TASK")
    p.add_argument("--cron", required=True, metavar="EXPR",
                   help="5 fields, or 6 with seconds first; @daily etc., @reboot (once per boot), @once (one shot)")
    p.add_argument("--tz", type=shared.zone_arg, metavar="TZ",
                   help="IANA time zone (default: config `timezone`, the device's, UTC)")
    p.add_argument("--misfire", choices=("skip", "fire_once"), default="skip",
                   help="fires missed by more than 30s: skip them, or run the oldest once (default skip)")
    p.add_argument("--jitter", type=shared.jitter, default=0, metavar="S",
                   help="delay each run by a random 0..S seconds (S: 0..3600, default 0)")
    p.add_argument("--id", metavar="ID", help="trigger id (default TASK-N)")
    p.epilog = TRIGGER_LIMITS


def _trigger_page(c: Client, after: str | None) -> tuple[list[Trigger], str | None]:
    from edge.tools.builtin import triggers as trigger_tools

    page = c.typed("qledge.trigger.list", trigger_tools.ListArgs(after=after), trigger_tools.TriggerPage)
    return page.triggers, page.next


def _head_page(c: Client, after: str | None) -> tuple[list[TriggerView], str | None]:
    from edge.tools.ai.projections import TriggerCursor, TriggerListArgs, TriggerPage

    args = TriggerListArgs(after=TriggerCursor(trigger_id=after) if after else None, limit=64)
    page = c.typed("qinglong.trigger.list", args, TriggerPage)
    return page.triggers, page.next.trigger_id if isinstance(page.next, TriggerCursor) else None


def _viewer_fields(t: TriggerView) -> None:
    shared.fields([
        ("trigger", t.trigger_id), ("revision", t.revision), ("task", f"{t.task_id} (revision {t.task_revision})"),
        ("enabled", yes(t.enabled)), ("updated", shared.when(t.updated_at_ms)),
        ("schedule", "not shown: it needs trigger.inspect (qledge next shows the coming fires)"),
    ])


def trigger_list(c: Client, a: argparse.Namespace) -> int:
    from edge.transports.client import all_pages

    if not c.may_call("qledge.trigger.list"):  # a viewer: the projection, without the schedule
        heads = all_pages(lambda after: _head_page(c, after))
        names = {} if a.json else shared.other_names(c, (t.task_id for t in heads))
        return show_list(
            a, heads, "no triggers yet",
            lambda t: [t.trigger_id, f"{t.task_id}@{t.task_revision}", *shared.named(names, t.task_id), yes(t.enabled),
                       shared.when(t.updated_at_ms)],
            ["TRIGGER", "TASK@REV", *(["NAME"] if names else []), "ENABLED", "UPDATED"],
        )
    triggers = all_pages(lambda after: _trigger_page(c, after))
    disabled = _disabled_tasks(c) if triggers and not a.json else set()
    names = {} if a.json else shared.other_names(c, (t.task_id for t in triggers))
    return show_list(
        a, triggers, "no triggers yet: qledge trigger add TASK --cron EXPR",
        lambda t: [t.id, f"{t.task_id}@{t.task_revision}", *shared.named(names, t.task_id), yes(t.enabled),
                   t.spec.expression, t.spec.timezone, _next_or_why(t, disabled)],
        ["TRIGGER", "TASK@REV", *(["NAME"] if names else []), "ENABLED", "CRON", "TIMEZONE", "NEXT FIRE"],
    )


def _just_before(text: str) -> str:
    """The greatest string below `text` that no Name can fall between (Names never hold
    U+10FFFF): a keyset page after it starts at `text` itself."""
    return text[:-1] + chr(ord(text[-1]) - 1) + "\U0010ffff"


def trigger_get(c: Client, a: argparse.Namespace) -> int:
    from edge.core.triggers import Trigger
    from edge.tools.builtin import triggers as trigger_tools
    from edge.transports.client import CallFailed

    if not c.may_call("qledge.trigger.get"):
        from edge.tools.ai.projections import TriggerCursor, TriggerListArgs, TriggerPage

        args = TriggerListArgs(after=TriggerCursor(trigger_id=_just_before(a.trigger)), limit=1)
        found = c.typed("qinglong.trigger.list", args, TriggerPage).triggers
        if not found or found[0].trigger_id != a.trigger:
            raise CallFailed("not_found", f"trigger {a.trigger!r} not found")
        return show(a, found[0], _viewer_fields)
    trigger = c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger)
    disabled = set() if a.json else _disabled_tasks(c, trigger.task_id)
    return show(a, trigger, lambda t: _fields(t, disabled))


def trigger_toggle(c: Client, a: argparse.Namespace) -> int:
    from edge.core.triggers import Trigger
    from edge.tools.builtin import triggers as trigger_tools

    trigger = c.typed(f"qledge.trigger.{a.action}", trigger_tools.TriggerRef(trigger_id=a.trigger), Trigger)
    return show(a, trigger, lambda t: print(f"trigger {t.id} {a.action}d (revision {t.revision})"))


def trigger_repin(c: Client, a: argparse.Namespace) -> int:
    from edge.core.triggers import Trigger
    from edge.tools.builtin import triggers as trigger_tools

    args = trigger_tools.RepinArgs(trigger_id=a.trigger, task_revision=a.task_revision)
    trigger = c.typed("qledge.trigger.repin", args, Trigger)
    return show(a, trigger, lambda t: print(f"trigger {t.id} runs task {t.task_id} revision {t.task_revision}"))


def trigger_rm(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import triggers as trigger_tools

    done = c.typed("qledge.trigger.delete", trigger_tools.TriggerRef(trigger_id=a.trigger), trigger_tools.Deleted)
    return show(a, done, lambda d: print(f"trigger {d.trigger_id} deleted"))


def trigger_events(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import triggers as trigger_tools

    args = trigger_tools.EventArgs(trigger_id=a.trigger or None, limit=a.limit)
    return show_list(
        a, c.typed("qledge.trigger.events", args, trigger_tools.EventPage).events, "no skipped or refused fires",
        lambda e: [shared.when(e.created_at_ms), e.trigger_id, e.type, e.reason,
                   "many" if e.fires is None else str(e.fires), _span(e)],
        ["RECORDED", "TRIGGER", "OUTCOME", "REASON", "FIRES", "SCHEDULED FOR"],
    )


def _span(e: TriggerEvent) -> str:
    first, last = e.scheduled_for_ms, e.last_scheduled_for_ms
    text = shared.when(first)
    if last is not None and last != first:
        text += f" .. {shared.when(last)}"
    elif last is None and e.fires is None:
        text += " .."
    return text


# -- trigger update ---------------------------------------------------------------------


def trigger_update(c: Client, a: argparse.Namespace) -> int:
    from edge.core.triggers import Trigger
    from edge.tools.builtin import triggers as trigger_tools

    if a.cron is None and a.tz is None and a.misfire is None and a.jitter is None:
        raise UsageError("nothing to change: give --cron, --tz, --misfire or --jitter")
    before: list[Trigger] = []

    def attempt() -> Trigger:
        head = c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger)
        before[:] = [head]
        args = trigger_tools.UpdateArgs(trigger_id=head.id, expected_revision=head.revision, expression=a.cron,
                                        timezone=a.tz, misfire=a.misfire, jitter_s=a.jitter)
        return c.typed("qledge.trigger.update", args, Trigger)

    def winner() -> str:
        now = c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger)
        return (f"trigger {a.trigger!r} was changed by another writer while this update was made, twice: it is"
                f" now at revision {now.revision} (updated {shared.when(now.updated_at_ms)}); this update changed"
                f" nothing: see `qledge trigger get {a.trigger}` and run it again")

    trigger = shared.compare_and_set(attempt, winner)
    unchanged = bool(before) and before[0].revision == trigger.revision

    def human(t: Trigger) -> None:
        what = "unchanged" if unchanged else "updated"
        print(f"trigger {t.id} {what} (revision {t.revision}): {t.spec.expression} in {t.spec.timezone};"
              f" next fire {next_fire(t)}")

    return show(a, trigger, human)


def trigger_options(p: argparse.ArgumentParser) -> None:
    """The flags of `trigger update`: each one given replaces that part of the schedule."""
    p.add_argument("trigger", metavar="TRIGGER")
    p.epilog = TRIGGER_LIMITS
    p.add_argument("--cron", metavar="EXPR", help="a new cron expression")
    p.add_argument("--tz", type=shared.zone_arg, metavar="TZ", help="a new IANA time zone")
    p.add_argument("--misfire", choices=("skip", "fire_once"), help="a new misfire policy")
    p.add_argument("--jitter", type=shared.jitter, metavar="S", help="a new jitter (0..3600 seconds)")


def _named(p: argparse.ArgumentParser) -> None:
    p.add_argument("trigger", metavar="TRIGGER")


def _repin_options(p: argparse.ArgumentParser) -> None:
    _named(p)
    p.add_argument("--task-revision", type=int, metavar="N", help="pin to this task revision instead")


def _events_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("trigger", metavar="TRIGGER", nargs="?")
    p.add_argument("--limit", type=shared.bounded_int("--limit", 1, 64), default=32, metavar="N",
                   help="1..64 (default 32)")


VERBS = {
    "next": Verb("next", upcoming, options=_next_options),
    "cron": (Verb("next", cron_next, "print the next fire times of a cron expression (no daemon needed)",
                  _cron_options, offline=True),),
    "trigger": (
        Verb("add", trigger_add, "add a cron trigger: qledge trigger add TASK --cron EXPR", _add_options),
        Verb("update", trigger_update, "change a trigger's schedule; its task, enabled flag and events stay",
             trigger_options),
        Verb("list", trigger_list, "list triggers"),
        Verb("get", trigger_get, "get a trigger", _named),
        Verb("enable", trigger_toggle, "enable a trigger", _named),
        Verb("disable", trigger_toggle, "disable a trigger", _named),
        Verb("rm", trigger_rm, "rm a trigger", _named),
        Verb("repin", trigger_repin, "pin a trigger to the task's current (or a given) revision", _repin_options),
        Verb("events", trigger_events, "fires that were skipped or refused, newest first", _events_options),
    ),
}
