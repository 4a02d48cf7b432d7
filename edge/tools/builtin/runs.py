"""Run tools for the CLI: start, inspect, wait for, cancel and read the log of runs."""

from __future__ import annotations

import os
from typing import Annotated

import msgspec

from edge.core.errors import conflict, not_found
from edge.core.ports import RunCursor
from edge.core.runs import Run, RunEvent
from edge.core.text import Id, Limit, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import READ_DEADLINE_S, WRITE_DEADLINE_S, Tool

LOG_READ_MAX = 64 * 1024
WAIT_MAX_MS = 60_000


class StartArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name


class RunId(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: Id


class Cursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    created_at_ms: NonNegative
    run_id: Id


class ListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name | None = None
    after: Cursor | None = None
    limit: Limit = 32


class RunPage(msgspec.Struct, rename="camel", omit_defaults=True):
    runs: list[Run]
    next: Cursor | None = None


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
    return await ctx.services.runner.start(task, "user")


async def get(ctx: ToolContext, args: RunId) -> Run:
    return await _run(ctx, args.run_id)


async def list_runs(ctx: ToolContext, args: ListArgs) -> RunPage:
    after = RunCursor(args.after.created_at_ms, args.after.run_id) if args.after else None
    rows = await ctx.services.runs.list(ctx.project, args.task_id, after, args.limit + 1)
    page = rows[: args.limit]
    nxt = None
    if len(rows) > args.limit:
        nxt = Cursor(created_at_ms=page[-1].created_at_ms, run_id=page[-1].id)
    return RunPage(runs=page, next=nxt)


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
    try:
        fd = os.open(ctx.services.runner.log_path(run.id), os.O_RDONLY)
    except FileNotFoundError:
        return LogChunk(data=b"", offset=args.offset, total_bytes=0, eof=True, final=run.terminal)
    try:
        total = os.fstat(fd).st_size
        data = os.pread(fd, args.length, args.offset) if args.offset < total else b""
    finally:
        os.close(fd)
    return LogChunk(
        data=data, offset=args.offset, total_bytes=total,
        eof=args.offset + len(data) >= total, final=run.terminal,
    )


def _tool(name: str, handler, args_type, result_type, effect: str, permission: str, title: str,
          deadline_s: float = READ_DEADLINE_S) -> Tool:
    return Tool(
        name=name, version="1.0.0", effect=effect, risk="low" if effect == "read" else "medium",  # type: ignore[arg-type]
        permissions=(permission,), args_type=args_type, result_type=result_type, handler=handler,
        deadline_s=deadline_s, title=title,
    )


TOOLS = [
    _tool("qledge.run.start", start, StartArgs, Run, "write", "run.write", "Start a run of a task now",
          WRITE_DEADLINE_S),
    _tool("qledge.run.cancel", cancel, RunId, Run, "write", "run.write", "Cancel a queued or running run",
          WRITE_DEADLINE_S),
    _tool("qledge.run.get", get, RunId, Run, "read", "run.read", "A run"),
    _tool("qledge.run.list", list_runs, ListArgs, RunPage, "read", "run.read", "Runs, newest first"),
    _tool("qledge.run.events", events, EventArgs, EventPage, "read", "run.read", "A run's events"),
    _tool("qledge.run.wait", wait, WaitArgs, WaitResult, "read", "run.read", "Wait for a run to finish",
          WAIT_MAX_MS / 1000 + 5),
    _tool("qledge.run.log.read", read_log, LogArgs, LogChunk, "read", "artifact.read", "A byte range of a run's log"),
]
