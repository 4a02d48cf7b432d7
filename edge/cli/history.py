"""Browsing what ran and what will run: `run list` (filters, pages), `run get`, `run log`
(and `--follow`, through the daemon), `run cancel`, `qledge next` and `qledge audit`.

Wherever a run is named, the daemon takes an id, a unique prefix of it (8 characters or
more), `TASK:latest` or `TASK:latest-failed` (edge.tools.builtin.runs).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, cast

from edge.cli import render
from edge.cli.client import CallFailed, Client, UsageError
from edge.cli.commands import OK, show
from edge.cli.edit import bounded_int
from edge.core.auth import AuditEntry
from edge.core.runs import LOG_CAP_MARKER, LOG_HEAD_MAX, ORIGINS, STATUSES, Origin, Run, RunCursor, RunStatus
from edge.tools.builtin import credentials as credential_tools
from edge.tools.builtin import runs as run_tools
from edge.tools.builtin import triggers as trigger_tools

if TYPE_CHECKING:
    import argparse
    from typing import BinaryIO

RUN_HELP = "a run id, its first 8 or more characters, TASK:latest or TASK:latest-failed"
RUN_EPILOG = ("RUN: a run id (qledge run list shows them), a unique prefix of it (8 characters or more; the\n"
              "first 13, up to the second '-', are nearly always unique), TASK:latest (the task's newest\n"
              "run) or TASK:latest-failed (its newest run that failed, timed out or was lost).")
PAGE = 64  # runs per call: the tools' page limit
FOLLOW_WAIT_MS = 20_000  # one log read waits this long for more output (the tool allows 30 s)
_DURATION = re.compile(r"^([0-9]+)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# -- argparse types -----------------------------------------------------------------------


def time_arg(flag: str) -> Callable[[str], int]:
    """A moment as ms: a duration back from now (`30m`, `12h`, `7d`, `2w`) or a local date
    or time (`2026-11-30`, `2026-11-30 08:00`, any ISO 8601, with or without an offset)."""

    def parse(text: str) -> int:
        match = _DURATION.match(text.strip().lower())
        if match:
            return int(time.time() * 1000) - int(match.group(1)) * _SECONDS[match.group(2)] * 1000
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UsageError(f"{flag} {text!r} is neither a duration (30m, 12h, 7d, 2w) nor a date or time"
                             " (2026-11-30, 2026-11-30 08:00)") from None
        return int((when if when.tzinfo else when.astimezone()).timestamp() * 1000)

    return parse


def list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", metavar="TASK", help="only this task's runs")
    p.add_argument("--status", action="append", default=[], metavar="STATUS",
                   help=f"only runs in this status (repeatable, or comma-separated): {', '.join(STATUSES)}")
    p.add_argument("--origin", action="append", default=[], metavar="ORIGIN",
                   help=f"only runs started this way (repeatable, or comma-separated): {', '.join(ORIGINS)}")
    p.add_argument("--since", type=time_arg("--since"), metavar="WHEN",
                   help="created then or later: a duration back from now (30m, 12h, 7d) or a date/time")
    p.add_argument("--until", type=time_arg("--until"), metavar="WHEN", help="created before then (as --since)")
    p.add_argument("--limit", type=bounded_int("--limit", 1, 1000), default=20, metavar="N",
                   help="show at most N runs (1..1000, default 20)")
    p.add_argument("--all", action="store_true", help="every matching run, however many (ignores --limit)")
    p.add_argument("--after", metavar="CURSOR",
                   help="continue after this point: the CURSOR a previous list printed, or a RUN")
    p.epilog = ("Filters combine (a run must match each one given); each is served by an index, and a page\n"
                "examines a bounded number of runs.\n" + RUN_EPILOG)


def _choices(flag: str, given: list[str], valid: tuple[str, ...]) -> list[str]:
    found = [v.strip() for item in given for v in item.split(",") if v.strip()]
    wrong = [v for v in found if v not in valid]
    if wrong:
        raise UsageError(f"{flag} {wrong[0]!r} is not one of {', '.join(valid)}")
    return sorted(set(found), key=valid.index)


# -- run list ---------------------------------------------------------------------------


def cursor_text(c: RunCursor) -> str:
    return f"{c.created_at_ms}.{c.run_id}"


def _after(c: Client, text: str | None) -> RunCursor | None:
    if text is None:
        return None
    ms, dot, rid = text.partition(".")
    if dot and ms.isdigit() and rid:
        return RunCursor(int(ms), rid)
    run = c.typed("qledge.run.get", run_tools.RunId(run_id=text), Run)  # a run: list what comes after it
    return RunCursor(run.created_at_ms, run.id)


def run_list(c: Client, a: argparse.Namespace) -> int:
    statuses = _choices("--status", a.status, STATUSES)
    origins = _choices("--origin", a.origin, ORIGINS)
    after = _after(c, a.after)
    wanted = None if a.all else a.limit
    runs: list[Run] = []
    while wanted is None or len(runs) < wanted:
        limit = PAGE if wanted is None else min(PAGE, wanted - len(runs))
        args = run_tools.ListArgs(task_id=a.task, statuses=cast("list[RunStatus]", statuses),
                                  origins=cast("list[Origin]", origins), since_ms=a.since, until_ms=a.until,
                                  after=after, limit=limit)
        page = c.typed("qledge.run.list", args, run_tools.RunPage)
        runs += page.runs
        after = page.next
        if after is None:
            break
    more = f"more: qledge run list{_repeat(a)} --after {cursor_text(after)}" if after is not None else None
    if a.json:  # a list of runs, nothing else: --all, or qledge.run.list itself, pages for programs
        render.json_out(runs)
        return OK
    if not runs:
        print("no runs match" if statuses or origins or a.since or a.until else "no runs")
    else:
        render.table(
            [[r.id, r.task_id, r.status, r.origin, render.when(r.created_at_ms),
              render.duration(r.started_at_ms, r.finished_at_ms), render.exit_status(r.exit_code)] for r in runs],
            ["RUN", "TASK", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
        )
    if more:
        print(more)
    return OK


def _repeat(a: argparse.Namespace) -> str:
    """The filters of this list, to continue it with --after."""
    words = []
    if a.task:
        words.append(f"--task {a.task}")
    words += [f"--status {s}" for s in a.status] + [f"--origin {o}" for o in a.origin]
    words += [f"--since {a.since}"] if a.since else []
    words += [f"--until {a.until}"] if a.until else []
    return "".join(" " + w for w in words)


# -- run get, log, cancel ---------------------------------------------------------------


def _run_fields(r: Run) -> None:
    render.fields([
        ("run", r.id), ("task", f"{r.task_id} (revision {r.task_revision})"), ("status", r.status),
        ("origin", r.origin), ("trigger", f"{r.trigger_id} (revision {r.trigger_revision})" if r.trigger_id else None),
        ("retry of", f"{r.retry_of} (attempt {r.attempt})" if r.retry_of else None),
        ("retry due", render.when(r.retry_due_at_ms) if r.retry_due_at_ms else None),
        ("scheduled for", render.when(r.scheduled_for_ms) if r.scheduled_for_ms is not None else None),
        ("jitter", render.span(r.jitter_ms / 1000) if r.jitter_ms else None),
        ("created", render.when(r.created_at_ms)), ("started", render.when(r.started_at_ms)),
        ("finished", render.when(r.finished_at_ms)),
        ("took", render.duration(r.started_at_ms, r.finished_at_ms)),
        ("exit", None if r.exit_code is None else render.exit_status(r.exit_code) if r.exit_code < 0
         else r.exit_code),
        ("error", r.error_code), ("summary", r.error_summary),
        ("log", render.size(r.log_bytes) + (" (truncated at its cap)" if r.log_truncated else "")
         + (f", dropped {render.when(r.log_dropped_at_ms)} (log quota)" if r.log_dropped_at_ms else "")),
    ])


def run_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.run.get", run_tools.RunId(run_id=a.run), Run), _run_fields)


def run_cancel(c: Client, a: argparse.Namespace) -> int:
    cancelled = c.typed("qledge.run.cancel", run_tools.RunId(run_id=a.run), Run)
    return show(a, cancelled, lambda r: print(render.run_line(r)))


def _read(c: Client, run: str, offset: int, wait_ms: int = 0) -> run_tools.LogChunk:
    return c.typed("qledge.run.log.read", run_tools.LogArgs(run_id=run, offset=offset, wait_ms=wait_ms),
                   run_tools.LogChunk)


def run_log(c: Client, a: argparse.Namespace) -> int:
    if a.follow:
        follow(c, a.run)
        return OK
    offset = 0
    out = sys.stdout.buffer
    while True:
        chunk = _read(c, a.run, offset)
        out.write(chunk.data)
        offset += len(chunk.data)
        if chunk.eof:
            break
    out.flush()
    return OK


def follow(c: Client, reference: str, out: BinaryIO | None = None) -> None:
    """Print a run's log as it grows, until the run has ended and all of it is printed.

    Every read goes through the daemon (qledge.run.log.read with waitMs), which answers as
    soon as there is more output or the run ends. A log that went over its cap is, once the
    run ends, its head, the cap marker and the tail: what streamed beyond the head is then
    followed by the marker and the tail.
    """
    sink = out or sys.stdout.buffer
    offset = 0
    run = reference
    rewound = False
    while True:
        chunk = _read(c, run, offset, FOLLOW_WAIT_MS)
        run = chunk.run_id or run  # a prefix or TASK:latest is pinned to the run it named first
        if chunk.final and chunk.truncated and not rewound:
            rewound = True
            offset = _skip_to_marker(c, run, offset)
            chunk = _read(c, run, offset)
        sink.write(chunk.data)
        sink.flush()
        offset += len(chunk.data)
        if chunk.final and chunk.eof:
            return
        if not chunk.data:
            time.sleep(0.5)  # the daemon waited and nothing came (or it cannot wait here): not a busy loop


def _skip_to_marker(c: Client, run: str, offset: int) -> int:
    """Where to go on in a capped log that was rewritten as head + marker + tail: at the
    marker, when the part already printed reaches past it (else where it was)."""
    window = b""
    while len(window) < LOG_HEAD_MAX + 128:
        part = _read(c, run, len(window))
        window += part.data
        if part.eof:
            break
    found = LOG_CAP_MARKER.search(window)
    return found.start() if found and found.start() < offset else offset


# -- qledge next ------------------------------------------------------------------------


def _in(ms: int, now: int) -> str:
    seconds = round((ms - now) / 1000)
    return "due now" if seconds <= 0 else "in " + render.span(seconds, units=2)


def upcoming(c: Client, a: argparse.Namespace) -> int:
    found = c.typed("qledge.trigger.upcoming", trigger_tools.UpcomingArgs(count=a.count), trigger_tools.Upcoming)
    if a.json:
        render.json_out(found.fires)
        return OK
    if not found.fires:
        print("nothing is scheduled: no enabled trigger fires (qledge trigger list)")
        return OK
    now = int(time.time() * 1000)
    render.table(
        [[render.when(f.at_ms), _in(f.at_ms, now), f.trigger_id, f.task_id, f.timezone,
          render.span(f.jitter_s) if f.jitter_s else "-"] for f in found.fires],
        ["WHEN", "", "TRIGGER", "TASK", "TIMEZONE", "JITTER"],
    )
    return OK


# -- qledge audit -----------------------------------------------------------------------


def audit(c: Client, a: argparse.Namespace) -> int:
    entries: list[AuditEntry] = []
    before: int | None = None
    while len(entries) < a.limit:
        args = credential_tools.AuditArgs(since_ms=a.since, before=before, limit=min(64, a.limit - len(entries)))
        try:
            page = c.typed("qledge.audit.list", args, credential_tools.AuditList)
        except CallFailed as exc:
            if exc.code == "permission_denied":
                raise CallFailed(exc.code, exc.message + " (the audit is for owners)") from None
            raise
        entries += page.entries
        before = page.next
        if before is None:
            break
    if a.json:
        render.json_out(entries)
        return OK
    if not entries:
        print("no audit rows" + (" since then" if a.since else ""))
        return OK
    render.table(
        [[render.when(e.at_ms), e.principal, e.tool, e.outcome,
          ", ".join(r for r in e.reasons if not r.startswith("tool_")) or "-", e.transport, _calls(e)]
         for e in entries],
        ["TIME", "WHO", "TOOL", "OUTCOME", "WHY", "VIA", "CALLS"],
    )
    return OK


def _calls(e: AuditEntry) -> str:
    """1, or for an aggregate of refused calls how many and until when (TIME is the first)."""
    if e.count <= 1 or e.last_at_ms is None:
        return str(e.count)
    return f"{e.count} until {render.when(e.last_at_ms)}"
