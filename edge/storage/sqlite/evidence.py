"""The evidence history of AI runs (seed 001) on the daemon's database: one row per run.
Implements AgentEvidenceStore (edge.core.ports.agent).

Seed 001's write discipline: a record is written once, whole, when its run reaches its
terminal state (the daemon holds its rounds in memory until then); starting a run writes
nothing. On a router that is one transaction of flash per AI run for its evidence, not one
at its start and one per round besides.

Retention is part of the transaction that inserts a record, and of nothing else (no
sweeper, no start-up pass): the newest MAX_RECORDS records are kept and none created more
than MAX_AGE_MS before the inserting write's clock (the device clock: a clock set wrongly
prunes early or late, which changes nothing else). Each insert looks at the PRUNE_BATCH
oldest rows only, so its cost is bounded and the table converges. The rule covers the
whole table, as one daemon serves one project.

The store's change position, recorded before and after each run, costs no write: it is the
number of rows the daemon's connection has changed since it opened, above a base taken once
per daemon from the highest position any record holds. So within one daemon's life the
difference of two positions is exactly the number of rows changed in between, and across
restarts positions only grow.
"""

from __future__ import annotations

import apsw
import msgspec

from edge.core.errors import unavailable
from edge.core.agent import (
    EvidenceCursor, EvidenceDetail, EvidenceLimits, EvidenceOpen, EvidenceRecord, EvidenceSummary, RoundMeta,
)
from edge.storage.sqlite.db import Database, immediate, one

MAX_RECORDS = 500
MAX_AGE_MS = 90 * 86_400_000
PRUNE_BATCH = 16

_rounds_json = msgspec.json.Encoder()
_rounds = msgspec.json.Decoder(list[RoundMeta])
_limits = msgspec.json.Decoder(EvidenceLimits)

SQL_HIGHEST = "SELECT max(coalesce(max(position_before), 0), coalesce(max(position_after), 0)) FROM agent_evidence"
SQL_INSERT = (
    "INSERT INTO agent_evidence (run_id, project_id, task_id, task_revision, state, error_code, budget, error,"
    " instruction, provider, model, rounds, round_count, input_tokens, output_tokens, usage_estimated, cost_usd,"
    " answer_summary, position_before, position_after, created_at_ms, finished_at_ms, limits)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING"
)
# Only the oldest few rows (seq is insertion order) are looked at, so no insert scans the table.
SQL_PRUNE = (
    "DELETE FROM agent_evidence WHERE seq IN (SELECT seq FROM (SELECT seq, created_at_ms FROM agent_evidence"
    " ORDER BY seq LIMIT ?) WHERE seq <= ? OR created_at_ms < ?)"
)
SUMMARY = (
    "project_id, run_id, task_id, task_revision, state, error_code, budget, provider, model, round_count,"
    " input_tokens, output_tokens, usage_estimated, cost_usd, created_at_ms, finished_at_ms"
)
SQL_PAGE = (
    f"SELECT {SUMMARY} FROM agent_evidence WHERE project_id = ? AND (created_at_ms, run_id) < (?, ?)"
    " ORDER BY created_at_ms DESC, run_id DESC LIMIT ?"
)
SQL_GET = (
    f"SELECT {SUMMARY}, instruction, rounds, error, answer_summary, position_before, position_after, limits"
    " FROM agent_evidence WHERE run_id = ? AND project_id = ?"
)
_AHEAD_OF_ALL = EvidenceCursor(created_at_ms=1 << 62, run_id="\U0010ffff")
_USAGE_ESTIMATED = 12  # column index in SUMMARY


class Position:
    """The change position of one daemon's connection (see the module's docstring)."""

    def __init__(self) -> None:
        self._base: int | None = None

    def __call__(self, conn: apsw.Connection) -> int:
        if self._base is None:  # once per daemon, at its first record: at most MAX_RECORDS rows
            self._base = int(one(conn, SQL_HIGHEST)[0] or 0) + 1 - conn.total_changes()
        return self._base + conn.total_changes()


def position(conn: apsw.Connection, where: Position) -> int:
    return where(conn)


def write_record(conn: apsw.Connection, record: EvidenceRecord, now: int, where: Position) -> None:
    """The whole record in one transaction, with retention; a record that exists is left."""
    started = record.started
    with immediate(conn):
        after = where(conn)
        conn.execute(SQL_INSERT, (
            started.run_id, started.project_id, started.task_id, started.task_revision, record.state,
            record.error_code, record.budget, record.error, started.instruction, started.provider, started.model,
            _rounds_json.encode(record.rounds).decode(), len(record.rounds), record.input_tokens,
            record.output_tokens, int(record.usage_estimated), record.cost_usd, record.answer_summary,
            after if record.position_before is None else record.position_before, after,
            now if record.created_at_ms is None else record.created_at_ms, now,
            None if started.limits is None else _rounds_json.encode(started.limits).decode(),
        ))
        (newest,) = one(conn, "SELECT coalesce(max(seq), 0) FROM agent_evidence")
        conn.execute(SQL_PRUNE, (PRUNE_BATCH, newest - MAX_RECORDS, now - MAX_AGE_MS))


def _flags(row: tuple) -> tuple:
    # SQLite stores booleans as integers; anything but 0/1 stays an int and fails validation.
    value = row[_USAGE_ESTIMATED]
    return (*row[:_USAGE_ESTIMATED], bool(value) if value in (0, 1) else value, *row[_USAGE_ESTIMATED + 1 :])


def page(conn: apsw.Connection, project: str, after: EvidenceCursor, limit: int) -> list[EvidenceSummary]:
    rows = conn.execute(SQL_PAGE, (project, after.created_at_ms, after.run_id, limit))
    return [EvidenceSummary(*_flags(row)) for row in rows]


def get(conn: apsw.Connection, project: str, run_id: str) -> EvidenceDetail | None:
    row = conn.execute(SQL_GET, (run_id, project)).fetchone()
    if row is None:
        return None
    head = _flags(row[:16])
    instruction, rounds, error, answer, before, after, kept = row[16:]
    try:
        meta = _rounds.decode(rounds)
        limits = None if kept is None else _limits.decode(kept)
    except msgspec.DecodeError:
        raise unavailable("storage returned a malformed evidence record; nothing is returned") from None
    return EvidenceDetail(*[*head, instruction, meta, error, answer, before, after, limits])


class SqliteEvidenceStore:
    """AgentEvidenceStore on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._position = Position()

    async def start(self, record: EvidenceOpen, now_ms: int) -> int:
        return await self._db.run(position, self._position)  # a read: nothing is written yet

    async def finish(self, record: EvidenceRecord, now_ms: int) -> None:
        await self._db.run(write_record, record, now_ms, self._position)

    async def page(self, project: str, after: EvidenceCursor | None, limit: int) -> list[EvidenceSummary]:
        return await self._db.run(page, project, after or _AHEAD_OF_ALL, limit)

    async def get(self, project: str, run_id: str) -> EvidenceDetail | None:
        return await self._db.run(get, project, run_id)
