"""The security audit log, bounded on write (rows and age), never by a sweeper."""

from __future__ import annotations

import apsw
import msgspec

from edge.core.auth import AuditRecord
from edge.storage.sqlite.db import Database, immediate, one

_reasons = msgspec.json.Encoder()
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per call, converges over calls
# Over max_rows, the oldest go down to max_rows - TRIM at once: deleting one row per call
# rebalances the oldest pages on every call, about two more pages written per call.
TRIM = 32
SQL_PRUNE = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
    " ORDER BY id LIMIT ?) WHERE id <= ? OR at_ms < ?)"
)


def append(conn: apsw.Connection, record: AuditRecord, max_rows: int, min_at_ms: int) -> None:
    with immediate(conn):
        conn.execute(
            "INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport, request_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (record.at_ms, record.project_id, record.principal, record.tool, record.outcome,
             _reasons.encode(record.reasons).decode(), record.transport, record.request_id),
        )
        newest = conn.last_insert_rowid()
        # Look only at the oldest few rows (id order is insertion order), so one write
        # never scans the table; each write trims a little until both bounds hold.
        oldest = one(conn, "SELECT min(id) FROM security_audit")[0]
        over = oldest is not None and oldest <= newest - max_rows
        conn.execute(SQL_PRUNE, (PRUNE_BATCH, newest - max_rows + min(TRIM, max_rows // 4) if over else 0, min_at_ms))


class SqliteAuditLog:
    def __init__(self, db: Database, max_rows: int = 10_000, max_age_days: int = 30) -> None:
        self._db = db
        self._max_rows = max_rows
        self._max_age_ms = max_age_days * 86_400_000

    async def append(self, record: AuditRecord) -> None:
        await self._db.run(append, record, self._max_rows, record.at_ms - self._max_age_ms)
