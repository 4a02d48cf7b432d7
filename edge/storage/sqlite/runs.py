"""Runs and their events. Every status change appends an event in the same transaction."""

from __future__ import annotations

import contextlib
import os

import apsw

from edge.core.errors import conflict, not_found
from edge.core.ports import RunCursor, RunProcess, RunUpdate
from edge.core.runs import TERMINAL, ActorType, Run, RunEvent, check_transition, event_type, log_file
from edge.storage.sqlite import retention
from edge.storage.sqlite.db import Database, immediate

COLUMNS = (
    "id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,"
    " trigger_id, trigger_revision, queued_at_ms, started_at_ms, finished_at_ms, scheduled_for_ms,"
    " exit_code, error_code, error_summary, log_bytes, log_truncated, idempotency_key, jitter_ms,"
    " log_dropped_at_ms"
)
_FIELDS = [c.strip() for c in COLUMNS.split(",")]

SQL_GET = f"SELECT {COLUMNS} FROM runs WHERE id = ? AND project_id = ?"
# Keyset pages in (created_at_ms DESC, id DESC); row values let the index seek to the cursor.
SQL_LIST_PROJECT = (
    f"SELECT {COLUMNS} FROM runs WHERE project_id = ? AND (created_at_ms, id) < (?, ?)"
    " ORDER BY created_at_ms DESC, id DESC LIMIT ?"
)
SQL_LIST_TASK = (
    f"SELECT {COLUMNS} FROM runs WHERE project_id = ? AND task_id = ? AND (created_at_ms, id) < (?, ?)"
    " ORDER BY created_at_ms DESC, id DESC LIMIT ?"
)
SQL_STATE = "SELECT project_id, status, version, event_seq, log_bytes FROM runs WHERE id = ?"
SQL_ACTIVE = f"SELECT {COLUMNS} FROM runs WHERE status IN ('queued', 'running')"
SQL_ACTIVE_PROCESSES = f"SELECT {COLUMNS}, pid, pid_start_ticks FROM runs WHERE status IN ('queued', 'running')"
SQL_EVENTS = (
    "SELECT e.run_id, e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail FROM run_events AS e"
    " JOIN runs AS r ON r.id = e.run_id"
    " WHERE e.run_id = ? AND r.project_id = ? AND e.sequence > ? ORDER BY e.sequence LIMIT ?"
)
_MAX_CURSOR = (1 << 62, "\U0010ffff")  # sorts after every real (created_at_ms, id)


def _run(row: tuple) -> Run:
    values = dict(zip(_FIELDS, row))
    values["log_truncated"] = bool(values["log_truncated"])
    return Run(**values)


def get(conn: apsw.Connection, project: str, run_id: str) -> Run | None:
    row = conn.execute(SQL_GET, (run_id, project)).fetchone()
    return _run(row) if row else None


def _append_event(
    conn: apsw.Connection, run_id: str, sequence: int, kind: str, actor: ActorType, now: int, detail: str | None
) -> None:
    conn.execute(
        "INSERT INTO run_events (run_id, sequence, type, actor_type, created_at_ms, detail) VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, sequence, kind, actor, now, detail),
    )


def insert(conn: apsw.Connection, run: Run, actor: ActorType) -> Run:
    """Insert a new run with its first event. Call inside a transaction."""
    values = [getattr(run, f) for f in _FIELDS]
    values[_FIELDS.index("event_seq")] = 1
    values[_FIELDS.index("log_truncated")] = int(run.log_truncated)
    try:
        conn.execute(f"INSERT INTO runs ({COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))})", values)
    except apsw.ConstraintError:
        raise conflict(f"run {run.idempotency_key or run.id} already exists") from None
    _append_event(conn, run.id, 1, event_type(run.status), actor, run.created_at_ms, None)
    retention.add_log_bytes(conn, run.project_id, run.log_bytes)
    created = get(conn, run.project_id, run.id)
    assert created is not None
    return created


def _create(conn: apsw.Connection, run: Run, actor: ActorType) -> Run:
    with immediate(conn):
        return insert(conn, run, actor)


def transition(
    conn: apsw.Connection, run_id: str, expected_version: int, status: str, now: int,
    actor: ActorType, update: RunUpdate, detail: str | None,
    policy: retention.Policy | None = None, logs_dir: str | None = None,
) -> Run:
    """Compare-and-set on `version`; the event is appended in the same transaction.

    A run that finishes also applies retention in that transaction; the logs of the runs
    it removed are unlinked once it has committed.
    """
    removed: list[str] = []
    with immediate(conn):
        run = apply_transition(conn, run_id, expected_version, status, now, actor, update, detail)
        if policy is not None and status in TERMINAL:
            removed = retention.enforce(conn, run.project_id, run.task_id, now, policy)
    if logs_dir is not None:
        remove_logs(logs_dir, removed)
    return run


def remove_logs(logs_dir: str, run_ids: list[str]) -> None:
    for run_id in run_ids:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log_file(logs_dir, run_id))


def apply_transition(
    conn: apsw.Connection, run_id: str, expected_version: int, status: str, now: int,
    actor: ActorType, update: RunUpdate, detail: str | None,
) -> Run:
    row = conn.execute(SQL_STATE, (run_id,)).fetchone()
    if row is None:
        raise not_found(f"run {run_id} not found")
    project, current, version, seq, log_bytes = row
    if version != expected_version:
        raise conflict(f"run {run_id} changed (version {version}, expected {expected_version})")
    check_transition(current, status)
    sets = ["status = ?", "version = version + 1", "event_seq = event_seq + 1"]
    params: list = [status]
    for field in update.__struct_fields__:
        value = getattr(update, field)
        if value is not None:
            sets.append(f"{field} = ?")
            params.append(int(value) if isinstance(value, bool) else value)
    conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", (*params, run_id))
    _append_event(conn, run_id, seq + 1, event_type(status), actor, now, detail)
    if update.log_bytes is not None:
        retention.add_log_bytes(conn, project, update.log_bytes - log_bytes)
    updated = get(conn, project, run_id)
    assert updated is not None
    return updated


def list_runs(
    conn: apsw.Connection, project: str, task_id: str | None, after: RunCursor | None, limit: int
) -> list[Run]:
    created, rid = (after.created_at_ms, after.run_id) if after else _MAX_CURSOR
    if task_id is None:
        rows = conn.execute(SQL_LIST_PROJECT, (project, created, rid, limit))
    else:
        rows = conn.execute(SQL_LIST_TASK, (project, task_id, created, rid, limit))
    return [_run(row) for row in rows]


def active(conn: apsw.Connection) -> list[Run]:
    return [_run(row) for row in conn.execute(SQL_ACTIVE)]


def active_processes(conn: apsw.Connection) -> list[tuple[Run, RunProcess]]:
    return [(_run(row[:-2]), RunProcess(pid=row[-2], start_ticks=row[-1])) for row in conn.execute(SQL_ACTIVE_PROCESSES)]


def events(conn: apsw.Connection, project: str, run_id: str, after: int, limit: int) -> list[RunEvent]:
    return [
        RunEvent(run_id=r[0], sequence=r[1], type=r[2], actor_type=r[3], created_at_ms=r[4], detail=r[5])
        for r in conn.execute(SQL_EVENTS, (run_id, project, after, limit))
    ]


class SqliteRunStore:
    """`policy` and `logs_dir` turn on retention for every run that finishes through it."""

    def __init__(self, db: Database, policy: retention.Policy | None = None, logs_dir: str | None = None) -> None:
        self._db = db
        self._policy = policy
        self._logs_dir = logs_dir

    async def create(self, run: Run, actor: ActorType) -> Run:
        return await self._db.run(_create, run, actor)

    async def transition(
        self, run_id: str, expected_version: int, status: str, now_ms: int,
        actor: ActorType, update: RunUpdate, detail: str | None = None,
    ) -> Run:
        return await self._db.run(
            transition, run_id, expected_version, status, now_ms, actor, update, detail, self._policy, self._logs_dir)

    async def get(self, project: str, run_id: str) -> Run | None:
        return await self._db.run(get, project, run_id)

    async def list(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
        return await self._db.run(list_runs, project, task_id, after, limit)

    async def active(self) -> list[Run]:
        return await self._db.run(active)

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        return await self._db.run(active_processes)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]:
        return await self._db.run(events, project, run_id, after_sequence, limit)
