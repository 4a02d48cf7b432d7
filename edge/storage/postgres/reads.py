"""Narrow PostgreSQL readers for the AI read tools and `qledge status`: the same few
columns, project scope, order and bounds as edge.storage.sqlite.reads. The seed-000
outcome window is one `LIMIT 65` read on runs_task_created_idx; the seed-002 trigger list
is the current-head keyset on the triggers primary key (tests/test_postgres_plans.py runs
the real EXPLAIN of each)."""

from __future__ import annotations

from edge.core.errors import ToolError
from edge.core.ports.stores import Readers
from edge.core.reads import Counts, OutcomeRow, RunEventSummary, RunSummary, TaskDetail, TaskHead, TriggerHead
from edge.core.runs import RunCursor
from edge.storage.postgres.db import PgDatabase, Tx

_TASK_HEAD = """
SELECT t.project_id, t.id, t.revision, t.name, r.spec::jsonb -> 'command' ->> 'kind', r.spec_schema,
       t.enabled, t.updated_at_ms{extra}
FROM tasks AS t
LEFT JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.revision
"""
SQL_TASK_LIST = _TASK_HEAD.format(extra="") + "WHERE t.project_id = %s AND t.id > %s ORDER BY t.id LIMIT %s"
SQL_TASK_GET = _TASK_HEAD.format(extra=", r.content_digest, t.created_at_ms") + "WHERE t.project_id = %s AND t.id = %s"
SQL_TRIGGER_LIST = """
SELECT g.project_id, g.id, g.revision, g.task_id, g.task_revision, r.spec_schema, g.enabled, g.updated_at_ms
FROM triggers AS g
LEFT JOIN trigger_revisions AS r ON r.project_id = g.project_id AND r.trigger_id = g.id AND r.revision = g.revision
WHERE g.project_id = %s AND g.id > %s ORDER BY g.id LIMIT %s
"""
_RUN = (
    "SELECT id, project_id, task_id, task_revision, status, origin, created_at_ms, queued_at_ms,"
    " started_at_ms, finished_at_ms, exit_code, log_bytes, retry_of FROM runs"
)
SQL_RUN_GET = _RUN + " WHERE id = %s AND project_id = %s"
SQL_RUN_FIRST = _RUN + " WHERE project_id = %s ORDER BY created_at_ms DESC, id DESC LIMIT %s"
SQL_RUN_PAGE = (
    _RUN + " WHERE project_id = %s AND (created_at_ms, id) < (%s, %s) ORDER BY created_at_ms DESC, id DESC LIMIT %s"
)
SQL_RUN_EVENTS = """
SELECT e.run_id, r.project_id, e.sequence, e.type, e.actor_type, e.created_at_ms
FROM run_events AS e JOIN runs AS r ON r.id = e.run_id
WHERE e.run_id = %s AND r.project_id = %s AND e.sequence > %s ORDER BY e.sequence LIMIT %s
"""
SQL_WINDOW = (
    "SELECT id, project_id, task_id, status, created_at_ms FROM runs"
    " WHERE project_id = %s AND task_id = %s ORDER BY created_at_ms DESC, id DESC LIMIT %s"
)
SQL_COUNTS = """
SELECT (SELECT count(*) FROM tasks WHERE project_id = %(p)s),
       (SELECT count(*) FROM triggers WHERE project_id = %(p)s),
       (SELECT count(*) FROM runs WHERE project_id = %(p)s),
       (SELECT count(*) FROM runs WHERE project_id = %(p)s AND status IN ('queued', 'running')),
       (SELECT count(*) FROM credentials WHERE project_id = %(p)s AND revoked_at_ms IS NULL)
"""


async def _task_heads(tx: Tx, project: str, after: str, limit: int) -> list[TaskHead]:
    return [TaskHead(*row) for row in await tx.rows(SQL_TASK_LIST, (project, after, limit))]


async def _task_detail(tx: Tx, project: str, task_id: str) -> TaskDetail | None:
    row = await tx.row(SQL_TASK_GET, (project, task_id))
    return TaskDetail(*row) if row else None


async def _trigger_heads(tx: Tx, project: str, after: str, limit: int) -> list[TriggerHead]:
    return [TriggerHead(*row) for row in await tx.rows(SQL_TRIGGER_LIST, (project, after, limit))]


async def _run_summary(tx: Tx, project: str, run_id: str) -> RunSummary | None:
    row = await tx.row(SQL_RUN_GET, (run_id, project))
    return RunSummary(*row) if row else None


async def _run_page(tx: Tx, project: str, after: RunCursor | None, limit: int) -> list[RunSummary]:
    if after is None:
        rows = await tx.rows(SQL_RUN_FIRST, (project, limit))
    else:
        rows = await tx.rows(SQL_RUN_PAGE, (project, after.created_at_ms, after.run_id, limit))
    return [RunSummary(*row) for row in rows]


async def _run_events(tx: Tx, project: str, run_id: str, after: int, limit: int) -> list[RunEventSummary]:
    return [RunEventSummary(*row) for row in await tx.rows(SQL_RUN_EVENTS, (run_id, project, after, limit))]


async def _window(tx: Tx, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
    return [OutcomeRow(*row) for row in await tx.rows(SQL_WINDOW, (project, task_id, limit))]


async def _counts(tx: Tx, project: str) -> Counts:
    return Counts(*(int(v) for v in await tx.one(SQL_COUNTS, {"p": project})))


class PgTaskHeadReader:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TaskHead]:
        return await self._db.tx(_task_heads, project, after or "", limit)

    async def get_head(self, project: str, task_id: str) -> TaskDetail | None:
        return await self._db.tx(_task_detail, project, task_id)


class PgTriggerHeadReader:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TriggerHead]:
        return await self._db.tx(_trigger_heads, project, after or "", limit)


class PgRunSummaryReader:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def get(self, project: str, run_id: str) -> RunSummary | None:
        return await self._db.tx(_run_summary, project, run_id)

    async def page(self, project: str, after: RunCursor | None, limit: int) -> list[RunSummary]:
        return await self._db.tx(_run_page, project, after, limit)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEventSummary]:
        return await self._db.tx(_run_events, project, run_id, after_sequence, limit)


class PgOutcomeWindowReader:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        return await self._db.tx(_window, project, task_id, limit)


class PgCountsReader:
    """Counts for `qledge status`; while PostgreSQL is unreachable, the last ones read (status
    must still answer, to say that it is unreachable)."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db
        self._last: dict[str, Counts] = {}

    async def counts(self, project: str) -> Counts:
        try:
            self._last[project] = await self._db.tx(_counts, project)
        except ToolError:
            if self._db.down_since is None:
                raise
            return self._last.get(project) or Counts(0, 0, 0, 0, 0)
        return self._last[project]


def pg_readers(db: PgDatabase) -> Readers:
    return Readers(tasks=PgTaskHeadReader(db), triggers=PgTriggerHeadReader(db), runs=PgRunSummaryReader(db),
                   outcome_window=PgOutcomeWindowReader(db))
