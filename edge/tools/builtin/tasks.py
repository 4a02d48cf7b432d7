"""Task management tools: full specs, for owners and operators."""

from __future__ import annotations

import contextlib
import os

import msgspec

from edge.core.errors import not_found
from edge.core.tasks import Task, TaskSpec
from edge.core.text import Label, Limit, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, Tool


class CreateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    spec: TaskSpec
    name: Label | None = None


class UpdateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    expected_revision: NonNegative
    spec: TaskSpec
    name: Label | None = None


class TaskId(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name


class TaskRef(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    expected_revision: NonNegative | None = None


class ListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: Name | None = None
    limit: Limit = 64


class TaskPage(msgspec.Struct, rename="camel", omit_defaults=True):
    tasks: list[Task]
    next: str | None = None


class Deleted(msgspec.Struct, rename="camel"):
    task_id: str
    runs_deleted: int


async def _get(ctx: ToolContext, task_id: str) -> Task:
    task = await ctx.services.tasks.get(ctx.project, task_id)
    if task is None:
        raise not_found(f"task {task_id!r} not found")
    return task


async def create(ctx: ToolContext, args: CreateArgs) -> Task:
    return await ctx.services.tasks.create(ctx.project, args.task_id, args.name or args.task_id, args.spec, ctx.now_ms())


async def update(ctx: ToolContext, args: UpdateArgs) -> Task:
    return await ctx.services.tasks.update(
        ctx.project, args.task_id, args.expected_revision, args.spec, args.name, ctx.now_ms()
    )


async def get(ctx: ToolContext, args: TaskId) -> Task:
    return await _get(ctx, args.task_id)


async def list_tasks(ctx: ToolContext, args: ListArgs) -> TaskPage:
    rows = await ctx.services.tasks.list(ctx.project, args.after, args.limit + 1)
    page = rows[: args.limit]
    return TaskPage(tasks=page, next=page[-1].id if len(rows) > args.limit else None)


async def enable(ctx: ToolContext, args: TaskRef) -> Task:
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, True, args.expected_revision, ctx.now_ms())


async def disable(ctx: ToolContext, args: TaskRef) -> Task:
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, False, args.expected_revision, ctx.now_ms())


async def delete(ctx: ToolContext, args: TaskRef) -> Deleted:
    run_ids = await ctx.services.tasks.delete(ctx.project, args.task_id, args.expected_revision)
    for run_id in run_ids:  # a run's log goes with its row
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ctx.services.runner.log_path(run_id))
    return Deleted(task_id=args.task_id, runs_deleted=len(run_ids))


def _write(name: str, handler, args_type, result_type, title: str) -> Tool:
    return Tool(
        name=name, version="1.0.0", effect="write", risk="medium", permissions=("task.write",),
        args_type=args_type, result_type=result_type, handler=handler,
        deadline_s=WRITE_DEADLINE_S, title=title,
    )


TOOLS = [
    _write("qledge.task.create", create, CreateArgs, Task, "Create a task"),
    _write("qledge.task.update", update, UpdateArgs, Task, "Replace a task's spec (compare-and-set on revision)"),
    _write("qledge.task.enable", enable, TaskRef, Task, "Enable a task"),
    _write("qledge.task.disable", disable, TaskRef, Task, "Disable a task"),
    _write("qledge.task.delete", delete, TaskRef, Deleted, "Delete a task, its triggers and its finished runs"),
    Tool(name="qledge.task.get", version="1.0.0", effect="read", risk="medium", permissions=("task.inspect",),
         args_type=TaskId, result_type=Task, handler=get, title="A task with its full spec"),
    Tool(name="qledge.task.list", version="1.0.0", effect="read", risk="medium", permissions=("task.inspect",),
         args_type=ListArgs, result_type=TaskPage, handler=list_tasks, title="Tasks with their full specs"),
]
