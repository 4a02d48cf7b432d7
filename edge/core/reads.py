"""The rows the narrow readers return (edge.core.ports.stores), the guards on them, and
the keyset-page idiom every list tool shares.

Each reader returns the few columns one projection needs, scoped by project, in a fixed
order and a bounded count. Tools never trust that: every page is re-validated here
(types, constraints, project, order, count) and any anomaly fails the whole call as
`unavailable`, never as partial data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from edge.core.errors import ToolError, unavailable
from edge.core.runs import ActorType, Origin, RunStatus
from edge.core.text import MAX_SAFE_INT, SAFE_TEXT, Millis, Revision

PAGE_DEFAULT = 32
# Index entries one filtered page may examine: a filter that matches rarely still costs a
# bounded read per page, and the page says where to go on (RunStore.search, AuditReader).
SEARCH_BUDGET = 512
WINDOW_LIMIT = 64  # task.runs.compare: the newest 64 runs are searched, a 65th proves older ones exist

# What storage may hand back: bounded, control-free text.
_RowText = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=SAFE_TEXT)]
# A person's free-text label: any characters (projections neutralize controls), bounded.
_RowLabel = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
# The schemas this qledge knows (edge.core.tasks, edge.core.triggers): a row under any other,
# however well formed, fails the read closed (`unavailable`), never passed through.
_TaskSchema = Literal["qinglong/command@v1", "qinglong/agent@v1"]
_TriggerSchema = Literal["qinglong/cron@v1"]
_Digest = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9]+:[0-9a-f]+$")]
_EventType = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]


class TaskHead(msgspec.Struct, frozen=True):
    """A task's current head, without command, environment or digests."""

    project_id: _RowText
    task_id: _RowText
    revision: Revision
    name: _RowLabel
    kind: Literal["argv", "shell", "agent"]
    spec_schema: _TaskSchema
    enabled: bool
    updated_at_ms: Millis


class TaskDetail(TaskHead, frozen=True):
    content_digest: _Digest
    created_at_ms: Millis


class TriggerHead(msgspec.Struct, frozen=True):
    """A trigger's current head: never its cron expression, timezone, misfire or digests."""

    project_id: _RowText
    trigger_id: _RowText
    revision: Revision
    task_id: _RowText
    task_revision: Revision
    spec_schema: _TriggerSchema
    enabled: bool
    updated_at_ms: Millis


class RunSummary(msgspec.Struct, frozen=True):
    """The low-sensitivity columns of a run (plus log_bytes, which only the log tool reads)."""

    id: _RowText
    project_id: _RowText
    task_id: _RowText
    task_revision: Revision
    status: RunStatus
    origin: Origin
    created_at_ms: Millis
    queued_at_ms: Millis | None
    started_at_ms: Millis | None
    finished_at_ms: Millis | None
    exit_code: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] | None
    log_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
    retry_of: _RowText | None = None  # the run this one retries (origin `retry`)


class RunEventSummary(msgspec.Struct, frozen=True):
    run_id: _RowText
    project_id: _RowText
    sequence: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]
    type: _EventType
    actor_type: ActorType
    created_at_ms: Millis


class OutcomeRow(msgspec.Struct, frozen=True):
    """Exactly the five columns the task outcome window may read."""

    id: _RowText
    project_id: _RowText
    task_id: _RowText
    status: RunStatus
    created_at_ms: Millis


class Counts(msgspec.Struct, rename="camel"):
    """What `qledge status` counts."""

    tasks: int
    triggers: int
    runs: int
    active_runs: int
    credentials: int


# -- guards -----------------------------------------------------------------------

R = TypeVar("R", bound=msgspec.Struct)
P = TypeVar("P")


def keyset(rows: list[P], limit: int) -> tuple[list[P], P | None]:
    """A page read with `limit + 1` rows: the page, and its last row when there is more
    (the extra row only proves that; it is never returned)."""
    page = rows[:limit]
    return page, (page[-1] if len(rows) > limit else None)


def storage_fault(what: str) -> ToolError:
    return unavailable(f"storage returned {what}; nothing is returned")


def valid_row(row: Any, row_type: type[R], project: str) -> R:
    """Re-validate one row against its declared constraints and the caller's project."""
    if type(row) is not row_type:
        raise storage_fault(f"a malformed {row_type.__name__} row")
    try:
        checked = msgspec.convert(msgspec.to_builtins(row), row_type)
    except (msgspec.ValidationError, TypeError):
        raise storage_fault(f"a malformed {row_type.__name__} row") from None
    if checked.project_id != project:  # type: ignore[attr-defined]
        raise storage_fault("a row of another project")
    return checked


def valid_page(
    rows: Any, row_type: type[R], project: str, limit: int, key: Callable[[R], Any], descending: bool = False
) -> list[R]:
    """Re-validate a page: a list of at most `limit` valid rows, strictly ordered by `key`."""
    if not isinstance(rows, list):
        raise storage_fault(f"a malformed {row_type.__name__} page")
    if len(rows) > limit:
        raise storage_fault("more rows than were asked for")
    checked = [valid_row(row, row_type, project) for row in rows]
    strictly_ordered([key(r) for r in checked], descending)
    return checked


def strictly_ordered(keys: Sequence[Any], descending: bool = False) -> None:
    for before, after in zip(keys, keys[1:], strict=False):
        if (after >= before) if descending else (after <= before):
            raise storage_fault("rows out of order")
