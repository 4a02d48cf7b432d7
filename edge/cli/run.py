"""`qledge run …`: start a run (and wait for it, or follow its output), list runs (filters,
pages), get one, print its log (and `--follow`, through the daemon), cancel one.

Wherever a run is named, the daemon takes an id, a unique prefix of it (8 characters or
more), `TASK:latest` or `TASK:latest-failed` (edge.tools.builtin.runs).
"""

from __future__ import annotations

import sys
import time

from edge.cli import shared
from edge.cli.shared import EXIT_OK, EXIT_TOOL, UsageError, Verb, show

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import BinaryIO

    from edge.core.runs import Run, RunCursor
    from edge.tools.builtin.runs import LogChunk
    from edge.transports.client import Client

RUN_HELP = "a run id, its first 8 or more characters, TASK:latest or TASK:latest-failed"
RUN_EPILOG = ("RUN: a run id (qledge run list shows them), a unique prefix of it (8 characters or more; the\n"
              "first 13, up to the second '-', are nearly always unique), TASK:latest (the task's newest\n"
              "run) or TASK:latest-failed (its newest run that failed, timed out or was lost).")
PAGE = 64  # runs per call: the tools' page limit
LIMIT = 20  # runs a list shows unless told
FOLLOW_WAIT_MS = 20_000  # one log read waits this long for more output (the tool allows 30 s)


# -- run start ----------------------------------------------------------------------------


def waited(c: Client, run_id: str) -> Run:
    """The run once it has ended (asking the daemon to wait, 30 s at a time)."""
    from edge.tools.builtin import runs as run_tools

    while True:
        done = c.typed("qledge.run.wait", run_tools.WaitArgs(run_id=run_id, timeout_ms=30_000), run_tools.WaitResult)
        if done.done:
            return done.run


def run_start(c: Client, a: argparse.Namespace) -> int:
    from edge.core.runs import Run
    from edge.tools.builtin import runs as run_tools

    run = c.typed("qledge.run.start", run_tools.StartArgs(task_id=shared.task_id(c, a.task)), Run)
    if not a.wait and not a.follow:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}"))
    # Following: the output goes to stdout, the run's own lines to stderr.
    status_out = sys.stderr if a.follow else sys.stdout
    if not a.json:
        print(f"run {run.id} {run.status}", file=status_out, flush=True)
    if a.follow:
        follow(c, run.id)
    final = waited(c, run.id)
    if a.json:
        shared.json_out(final)
    else:
        print(shared.run_line(final), file=status_out)
        if final.retry_due_at_ms is not None:
            print(_retry_line(c, final), file=status_out)
    return EXIT_OK if final.status == "succeeded" else EXIT_TOOL


def _retry_line(c: Client, run: Run) -> str:
    """What comes of a failed run that will be retried: `retry 1 of 2 due in 2s`."""
    import math

    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools

    due = run.retry_due_at_ms or 0
    secs = max(0, math.ceil((due - time.time() * 1000) / 1000))
    task = c.typed("qledge.task.get", task_tools.TaskId(task_id=run.task_id), Task) if c.may_call(
        "qledge.task.get") else None
    policy = task.spec.retry if task is not None else None
    of = f" of {policy.count}" if policy is not None else ""
    return (f"retry {run.attempt}{of} due in {shared.span(secs, units=2)}"
            f" ({shared.when(due)}; qledge run list --task {run.task_id})")


def _start_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", metavar="TASK")
    p.add_argument("--wait", action="store_true", help="wait until it finishes; exit 1 unless it succeeded")
    p.add_argument("--follow", action="store_true",
                   help="print the run's output as it comes, until it ends (implies --wait)")


# -- run list ---------------------------------------------------------------------------


def list_options(p: argparse.ArgumentParser) -> None:
    from edge.core.runs import STARTED, STATUSES

    p.add_argument("--task", metavar="TASK", help="only this task's runs")
    p.add_argument("--status", action="append", default=[], metavar="STATUS",
                   help=f"only runs in this status (repeatable, or comma-separated): {', '.join(STATUSES)}")
    p.add_argument("--origin", action="append", default=[], metavar="ORIGIN",
                   help=f"only runs started this way (repeatable, or comma-separated): {', '.join(STARTED)}")
    p.add_argument("--since", type=shared.time_arg("--since"), metavar="WHEN",
                   help="created then or later: a duration back from now (30m, 12h, 7d) or a date/time")
    p.add_argument("--until", type=shared.time_arg("--until"), metavar="WHEN", help="created before then (as --since)")
    p.add_argument("--limit", type=shared.bounded_int("--limit", 1, 1000), default=LIMIT, metavar="N",
                   help=f"show at most N runs (1..1000, default {LIMIT})")
    p.add_argument("--all", action="store_true", help="every matching run, however many (ignores --limit)")
    p.add_argument("--after", metavar="CURSOR",
                   help="continue after this point: the CURSOR a previous list printed, or a RUN")
    p.epilog = ("Filters combine (a run must match each one given); each is served by an index, and a page\n"
                "examines a bounded number of runs.\nORIGIN, how a run was started:\n"
                + "".join(f"  {o:<10} {why}\n" for o, why in STARTED.items()) + RUN_EPILOG)


def _choices(flag: str, given: list[str], valid: tuple[str, ...]) -> list[str]:
    found = [v.strip() for item in given for v in item.split(",") if v.strip()]
    wrong = [v for v in found if v not in valid]
    if wrong:
        raise UsageError(f"{flag} {wrong[0]!r} is not one of {', '.join(valid)}")
    return sorted(set(found), key=valid.index)


def cursor_text(c: RunCursor) -> str:
    return f"{c.created_at_ms}.{c.run_id}"


def _after(c: Client, text: str | None) -> RunCursor | None:
    from edge.core.runs import Run, RunCursor
    from edge.tools.builtin import runs as run_tools

    if text is None:
        return None
    ms, dot, rid = text.partition(".")
    if dot and ms.isdigit() and rid:
        return RunCursor(int(ms), rid)
    run = c.typed("qledge.run.get", run_tools.RunId(run_id=text), Run)  # a run: list what comes after it
    return RunCursor(run.created_at_ms, run.id)


def run_list(c: Client, a: argparse.Namespace) -> int:
    from typing import cast

    from edge.core.runs import STARTED, STATUSES, Origin, RunStatus
    from edge.tools.builtin import runs as run_tools

    statuses = _choices("--status", a.status, STATUSES)
    if any("agent" in o.split(",") for o in a.origin):  # a wire value no run is created with
        raise UsageError("--origin agent matches no run: an AI task's runs are scheduled, manual or retry like"
                         " any task's (filter with --task); the AI operator's own runs are `qledge agent list`")
    origins = _choices("--origin", a.origin, tuple(STARTED))
    after = _after(c, a.after)
    task = shared.task_id(c, a.task) if a.task else None
    wanted = None if a.all else a.limit
    runs: list[Run] = []
    while wanted is None or len(runs) < wanted:
        limit = PAGE if wanted is None else min(PAGE, wanted - len(runs))
        args = run_tools.ListArgs(task_id=task, statuses=cast("list[RunStatus]", statuses),
                                  origins=cast("list[Origin]", origins), since_ms=shared.plain(a.since),
                                  until_ms=shared.plain(a.until),
                                  after=after, limit=limit)
        page = c.typed("qledge.run.list", args, run_tools.RunPage)
        runs += page.runs
        after = page.next
        if after is None:
            break
    more = f"more: qledge run list{_repeat(a)} --after {cursor_text(after)}" if after is not None else None
    if a.json:  # a list of runs, nothing else: --all, or qledge.run.list itself, pages for programs
        shared.json_out(runs)
        return EXIT_OK
    if not runs:
        print("no runs match" if statuses or origins or a.since or a.until else "no runs")
    else:
        names = shared.other_names(c, (r.task_id for r in runs))
        shared.table(
            [[r.id, r.task_id, *shared.named(names, r.task_id), r.status, r.origin, shared.when(r.created_at_ms),
              shared.duration(r.started_at_ms, r.finished_at_ms), shared.exit_status(r.exit_code)] for r in runs],
            ["RUN", "TASK", *(["NAME"] if names else []), "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
        )
    if more:
        print(more)
    return EXIT_OK


def _repeat(a: argparse.Namespace) -> str:
    """The filters of this list as they were typed, and its --limit, to continue it with --after."""
    from shlex import quote

    def typed(value: int) -> str:
        return quote(value.typed if isinstance(value, shared.Typed) else str(value))

    words = []
    if a.task:
        words.append(f"--task {quote(a.task)}")
    words += [f"--status {quote(s)}" for s in a.status] + [f"--origin {quote(o)}" for o in a.origin]
    words += [f"--since {typed(a.since)}"] if a.since else []
    words += [f"--until {typed(a.until)}"] if a.until else []
    words += [f"--limit {a.limit}"] if not a.all and a.limit != LIMIT else []
    return "".join(" " + w for w in words)


# -- run get, log, cancel ---------------------------------------------------------------


def _run_fields(r: Run) -> None:
    shared.fields([
        ("run", r.id), ("task", f"{r.task_id} (revision {r.task_revision})"), ("status", r.status),
        ("origin", r.origin), ("trigger", f"{r.trigger_id} (revision {r.trigger_revision})" if r.trigger_id else None),
        ("retry of", f"{r.retry_of} (attempt {r.attempt})" if r.retry_of else None),
        ("retry due", shared.when(r.retry_due_at_ms) if r.retry_due_at_ms else None),
        ("scheduled for", shared.when(r.scheduled_for_ms) if r.scheduled_for_ms is not None else None),
        ("jitter", shared.span(r.jitter_ms / 1000) if r.jitter_ms else None),
        ("created", shared.when(r.created_at_ms)), ("started", shared.when(r.started_at_ms)),
        ("finished", shared.when(r.finished_at_ms)),
        ("took", shared.duration(r.started_at_ms, r.finished_at_ms)),
        ("exit", None if r.exit_code is None else shared.exit_status(r.exit_code) if r.exit_code < 0
         else r.exit_code),
        ("error", r.error_code), ("summary", r.error_summary),
        ("log", shared.size(r.log_bytes) + (" (truncated at its cap)" if r.log_truncated else "")
         + (f", dropped {shared.when(r.log_dropped_at_ms)} (log quota)" if r.log_dropped_at_ms else "")),
    ])


def run_get(c: Client, a: argparse.Namespace) -> int:
    from edge.core.runs import Run
    from edge.tools.builtin import runs as run_tools

    return show(a, c.typed("qledge.run.get", run_tools.RunId(run_id=shared.run_ref(c, a.run)), Run), _run_fields)


def run_cancel(c: Client, a: argparse.Namespace) -> int:
    from edge.core.runs import Run
    from edge.tools.builtin import runs as run_tools

    cancelled = c.typed("qledge.run.cancel", run_tools.RunId(run_id=shared.run_ref(c, a.run)), Run)
    return show(a, cancelled, lambda r: print(shared.run_line(r)))


def _read(c: Client, run: str, offset: int, wait_ms: int = 0) -> LogChunk:
    from edge.tools.builtin import runs as run_tools

    return c.typed("qledge.run.log.read", run_tools.LogArgs(run_id=run, offset=offset, wait_ms=wait_ms),
                   run_tools.LogChunk)


def log_bytes(c: Client, run_id: str) -> bytes:
    """A run's whole log, as it is now."""
    data = bytearray()
    while True:
        chunk = _read(c, run_id, len(data))
        data += chunk.data
        if chunk.eof:
            return bytes(data)


def run_log(c: Client, a: argparse.Namespace) -> int:
    a.run = shared.run_ref(c, a.run)
    if a.follow:
        follow(c, a.run)
        return EXIT_OK
    offset = 0
    out = sys.stdout.buffer
    while True:
        chunk = _read(c, a.run, offset)
        out.write(chunk.data)
        offset += len(chunk.data)
        if chunk.eof:
            break
    out.flush()
    return EXIT_OK


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
    from edge.core.runs import LOG_CAP_MARKER, LOG_HEAD_MAX

    window = b""
    while len(window) < LOG_HEAD_MAX + 128:
        part = _read(c, run, len(window))
        window += part.data
        if part.eof:
            break
    found = LOG_CAP_MARKER.search(window)
    return found.start() if found and found.start() < offset else offset


def _named(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.epilog = RUN_EPILOG


def _log_options(p: argparse.ArgumentParser) -> None:
    _named(p)
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing the output of a running run until it ends")


VERBS = {"run": (
    Verb("start", run_start, "start a run of a task now", _start_options),
    Verb("list", run_list, "list runs, newest first (a page at a time, or --all)", list_options),
    Verb("get", run_get, "show a run", _named),
    Verb("log", run_log, "print a run's log", _log_options),
    Verb("cancel", run_cancel, "cancel a run", _named),
)}
