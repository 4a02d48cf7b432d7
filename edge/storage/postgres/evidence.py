"""The evidence history of AI runs (seed 001) on a cluster's PostgreSQL: one row per run,
written by whichever node ran it. Implements AgentEvidenceStore (edge.core.ports.agent),
with the SQLite adapter's rules (edge.storage.sqlite.evidence).

Retention is part of the transaction that inserts a record, and of nothing else: the
newest MAX_RECORDS records are kept and none created more than MAX_AGE_MS before the
inserting write's clock (PostgreSQL's, the cluster's clock). Each insert looks at the
PRUNE_BATCH oldest rows only (and at most MAX_RECORDS + 1 entries of the primary key to
find the cut), so its cost is bounded and the table converges; two nodes inserting at once
may leave a record more for a moment, which the next insert removes. The rule covers the
whole table, as a cluster serves one project.

A record is inserted `running` when its run starts, so that the reaping of a run whose node
died can end it in its own transaction (edge.storage.postgres.claims.SQL_EVIDENCE_LOST), and
written whole once more at the terminal state: the rounds the running node held in memory,
the totals and the outcome (seed 001's discipline, less the flash it saves on a router).

The store's change position costs no write: PostgreSQL's next transaction id
(`pg_current_snapshot`), which every writing transaction of the cluster moves, so a
record's positions before and after bracket every change made while its run went on.
A record of a run that a node lost (its lease expired) is ended `lost` by the reaping
transaction itself (edge.storage.postgres.claims.SQL_EVIDENCE_LOST).
"""

from __future__ import annotations

import msgspec

from edge.core.agent import (
    EvidenceCursor, EvidenceDetail, EvidenceLimits, EvidenceOpen, EvidenceRecord, EvidenceSummary, RoundMeta,
)
from edge.core.errors import unavailable
from edge.storage.postgres.db import PgDatabase
from edge.storage.tx import Row, Tx

MAX_RECORDS = 500
MAX_AGE_MS = 90 * 86_400_000
PRUNE_BATCH = 16

_round = msgspec.json.Encoder()
_rounds = msgspec.json.Decoder(list[RoundMeta])
_limits = msgspec.json.Decoder(EvidenceLimits)

POSITION = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
SQL_INSERT = (
    "INSERT INTO agent_evidence (run_id, project_id, task_id, task_revision, state, instruction, provider, model,"
    " cost_usd, position_before, created_at_ms, limits)"
    f" VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, %s, {POSITION}, %s, %s::jsonb)"
    " ON CONFLICT (run_id) DO NOTHING"
)
# The cut: the newest record beyond the ones kept (an index walk of MAX_RECORDS + 1 keys).
SQL_CUT = "SELECT seq FROM agent_evidence ORDER BY seq DESC OFFSET %s LIMIT 1"
SQL_PRUNE = (
    "DELETE FROM agent_evidence WHERE seq IN (SELECT seq FROM (SELECT seq, created_at_ms FROM agent_evidence"
    " ORDER BY seq LIMIT %s) AS oldest WHERE seq <= %s OR created_at_ms < %s)"
)
SQL_FINISH = (
    "UPDATE agent_evidence SET state = %s, error_code = %s, budget = %s, error = %s, answer_summary = %s,"
    " rounds = %s::jsonb, round_count = %s, input_tokens = %s, output_tokens = %s, usage_estimated = %s,"
    f" cost_usd = %s, position_after = {POSITION}, finished_at_ms = %s"
    " WHERE run_id = %s AND project_id = %s AND state = 'running'"
)
SUMMARY = (
    "project_id, run_id, task_id, task_revision, state, error_code, budget, provider, model, round_count,"
    " input_tokens, output_tokens, usage_estimated, cost_usd, created_at_ms, finished_at_ms"
)
SQL_PAGE = (
    f"SELECT {SUMMARY} FROM agent_evidence WHERE project_id = %s AND (created_at_ms, run_id) < (%s, %s)"
    " ORDER BY created_at_ms DESC, run_id DESC LIMIT %s"
)
SQL_GET = (
    f"SELECT {SUMMARY}, instruction, rounds::text, error, answer_summary, position_before, position_after,"
    " limits::text"
    " FROM agent_evidence WHERE run_id = %s AND project_id = %s"
)
_AHEAD_OF_ALL = EvidenceCursor(created_at_ms=1 << 62, run_id="\U0010ffff")


def _insert(tx: Tx, record: EvidenceOpen, now: int) -> None:
    tx.execute(SQL_INSERT, (
        record.run_id, record.project_id, record.task_id, record.task_revision, record.instruction,
        record.provider, record.model, 0.0 if record.cost_known else None, now,
        None if record.limits is None else _round.encode(record.limits).decode(),
    ))
    cut = tx.row(SQL_CUT, (MAX_RECORDS,))
    tx.execute(SQL_PRUNE, (PRUNE_BATCH, cut[0] if cut else 0, now - MAX_AGE_MS))


def _start(tx: Tx, record: EvidenceOpen, now: int) -> int:
    _insert(tx, record, now)
    row = tx.row("SELECT position_before FROM agent_evidence WHERE run_id = %s", (record.run_id,))
    return int(row[0]) if row else 0


def _finish(tx: Tx, record: EvidenceRecord, now: int) -> None:
    started = record.started
    found = tx.row("SELECT 1 FROM agent_evidence WHERE run_id = %s AND project_id = %s FOR UPDATE",
                         (started.run_id, started.project_id))
    if found is None:  # its start was not recorded (or it never started)
        _insert(tx, started, now if record.created_at_ms is None else record.created_at_ms)
    tx.execute(SQL_FINISH, (
        record.state, record.error_code, record.budget, record.error, record.answer_summary,
        _round.encode(record.rounds).decode(), len(record.rounds), record.input_tokens, record.output_tokens,
        record.usage_estimated, record.cost_usd, now, started.run_id, started.project_id))


def _page(tx: Tx, project: str, after: EvidenceCursor, limit: int) -> list[EvidenceSummary]:
    rows = tx.rows(SQL_PAGE, (project, after.created_at_ms, after.run_id, limit))
    return [EvidenceSummary(*row) for row in rows]


def _detail(row: Row) -> EvidenceDetail:
    instruction, rounds, error, answer, before, after, kept = row[16:]
    try:
        meta = _rounds.decode(rounds)
        limits = None if kept is None else _limits.decode(kept)
    except msgspec.DecodeError:
        raise unavailable("storage returned a malformed evidence record; nothing is returned") from None
    return EvidenceDetail(*[*row[:16], instruction, meta, error, answer, before, after, limits])


def _get(tx: Tx, project: str, run_id: str) -> EvidenceDetail | None:
    row = tx.row(SQL_GET, (run_id, project))
    return _detail(row) if row is not None else None


class PgEvidenceStore:
    """AgentEvidenceStore on the cluster's PostgreSQL."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def start(self, record: EvidenceOpen, now_ms: int) -> int:
        return await self._db.write(_start, record, now_ms)

    async def finish(self, record: EvidenceRecord, now_ms: int) -> None:
        await self._db.write(_finish, record, now_ms)

    async def page(self, project: str, after: EvidenceCursor | None, limit: int) -> list[EvidenceSummary]:
        return await self._db.read(_page, project, after or _AHEAD_OF_ALL, limit)

    async def get(self, project: str, run_id: str) -> EvidenceDetail | None:
        return await self._db.read(_get, project, run_id)
