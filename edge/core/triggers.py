"""Triggers: a head plus immutable revisions of a `qinglong/cron@v1` spec, each pinned
to one task revision. The scheduler only ever runs the task revision a trigger names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, Protocol

import msgspec

from edge.core.runs import Run
from edge.core.schedule import Misfire, Schedule
from edge.core.tasks import Task

SPEC_SCHEMA = "qinglong/cron@v1"
MAX_JITTER_S = 3600

EventType = Literal["skipped", "refused"]
# Why a fire did not become a run. Stable codes: tools and people filter on them.
SkipReason = Literal["misfire", "overlap", "task_disabled", "queue_full", "timezone_unavailable"]


class CronSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    expression: Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
    timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._+/-]+$")]
    misfire: Misfire = "skip"
    jitter_s: Annotated[int, msgspec.Meta(ge=0, le=MAX_JITTER_S)] = 0

    def schedule(self) -> Schedule:
        """Raises ScheduleError (one clear line) for a bad expression or a missing zone."""
        return Schedule(self.expression, self.timezone)


class Trigger(msgspec.Struct, rename="camel"):
    id: str
    project_id: str
    revision: int
    task_id: str
    task_revision: int
    enabled: bool
    spec_schema: str
    spec: CronSpec
    content_digest: str
    created_at_ms: int
    updated_at_ms: int
    next_fire_at_ms: int | None = None  # the durable cursor: the next fire not yet handled
    last_scheduled_at_ms: int | None = None  # scheduled time of the newest run it admitted


class TriggerEvent(msgspec.Struct, rename="camel"):
    """Fires that did not become runs. Consecutive fires with the same outcome share one
    event: `fires` counts them (None: more than could be counted) from `scheduled_for_ms`
    to `last_scheduled_for_ms`."""

    id: int
    trigger_id: str
    type: EventType
    reason: str
    scheduled_for_ms: int | None
    last_scheduled_for_ms: int | None
    fires: int | None
    created_at_ms: int


class Admission(msgspec.Struct):
    """The outcome of one admission transaction."""

    runs: list[Run] = []  # admitted and queued: hand them to the runner
    cancel: list[str] = []  # active runs the new ones replace (overlap `replace`)
    cursor: int | None = None  # the trigger's next fire; None: not armed any more
    gone: bool = False  # the trigger was deleted
    retry: bool = False  # could not be planned (zone data missing): try again later


class TriggerStore(Protocol):
    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec, now_ms: int
    ) -> Trigger:
        """Pin to `task_revision`, or to the task's current revision when None."""
        ...

    async def get(self, project: str, trigger_id: str) -> Trigger | None: ...

    async def list(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        """Current heads in trigger id order, disabled ones included."""
        ...

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger: ...

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger: ...

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None: ...

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        """Newest first."""
        ...


class SchedulerStore(Protocol):
    """What the scheduler loop needs from storage."""

    async def armed(self, project: str) -> list[tuple[int, str]]:
        """(next_fire_at_ms, trigger_id) of every enabled trigger that will fire."""
        ...

    async def admit(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        """One transaction: plan the due fires, admit, record skips, move the cursor."""
        ...

    async def newest_time(self, project: str) -> int:
        """The newest wall-clock time the store has seen (for clock sanity)."""
        ...

    async def save_time(self, now_ms: int) -> None: ...


class RunAdmission(Protocol):
    """Manual starts go through the same overlap policy and queue bound as fires."""

    async def admit_manual(self, task: Task, actor: str, now_ms: int) -> tuple[Run, list[str]]:
        """The queued run and the ids of active runs it replaces."""
        ...
