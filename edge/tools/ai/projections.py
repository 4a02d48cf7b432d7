"""What the AI read tools share: their definition, the run projection and run comparison.

A projection is the low-sensitivity view of a stored row: no project id, no trigger or
idempotency keys, no error text, no commands, environment or digests beyond those a
tool names. The comparison is shared by qinglong.run.compare and
qinglong.task.runs.compare so both compute changed fields and deltas the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from edge.core.errors import unavailable
from edge.core.reads import Readers, RunSummary, storage_fault, valid_row
from edge.core.runs import TERMINAL, Origin, RunStatus
from edge.tools.context import ToolContext
from edge.tools.definition import READ_DEADLINE_S, Risk, Tool

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
    name: str,
    handler: Callable[[ToolContext, Any], Awaitable[Any]],
    args_type: type,
    result_type: type,
    permission: str,
    title: str,
    description: str,
    risk: Risk = "low",
) -> Tool:
    """An AI read tool: version 1.0.0, effect read, 5 s deadline, offered to AI clients."""
    return Tool(
        name=name, version="1.0.0", effect="read", risk=risk, permissions=(permission,),
        args_type=args_type, result_type=result_type, handler=handler, deadline_s=READ_DEADLINE_S,
        title=title, description=description, ai=True,
    )


V = TypeVar("V", bound=msgspec.Struct)


def view(row: msgspec.Struct, view_type: type[V]) -> V:
    """Project a validated row onto a view: the view's fields are the whitelist."""
    return view_type(**{name: getattr(row, name) for name in view_type.__struct_fields__})


def readers(ctx: ToolContext) -> Readers:
    found = ctx.services.readers
    if not isinstance(found, Readers):
        raise unavailable("the read tools have no storage in this daemon")
    return found


async def read_run(ctx: ToolContext, run_id: str) -> RunSummary | None:
    """One project-scoped point read of a run, re-validated; None when there is no such run here."""
    row = await readers(ctx).runs.get(ctx.project, run_id)
    if row is None:
        return None
    run = valid_row(row, RunSummary, ctx.project)
    if run.id != run_id:
        raise storage_fault("a different run than was asked for")
    return run


class RunView(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """The run projection; times are UTC epoch ms, null while unknown."""

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


def run_view(run: RunSummary) -> RunView:
    return view(run, RunView)


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
