"""Runs and their events. Every status change appends an event in the same transaction."""

from __future__ import annotations

import apsw

from edge.core.errors import conflict, not_found
from edge.core.ports.stores import RunLogFiles
from edge.core.reads import SEARCH_BUDGET
from edge.core.runs import (
    ACTIVE,
    TERMINAL,
    UNSUCCESSFUL,
    ActorType,
    Run,
    RunCursor,
    RunEvent,
    RunProcess,
    RunQuery,
    RunSearch,
    RunStatus,
    RunUpdate,
    check_transition,
    event_type,
)
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
SQL_STATE = "SELECT project_id, status, version, event_seq FROM runs WHERE id = ?"
SQL_ACTIVE = f"SELECT {COLUMNS} FROM runs WHERE status IN ('queued', 'running')"
SQL_ACTIVE_PROCESSES = f"SELECT {COLUMNS}, pid, pid_start_ticks FROM runs WHERE status IN ('queued', 'running')"
SQL_EVENTS = (
    "SELECT e.run_id, e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail FROM run_events AS e"
    " JOIN runs AS r ON r.id = e.run_id"
    " WHERE e.run_id = ? AND r.project_id = ? AND e.sequence > ? ORDER BY e.sequence LIMIT ?"
)
_BEFORE_EVERY_RUN = RunCursor(1 << 62, "\U0010ffff")  # ahead of every real (created_at_ms, id) in DESC order


def _run(row: tuple) -> Run:
    values = dict(zip(_FIELDS, row, strict=True))
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
    created = get(conn, run.project_id, run.id)
    assert created is not None
    return created


def _create(conn: apsw.Connection, run: Run, actor: ActorType) -> Run:
    with immediate(conn):
        return insert(conn, run, actor)


def transition(
    conn: apsw.Connection, run_id: str, expected_version: int, status: RunStatus, now: int,
    actor: ActorType, update: RunUpdate, detail: str | None, policy: retention.Policy,
    started: RunUpdate | None = None,
) -> tuple[Run, list[str]]:
    """Compare-and-set on `version`; the event is appended in the same transaction (after
    `running`, when `started` says the start was not recorded yet). A run that finishes
    also applies retention in it. Returns the run and the ids of the runs whose logs must
    go once this has committed."""
    removed: list[str] = []
    with immediate(conn):
        if started is not None:
            at = started.started_at_ms if started.started_at_ms is not None else now
            expected_version = apply_transition(
                conn, run_id, expected_version, "running", at, "runner", started, None).version
        run = apply_transition(conn, run_id, expected_version, status, now, actor, update, detail)
        if status in TERMINAL:
            removed = retention.enforce(conn, run.project_id, run.task_id, now, policy)
    return run, removed


def apply_transition(
    conn: apsw.Connection, run_id: str, expected_version: int, status: RunStatus, now: int,
    actor: ActorType, update: RunUpdate, detail: str | None,
) -> Run:
    row = conn.execute(SQL_STATE, (run_id,)).fetchone()
    if row is None:
        raise not_found(f"run {run_id} not found")
    project, current, version, seq = row
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
    updated = get(conn, project, run_id)
    assert updated is not None
    return updated


def page(conn: apsw.Connection, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
    created, rid = (after or _BEFORE_EVERY_RUN).created_at_ms, (after or _BEFORE_EVERY_RUN).run_id
    if task_id is None:
        rows = conn.execute(SQL_LIST_PROJECT, (project, created, rid, limit))
    else:
        rows = conn.execute(SQL_LIST_TASK, (project, task_id, created, rid, limit))
    return [_run(row) for row in rows]


# -- search: filtered pages, one index each, a bounded walk per page --------------------

# Each filter is served by the index its terms name: a partial index is used only when the
# query repeats its WHERE term exactly, hence these literal terms.
_UNSUCCESSFUL_TERM = "status IN ({})".format(", ".join(f"'{s}'" for s in UNSUCCESSFUL))
_ACTIVE_TERM = "status IN ('queued', 'running')"
_UNSCHEDULED_TERM = "origin != 'scheduled'"
_SCAN = "SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = ?"
_ORDER = " AND (created_at_ms, id) < (?, ?){since} ORDER BY created_at_ms DESC, id DESC LIMIT ?"


def _active_only(query: RunQuery) -> bool:
    return bool(query.statuses) and set(query.statuses) <= ACTIVE


def scan_sql(query: RunQuery) -> str:
    """The key walk of one search page: the terms that pick the index (what they do not
    decide, search() checks on each entry) and the cursor bound."""
    task = "" if query.task_id is None else " AND task_id = ?"
    since = "" if query.since_ms is None else " AND created_at_ms >= ?"
    if _active_only(query):
        # Queued and running runs are few by construction (the admission bound): all of
        # them, from their own index, ordered by search() rather than walked in order.
        return (f"SELECT id, created_at_ms, status, origin FROM runs INDEXED BY runs_active_idx"
                f" WHERE project_id = ?{task} AND {_ACTIVE_TERM} AND (created_at_ms, id) < (?, ?){since} LIMIT ?")
    terms = task
    statuses = set(query.statuses)
    if statuses and statuses <= set(UNSUCCESSFUL):
        terms += f" AND {_UNSUCCESSFUL_TERM}"  # runs_unsuccessful_idx, runs_task_unsuccessful_idx
    elif query.task_id is None and query.origins and "scheduled" not in query.origins:
        terms += f" AND {_UNSCHEDULED_TERM}"  # runs_unscheduled_idx
    return _SCAN + terms + _ORDER.format(since=since)


def _scan_params(project: str, query: RunQuery, after: RunCursor | None, budget: int) -> tuple:
    bound = after or _BEFORE_EVERY_RUN
    if query.until_ms is not None and (query.until_ms, "") < (bound.created_at_ms, bound.run_id):
        bound = RunCursor(query.until_ms, "")  # created before `until`: ahead of every id at that ms
    params: list = [project]
    if query.task_id is not None:
        params.append(query.task_id)
    params += [bound.created_at_ms, bound.run_id]
    if query.since_ms is not None:
        params.append(query.since_ms)
    return (*params, -1 if _active_only(query) else budget)  # the active runs: all of them


def search(
    conn: apsw.Connection, project: str, query: RunQuery, after: RunCursor | None, limit: int,
    budget: int = SEARCH_BUDGET,
) -> RunSearch:
    statuses, origins = set(query.statuses), set(query.origins)
    hits: list[RunCursor] = []
    last: RunCursor | None = None
    scanned = 0
    cursor = conn.execute(scan_sql(query), _scan_params(project, query, after, budget))
    try:
        entries = sorted(cursor, key=lambda e: (e[1], e[0]), reverse=True) if _active_only(query) else cursor
        for rid, created, status, origin in entries:
            scanned += 1
            last = RunCursor(created, rid)
            if (not statuses or status in statuses) and (not origins or origin in origins):
                hits.append(last)
                if len(hits) > limit:
                    break
    finally:
        cursor.close()
    nxt: RunCursor | None = None
    if len(hits) > limit:
        hits = hits[:limit]
        nxt = hits[-1]
    elif scanned == budget and not _active_only(query):
        nxt = last  # more entries than one page may look at: go on from here
    runs = [run for run in (get(conn, project, key.run_id) for key in hits) if run is not None]
    return RunSearch(runs=runs, next=nxt)


# `+project_id`: the primary key's range, never a walk of a project index and a sort.
SQL_PREFIX = "SELECT id FROM runs WHERE id >= ? AND id < ? AND +project_id = ? ORDER BY id LIMIT ?"


def with_prefix(conn: apsw.Connection, project: str, prefix: str, limit: int) -> list[str]:
    if not prefix:
        return []
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string after every one with the prefix
    return [rid for (rid,) in conn.execute(SQL_PREFIX, (prefix, upper, project, limit))]


def active(conn: apsw.Connection) -> list[Run]:
    return [_run(row) for row in conn.execute(SQL_ACTIVE)]


def active_processes(conn: apsw.Connection) -> list[tuple[Run, RunProcess]]:
    return [(_run(row[:-2]), RunProcess(pid=row[-2], start_ticks=row[-1]))
            for row in conn.execute(SQL_ACTIVE_PROCESSES)]


def events(conn: apsw.Connection, project: str, run_id: str, after: int, limit: int) -> list[RunEvent]:
    return [
        RunEvent(run_id=r[0], sequence=r[1], type=r[2], actor_type=r[3], created_at_ms=r[4], detail=r[5])
        for r in conn.execute(SQL_EVENTS, (run_id, project, after, limit))
    ]


class SqliteRunStore:
    """RunStore (edge.core.ports.stores) on the daemon's database; every run that finishes
    through it applies `policy`, and the logs of the runs retention removed go after the
    commit."""

    def __init__(self, db: Database, policy: retention.Policy, logs: RunLogFiles) -> None:
        self._db = db
        self._policy = policy
        self._logs = logs

    async def create(self, run: Run, actor: ActorType) -> Run:
        return await self._db.run(_create, run, actor)

    async def transition(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int,
        actor: ActorType, update: RunUpdate, detail: str | None = None, started: RunUpdate | None = None,
    ) -> Run:
        run, removed = await self._db.run(
            transition, run_id, expected_version, status, now_ms, actor, update, detail, self._policy, started)
        self._logs.remove(removed)
        return run

    async def get(self, project: str, run_id: str) -> Run | None:
        return await self._db.run(get, project, run_id)

    async def page(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
        return await self._db.run(page, project, task_id, after, limit)

    async def search(self, project: str, query: RunQuery, after: RunCursor | None, limit: int) -> RunSearch:
        return await self._db.run(search, project, query, after, limit)

    async def with_prefix(self, project: str, prefix: str, limit: int) -> list[str]:
        return await self._db.run(with_prefix, project, prefix, limit)

    async def active(self) -> list[Run]:
        return await self._db.run(active)

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        return await self._db.run(active_processes)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]:
        return await self._db.run(events, project, run_id, after_sequence, limit)
