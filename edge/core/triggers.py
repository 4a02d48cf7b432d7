"""Triggers: a head plus immutable revisions of a `qinglong/cron@v1` spec, each pinned
to one task revision. The scheduler only ever runs the task revision a trigger names."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from edge.core.runs import Run
from edge.core.schedule import Misfire, Schedule
from edge.core.tasks import ImportTask, TaskSpec, unknown_schema

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


_stored = msgspec.json.Decoder(CronSpec)


def stored_spec(schema: object, raw: str | bytes) -> CronSpec:
    """A stored trigger spec, decoded only under the one schema a trigger has: an unknown
    one fails closed (`unavailable`), never read as if it were valid."""
    if schema != SPEC_SCHEMA:
        raise unknown_schema("trigger", schema)
    try:
        return _stored.decode(raw)
    except msgspec.DecodeError:
        raise unknown_schema("trigger", schema) from None


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


class SkippedFires(msgspec.Struct, frozen=True):
    """Fires of one admission that did not become runs, with one outcome."""

    task_id: str
    type: EventType
    reason: SkipReason
    first_ms: int
    last_ms: int | None
    fires: int | None  # None: more than could be counted


class Admission(msgspec.Struct):
    """The outcome of one admission transaction."""

    runs: list[Run] = []  # admitted and queued: hand them to the runner
    skipped: list[SkippedFires] = []  # recorded as trigger events, in fire order
    cancel: list[str] = []  # active runs the new ones replace (overlap `replace`)
    cursor: int | None = None  # the trigger's next fire; None: not armed any more
    gone: bool = False  # the trigger was deleted
    retry: bool = False  # could not be planned (zone data missing): try again later
    notified: int = 0  # notifications queued for fires that did not run


class PlannedTask(msgspec.Struct, frozen=True, kw_only=True):
    """A task an import writes: created (`expected` None) or given a new revision at the
    head it was planned against (`expected`: compare-and-set), with its name and flag."""

    id: str
    name: str
    spec: TaskSpec
    enabled: bool
    privileged: bool  # its writer held task.privileged (Task.privileged)
    expected: int | None = None


class PlannedTrigger(msgspec.Struct, frozen=True, kw_only=True):
    """A trigger an import writes, pinned to its task's head: created (`expected` None),
    or revised at the head it was planned against (its spec, its flag); `recreate`: it
    names another task here, so it is deleted and created anew."""

    id: str
    task_id: str
    spec: CronSpec
    enabled: bool
    expected: int | None = None
    recreate: bool = False


class PreparedImport(msgspec.Struct, frozen=True, kw_only=True):
    """An import's task (crond, qinglong) as checked for its writer: its triggers' specs and
    whether the writer held task.privileged (TaskStore.import_tasks)."""

    item: ImportTask
    triggers: list[CronSpec]
    privileged: bool


class ImportPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What an import writes, checked before anything is: one transaction (TaskStore.apply_import)."""

    tasks: list[PlannedTask] = []
    triggers: list[PlannedTrigger] = []


class ManualAdmission(msgspec.Struct, frozen=True):
    """A manual start: the queued run, and the active runs it replaces (overlap `replace`)."""

    run: Run
    replaces: list[str] = []
