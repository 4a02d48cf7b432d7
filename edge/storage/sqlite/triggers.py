"""Triggers: heads, immutable revisions (each pinned to one task revision) and the events
of fires that did not become runs. Admission, which turns fires into runs, is
edge.storage.sqlite.admission."""

from __future__ import annotations

import functools
import apsw
import msgspec

from edge.core.errors import conflict, invalid, not_found
from edge.core.schedule import ONCE, REBOOT, Schedule, ScheduleError
from edge.core.tasks import content_digest
from edge.core.triggers import SPEC_SCHEMA, CronSpec, Trigger, TriggerEvent, stored_spec
from edge.storage.sqlite.db import Database, immediate, rows

_spec_encoder = msgspec.json.Encoder()

EVENTS_PER_TRIGGER = 100  # newest events kept per trigger
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per write, converges over writes
CLOCK_KEY = "clock.newest_ms"  # the newest wall-clock time the scheduler saw (meta table)

_SELECT = """
SELECT h.project_id, h.id, h.revision, h.task_id, h.task_revision, h.enabled, r.spec_schema, r.spec,
       r.content_digest, h.created_at_ms, h.updated_at_ms, h.next_fire_at_ms, h.last_scheduled_at_ms
FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
"""
SQL_GET = _SELECT + "WHERE h.project_id = ? AND h.id = ?"
SQL_LIST = _SELECT + "WHERE h.project_id = ? AND h.id > ? ORDER BY h.id LIMIT ?"
SQL_FOLLOWING = "SELECT id FROM triggers WHERE project_id = ? AND task_id = ? AND task_revision = ?"
_EVENT_COLUMNS = "id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms, fires, created_at_ms"
SQL_EVENTS_TRIGGER = (
    f"SELECT {_EVENT_COLUMNS} FROM trigger_events WHERE project_id = ? AND trigger_id = ? AND id < ?"
    " ORDER BY id DESC LIMIT ?"
)
SQL_EVENTS_PROJECT = (
    f"SELECT {_EVENT_COLUMNS} FROM trigger_events WHERE project_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
)
SQL_NEWEST_EVENT = (
    "SELECT id, type, reason, coalesce(last_scheduled_for_ms, scheduled_for_ms), fires FROM trigger_events"
    " WHERE project_id = ? AND trigger_id = ? ORDER BY id DESC LIMIT 1"
)
SQL_PRUNE_EVENTS = (
    "DELETE FROM trigger_events WHERE id IN (SELECT id FROM trigger_events WHERE project_id = ? AND trigger_id = ?"
    " ORDER BY id DESC LIMIT ? OFFSET ?)"
)
_NO_EVENT = 1 << 62


# -- reading ----------------------------------------------------------------------


def _trigger(row: tuple) -> Trigger:
    project, tid, revision, task_id, task_rev, enabled, schema, spec, digest, created, updated, nxt, last = row
    return Trigger(
        id=tid, project_id=project, revision=revision, task_id=task_id, task_revision=task_rev,
        enabled=bool(enabled), spec_schema=schema, spec=stored_spec(schema, spec), content_digest=digest,
        created_at_ms=created, updated_at_ms=updated, next_fire_at_ms=nxt, last_scheduled_at_ms=last,
    )


def get(conn: apsw.Connection, project: str, trigger_id: str) -> Trigger | None:
    row = conn.execute(SQL_GET, (project, trigger_id)).fetchone()
    return _trigger(row) if row else None


def page(conn: apsw.Connection, project: str, after: str, limit: int) -> list[Trigger]:
    return [_trigger(row) for row in conn.execute(SQL_LIST, (project, after, limit))]


def events(
    conn: apsw.Connection, project: str, trigger_id: str | None, before: int | None, limit: int
) -> list[TriggerEvent]:
    before = _NO_EVENT if before is None else before
    if trigger_id is None:
        rows = conn.execute(SQL_EVENTS_PROJECT, (project, before, limit))
    else:
        rows = conn.execute(SQL_EVENTS_TRIGGER, (project, trigger_id, before, limit))
    return [TriggerEvent(id=r[0], trigger_id=r[1], type=r[2], reason=r[3], scheduled_for_ms=r[4],
                         last_scheduled_for_ms=r[5], fires=r[6], created_at_ms=r[7]) for r in rows]


# -- writing ----------------------------------------------------------------------


def _schedule(spec: CronSpec) -> Schedule:
    try:
        return spec.schedule()
    except ScheduleError as exc:
        raise invalid(str(exc)) from None


def clock_mark(conn: apsw.Connection) -> int:
    """The newest wall-clock time the scheduler saved (0 when none)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (CLOCK_KEY,)).fetchone()
    return row[0] if row and isinstance(row[0], int) else 0


SQL_NEWEST_RUN = "SELECT max(created_at_ms) FROM runs WHERE project_id = ?"


def newest_time(conn: apsw.Connection, project: str) -> int:
    """The newest wall-clock time on record: saved by the scheduler, or stamped on a run
    or an audit row (every tool call writes one)."""
    audit = conn.execute(  # an aggregate of refused calls: its last call
        "SELECT max(at_ms, coalesce(last_at_ms, at_ms)) FROM security_audit ORDER BY id DESC LIMIT 1").fetchone()
    run = conn.execute(SQL_NEWEST_RUN, (project,)).fetchone()
    return max([clock_mark(conn)] + [r[0] for r in (audit, run) if r and isinstance(r[0], int)])


def arm_mark(conn: apsw.Connection, project: str, now: int) -> int:
    """From when a trigger made now is armed: the newest time on record, not the wall clock
    (a trigger made while the clock still says 1970 must not count half a century of
    missed fires once it is set)."""
    return max(now, newest_time(conn, project))


def _arm(conn: apsw.Connection, project: str, schedule: Schedule, now: int, mark: int | None = None) -> int | None:
    mark = arm_mark(conn, project, now) if mark is None else mark
    if schedule.event == REBOOT:
        return None  # armed by the next boot (admission.arm_boot), not by being created or enabled
    if schedule.event == ONCE:
        return mark  # due at once, or when the clock has caught up
    return _next_fire(schedule.expression, schedule.zone_name, mark)


@functools.lru_cache(maxsize=1024)
def _next_fire(expression: str, zone: str, after_ms: int) -> int | None:
    """Remembered: the triggers an import makes in one transaction share a few schedules and one mark."""
    return Schedule(expression, zone).next_after(after_ms)


def _task_revision(conn: apsw.Connection, project: str, task_id: str, wanted: int | None) -> int:
    row = conn.execute("SELECT revision FROM tasks WHERE project_id = ? AND id = ?", (project, task_id)).fetchone()
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if wanted is None:
        return row[0]
    if conn.execute(
        "SELECT 1 FROM task_revisions WHERE project_id = ? AND task_id = ? AND revision = ?", (project, task_id, wanted)
    ).fetchone() is None:
        raise not_found(f"task {task_id!r} has no revision {wanted}")
    return wanted


def _insert_revision(conn: apsw.Connection, t: Trigger) -> None:
    conn.execute(
        "INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision, enabled,"
        " spec_schema, spec, content_digest, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (t.project_id, t.id, t.revision, t.task_id, t.task_revision, int(t.enabled), SPEC_SCHEMA,
         _spec_encoder.encode(t.spec).decode(), t.content_digest, t.updated_at_ms),
    )


def _free_id(conn: apsw.Connection, project: str, task_id: str) -> str:
    """`<task>-1`, `<task>-2`, …: short names people can type."""
    for n in range(1, 10_000):
        suffix = f"-{n}"
        candidate = task_id[: 128 - len(suffix)] + suffix
        taken = conn.execute("SELECT 1 FROM triggers WHERE project_id = ? AND id = ?", (project, candidate)).fetchone()
        if taken is None:
            return candidate
    raise conflict(f"task {task_id!r} has too many triggers")


def insert(
    conn: apsw.Connection, project: str, trigger_id: str | None, task_id: str, task_revision: int | None,
    spec: CronSpec, now: int, enabled: bool = True, mark: int | None = None,
) -> Trigger:
    """A new trigger, inside the caller's transaction (`mark`: arm_mark, when the caller has it)."""
    schedule = _schedule(spec)
    pin = _task_revision(conn, project, task_id, task_revision)
    tid = trigger_id or _free_id(conn, project, task_id)
    first = Trigger(
        id=tid, project_id=project, revision=1, task_id=task_id, task_revision=pin, enabled=enabled,
        spec_schema=SPEC_SCHEMA, spec=spec, content_digest=content_digest(spec), created_at_ms=now,
        updated_at_ms=now, next_fire_at_ms=_arm(conn, project, schedule, now, mark) if enabled else None,
    )
    try:
        conn.execute(
            "INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
            " updated_at_ms, next_fire_at_ms) VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?)",
            (project, tid, task_id, pin, int(enabled), now, now, first.next_fire_at_ms),
        )
    except apsw.ConstraintError:
        raise conflict(f"trigger {tid!r} already exists") from None
    _insert_revision(conn, first)
    return first  # what was written, as get would read it back


def create(
    conn: apsw.Connection, project: str, trigger_id: str | None, task_id: str, task_revision: int | None,
    spec: CronSpec, now: int,
) -> Trigger:
    _schedule(spec)  # a bad spec is refused before the transaction
    with immediate(conn):
        return insert(conn, project, trigger_id, task_id, task_revision, spec, now)


def head(conn: apsw.Connection, project: str, trigger_id: str, expected: int | None) -> Trigger:
    trigger = get(conn, project, trigger_id)
    if trigger is None:
        raise not_found(f"trigger {trigger_id!r} not found")
    if expected is not None and trigger.revision != expected:
        raise conflict(f"trigger {trigger_id!r} is at revision {trigger.revision}, not {expected}")
    return trigger


def _revise(
    conn: apsw.Connection, current: Trigger, now: int, enabled: bool, task_revision: int, spec: CronSpec | None = None
) -> Trigger:
    """A new revision with the given flag, pin and (when given) spec; the cursor is re-armed
    on enable and for a new spec."""
    nxt = current.next_fire_at_ms
    if not enabled:
        nxt = None
    elif spec is not None or not current.enabled or nxt is None:
        nxt = _arm(conn, current.project_id, _schedule(spec or current.spec), now)  # missed while disabled: not missed
    revision = current.revision + 1
    changed = {"spec": spec, "content_digest": content_digest(spec)} if spec is not None else {}
    _insert_revision(conn, msgspec.structs.replace(
        current, revision=revision, enabled=enabled, task_revision=task_revision, updated_at_ms=now, **changed))
    conn.execute(
        "UPDATE triggers SET revision = ?, enabled = ?, task_revision = ?, updated_at_ms = ?, next_fire_at_ms = ?"
        " WHERE project_id = ? AND id = ?",
        (revision, int(enabled), task_revision, now, nxt, current.project_id, current.id),
    )
    updated = get(conn, current.project_id, current.id)
    assert updated is not None
    return updated


def set_enabled(
    conn: apsw.Connection, project: str, trigger_id: str, enabled: bool, expected: int | None, now: int
) -> Trigger:
    with immediate(conn):
        current = head(conn, project, trigger_id, expected)
        armed = current.next_fire_at_ms is not None or current.spec.expression == REBOOT
        if current.enabled == enabled and (not enabled or armed):
            return current
        return _revise(conn, current, now, enabled, current.task_revision)


def repin(
    conn: apsw.Connection, project: str, trigger_id: str, task_revision: int | None, expected: int | None, now: int
) -> Trigger:
    with immediate(conn):
        current = head(conn, project, trigger_id, expected)
        pin = _task_revision(conn, project, current.task_id, task_revision)
        if pin == current.task_revision:
            return current
        return _revise(conn, current, now, current.enabled, pin)


def disable_fired(conn: apsw.Connection, trigger: Trigger, now: int) -> None:
    """A one-shot (`@once`) that has fired disables itself, by a new revision."""
    _revise(conn, trigger, now, False, trigger.task_revision)


def update(
    conn: apsw.Connection, project: str, trigger_id: str, spec: CronSpec, expected: int | None, now: int
) -> Trigger:
    _schedule(spec)  # refused before the transaction: a spec that cannot fire is never stored
    with immediate(conn):
        current = head(conn, project, trigger_id, expected)
        if current.spec == spec:
            return current
        return _revise(conn, current, now, current.enabled, current.task_revision, spec)


def follow_task(conn: apsw.Connection, project: str, task_id: str, old: int, new: int, now: int) -> None:
    """Triggers pinned to a task's current revision move with it (inside the task's
    transaction), each by a new trigger revision. Triggers pinned elsewhere stay."""
    for (tid,) in rows(conn, SQL_FOLLOWING, (project, task_id, old)):
        current = get(conn, project, tid)
        assert current is not None
        _revise(conn, current, now, current.enabled, new)


def delete(conn: apsw.Connection, project: str, trigger_id: str, expected: int | None) -> None:
    with immediate(conn):
        head(conn, project, trigger_id, expected)
        conn.execute("DELETE FROM triggers WHERE project_id = ? AND id = ?", (project, trigger_id))


def record_event(
    conn: apsw.Connection, project: str, trigger_id: str, kind: str, reason: str,
    first: int, last: int | None, fires: int | None, now: int, last_admitted: int | None,
) -> bool:
    """Record fires that did not run, merged into the newest event when that one has the
    same outcome and no run was admitted since (a disabled task skips quietly, once).
    Call inside the admission transaction; prunes the trigger's oldest events, bounded.
    True when a new event was recorded (not merged into the newest)."""
    newest = conn.execute(SQL_NEWEST_EVENT, (project, trigger_id)).fetchone()
    if newest and newest[1:3] == (kind, reason) and (last_admitted is None or (newest[3] or 0) > last_admitted):
        if newest[3] is not None and newest[3] >= first:
            return False  # the same fire again (a retry): already on record
        count = None if newest[4] is None or fires is None else newest[4] + fires
        conn.execute("UPDATE trigger_events SET fires = ?, last_scheduled_for_ms = ? WHERE id = ?",
                     (count, last, newest[0]))
        return False
    conn.execute(
        "INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms,"
        " fires, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (project, trigger_id, kind, reason, first, last, fires, now),
    )
    conn.execute(SQL_PRUNE_EVENTS, (project, trigger_id, PRUNE_BATCH, EVENTS_PER_TRIGGER))
    return True


class SqliteTriggerStore:
    """TriggerStore (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec,
        now_ms: int,
    ) -> Trigger:
        return await self._db.run(create, project, trigger_id, task_id, task_revision, spec, now_ms)

    async def get(self, project: str, trigger_id: str) -> Trigger | None:
        return await self._db.run(get, project, trigger_id)

    async def page(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        return await self._db.run(page, project, after or "", limit)

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.run(set_enabled, project, trigger_id, enabled, expected_revision, now_ms)

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.run(repin, project, trigger_id, task_revision, expected_revision, now_ms)

    async def update(
        self, project: str, trigger_id: str, spec: CronSpec, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.run(update, project, trigger_id, spec, expected_revision, now_ms)

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None:
        await self._db.run(delete, project, trigger_id, expected_revision)

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        return await self._db.run(events, project, trigger_id, before_id, limit)
