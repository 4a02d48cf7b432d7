"""Narrow readers for the AI read tools (few columns, one project, bounded keyset pages)
and the counts of `qledge status`, once for both backends. Every page query rides an
existing index (primary keys, runs_project_created_idx); the seed-000 outcome window is one
bounded read on runs_task_created_idx (tests/test_ai_plans.py, test_postgres_plans.py run
the real plan of each)."""

from __future__ import annotations

import msgspec

from edge.core.ports.stores import Readers
from edge.core.reads import Counts, OutcomeRow, RunEventSummary, RunSummary, TaskDetail, TaskHead, TriggerHead
from edge.core.runs import RunCursor
from edge.storage.runs import BEFORE_EVERY_RUN
from edge.storage.tx import Db, Row, Tx


class ReadsSql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect. The head queries LEFT JOIN
    their revision: a head without one must surface as a malformed row (and fail the call),
    not silently vanish from the page."""

    task_list: str
    task_get: str
    trigger_list: str
    run_get: str
    run_page: str
    run_events: str
    window: str  # exactly five columns, no index of its own, no sort
    counts: str  # named parameter `p`: the project


def _bool_at(row: Row, index: int) -> Row:
    # SQLite stores booleans as integers; anything but 0/1 stays as it is and fails validation.
    value = row[index]
    return (*row[:index], bool(value) if value in (0, 1) else value, *row[index + 1 :])


def task_heads(tx: Tx, q: ReadsSql, project: str, after: str, limit: int) -> list[TaskHead]:
    return [TaskHead(*_bool_at(row, 6)) for row in tx.rows(q.task_list, (project, after, limit))]


def task_detail(tx: Tx, q: ReadsSql, project: str, task_id: str) -> TaskDetail | None:
    row = tx.row(q.task_get, (project, task_id))
    return TaskDetail(*_bool_at(row, 6)) if row else None


def trigger_heads(tx: Tx, q: ReadsSql, project: str, after: str, limit: int) -> list[TriggerHead]:
    return [TriggerHead(*_bool_at(row, 6)) for row in tx.rows(q.trigger_list, (project, after, limit))]


def run_summary(tx: Tx, q: ReadsSql, project: str, run_id: str) -> RunSummary | None:
    row = tx.row(q.run_get, (run_id, project))
    return RunSummary(*row) if row else None


def run_page(tx: Tx, q: ReadsSql, project: str, after: RunCursor, limit: int) -> list[RunSummary]:
    return [RunSummary(*row) for row in tx.rows(q.run_page, (project, after.created_at_ms, after.run_id, limit))]


def run_events(tx: Tx, q: ReadsSql, project: str, run_id: str, after: int, limit: int) -> list[RunEventSummary]:
    return [RunEventSummary(*row) for row in tx.rows(q.run_events, (run_id, project, after, limit))]


def window(tx: Tx, q: ReadsSql, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
    return [OutcomeRow(*row) for row in tx.rows(q.window, (project, task_id, limit))]


def counts(tx: Tx, q: ReadsSql, project: str) -> Counts:
    return Counts(*(int(v) for v in tx.one(q.counts, {"p": project})))


class SqlTaskHeadReader:
    def __init__(self, db: Db, q: ReadsSql) -> None:
        self._db = db
        self._q = q

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TaskHead]:
        return await self._db.read(task_heads, self._q, project, after or "", limit)

    async def get_head(self, project: str, task_id: str) -> TaskDetail | None:
        return await self._db.read(task_detail, self._q, project, task_id)


class SqlTriggerHeadReader:
    def __init__(self, db: Db, q: ReadsSql) -> None:
        self._db = db
        self._q = q

    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TriggerHead]:
        return await self._db.read(trigger_heads, self._q, project, after or "", limit)


class SqlRunSummaryReader:
    def __init__(self, db: Db, q: ReadsSql) -> None:
        self._db = db
        self._q = q

    async def get(self, project: str, run_id: str) -> RunSummary | None:
        return await self._db.read(run_summary, self._q, project, run_id)

    async def page(self, project: str, after: RunCursor | None, limit: int) -> list[RunSummary]:
        return await self._db.read(run_page, self._q, project, after or BEFORE_EVERY_RUN, limit)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEventSummary]:
        return await self._db.read(run_events, self._q, project, run_id, after_sequence, limit)


class SqlOutcomeWindowReader:
    def __init__(self, db: Db, q: ReadsSql) -> None:
        self._db = db
        self._q = q

    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        return await self._db.read(window, self._q, project, task_id, limit)


class SqlCountsReader:
    def __init__(self, db: Db, q: ReadsSql) -> None:
        self._db = db
        self._q = q

    async def counts(self, project: str) -> Counts:
        return await self._db.read(counts, self._q, project)


def readers(db: Db, q: ReadsSql) -> Readers:
    return Readers(tasks=SqlTaskHeadReader(db, q), triggers=SqlTriggerHeadReader(db, q),
                   runs=SqlRunSummaryReader(db, q), outcome_window=SqlOutcomeWindowReader(db, q))
