"""Task management tools: full specs, for owners and operators.

Every write that sets what a task runs (create, update) or makes it runnable again
(enable) is checked against the caller's permissions for what it would run (who as, which
secrets: ToolContext.may_run), so a role's limits hold through the tasks it can write.
Disabling and deleting only stop things and need task.write alone."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import ToolError, invalid, not_found
from edge.core.reads import keyset
from edge.core.schedule import ScheduleError, normalize
from edge.core.tasks import (
    AgentInstruction,
    ArgvCommand,
    ImportedTask,
    ImportKey,
    ImportRecord,
    ImportTask,
    Task,
    TaskSpec,
    redact_label,
)
from edge.core.text import Label, Limit, Name, NonNegative
from edge.core.triggers import CronSpec, PreparedImport
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, tool


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


class ImportListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: ImportKey | None = None
    limit: Limit = 64


class ImportPage(msgspec.Struct, rename="camel", omit_defaults=True):
    imports: list[ImportRecord]
    next: str | None = None


async def _get(ctx: ToolContext, task_id: str) -> Task:
    task = await ctx.services.tasks.get(ctx.project, task_id)
    if task is None:
        raise not_found(f"task {task_id!r} not found")
    return task


def named(ctx: ToolContext, spec: TaskSpec) -> TaskSpec:
    """A spec always names its user: one that does not gets the default now, so what it
    runs as never changes behind its back when the configuration does."""
    if spec.user is not None or isinstance(spec.command, AgentInstruction):  # an AI run is the [agent] user
        return spec
    return msgspec.structs.replace(spec, user=ctx.services.users.default_user)


def check_program(spec: TaskSpec) -> None:
    """A run never resolves a path against the daemon's own directory: a program given as
    a path is absolute (a bare name is looked up in PATH). The working directory's rule is
    TaskUsers.working_dir's, applied by ToolContext.may_run."""
    command = spec.command
    if isinstance(command, ArgvCommand) and "/" in command.file and not command.file.startswith("/"):
        raise invalid(f"program {command.file!r} is a relative path: give an absolute path,"
                      " or a name to look up in PATH")


async def label(ctx: ToolContext, name: str | None, values: list[str] | None = None) -> str | None:
    """A task's name as it is stored: free text that every reader may see (viewers, AI
    clients, notifications), so a credential in it is masked as in a run's log (`values`:
    the project's secret values, when the caller has them already)."""
    if name is None:
        return None
    return redact_label(name, values if values is not None else await ctx.services.secrets.values(ctx.project))


async def create(ctx: ToolContext, args: CreateArgs) -> Task:
    check_program(args.spec)
    name = await label(ctx, args.name) or args.task_id
    spec = named(ctx, args.spec)
    privileged = ctx.may_run(f"task {args.task_id}", spec)
    return await ctx.services.tasks.create(ctx.project, args.task_id, name, spec, ctx.now_ms(), privileged=privileged)


async def update(ctx: ToolContext, args: UpdateArgs) -> Task:
    check_program(args.spec)
    spec = named(ctx, args.spec)
    privileged = ctx.may_run(f"task {args.task_id}", spec)
    return await ctx.services.tasks.update(
        ctx.project, args.task_id, args.expected_revision, spec, await label(ctx, args.name), ctx.now_ms(),
        privileged=privileged,
    )


async def get(ctx: ToolContext, args: TaskId) -> Task:
    return await _get(ctx, args.task_id)


async def list_tasks(ctx: ToolContext, args: ListArgs) -> TaskPage:
    page, last = keyset(await ctx.services.tasks.page(ctx.project, args.after, args.limit + 1), args.limit)
    return TaskPage(tasks=page, next=last.id if last else None)


async def enable(ctx: ToolContext, args: TaskRef) -> Task:
    task = await _get(ctx, args.task_id)
    if not task.enabled:
        ctx.may_run(f"enabling task {task.id}", task.spec)
    # Compare-and-set on the revision just checked: a newer one is checked anew.
    expected = task.revision if args.expected_revision is None else args.expected_revision
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, True, expected, ctx.now_ms())


async def disable(ctx: ToolContext, args: TaskRef) -> Task:
    return await ctx.services.tasks.set_enabled(ctx.project, args.task_id, False, args.expected_revision, ctx.now_ms())


async def delete(ctx: ToolContext, args: DeleteArgs) -> Deleted:
    runs = await ctx.services.tasks.delete(ctx.project, args.task_id, args.expected_revision, args.with_triggers)
    ctx.services.users.forget(ctx.project, args.task_id)  # its data directory (and HOME) goes with it
    return Deleted(task_id=args.task_id, runs_deleted=runs)


_WHAT = "\x00task"  # what a remembered refusal says it is about, until it is said of an entry


def _prepared(ctx: ToolContext, args: ImportTask, name: str | None,
              seen: dict[tuple[object, ...], bool | ToolError] | None = None) -> PreparedImport:
    """An import's task checked like any task the caller writes (raises what that raises).
    `seen`: may_run's answers by what they depend on, so a batch of entries that run alike
    looks the system's users up once."""
    check_program(args.spec)
    args = msgspec.structs.replace(args, spec=named(ctx, args.spec), name=name)
    task = args.spec
    key = (task.user, task.group, task.working_dir, tuple(task.secrets()), type(task.command))
    answer = seen.get(key) if seen is not None else None
    if answer is None:
        try:
            answer = ctx.may_run(_WHAT, task)
        except ToolError as exc:
            answer = exc
        if seen is not None:
            seen[key] = answer
    if isinstance(answer, ToolError):  # said of this entry
        raise ToolError(answer.code, answer.message.replace(_WHAT, f"task {args.task_id}", 1))
    privileged = answer
    specs: list[CronSpec] = []
    for wanted in args.triggers:
        try:
            spec = CronSpec(expression=normalize(wanted.expression), misfire=wanted.misfire,
                            timezone=wanted.timezone or ctx.services.triggers.default_timezone)
            spec.schedule()
        except ScheduleError as exc:
            raise invalid(str(exc)) from None
        specs.append(spec)
    return PreparedImport(item=args, triggers=specs, privileged=privileged)


IMPORT_BATCH = 512  # entries one call may carry (its frame is bounded too)


class ImportTasksArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    items: Annotated[list[ImportTask], msgspec.Meta(max_length=IMPORT_BATCH)]
    check: bool = False  # check every entry as its import would, write nothing


class ImportTasksResult(msgspec.Struct, rename="camel"):
    results: list[ImportedTask]  # one per item, in order


async def import_tasks(ctx: ToolContext, args: ImportTasksArgs) -> ImportTasksResult:
    """Tasks with their triggers from an import (crond, qinglong), once per import key: each
    entry checked like any task the caller writes (one that may not be imported is
    `refused`, with the error it raised), then the others written in one transaction; with
    `check`, nothing is written (`checked`)."""
    values = await ctx.services.secrets.values(ctx.project)
    results: list[ImportedTask | None] = []
    ready: list[PreparedImport] = []
    seen: dict[tuple[object, ...], bool | ToolError] = {}
    for item in args.items:
        try:
            ready.append(_prepared(ctx, item, await label(ctx, item.name, values), seen))
            results.append(None)
        except ToolError as exc:
            results.append(ImportedTask(key=item.key, status="refused", task_id=item.task_id, code=exc.code,
                                        message=exc.message))
    if args.check:
        made = iter([ImportedTask(key=r.item.key, status="checked", task_id=r.item.task_id) for r in ready])
    else:
        made = iter(await ctx.services.triggers.import_tasks(ctx.project, ready, ctx.now_ms()) if ready else [])
    return ImportTasksResult(results=[r if r is not None else next(made) for r in results])


async def list_imports(ctx: ToolContext, args: ImportListArgs) -> ImportPage:
    page, last = keyset(await ctx.services.tasks.imports(ctx.project, args.after, args.limit + 1), args.limit)
    return ImportPage(imports=page, next=last.key if last else None)


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
    tool("qledge.import.tasks", import_tasks, ImportTasksArgs, ImportTasksResult, effect="write", risk="medium",
         permission=("task.write", "trigger.write"), deadline_s=4 * WRITE_DEADLINE_S,
         title="Check, or create, many tasks with their triggers from an import, once per import key"),
    tool("qledge.import.list", list_imports, ImportListArgs, ImportPage, effect="read", risk="medium",
         permission="task.inspect", title="What earlier imports created, by import key"),
    tool("qledge.task.get", get, TaskId, Task, effect="read", risk="medium", permission="task.inspect",
         title="A task with its full spec"),
    tool("qledge.task.list", list_tasks, ListArgs, TaskPage, effect="read", risk="medium", permission="task.inspect",
         title="Tasks with their full specs"),
]
