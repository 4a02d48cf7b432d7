"""Projections for AI clients, and the task and trigger read tools.

A projection is the low-sensitivity view of a stored row: no project id, no trigger or
idempotency keys, no error text, no commands, environment or digests beyond those a
tool names. This module holds what the AI read tools share (their definition, row-to-view
projection, the run projection and the run comparison used by both qinglong.run.compare
and qinglong.task.runs.compare) and the head tools: qinglong.task.list, qinglong.task.get
and qinglong.trigger.list. Their pages are keysets on the primary key: the reader is asked
for limit + 1 rows, the extra row only proves there is more. Disabled tasks and triggers
are listed like the others (filtering them would mean reading an unbounded number of rows
to fill a page).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from edge.core.reads import (
    PAGE_DEFAULT,
    RunSummary,
    TaskDetail,
    TaskHead,
    TriggerHead,
    keyset,
    storage_fault,
    valid_page,
    valid_row,
)
from edge.core.runs import TERMINAL, Origin, RunStatus
from edge.core.tasks import redact_label
from edge.core.text import PageLimit, ReadId, normalize
from edge.tools.context import ToolContext
from edge.tools.definition import Handler, Risk, Tool, tool

ChangedField = Literal["taskId", "taskRevision", "status", "origin", "exitCode"]
# Fields compared between two runs, in the order changedFields lists them.
_COMPARED: tuple[tuple[ChangedField, str], ...] = (
    ("taskId", "task_id"),
    ("taskRevision", "task_revision"),
    ("status", "status"),
    ("origin", "origin"),
    ("exitCode", "exit_code"),
)


def ai_read_tool(
    name: str, handler: Handler, args_type: type, result_type: type, permission: str, title: str, description: str,
    risk: Risk = "low",
) -> Tool:
    """An AI read tool: effect read (5 s deadline), offered to AI clients with its description."""
    return tool(name, handler, args_type, result_type, effect="read", risk=risk, permission=permission, title=title,
                description=description, ai=True)


V = TypeVar("V", bound=msgspec.Struct)
H = TypeVar("H", TaskHead, TriggerHead)
T = TypeVar("T", bound="TaskView")


def view(row: msgspec.Struct, view_type: type[V]) -> V:
    """Project a validated row onto a view: the view's fields are the whitelist."""
    return view_type(**{name: getattr(row, name) for name in view_type.__struct_fields__})


async def read_run(ctx: ToolContext, run_id: str) -> RunSummary | None:
    """One project-scoped point read of a run, re-validated; None when there is no such run here."""
    row = await ctx.services.readers.runs.get(ctx.project, run_id)
    if row is None:
        return None
    run = valid_row(row, RunSummary, ctx.project)
    if run.id != run_id:
        raise storage_fault("a different run than was asked for")
    return run


class RunView(msgspec.Struct, rename="camel", omit_defaults=True):
    """The run projection; times are UTC epoch ms, null while unknown. `retryOf`, only on a
    run with origin `retry`: the run it retries."""

    id: str
    task_id: str
    task_revision: int
    status: RunStatus
    origin: Origin
    created_at_ms: int
    queued_at_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    exit_code: int | None
    retry_of: str | None = None


class Comparison(msgspec.Struct, rename="camel", kw_only=True):
    """How a candidate run differs from a baseline run; deltas are candidate − baseline.

    Result Structs inherit these fields; they are left unset when there is no pair to compare.
    """

    comparable: bool | UnsetType = UNSET  # both runs have finished: outcome and durations are final
    same_task: bool | UnsetType = UNSET
    same_task_revision: bool | UnsetType = UNSET
    changed_fields: list[ChangedField] | UnsetType = UNSET
    # Omitted when a timestamp they need is unknown on either side.
    queue_delay_delta_ms: int | UnsetType = UNSET  # started − queued
    execution_duration_delta_ms: int | UnsetType = UNSET  # finished − started
    total_duration_delta_ms: int | UnsetType = UNSET  # finished − created


def _span(start: int | None, end: int | None) -> int | None:
    return end - start if start is not None and end is not None else None


def _delta(baseline: int | None, candidate: int | None) -> int | UnsetType:
    return candidate - baseline if baseline is not None and candidate is not None else UNSET


def comparison_fields(baseline: RunSummary, candidate: RunSummary) -> dict[str, Any]:
    """The Comparison fields for two runs, as keyword arguments of a result Struct."""

    def spans(r: RunSummary) -> tuple[int | None, int | None, int | None]:
        return (_span(r.queued_at_ms, r.started_at_ms), _span(r.started_at_ms, r.finished_at_ms),
                _span(r.created_at_ms, r.finished_at_ms))

    (bq, be, bt), (cq, ce, ct) = spans(baseline), spans(candidate)
    return {
        "comparable": baseline.status in TERMINAL and candidate.status in TERMINAL,
        "same_task": baseline.task_id == candidate.task_id,
        "same_task_revision": baseline.task_id == candidate.task_id
        and baseline.task_revision == candidate.task_revision,
        "changed_fields": [wire for wire, attr in _COMPARED if getattr(baseline, attr) != getattr(candidate, attr)],
        "queue_delay_delta_ms": _delta(bq, cq),
        "execution_duration_delta_ms": _delta(be, ce),
        "total_duration_delta_ms": _delta(bt, ct),
    }


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
                    limit: int) -> tuple[list[H], H | None]:
    """Validate a keyset page read with limit + 1; returns the page and its last row when there is more."""
    heads = valid_page(rows, row_type, ctx.project, limit + 1, key=lambda h: getattr(h, key))
    if heads and after is not None and getattr(heads[0], key) <= after:
        raise storage_fault("rows at or before the cursor")
    return keyset(heads, limit)


def _task_view(head: TaskHead, view_type: type[T]) -> T:
    if (head.kind == "agent") != (head.spec_schema == "qinglong/agent@v1"):
        raise storage_fault("a task under a spec schema its command does not have")
    # A name is free text: controls that could hide or reorder what a reader sees become U+FFFD.
    projected = view(head, view_type)
    # And a credential in it is masked as in a log (names written before that rule held).
    projected.name = redact_label(normalize(projected.name).replace("\n", "\ufffd"))
    return projected


async def task_list(ctx: ToolContext, args: TaskListArgs) -> TaskPage:
    after = args.after.task_id if args.after else None
    rows = await ctx.services.readers.tasks.page_heads(ctx.project, after, args.limit + 1)
    page, last = _ascending_page(ctx, rows, TaskHead, "task_id", after, args.limit)
    return TaskPage(
        tasks=[_task_view(h, TaskView) for h in page], has_more=last is not None,
        next=TaskCursor(task_id=last.task_id) if last else UNSET,
    )


async def task_get(ctx: ToolContext, args: TaskGetArgs) -> TaskGetResult:
    row = await ctx.services.readers.tasks.get_head(ctx.project, args.task_id)
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
    rows = await ctx.services.readers.triggers.page_heads(ctx.project, after, args.limit + 1)
    page, last = _ascending_page(ctx, rows, TriggerHead, "trigger_id", after, args.limit)
    return TriggerPage(
        triggers=[view(h, TriggerView) for h in page], has_more=last is not None,
        next=TriggerCursor(trigger_id=last.trigger_id) if last else UNSET,
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
