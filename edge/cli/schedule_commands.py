"""`qledge cron next` (offline: no daemon, no event loop, no database) and `qledge trigger …`."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from edge.cli import render
from edge.cli.commands import all_pages, show, show_list
from edge.app.config import default_zone
from edge.core.schedule import Schedule, ScheduleError, format_local, load_zone, local_time

if TYPE_CHECKING:
    import argparse

    from edge.cli.client import Client

OK, USAGE = 0, 2


def _after_ms(text: str | None, schedule: Schedule) -> int:
    if text is None:
        return time.time_ns() // 1_000_000
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"--after {text!r} is not an ISO 8601 time (e.g. 2024-03-10T01:30:00-05:00)") from None
    if when.tzinfo is None:  # a local time in the schedule's zone
        when = when.replace(tzinfo=schedule.zone)
    return int(when.timestamp() * 1000)


def cron_next(a: argparse.Namespace) -> int:
    try:
        schedule = Schedule(a.expression, a.tz or default_zone(None))
        after = _after_ms(a.after, schedule)
    except ScheduleError as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return USAGE
    fires = list(islice(schedule.fires_after(after), a.count))
    if a.json:
        render.json_out([
            {"atMs": ms, "local": local_time(ms, schedule.zone).isoformat(), "timezone": schedule.zone_name}
            for ms in fires
        ])
    else:
        for ms in fires:
            print(format_local(ms, schedule.zone))
    return OK


def count(text: str) -> int:
    """argparse type for --count: 1..1000."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be 1..1000")
    return value


# -- triggers (through the daemon) ------------------------------------------------


def _fire(ms: int | None, zone_name: str) -> str:
    if ms is None:
        return "-"
    try:
        return format_local(ms, load_zone(zone_name))
    except ScheduleError:  # this machine lacks the zone data: show UTC
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))


def _fields(t: dict) -> None:
    spec = t["spec"]
    render.fields([
        ("trigger", t["id"]), ("revision", t["revision"]),
        ("task", f"{t['taskId']} (revision {t['taskRevision']})"), ("enabled", "yes" if t["enabled"] else "no"),
        ("cron", spec["expression"]), ("timezone", spec["timezone"]), ("misfire", spec.get("misfire", "skip")),
        ("jitter", f"{spec.get('jitterS', 0)}s"), ("next fire", _fire(t.get("nextFireAtMs"), spec["timezone"])),
        ("last run for", _fire(t.get("lastScheduledAtMs"), spec["timezone"])), ("digest", t["contentDigest"]),
        ("updated", render.when(t["updatedAtMs"])),
    ])


def trigger_add(c: Client, a: argparse.Namespace) -> int:
    args: dict[str, Any] = {"taskId": a.task, "expression": a.cron, "misfire": a.misfire, "jitterS": a.jitter}
    if a.tz:
        args["timezone"] = a.tz
    if a.id:
        args["triggerId"] = a.id
    t = c.call("qledge.trigger.create", args)
    return show(a, t, lambda t: print(
        f"trigger {t['id']} created for task {t['taskId']} (revision {t['taskRevision']});"
        f" next fire {_fire(t.get('nextFireAtMs'), t['spec']['timezone'])}"))


def trigger_list(c: Client, a: argparse.Namespace) -> int:
    return show_list(
        a, all_pages(c, "qledge.trigger.list", "triggers"), "no triggers yet: qledge trigger add TASK --cron EXPR",
        lambda t: [t["id"], f"{t['taskId']}@{t['taskRevision']}", "yes" if t["enabled"] else "no",
                   t["spec"]["expression"], t["spec"]["timezone"], _fire(t.get("nextFireAtMs"), t["spec"]["timezone"])],
        ["TRIGGER", "TASK@REV", "ENABLED", "CRON", "TIMEZONE", "NEXT FIRE"],
    )


def trigger_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.call("qledge.trigger.get", {"triggerId": a.trigger}), _fields)


def trigger_toggle(c: Client, a: argparse.Namespace) -> int:
    t = c.call(f"qledge.trigger.{a.action}", {"triggerId": a.trigger})
    return show(a, t, lambda t: print(f"trigger {t['id']} {a.action}d (revision {t['revision']})"))


def trigger_repin(c: Client, a: argparse.Namespace) -> int:
    args: dict[str, Any] = {"triggerId": a.trigger}
    if a.task_revision is not None:
        args["taskRevision"] = a.task_revision
    t = c.call("qledge.trigger.repin", args)
    return show(a, t, lambda t: print(f"trigger {t['id']} runs task {t['taskId']} revision {t['taskRevision']}"))


def trigger_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.call("qledge.trigger.delete", {"triggerId": a.trigger})
    return show(a, done, lambda d: print(f"trigger {d['triggerId']} deleted"))


def trigger_events(c: Client, a: argparse.Namespace) -> int:
    args: dict[str, Any] = {"limit": a.limit}
    if a.trigger:
        args["triggerId"] = a.trigger
    return show_list(
        a, c.call("qledge.trigger.events", args)["events"], "no skipped or refused fires",
        lambda e: [render.when(e["createdAtMs"]), e["triggerId"], e["type"], e["reason"],
                   "many" if e.get("fires") is None else str(e["fires"]), _span(e)],
        ["RECORDED", "TRIGGER", "OUTCOME", "REASON", "FIRES", "SCHEDULED FOR"],
    )


def _span(e: dict) -> str:
    first, last = e.get("scheduledForMs"), e.get("lastScheduledForMs")
    text = render.when(first)
    if last is not None and last != first:
        text += f" .. {render.when(last)}"
    elif last is None and e.get("fires") is None:
        text += " .."
    return text
