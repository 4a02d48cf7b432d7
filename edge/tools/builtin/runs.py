"""Run tools for the CLI: start, inspect, wait for, cancel and read (or follow) the log of
runs, and list them with filters. Every tool that takes a run takes what people type: an
id, a unique id prefix, TASK:latest or TASK:latest-failed."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import ToolError, invalid, not_found
from edge.core.runs import (
    FAILED_STATUSES,
    MIN_PREFIX,
    Origin,
    Run,
    RunCursor,
    RunEvent,
    RunQuery,
    RunStatus,
    parse_reference,
    short_prefix,
)
from edge.core.tasks import TaskRef
from edge.core.text import Id, Limit, Millis, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import tool

LOG_READ_MAX = 64 * 1024
WAIT_MAX_MS = 60_000
FOLLOW_MAX_MS = 30_000  # how long one log read may wait for more output


class StartArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name


class RunId(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A run: its id, a unique prefix of it (8 characters or more), `TASK:latest` or
    `TASK:latest-failed` (every run tool takes these)."""

    run_id: Id


class ListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """Runs newest first; every filter given narrows the list."""

    task_id: Name | None = None
    statuses: Annotated[list[RunStatus], msgspec.Meta(max_length=7)] = []
    origins: Annotated[list[Origin], msgspec.Meta(max_length=4)] = []
    since_ms: Millis | None = None  # created at or after
    until_ms: Millis | None = None  # created before
    after: RunCursor | None = None
    limit: Limit = 32


class RunPage(msgspec.Struct, rename="camel", omit_defaults=True):
    runs: list[Run]
    next: RunCursor | None = None


class WaitArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: Id
    timeout_ms: Annotated[int, msgspec.Meta(ge=0, le=WAIT_MAX_MS)] = 30_000


class WaitResult(msgspec.Struct, rename="camel"):
    run: Run
    done: bool


class EventArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: Id
    after_sequence: NonNegative = 0
    limit: Limit = 64


class EventPage(msgspec.Struct, rename="camel"):
    events: list[RunEvent]


class LogArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: Id
    offset: NonNegative = 0
    length: Annotated[int, msgspec.Meta(ge=1, le=LOG_READ_MAX)] = LOG_READ_MAX
    # At the end of a running run's log: wait up to this long for more output (or its end).
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=FOLLOW_MAX_MS)] = 0


class LogChunk(msgspec.Struct, rename="camel"):
    data: bytes
    offset: int
    total_bytes: int
    eof: bool
    final: bool  # the run has finished: the log will not grow any more
    run_id: str = ""  # the run read (a prefix or TASK:latest names one)
    truncated: bool = False  # final, and the log went over its cap: head, marker, tail


async def _task_run(ctx: ToolContext, task_id: str, failed: bool) -> Run:
    if await ctx.services.tasks.get(ctx.project, task_id) is None:
        raise not_found(f"task {task_id!r} not found")
    query = RunQuery(task_id=task_id, statuses=list(FAILED_STATUSES) if failed else [])
    after: RunCursor | None = None
    while True:  # a page may come back empty when its walk ran out of budget
        found = await ctx.services.runs.search(ctx.project, query, after, 1)
        if found.runs:
            return found.runs[0]
        if found.next is None:
            raise not_found(f"task {task_id!r} has no {'failed ' if failed else ''}runs")
        after = found.next


async def _run(ctx: ToolContext, reference: str) -> Run:
    """The run a reference names (RunId): an id, a unique id prefix, TASK:latest[-failed]."""
    try:
        ref = parse_reference(reference)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    if ref.task_id is not None:
        return await _task_run(ctx, ref.task_id, ref.failed)
    assert ref.run_id is not None
    run = await ctx.services.runs.get(ctx.project, ref.run_id)
    if run is not None:
        return run
    if ref.prefix is None:
        raise not_found(f"run {reference} not found")
    if len(ref.prefix) < MIN_PREFIX:
        raise invalid(short_prefix(reference))
    ids = await ctx.services.runs.with_prefix(ctx.project, ref.prefix, 3)
    if not ids:
        raise not_found(f"no run id starts with {reference}")
    if len(ids) > 1:
        shown = ", ".join(ids[:2]) + (", …" if len(ids) > 2 else "")
        raise invalid(f"run id prefix {reference} is ambiguous ({shown}): give more characters")
    found = await ctx.services.runs.get(ctx.project, ids[0])
    if found is None:  # deleted in between
        raise not_found(f"no run id starts with {reference}")
    return found


async def start(ctx: ToolContext, args: StartArgs) -> Run:
    # Refused here rather than admitted only to fail: like a full queue, a full disk is a
    # resource the caller can see (scheduled fires are recorded `disk_space_low`).
    short = ctx.services.runner.disk_shortfall()
    if short is not None:
        raise ToolError("resource_exhausted", f"disk_space_low: {short}")
    # The task is read in the admission's transaction (missing, disabled: refused there),
    # so the call's audit row, its admission and its claim on a node are one transaction.
    return await ctx.services.runner.start(TaskRef(project_id=ctx.project, id=args.task_id), "user")


async def get(ctx: ToolContext, args: RunId) -> Run:
    return await _run(ctx, args.run_id)


async def list_runs(ctx: ToolContext, args: ListArgs) -> RunPage:
    if args.task_id is not None and await ctx.services.tasks.get(ctx.project, args.task_id) is None:
        raise not_found(f"task {args.task_id!r} not found")
    if args.since_ms is not None and args.until_ms is not None and args.since_ms >= args.until_ms:
        raise invalid("since must be earlier than until")
    query = RunQuery(task_id=args.task_id, statuses=args.statuses, origins=args.origins, since_ms=args.since_ms,
                     until_ms=args.until_ms)
    found = await ctx.services.runs.search(ctx.project, query, args.after, args.limit)
    return RunPage(runs=found.runs, next=found.next)


async def cancel(ctx: ToolContext, args: RunId) -> Run:
    run = await _run(ctx, args.run_id)
    return await ctx.services.runner.cancel(ctx.project, run.id, "user")


async def wait(ctx: ToolContext, args: WaitArgs) -> WaitResult:
    named = await _run(ctx, args.run_id)
    run = await ctx.services.runner.wait(ctx.project, named.id, args.timeout_ms / 1000)
    if run is None:
        raise not_found(f"run {named.id} not found")
    return WaitResult(run=run, done=run.terminal)


async def events(ctx: ToolContext, args: EventArgs) -> EventPage:
    run = await _run(ctx, args.run_id)
    return EventPage(events=await ctx.services.runs.events(ctx.project, run.id, args.after_sequence, args.limit))


async def _chunk(ctx: ToolContext, run: Run, args: LogArgs) -> LogChunk:
    found = await ctx.services.log_reader.read(run.id, args.offset, args.length)
    truncated = run.terminal and run.log_truncated
    if found is None:
        return LogChunk(data=b"", offset=args.offset, total_bytes=0, eof=True, final=run.terminal, run_id=run.id,
                        truncated=truncated)
    return LogChunk(
        data=found.data, offset=args.offset, total_bytes=found.total,
        eof=args.offset + len(found.data) >= found.total, final=run.terminal, run_id=run.id, truncated=truncated,
    )


async def read_log(ctx: ToolContext, args: LogArgs) -> LogChunk:
    run = await _run(ctx, args.run_id)
    runner = ctx.services.runner
    # The mark is taken before the read: output that lands after the read moves it, so the
    # wait below returns at once instead of missing it.
    mark = await runner.output_mark(ctx.project, run.id, None, 0) if args.wait_ms and not run.terminal else None
    chunk = await _chunk(ctx, run, args)
    # Until the log has more at this offset, or the run ends: output beyond the log's cap
    # (or held back by redaction) moves the mark without growing the file, so one read may
    # wait through several moves. Whatever there is, it is answered at once.
    deadline = ctx.services.clock.monotonic() + args.wait_ms / 1000
    while mark is not None and not chunk.data and not run.terminal:
        remaining = deadline - ctx.services.clock.monotonic()
        if remaining <= 0:
            break
        seen, mark = mark, await runner.output_mark(ctx.project, run.id, mark, remaining)
        run = await ctx.services.runs.get(ctx.project, run.id) or run
        chunk = await _chunk(ctx, run, args)
        if mark == seen:
            break  # the time is up, or the runner would not wait (too many follow): answered now
    return chunk


TOOLS = [
    tool("qledge.run.start", start, StartArgs, Run, effect="write", risk="medium", permission="run.write",
         title="Start a run of a task now"),
    tool("qledge.run.cancel", cancel, RunId, Run, effect="write", risk="medium", permission="run.write",
         title="Cancel a queued or running run"),
    tool("qledge.run.get", get, RunId, Run, effect="read", risk="low", permission="run.read", title="A run"),
    tool("qledge.run.list", list_runs, ListArgs, RunPage, effect="read", risk="low", permission="run.read",
         title="Runs, newest first"),
    tool("qledge.run.events", events, EventArgs, EventPage, effect="read", risk="low", permission="run.read",
         title="A run's events"),
    tool("qledge.run.wait", wait, WaitArgs, WaitResult, effect="read", risk="low", permission="run.read",
         title="Wait for a run to finish", deadline_s=WAIT_MAX_MS / 1000 + 5),
    tool("qledge.run.log.read", read_log, LogArgs, LogChunk, effect="read", risk="low", permission="artifact.read",
         title="A byte range of a run's log (waitMs: wait for more of a running run's output)",
         deadline_s=FOLLOW_MAX_MS / 1000 + 5),
]
