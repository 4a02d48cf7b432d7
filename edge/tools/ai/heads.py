"""qinglong.task.list, qinglong.task.get and qinglong.trigger.list: current heads only.

Pages are keysets on the primary key: the reader is asked for limit + 1 rows, the extra
row only proves there is more. Disabled tasks and triggers are listed like the others
(filtering them would mean reading an unbounded number of rows to fill a page).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from edge.core.excerpt import normalize
from edge.core.reads import (
    PAGE_DEFAULT,
    PageLimit,
    ReadId,
    TaskDetail,
    TaskHead,
    TriggerHead,
    storage_fault,
    valid_page,
    valid_row,
)
from edge.tools.ai.projections import ai_read_tool, readers, view
from edge.tools.context import ToolContext

H = TypeVar("H", TaskHead, TriggerHead)
V = TypeVar("V", bound="TaskView")

# -- task.list / task.get ----------------------------------------------------------


class TaskCursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: ReadId


class TaskListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: TaskCursor | None = None
    limit: PageLimit = PAGE_DEFAULT


class TaskView(msgspec.Struct, rename="camel"):
    task_id: str
    revision: int
    name: str
    kind: str  # "argv" | "shell"
    spec_schema: str
    enabled: bool
    updated_at_ms: int


class TaskDetailView(TaskView, rename="camel"):
    content_digest: str
    created_at_ms: int


class TaskPage(msgspec.Struct, rename="camel"):
    tasks: list[TaskView]
    has_more: bool
    next: TaskCursor | UnsetType = UNSET  # only when hasMore


class TaskGetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: ReadId


class TaskGetResult(msgspec.Struct, rename="camel"):
    found: bool
    task: TaskDetailView | UnsetType = UNSET


def _ascending_page(ctx: ToolContext, rows: object, row_type: type[H], key: str, after: str | None,
                    limit: int) -> tuple[list[H], bool]:
    """Validate a keyset page read with limit + 1; returns the page and whether there is more."""
    heads = valid_page(rows, row_type, ctx.project, limit + 1, key=lambda h: getattr(h, key))
    if heads and after is not None and getattr(heads[0], key) <= after:
        raise storage_fault("rows at or before the cursor")
    return heads[:limit], len(heads) > limit


def _task_view(head: TaskHead, view_type: type[V]) -> V:
    # A name is free text: controls that could hide or reorder what a reader sees become U+FFFD.
    projected = view(head, view_type)
    projected.name = normalize(projected.name).replace("\n", "\ufffd")
    return projected


async def task_list(ctx: ToolContext, args: TaskListArgs) -> TaskPage:
    after = args.after.task_id if args.after else None
    rows = await readers(ctx).tasks.list_heads(ctx.project, after, args.limit + 1)
    page, more = _ascending_page(ctx, rows, TaskHead, "task_id", after, args.limit)
    return TaskPage(
        tasks=[_task_view(h, TaskView) for h in page], has_more=more,
        next=TaskCursor(task_id=page[-1].task_id) if more else UNSET,
    )


async def task_get(ctx: ToolContext, args: TaskGetArgs) -> TaskGetResult:
    row = await readers(ctx).tasks.get_head(ctx.project, args.task_id)
    if row is None:
        return TaskGetResult(found=False)
    head = valid_row(row, TaskDetail, ctx.project)
    if head.task_id != args.task_id:
        raise storage_fault("a different task than was asked for")
    return TaskGetResult(found=True, task=_task_view(head, TaskDetailView))


# -- trigger.list -----------------------------------------------------------------


class TriggerCursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    trigger_id: ReadId


class TriggerListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: TriggerCursor | None = None
    limit: PageLimit = PAGE_DEFAULT


class TriggerView(msgspec.Struct, rename="camel"):
    trigger_id: str
    revision: int
    task_id: str
    task_revision: int
    spec_schema: str
    enabled: bool
    updated_at_ms: int


class TriggerPage(msgspec.Struct, rename="camel"):
    triggers: list[TriggerView]
    has_more: bool
    next: TriggerCursor | UnsetType = UNSET  # only when hasMore


async def trigger_list(ctx: ToolContext, args: TriggerListArgs) -> TriggerPage:
    after = args.after.trigger_id if args.after else None
    rows = await readers(ctx).triggers.list_heads(ctx.project, after, args.limit + 1)
    page, more = _ascending_page(ctx, rows, TriggerHead, "trigger_id", after, args.limit)
    return TriggerPage(
        triggers=[view(h, TriggerView) for h in page], has_more=more,
        next=TriggerCursor(trigger_id=page[-1].trigger_id) if more else UNSET,
    )


_PAGING = (
    " Pass `next` back as `after` for the following page; `next` is present only when hasMore is true."
    " limit is 1..64 (default 32)."
)

TOOLS = [
    ai_read_tool(
        "qinglong.task.list", task_list, TaskListArgs, TaskPage, "task.read", "List tasks",
        "Tasks of this device ordered by taskId, disabled ones included: id, revision, name, command kind"
        " (argv or shell), spec schema, enabled and last update time. Never the command, environment,"
        " description or digests." + _PAGING,
    ),
    ai_read_tool(
        "qinglong.task.get", task_get, TaskGetArgs, TaskGetResult, "task.read", "Get a task",
        "One task's current head: the task.list fields plus its content digest and creation time."
        " found is false when no such task exists. Never the command or environment.",
    ),
    ai_read_tool(
        "qinglong.trigger.list", trigger_list, TriggerListArgs, TriggerPage, "trigger.read", "List triggers",
        "Schedule triggers ordered by triggerId, disabled ones included (enabled=false): id, revision, the task"
        " and task revision they start, spec schema and last update time. Never the cron expression, timezone,"
        " misfire policy, digests or secret references." + _PAGING,
    ),
]
