"""Admission: the one transaction in which a fire or a manual start becomes a queued run,
is skipped, or is refused; and the clock mark that keeps scheduling sane across a
router's 1970 boot. Implements RunAdmission (edge.core.ports.stores)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import apsw

from edge.core.errors import ToolError, conflict, not_found
from edge.core.ids import uuid7
from edge.core.runs import ActorType, Followers, Run
from edge.core.schedule import ONCE, REBOOT, ScheduleError, plan
from edge.core.tasks import Task
from edge.core.triggers import Admission, EventType, ManualAdmission, SkipReason, SkippedFires, Trigger
from edge.storage.sqlite import runs as run_sql
from edge.storage import catalog
from edge.storage.sqlite.sql import CATALOG
from edge.storage.sqlite.db import Database, SqliteTx, immediate, one

log = logging.getLogger("qledge.store")

SQL_ARMED = (
    "SELECT next_fire_at_ms, id FROM triggers WHERE project_id = ? AND next_fire_at_ms IS NOT NULL"
    " ORDER BY next_fire_at_ms"
)
# The task revision a run will execute: its enabled flag (the head's) and overlap policy.
SQL_PINNED_TASK = """
SELECT t.enabled, coalesce(json_extract(r.spec, '$.overlap'), 'forbid')
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
WHERE t.project_id = ? AND t.id = ? AND r.revision = ?
"""
SQL_ACTIVE_FOR_TASK = "SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND status IN ('queued', 'running')"
# The runner's slots and queue are shared by every project it runs.
SQL_ACTIVE_COUNT = "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
SQL_BY_KEY = "SELECT id FROM runs WHERE idempotency_key = ?"
SQL_MOVE_CURSOR = "UPDATE triggers SET next_fire_at_ms = ?, last_scheduled_at_ms = ? WHERE project_id = ? AND id = ?"
# Enabled `@reboot` triggers, armed once per boot of the device.
SQL_REBOOT_TRIGGERS = """
SELECT h.id FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
WHERE h.project_id = ? AND h.enabled = 1 AND json_extract(r.spec, '$.expression') = ?
"""
SQL_SET_META = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
SQL_SAVE_TIME = (
    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)


SQL_ARMED_RETRIES = (
    "SELECT retry_due_at_ms, id FROM runs WHERE project_id = ? AND retry_due_at_ms IS NOT NULL ORDER BY retry_due_at_ms"
)


def armed(conn: apsw.Connection, project: str) -> list[tuple[int, str]]:
    return [(nxt, tid) for nxt, tid in conn.execute(SQL_ARMED, (project,))]


def armed_retries(conn: apsw.Connection, project: str) -> list[tuple[int, str]]:
    return [(due, rid) for due, rid in conn.execute(SQL_ARMED_RETRIES, (project,))]


def newest_time(conn: apsw.Connection, project: str) -> int:
    return catalog.newest_time(SqliteTx(conn), CATALOG, project)


SQL_NEWEST_RUN = CATALOG.newest_run


def save_time(conn: apsw.Connection, now: int) -> None:
    conn.execute(SQL_SAVE_TIME, (catalog.CLOCK_KEY, now))


def _save_time_tx(conn: apsw.Connection, now: int) -> None:
    with immediate(conn):
        save_time(conn, now)


# What age retention and run lists order by: the times of runs, their events and the audit.
RESTAMPED = (
    ("runs", ("created_at_ms", "queued_at_ms", "started_at_ms", "finished_at_ms", "log_dropped_at_ms",
              "retry_due_at_ms")),
    ("run_events", ("created_at_ms",)),
    ("security_audit", ("at_ms",)),
    ("notifications", ("first_at_ms", "created_at_ms", "due_at_ms", "done_at_ms")),
    ("notify_attempts", ("at_ms",)),
    ("failing_tasks", ("since_ms",)),
)


def restamp(conn: apsw.Connection, after: int, upto: int, shift: int) -> int:
    """Move every time in (after, upto] of RESTAMPED by `shift`, in one transaction;
    returns how many runs moved. Rare (once per boot with an unset clock), so it may walk
    those tables."""
    with immediate(conn):
        moved = 0
        for table, columns in RESTAMPED:
            # A NULL time stays NULL; (c > ?1 AND c <= ?2) is 1 inside the range, else 0.
            sets = ", ".join(f"{c} = {c} + ?3 * ({c} > ?1 AND {c} <= ?2)" for c in columns)
            where = " OR ".join(f"({c} > ?1 AND {c} <= ?2)" for c in columns)
            conn.execute(f"UPDATE {table} SET {sets} WHERE {where}", (after, upto, shift))
            if table == "runs":
                moved = conn.changes()
        save_time(conn, upto + shift)
    return moved


def _gate(
    conn: apsw.Connection, project: str, task_id: str, overlap: str, capacity: int, replacing: list[str]
) -> tuple[SkipReason | None, str | None]:
    """(None, None) when a new run may be queued, else (reason, blocking run id).
    Under `replace` the active runs are added to `replacing` instead."""
    active = [r for (r,) in conn.execute(SQL_ACTIVE_FOR_TASK, (project, task_id)) if r not in replacing]
    if active and overlap == "forbid":
        return "overlap", active[0]
    if active and overlap == "replace":
        replacing.extend(active)
    if one(conn, SQL_ACTIVE_COUNT)[0] - len(replacing) >= capacity:
        return "queue_full", None
    return None, None


def _boot_key(project: str) -> str:
    return f"boot.id:{project}"


def _seen_boot(conn: apsw.Connection, key: str) -> object:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def arm_boot(conn: apsw.Connection, project: str, boot_id: str, at: int) -> int:
    """Once per boot: when `boot_id` is not the one on record, record it and arm every
    enabled `@reboot` trigger to fire at `at`; returns how many were armed. A daemon
    restarted within the same boot arms nothing; one that dies after arming finds the
    cursors armed and fires them then (once: the fire clears the cursor)."""
    key = _boot_key(project)
    if _seen_boot(conn, key) == boot_id:
        return 0  # a restart within the boot: a read, no write
    with immediate(conn):
        if _seen_boot(conn, key) == boot_id:
            return 0
        conn.execute(SQL_SET_META, (key, boot_id))
        ids = [tid for (tid,) in conn.execute(SQL_REBOOT_TRIGGERS, (project, REBOOT))]
        for tid in ids:
            conn.execute("UPDATE triggers SET next_fire_at_ms = ? WHERE project_id = ? AND id = ?", (at, project, tid))
    return len(ids)


def _scheduled_run(trig: Trigger, fire: int, origin: str, now: int, jitter: int | None, key: str | None = None) -> Run:
    return Run(
        id=uuid7(now), project_id=trig.project_id, task_id=trig.task_id, task_revision=trig.task_revision,
        origin=origin, status="queued", version=1, event_seq=1, created_at_ms=now,  # type: ignore[arg-type]
        trigger_id=trig.id, trigger_revision=trig.revision, queued_at_ms=now, scheduled_for_ms=fire,
        idempotency_key=key or f"cron:{trig.id}:{trig.revision}:{fire}", jitter_ms=jitter,
    )


def _admit_event(
    conn: apsw.Connection, trig: Trigger, event: str, now: int, capacity: int, rng: Callable[[], float]
) -> Admission:
    """`@reboot` and `@once`: one fire, now (after the clock-sync hold, which kept it from
    being due earlier), under the same gates as any fire; then the trigger is unarmed, and
    a one-shot disables itself. Call inside the admission transaction."""
    project = trig.project_id
    if event == REBOOT:
        key = f"boot:{trig.id}:{_seen_boot(conn, _boot_key(project))}"  # once per boot, whatever the revision
    else:
        key = f"once:{trig.id}:{trig.revision}"  # re-enabling makes a new revision, and a new shot
    enabled, overlap = one(conn, SQL_PINNED_TASK, (project, trig.task_id, trig.task_revision))
    replacing: list[str] = []
    reason: SkipReason | None = "task_disabled" if not enabled else _gate(
        conn, project, trig.task_id, overlap, capacity, replacing)[0]
    admitted: list[Run] = []
    skipped: list[SkippedFires] = []
    last_admitted = trig.last_scheduled_at_ms
    notified = 0
    if reason is not None:
        kind: EventType = "refused" if reason == "queue_full" else "skipped"
        if catalog.record_event(SqliteTx(conn), CATALOG, project, trig.id, kind, reason, now, now, 1, now, last_admitted):
            notified = run_sql.queue_skip(conn, project, trig.task_id, trig.task_revision, reason, now)
        skipped.append(SkippedFires(trig.task_id, kind, reason, now, now, 1))
    elif conn.execute(SQL_BY_KEY, (key,)).fetchone() is None:
        jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
        admitted.append(run_sql.insert(conn, _scheduled_run(trig, now, "scheduled", now, jitter, key), "scheduler"))
        last_admitted = now
    conn.execute(SQL_MOVE_CURSOR, (None, last_admitted, project, trig.id))
    if event == ONCE:
        current = catalog.get_trigger(SqliteTx(conn), CATALOG, project, trig.id)
        assert current is not None
        catalog.disable_fired(SqliteTx(conn), CATALOG, current, now)
    if not admitted:  # an admitted run carries the time itself (newest_time reads it)
        save_time(conn, now)
    return Admission(runs=admitted, cancel=replacing, cursor=None, skipped=skipped, notified=notified)


def admit_fires(
    conn: apsw.Connection, project: str, trigger_id: str, now: int, grace_ms: int, capacity: int,
    rng: Callable[[], float],
) -> Admission:
    """Admit what is due of one trigger: plan, runs with their events, skipped and
    refused fires, the cursor and the clock mark, all in one transaction."""
    with immediate(conn):
        trig = catalog.get_trigger(SqliteTx(conn), CATALOG, project, trigger_id)
        if trig is None:
            return Admission(gone=True)
        if not trig.enabled or trig.next_fire_at_ms is None:
            return Admission(cursor=None)
        try:
            schedule = trig.spec.schedule()
        except ScheduleError:  # zone data went missing: keep the cursor, say so once, retry later
            catalog.record_event(SqliteTx(conn), CATALOG, project, trig.id, "refused", "timezone_unavailable", trig.next_fire_at_ms,
                                     trig.next_fire_at_ms, 1, now, trig.last_scheduled_at_ms)
            due = trig.next_fire_at_ms
            refused = SkippedFires(trig.task_id, "refused", "timezone_unavailable", due, due, 1)
            return Admission(cursor=trig.next_fire_at_ms, retry=True, skipped=[refused])
        if schedule.event is not None:
            if now < trig.next_fire_at_ms:
                return Admission(cursor=trig.next_fire_at_ms)  # not due yet (the clock went back)
            return _admit_event(conn, trig, schedule.event, now, capacity, rng)
        todo = plan(schedule, trig.next_fire_at_ms, now, trig.spec.misfire, grace_ms)
        if not todo.admit and todo.missed is None:
            if todo.cursor != trig.next_fire_at_ms:  # the cursor was no fire time (zone rules changed)
                conn.execute(SQL_MOVE_CURSOR, (todo.cursor, trig.last_scheduled_at_ms, project, trig.id))
            return Admission(cursor=todo.cursor)  # nothing due yet
        last_admitted = trig.last_scheduled_at_ms
        notified = 0
        skipped: list[SkippedFires] = []
        if todo.missed is not None:
            m = todo.missed
            if catalog.record_event(SqliteTx(conn), CATALOG, project, trig.id, "skipped", "misfire", m.first_ms, m.last_ms, m.fires,
                                        now, last_admitted):
                notified += run_sql.queue_skip(conn, project, trig.task_id, trig.task_revision, "misfire", now)
            skipped.append(SkippedFires(trig.task_id, "skipped", "misfire", m.first_ms, m.last_ms, m.fires))
        enabled, overlap = one(conn, SQL_PINNED_TASK, (project, trig.task_id, trig.task_revision))
        admitted: list[Run] = []
        replacing: list[str] = []
        for fire, origin in todo.admit:
            reason: SkipReason | None = "task_disabled" if not enabled else _gate(
                conn, project, trig.task_id, overlap, capacity, replacing)[0]
            if reason is not None:
                kind: EventType = "refused" if reason == "queue_full" else "skipped"
                if catalog.record_event(SqliteTx(conn), CATALOG, project, trig.id, kind, reason, fire, fire, 1, now, last_admitted):
                    notified += run_sql.queue_skip(conn, project, trig.task_id, trig.task_revision, reason, now)
                skipped.append(SkippedFires(trig.task_id, kind, reason, fire, fire, 1))
                continue
            if conn.execute(SQL_BY_KEY, (f"cron:{trig.id}:{trig.revision}:{fire}",)).fetchone() is not None:
                continue  # admitted before: the key makes a repeat impossible
            jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
            admitted.append(run_sql.insert(conn, _scheduled_run(trig, fire, origin, now, jitter), "scheduler"))
            last_admitted = fire
        conn.execute(SQL_MOVE_CURSOR, (todo.cursor, last_admitted, project, trig.id))
        if not admitted:  # an admitted run carries the time itself (newest_time reads it): one page less
            save_time(conn, now)
    return Admission(runs=admitted, cancel=replacing, cursor=todo.cursor, skipped=skipped, notified=notified)


def admit_retry(conn: apsw.Connection, project: str, run_id: str, now: int, capacity: int) -> Admission:
    """The retry of a failed run, once due: a new run under the same gates as any fire, or
    the refusal on record (a trigger event when the run came from a trigger, and an event
    on the failed run). The pending retry is cleared either way."""
    with immediate(conn):
        failed = run_sql.get(conn, project, run_id)
        if failed is None or failed.retry_due_at_ms is None:
            return Admission(gone=True)
        if now < failed.retry_due_at_ms:
            return Admission(cursor=failed.retry_due_at_ms)
        conn.execute("UPDATE runs SET retry_due_at_ms = NULL WHERE id = ?", (run_id,))
        pinned = conn.execute(SQL_PINNED_TASK, (project, failed.task_id, failed.task_revision)).fetchone()
        replacing: list[str] = []
        if pinned is None:
            reason: str | None = "task_disabled"
        elif not pinned[0]:
            reason = "task_disabled"
        else:
            reason = _gate(conn, project, failed.task_id, pinned[1], capacity, replacing)[0]
        key = f"retry:{failed.id}"
        if reason is not None:
            kind = "refused" if reason == "queue_full" else "skipped"
            if failed.trigger_id is not None and catalog.get_trigger(SqliteTx(conn), CATALOG, project, failed.trigger_id) is not None:
                catalog.record_event(SqliteTx(conn), CATALOG, project, failed.trigger_id, kind, reason, now, now, 1, now, None)
            run_sql.append_event(conn, failed.id, f"run.retry_{kind}", "scheduler", now, reason)
            notified = run_sql.queue_skip(conn, project, failed.task_id, failed.task_revision, reason, now)
            return Admission(cursor=None, notified=notified)
        if conn.execute(SQL_BY_KEY, (key,)).fetchone() is not None:
            return Admission(cursor=None)  # admitted before
        retry = Run(
            id=uuid7(now), project_id=project, task_id=failed.task_id, task_revision=failed.task_revision,
            origin="retry", status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now,
            trigger_id=failed.trigger_id, trigger_revision=failed.trigger_revision, scheduled_for_ms=now,
            idempotency_key=key, retry_of=failed.id, attempt=failed.attempt + 1,
        )
        admitted = run_sql.insert(conn, retry, "scheduler")
    return Admission(runs=[admitted], cancel=replacing, cursor=None)


def admit_manual(conn: apsw.Connection, task: Task, actor: ActorType, now: int, capacity: int) -> ManualAdmission:
    """A manual start under the task's overlap policy and the shared queue bound."""
    with immediate(conn):
        row = conn.execute(SQL_PINNED_TASK, (task.project_id, task.id, task.revision)).fetchone()
        if row is None:
            raise not_found(f"task {task.id!r} not found")
        if not row[0]:
            raise conflict(f"task {task.id!r} is disabled; enable it first")
        replacing: list[str] = []
        reason, blocking = _gate(conn, task.project_id, task.id, row[1], capacity, replacing)
        if reason == "overlap":
            raise conflict(f"task {task.id!r} already has an active run ({blocking}) and its overlap policy is forbid")
        if reason == "queue_full":
            raise ToolError("resource_exhausted", f"the run queue is full ({capacity} runs active or waiting)")
        run = Run(
            id=uuid7(now), project_id=task.project_id, task_id=task.id, task_revision=task.revision,
            origin="manual", status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now,
        )
        created = run_sql.insert(conn, run, actor)
    return ManualAdmission(run=created, replaces=replacing)


class SqliteAdmission:
    """RunAdmission on the daemon's database. `capacity`: how many runs may be queued or
    running at once, the runner's slots plus its queue."""

    def __init__(self, db: Database, capacity: int, followers: Followers | None = None) -> None:
        self._db = db
        self._capacity = capacity
        self._followers = followers or Followers()

    def set_capacity(self, capacity: int) -> None:
        self._capacity = capacity

    async def armed(self, project: str) -> list[tuple[int, str]]:
        return await self._db.run(armed, project)

    async def admit_fires(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        return self._followed(await self._db.run(admit_fires, project, trigger_id, now_ms, grace_ms, self._capacity,
                                                 rng))

    async def armed_retries(self, project: str) -> list[tuple[int, str]]:
        return await self._db.run(armed_retries, project)

    async def admit_retry(self, project: str, run_id: str, now_ms: int) -> Admission:
        return self._followed(await self._db.run(admit_retry, project, run_id, now_ms, self._capacity))

    def _followed(self, admission: Admission) -> Admission:
        if admission.notified:
            self._followers.notify()
        return admission

    async def admit_manual(self, task: Task, actor: ActorType, now_ms: int) -> ManualAdmission:
        return await self._db.run(admit_manual, task, actor, now_ms, self._capacity)

    async def arm_boot(self, project: str, boot_id: str, at_ms: int) -> int:
        return await self._db.run(arm_boot, project, boot_id, at_ms)

    async def newest_time(self, project: str) -> int:
        return await self._db.run(newest_time, project)

    async def save_time(self, now_ms: int) -> None:
        await self._db.run(_save_time_tx, now_ms)

    def restamp(self, after_ms: int, upto_ms: int, shift_ms: int) -> None:
        self._db.before_next(_restamp_logged, after_ms, upto_ms, shift_ms)


def _restamp_logged(conn: apsw.Connection, after: int, upto: int, shift: int) -> None:
    moved = restamp(conn, after, upto, shift)
    log.info("the clock was set forward by %.0fs: %d runs (with their events) and the audit rows stamped while it"
             " was behind moved by as much", shift / 1000, moved)
