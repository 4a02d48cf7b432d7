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

The store's change position costs no write: PostgreSQL's next transaction id
(`pg_current_snapshot`), which every writing transaction of the cluster moves, so a
record's positions before and after bracket every change made while its run went on.
A record of a run that a node lost (its lease expired) is ended `lost` by the reaping
transaction itself (edge.storage.postgres.runs.SQL_EVIDENCE_LOST).
"""

from __future__ import annotations

import msgspec

from edge.core.agent import EvidenceCursor, EvidenceDetail, EvidenceEnd, EvidenceOpen, EvidenceSummary, RoundMeta
from edge.core.errors import unavailable
from edge.storage.postgres.db import PgDatabase, Row, Tx

MAX_RECORDS = 500
MAX_AGE_MS = 90 * 86_400_000
PRUNE_BATCH = 16

_round = msgspec.json.Encoder()
_rounds = msgspec.json.Decoder(list[RoundMeta])

POSITION = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
SQL_INSERT = (
    "INSERT INTO agent_evidence (run_id, project_id, task_id, task_revision, state, instruction, provider, model,"
    f" cost_usd, position_before, created_at_ms) VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, %s, {POSITION}, %s)"
    " ON CONFLICT (run_id) DO NOTHING"
)
# The cut: the newest record beyond the ones kept (an index walk of MAX_RECORDS + 1 keys).
SQL_CUT = "SELECT seq FROM agent_evidence ORDER BY seq DESC OFFSET %s LIMIT 1"
SQL_PRUNE = (
    "DELETE FROM agent_evidence WHERE seq IN (SELECT seq FROM (SELECT seq, created_at_ms FROM agent_evidence"
    " ORDER BY seq LIMIT %s) AS oldest WHERE seq <= %s OR created_at_ms < %s)"
)
SQL_ROUND = (
    "UPDATE agent_evidence SET rounds = rounds || jsonb_build_array(%s::jsonb), round_count = round_count + 1,"
    " input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
    " usage_estimated = usage_estimated OR %s,"
    " cost_usd = CASE WHEN %s::double precision IS NULL THEN NULL ELSE cost_usd + %s::double precision END"
    " WHERE run_id = %s AND project_id = %s AND state = 'running'"
)
SQL_END = (
    "UPDATE agent_evidence SET state = %s, error_code = %s, budget = %s, error = %s, answer_summary = %s,"
    f" position_after = {POSITION}, finished_at_ms = %s WHERE run_id = %s AND project_id = %s AND state = 'running'"
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
    f"SELECT {SUMMARY}, instruction, rounds::text, error, answer_summary, position_before, position_after"
    " FROM agent_evidence WHERE run_id = %s AND project_id = %s"
)
_AHEAD_OF_ALL = EvidenceCursor(created_at_ms=1 << 62, run_id="\U0010ffff")


async def _insert(tx: Tx, record: EvidenceOpen, now: int) -> None:
    await tx.execute(SQL_INSERT, (
        record.run_id, record.project_id, record.task_id, record.task_revision, record.instruction,
        record.provider, record.model, 0.0 if record.cost_known else None, now,
    ))
    cut = await tx.row(SQL_CUT, (MAX_RECORDS,))
    await tx.execute(SQL_PRUNE, (PRUNE_BATCH, cut[0] if cut else 0, now - MAX_AGE_MS))


async def _open(tx: Tx, record: EvidenceOpen, now: int) -> None:
    await _insert(tx, record, now)


async def _add_round(tx: Tx, project: str, run_id: str, meta: RoundMeta, cost: float | None) -> bool:
    changed = await tx.execute(SQL_ROUND, (
        _round.encode(meta).decode(), meta.input_tokens, meta.output_tokens, meta.usage_estimated, cost, cost,
        run_id, project))
    return changed > 0


async def _end(tx: Tx, end: EvidenceEnd, started: EvidenceOpen, now: int) -> None:
    found = await tx.row("SELECT 1 FROM agent_evidence WHERE run_id = %s AND project_id = %s FOR UPDATE",
                         (end.run_id, end.project_id))
    if found is None:
        await _insert(tx, started, now)
    await tx.execute(SQL_END, (end.state, end.error_code, end.budget, end.error, end.answer_summary, now,
                               end.run_id, end.project_id))


async def _page(tx: Tx, project: str, after: EvidenceCursor, limit: int) -> list[EvidenceSummary]:
    rows = await tx.rows(SQL_PAGE, (project, after.created_at_ms, after.run_id, limit))
    return [EvidenceSummary(*row) for row in rows]


def _detail(row: Row) -> EvidenceDetail:
    instruction, rounds, error, answer, before, after = row[16:]
    try:
        meta = _rounds.decode(rounds)
    except msgspec.DecodeError:
        raise unavailable("storage returned a malformed evidence record; nothing is returned") from None
    return EvidenceDetail(*[*row[:16], instruction, meta, error, answer, before, after])


async def _get(tx: Tx, project: str, run_id: str) -> EvidenceDetail | None:
    row = await tx.row(SQL_GET, (run_id, project))
    return _detail(row) if row is not None else None


class PgEvidenceStore:
    """AgentEvidenceStore on the cluster's PostgreSQL."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def open(self, record: EvidenceOpen, now_ms: int) -> None:
        await self._db.tx(_open, record, now_ms)

    async def add_round(self, project: str, run_id: str, meta: RoundMeta, cost_usd: float | None) -> bool:
        return await self._db.tx(_add_round, project, run_id, meta, cost_usd)

    async def end(self, end: EvidenceEnd, started: EvidenceOpen, now_ms: int) -> None:
        await self._db.tx(_end, end, started, now_ms)

    async def page(self, project: str, after: EvidenceCursor | None, limit: int) -> list[EvidenceSummary]:
        return await self._db.tx(_page, project, after or _AHEAD_OF_ALL, limit)

    async def get(self, project: str, run_id: str) -> EvidenceDetail | None:
        return await self._db.tx(_get, project, run_id)
