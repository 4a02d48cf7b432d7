"""Run tools for the CLI: start, inspect, wait for, cancel and read the log of runs."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import ToolError, conflict, not_found
from edge.core.reads import keyset
from edge.core.runs import Run, RunCursor, RunEvent
from edge.core.text import Id, Limit, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import tool

LOG_READ_MAX = 64 * 1024
WAIT_MAX_MS = 60_000


class StartArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name


class RunId(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: Id


class ListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name | None = None
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


class LogChunk(msgspec.Struct, rename="camel"):
    data: bytes
    offset: int
    total_bytes: int
    eof: bool
    final: bool  # the run has finished: the log will not grow any more


async def _run(ctx: ToolContext, run_id: str) -> Run:
    run = await ctx.services.runs.get(ctx.project, run_id)
    if run is None:
        raise not_found(f"run {run_id} not found")
    return run


async def start(ctx: ToolContext, args: StartArgs) -> Run:
    task = await ctx.services.tasks.get(ctx.project, args.task_id)
    if task is None:
        raise not_found(f"task {args.task_id!r} not found")
    if not task.enabled:
        raise conflict(f"task {args.task_id!r} is disabled; enable it first")
    # Refused here rather than admitted only to fail: like a full queue, a full disk is a
    # resource the caller can see (scheduled fires are recorded `disk_space_low`).
    short = ctx.services.runner.disk_shortfall()
    if short is not None:
        raise ToolError("resource_exhausted", f"disk_space_low: {short}")
    return await ctx.services.runner.start(task, "user")


async def get(ctx: ToolContext, args: RunId) -> Run:
    return await _run(ctx, args.run_id)


async def list_runs(ctx: ToolContext, args: ListArgs) -> RunPage:
    rows = await ctx.services.runs.page(ctx.project, args.task_id, args.after, args.limit + 1)
    page, last = keyset(rows, args.limit)
    return RunPage(runs=page, next=RunCursor(last.created_at_ms, last.id) if last else None)


async def cancel(ctx: ToolContext, args: RunId) -> Run:
    await _run(ctx, args.run_id)
    return await ctx.services.runner.cancel(ctx.project, args.run_id, "user")


async def wait(ctx: ToolContext, args: WaitArgs) -> WaitResult:
    run = await ctx.services.runner.wait(ctx.project, args.run_id, args.timeout_ms / 1000)
    if run is None:
        raise not_found(f"run {args.run_id} not found")
    return WaitResult(run=run, done=run.terminal)


async def events(ctx: ToolContext, args: EventArgs) -> EventPage:
    await _run(ctx, args.run_id)
    return EventPage(events=await ctx.services.runs.events(ctx.project, args.run_id, args.after_sequence, args.limit))


async def read_log(ctx: ToolContext, args: LogArgs) -> LogChunk:
    run = await _run(ctx, args.run_id)
    found = await ctx.services.log_reader.read(run.id, args.offset, args.length)
    if found is None:
        return LogChunk(data=b"", offset=args.offset, total_bytes=0, eof=True, final=run.terminal)
    return LogChunk(
        data=found.data, offset=args.offset, total_bytes=found.total,
        eof=args.offset + len(found.data) >= found.total, final=run.terminal,
    )


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
         title="A byte range of a run's log"),
]
