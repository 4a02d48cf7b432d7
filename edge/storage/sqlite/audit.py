"""The security audit log, bounded on write (rows and age), never by a sweeper."""

from __future__ import annotations

import apsw
import msgspec

from edge.core.auth import AuditEntry, AuditRecord
from edge.core.ports.stores import AuditPage
from edge.core.reads import SEARCH_BUDGET
from edge.storage.sqlite.db import Database, immediate

_reasons = msgspec.json.Encoder()
_reasons_decoder = msgspec.json.Decoder(list[str])
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per call, converges over calls
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
        conn.execute(SQL_PRUNE, (PRUNE_BATCH, newest - max_rows, min_at_ms))


# Newest first along the rowid (insertion order): no index of its own, so an audited call
# writes no more than before; `since` is checked on each row, within the page's budget.
SQL_PAGE = (
    "SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id FROM security_audit"
    " WHERE id < ? AND project_id = ? ORDER BY id DESC LIMIT ?"
)
_NO_ROW = 1 << 62


def page(
    conn: apsw.Connection, project: str, since_ms: int | None, before_id: int | None, limit: int,
    budget: int = SEARCH_BUDGET,
) -> AuditPage:
    entries: list[AuditEntry] = []
    scanned, last = 0, None
    cursor = conn.execute(SQL_PAGE, (_NO_ROW if before_id is None else before_id, project, budget))
    try:
        for rid, at, proj, principal, tool, outcome, reasons, transport, request_id in cursor:
            scanned, last = scanned + 1, rid
            if since_ms is not None and at < since_ms:
                continue
            if len(entries) == limit:
                return AuditPage(entries=entries, next=entries[-1].id)
            entries.append(AuditEntry(
                id=rid, at_ms=at, project_id=proj, principal=principal, tool=tool, outcome=outcome,
                reasons=_reasons_decoder.decode(reasons), transport=transport, request_id=request_id))
    finally:
        cursor.close()
    return AuditPage(entries=entries, next=last if scanned == budget else None)


class SqliteAuditReader:
    """AuditReader (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def page(self, project: str, since_ms: int | None, before_id: int | None, limit: int) -> AuditPage:
        return await self._db.run(page, project, since_ms, before_id, limit)


class SqliteAuditLog:
    def __init__(self, db: Database, max_rows: int = 10_000, max_age_days: int = 30) -> None:
        self._db = db
        self._max_rows = max_rows
        self._max_age_ms = max_age_days * 86_400_000

    async def append(self, record: AuditRecord) -> None:
        await self._db.run(append, record, self._max_rows, record.at_ms - self._max_age_ms)
