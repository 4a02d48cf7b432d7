"""Narrow SQLite readers for the AI read tools (few columns, one project, bounded keyset
pages) and the counts of `qledge status`.

Every page query here rides an existing index (primary keys, runs_project_created_idx);
tests/test_ai_plans.py runs the real EXPLAIN QUERY PLAN of each one.
"""

from __future__ import annotations

import apsw

from edge.core.ports.stores import Readers
from edge.core.reads import Counts, OutcomeRow, RunEventSummary, RunSummary, TaskDetail, TaskHead, TriggerHead
from edge.core.runs import RunCursor
from edge.storage.sqlite.db import Database, one

# LEFT JOIN: a head without its revision row must surface as a malformed row (and fail
# the call), not silently vanish from the page.
_TASK_HEAD = """
SELECT t.project_id, t.id, t.revision, t.name, json_extract(r.spec, '$.command.kind'), r.spec_schema,
       t.enabled, t.updated_at_ms{extra}
FROM tasks AS t
LEFT JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.revision
"""
SQL_TASK_LIST = _TASK_HEAD.format(extra="") + "WHERE t.project_id = ? AND t.id > ? ORDER BY t.id LIMIT ?"
SQL_TASK_GET = (
    _TASK_HEAD.format(extra=", r.content_digest, t.created_at_ms") + "WHERE t.project_id = ? AND t.id = ?"
)
SQL_TRIGGER_LIST = """
SELECT g.project_id, g.id, g.revision, g.task_id, g.task_revision, r.spec_schema, g.enabled, g.updated_at_ms
FROM triggers AS g
LEFT JOIN trigger_revisions AS r ON r.project_id = g.project_id AND r.trigger_id = g.id AND r.revision = g.revision
WHERE g.project_id = ? AND g.id > ? ORDER BY g.id LIMIT ?
"""
_RUN = (
    "SELECT id, project_id, task_id, task_revision, status, origin, created_at_ms, queued_at_ms,"
    " started_at_ms, finished_at_ms, exit_code, log_bytes, retry_of FROM runs"
)
SQL_RUN_GET = _RUN + " WHERE id = ? AND project_id = ?"
# Row values let runs_project_created_idx seek straight to the cursor.
SQL_RUN_PAGE = (
    _RUN + " WHERE project_id = ? AND (created_at_ms, id) < (?, ?) ORDER BY created_at_ms DESC, id DESC LIMIT ?"
)
SQL_RUN_EVENTS = """
SELECT e.run_id, r.project_id, e.sequence, e.type, e.actor_type, e.created_at_ms
FROM run_events AS e JOIN runs AS r ON r.id = e.run_id
WHERE e.run_id = ? AND r.project_id = ? AND e.sequence > ? ORDER BY e.sequence LIMIT ?
"""
# The task outcome window of qinglong.task.runs.compare: one bounded read of exactly five
# columns, on runs_task_created_idx (no index of its own, no sort).
SQL_WINDOW = (
    "SELECT id, project_id, task_id, status, created_at_ms FROM runs"
    " WHERE project_id = ? AND task_id = ? ORDER BY created_at_ms DESC, id DESC LIMIT ?"
)
_BEFORE_EVERY_RUN = RunCursor(1 << 62, "\U0010ffff")  # ahead of every real (created_at_ms, id) in DESC order
SQL_COUNTS = """
SELECT (SELECT count(*) FROM tasks WHERE project_id = ?1),
       (SELECT count(*) FROM triggers WHERE project_id = ?1),
       (SELECT count(*) FROM runs WHERE project_id = ?1),
       (SELECT count(*) FROM runs WHERE project_id = ?1 AND status IN ('queued', 'running')),
       (SELECT count(*) FROM credentials WHERE project_id = ?1 AND revoked_at_ms IS NULL)
"""


def _bool_at(row: tuple, index: int) -> tuple:
    # SQLite stores booleans as integers; anything but 0/1 stays an int and fails validation.
    value = row[index]
    return (*row[:index], bool(value) if value in (0, 1) else value, *row[index + 1 :])


def task_heads(conn: apsw.Connection, project: str, after: str, limit: int) -> list[TaskHead]:
    return [TaskHead(*_bool_at(row, 6)) for row in conn.execute(SQL_TASK_LIST, (project, after, limit))]


def task_detail(conn: apsw.Connection, project: str, task_id: str) -> TaskDetail | None:
    row = conn.execute(SQL_TASK_GET, (project, task_id)).fetchone()
    return TaskDetail(*_bool_at(row, 6)) if row else None


def trigger_heads(conn: apsw.Connection, project: str, after: str, limit: int) -> list[TriggerHead]:
    return [TriggerHead(*_bool_at(row, 6)) for row in conn.execute(SQL_TRIGGER_LIST, (project, after, limit))]


def run_summary(conn: apsw.Connection, project: str, run_id: str) -> RunSummary | None:
    row = conn.execute(SQL_RUN_GET, (run_id, project)).fetchone()
    return RunSummary(*row) if row else None


def run_page(conn: apsw.Connection, project: str, after: RunCursor, limit: int) -> list[RunSummary]:
    rows = conn.execute(SQL_RUN_PAGE, (project, after.created_at_ms, after.run_id, limit))
    return [RunSummary(*row) for row in rows]


def run_events(conn: apsw.Connection, project: str, run_id: str, after: int, limit: int) -> list[RunEventSummary]:
    return [RunEventSummary(*row) for row in conn.execute(SQL_RUN_EVENTS, (run_id, project, after, limit))]


def window(conn: apsw.Connection, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
    return [OutcomeRow(*row) for row in conn.execute(SQL_WINDOW, (project, task_id, limit))]


def counts(conn: apsw.Connection, project: str) -> Counts:
    return Counts(*one(conn, SQL_COUNTS, (project,)))


class SqliteTaskHeadReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TaskHead]:
        return await self._db.run(task_heads, project, after or "", limit)

    async def get_head(self, project: str, task_id: str) -> TaskDetail | None:
        return await self._db.run(task_detail, project, task_id)


class SqliteTriggerHeadReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TriggerHead]:
        return await self._db.run(trigger_heads, project, after or "", limit)


class SqliteRunSummaryReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, project: str, run_id: str) -> RunSummary | None:
        return await self._db.run(run_summary, project, run_id)

    async def page(self, project: str, after: RunCursor | None, limit: int) -> list[RunSummary]:
        return await self._db.run(run_page, project, after or _BEFORE_EVERY_RUN, limit)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEventSummary]:
        return await self._db.run(run_events, project, run_id, after_sequence, limit)


class SqliteOutcomeWindowReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        return await self._db.run(window, project, task_id, limit)


class SqliteCountsReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def counts(self, project: str) -> Counts:
        return await self._db.run(counts, project)


def sqlite_readers(db: Database) -> Readers:
    return Readers(
        tasks=SqliteTaskHeadReader(db),
        triggers=SqliteTriggerHeadReader(db),
        runs=SqliteRunSummaryReader(db),
        outcome_window=SqliteOutcomeWindowReader(db),
    )
