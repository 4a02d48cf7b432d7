"""Task management tools: full specs, for owners and operators."""

from __future__ import annotations

import msgspec

from edge.core.errors import invalid, not_found
from edge.core.reads import keyset
from edge.core.tasks import ArgvCommand, Task, TaskSpec
from edge.core.text import Label, Limit, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import tool


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


class DeleteArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: Name
    expected_revision: NonNegative | None = None
    with_triggers: bool = False  # without it, a task that has triggers is not deleted


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


def check_paths(spec: TaskSpec) -> None:
    """A run never resolves a path against the daemon's own directory: a working directory
    is absolute, and so is a program given as a path (a bare name is looked up in PATH)."""
    if spec.working_dir is not None and not spec.working_dir.startswith("/"):
        raise invalid(f"working directory {spec.working_dir!r} is relative: give an absolute path")
    command = spec.command
    if isinstance(command, ArgvCommand) and "/" in command.file and not command.file.startswith("/"):
        raise invalid(f"program {command.file!r} is a relative path: give an absolute path,"
                      " or a name to look up in PATH")


async def create(ctx: ToolContext, args: CreateArgs) -> Task:
    check_paths(args.spec)
    name = args.name or args.task_id
    return await ctx.services.tasks.create(ctx.project, args.task_id, name, args.spec, ctx.now_ms())


async def update(ctx: ToolContext, args: UpdateArgs) -> Task:
    check_paths(args.spec)
    return await ctx.services.tasks.update(
        ctx.project, args.task_id, args.expected_revision, args.spec, args.name, ctx.now_ms()
    )


async def get(ctx: ToolContext, args: TaskId) -> Task:
    return await _get(ctx, args.task_id)


async def list_tasks(ctx: ToolContext, args: ListArgs) -> TaskPage:
    page, last = keyset(await ctx.services.tasks.page(ctx.project, args.after, args.limit + 1), args.limit)
    return TaskPage(tasks=page, next=last.id if last else None)


async def enable(ctx: ToolContext, args: TaskRef) -> Task:
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, True, args.expected_revision, ctx.now_ms())


async def disable(ctx: ToolContext, args: TaskRef) -> Task:
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, False, args.expected_revision, ctx.now_ms())


async def delete(ctx: ToolContext, args: DeleteArgs) -> Deleted:
    runs = await ctx.services.tasks.delete(ctx.project, args.task_id, args.expected_revision, args.with_triggers)
    return Deleted(task_id=args.task_id, runs_deleted=runs)


TOOLS = [
    tool("qledge.task.create", create, CreateArgs, Task, effect="write", risk="medium", permission="task.write",
         title="Create a task"),
    tool("qledge.task.update", update, UpdateArgs, Task, effect="write", risk="medium", permission="task.write",
         title="Replace a task's spec (compare-and-set on revision)"),
    tool("qledge.task.enable", enable, TaskRef, Task, effect="write", risk="medium", permission="task.write",
         title="Enable a task"),
    tool("qledge.task.disable", disable, TaskRef, Task, effect="write", risk="medium", permission="task.write",
         title="Disable a task"),
    tool("qledge.task.delete", delete, DeleteArgs, Deleted, effect="write", risk="medium", permission="task.write",
         title="Delete a task and its finished runs (and, with withTriggers, its triggers)"),
    tool("qledge.task.get", get, TaskId, Task, effect="read", risk="medium", permission="task.inspect",
         title="A task with its full spec"),
    tool("qledge.task.list", list_tasks, ListArgs, TaskPage, effect="read", risk="medium", permission="task.inspect",
         title="Tasks with their full specs"),
]
