"""Narrow readers behind the AI read tools, the rows they return, and the guards on them.

Each reader returns the few columns one projection needs, scoped by project, in a fixed
order and a bounded count. Tools never trust that: every page is re-validated here
(types, constraints, project, order, count) and any anomaly fails the whole call as
`unavailable`, never as partial data. Storage adapters implement the Protocols;
composition wires them as `Services.readers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Protocol, TypeVar

import msgspec

from edge.core.errors import ToolError, unavailable
from edge.core.runs import ActorType, Origin, RunStatus

PAGE_DEFAULT = 32
PAGE_MAX = 64
WINDOW_LIMIT = 64  # task.runs.compare: the newest 64 runs are searched, a 65th proves older ones exist
MAX_SAFE_INT = 2**53 - 1  # what a JSON client can represent exactly

# Identifiers coming from AI clients: no C0/C1 controls, no zero-width or bidi controls.
_SAFE_TEXT = r"^[^\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]+$"
ReadId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_SAFE_TEXT)]
LongTaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=_SAFE_TEXT)]
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=PAGE_MAX)]
Millis = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
Revision = Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]
# What storage may hand back: bounded, control-free text.
_RowText = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=_SAFE_TEXT)]
# A person's free-text label: any characters (projections neutralize controls), bounded.
_RowLabel = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
_Schema = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._/-]*@v[0-9]+$")]
_Digest = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9]+:[0-9a-f]+$")]
_EventType = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]


class TaskHead(msgspec.Struct, frozen=True):
    """A task's current head, without command, environment or digests."""

    project_id: _RowText
    task_id: _RowText
    revision: Revision
    name: _RowLabel
    kind: Literal["argv", "shell"]
    spec_schema: _Schema
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
    spec_schema: _Schema
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


class RunKey(msgspec.Struct, frozen=True):
    """A position in (created_at_ms DESC, id DESC) order."""

    created_at_ms: int
    run_id: str


class TaskHeadReader(Protocol):
    async def list_heads(self, project: str, after: str | None, limit: int) -> list[TaskHead]:
        """Heads with task_id > after, ascending by task_id, at most `limit` rows."""
        ...

    async def get_head(self, project: str, task_id: str) -> TaskDetail | None: ...


class TriggerHeadReader(Protocol):
    async def list_heads(self, project: str, after: str | None, limit: int) -> list[TriggerHead]:
        """Heads with trigger_id > after, ascending by trigger_id, enabled or not, at most `limit` rows."""
        ...


class RunSummaryReader(Protocol):
    async def get(self, project: str, run_id: str) -> RunSummary | None: ...

    async def page(self, project: str, after: RunKey | None, limit: int) -> list[RunSummary]:
        """Runs strictly after `after` in (created_at_ms DESC, id DESC) order, at most `limit` rows."""
        ...

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEventSummary]:
        """Events with sequence > after_sequence, ascending, at most `limit` rows."""
        ...


class TaskRunOutcomeWindowReader(Protocol):
    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        """One read: the task's newest `limit` runs in (created_at_ms DESC, id DESC) order."""
        ...


class Readers:
    """The narrow readers composition hands to the AI read tools."""

    __slots__ = ("tasks", "triggers", "runs", "outcome_window")

    def __init__(
        self,
        *,
        tasks: TaskHeadReader,
        triggers: TriggerHeadReader,
        runs: RunSummaryReader,
        outcome_window: TaskRunOutcomeWindowReader,
    ) -> None:
        self.tasks = tasks
        self.triggers = triggers
        self.runs = runs
        self.outcome_window = outcome_window


# -- guards -----------------------------------------------------------------------

R = TypeVar("R", bound=msgspec.Struct)


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
    for before, after in zip(keys, keys[1:]):
        if (after >= before) if descending else (after <= before):
            raise storage_fault("rows out of order")
