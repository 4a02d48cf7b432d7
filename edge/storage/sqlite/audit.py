"""The security audit log, in three classes bounded separately on write (rows and age),
never by a sweeper: allowed calls (`call`), allowed changes of credentials and secrets
(`change`), and refused calls (`refused`: denied or unauthenticated).

Refused calls are aggregated: one row per project, principal, cause (the first reason),
outcome, transport and minute, with a count and its first and last time. The first call
of a row is written before the caller is answered; the calls after it are counted in
memory and added at most `FLUSH_S` later, in one transaction for every row (nothing runs
for a refused call, so its record need not be durable before the answer). A flood of
refused calls therefore writes a few rows a minute, and can never push out the rows of
the other classes.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Literal

import apsw
import msgspec

from edge.core.auth import AuditRecord
from edge.core.errors import ToolError
from edge.core.handoff import Background
from edge.core.ports.runtime import Timers
from edge.storage.sqlite.db import Database, immediate, one

log = logging.getLogger("qledge.store")

AuditClass = Literal["call", "change", "refused"]
_reasons = msgspec.json.Encoder()
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per call, converges over calls
FLUSH_S = 2.0  # how long counts of refused calls may wait in memory
MAX_PENDING = 256  # aggregate rows counted in memory at once; more are written at once
MINUTE_MS = 60_000

SQL_INSERT = (
    "INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport, request_id,"
    " class, count, last_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)"
)
# Allowed calls are the bulk: the oldest batch of them by id (only the rows of the small
# classes are passed over on the way), those beyond the newest `max_rows` ids or too old.
# Between those ids lie rows of the other classes too, so at most `max_rows` calls are kept.
SQL_PRUNE_CALLS = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
    " WHERE class = 'call' ORDER BY id LIMIT ?) WHERE id <= ? OR at_ms < ?)"
)
# A small class is counted exactly, through its partial index (the literal class is what
# lets the planner use it): the first `excess` of its oldest batch go, and any whose last
# call is older than the age bound.
SQL_COUNT = "SELECT count(*) FROM security_audit WHERE class = '{cls}'"
SQL_PRUNE = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, coalesce(last_at_ms, at_ms) AS t,"
    " row_number() OVER (ORDER BY id) AS n FROM (SELECT id, at_ms, last_at_ms FROM security_audit"
    " WHERE class = '{cls}' ORDER BY id LIMIT ?)) WHERE n <= ? OR t < ?)"
)
SQL_ADD = (
    "UPDATE security_audit SET count = count + ?, last_at_ms = max(coalesce(last_at_ms, at_ms), ?),"
    " request_id = NULL, tool = CASE WHEN ? THEN '*' ELSE tool END,"
    " reasons = CASE WHEN ? THEN ? ELSE reasons END WHERE id = ?"
)


class Bounds(msgspec.Struct, frozen=True, kw_only=True):
    """Rows kept per class, and the age beyond which any row goes."""

    calls: int = 10_000
    changes: int = 1_000
    refused: int = 1_000
    max_age_days: int = 30

    def rows(self, cls: AuditClass) -> int:
        return {"call": self.calls, "change": self.changes, "refused": self.refused}[cls]


def classify(record: AuditRecord) -> AuditClass:
    if record.outcome != "allowed":
        return "refused"
    return "change" if record.change else "call"


def trim(conn: apsw.Connection, cls: AuditClass, newest: int, max_rows: int, min_at_ms: int) -> None:
    if cls == "call":
        conn.execute(SQL_PRUNE_CALLS, (PRUNE_BATCH, newest - max_rows, min_at_ms))
        return
    excess = max(0, one(conn, SQL_COUNT.format(cls=cls))[0] - max_rows)
    conn.execute(SQL_PRUNE.format(cls=cls), (PRUNE_BATCH, excess, min_at_ms))


def append(conn: apsw.Connection, record: AuditRecord, cls: AuditClass, max_rows: int, min_at_ms: int) -> int:
    """Insert one row and trim its class (a little per write, until its bounds hold); its id."""
    with immediate(conn):
        conn.execute(SQL_INSERT, (
            record.at_ms, record.project_id, record.principal, record.tool, record.outcome,
            _reasons.encode(record.reasons).decode(), record.transport, record.request_id, cls,
            record.at_ms if cls == "refused" else None,
        ))
        row_id = conn.last_insert_rowid()
        trim(conn, cls, row_id, max_rows, min_at_ms)
    return row_id


class _Tally:
    """An aggregate row of refused calls: where it is, and what is not written yet."""

    __slots__ = ("row_id", "tool", "cause", "count", "last_at_ms", "mixed")

    def __init__(self, tool: str, cause: str) -> None:
        self.row_id: int | None = None  # None while its first call is being written
        self.tool = tool
        self.cause = cause
        self.count = 0
        self.last_at_ms = 0
        self.mixed = False  # calls of more than one tool: the row names none


def _add(conn: apsw.Connection, updates: list[tuple[int, int, bool, bool, str, int]]) -> None:
    with immediate(conn):
        for update in updates:
            conn.execute(SQL_ADD, update)


_Key = tuple[str, str, str, str, str, int]  # project, principal, outcome, cause, transport, minute


class SqliteAuditLog:
    """AuditLog (edge.core.ports.stores)."""

    def __init__(self, db: Database, bounds: Bounds | None = None, timers: Timers | None = None) -> None:
        self._db = db
        self._bounds = bounds or Bounds()
        self._max_age_ms = self._bounds.max_age_days * 86_400_000
        self._timers = timers
        self._tallies: dict[_Key, _Tally] = {}
        self._flush_armed = False
        self._background = Background(log)

    async def append(self, record: AuditRecord) -> None:
        cls = classify(record)
        if cls == "refused":
            return await self._refused(record)
        await self._db.run(append, record, cls, self._bounds.rows(cls), record.at_ms - self._max_age_ms)

    async def _refused(self, record: AuditRecord) -> None:
        cause = record.reasons[0] if record.reasons else ""
        key = (record.project_id, record.principal, record.outcome, cause, record.transport,
               record.at_ms // MINUTE_MS)
        tally = self._tallies.get(key)
        if tally is not None:  # counted now, written with the next flush
            tally.count += 1
            tally.last_at_ms = max(tally.last_at_ms, record.at_ms)
            tally.mixed = tally.mixed or record.tool != tally.tool
            self._arm()
            return
        if len(self._tallies) >= MAX_PENDING:
            await self.flush()
            self._tallies.clear()
        tally = self._tallies[key] = _Tally(record.tool, cause)
        try:
            tally.row_id = await self._db.run(
                append, record, "refused", self._bounds.refused, record.at_ms - self._max_age_ms)
        except BaseException:
            if self._tallies.get(key) is tally:
                del self._tallies[key]
            raise

    def _arm(self) -> None:
        if self._flush_armed:
            return
        self._flush_armed = True
        if self._timers is not None:
            self._timers.call_later(FLUSH_S, self._flush_later)

    def _flush_later(self) -> None:
        self._background.spawn(self._timed_flush(), "audit flush")

    async def _timed_flush(self) -> None:
        with contextlib.suppress(ToolError):  # logged by the store; the counts wait for the next flush
            await self.flush()

    async def flush(self) -> None:
        """Write the counts of refused calls held in memory; forget rows of past minutes."""
        self._flush_armed = False
        updates: list[tuple[int, int, bool, bool, str, int]] = []
        taken: list[tuple[_Tally, int]] = []
        for tally in self._tallies.values():
            if tally.row_id is not None and tally.count:
                reasons = _reasons.encode([tally.cause]).decode()
                updates.append((tally.count, tally.last_at_ms, tally.mixed, tally.mixed, reasons, tally.row_id))
                taken.append((tally, tally.count))
                tally.count = 0
        if updates:
            try:
                await self._db.run(_add, updates)
            except BaseException:
                for tally, count in taken:  # not written: counted again with the next flush
                    tally.count += count
                self._arm()
                raise
        current = max((key[5] for key in self._tallies), default=0)
        for key in [k for k, t in self._tallies.items() if k[5] < current and t.row_id is not None and not t.count]:
            del self._tallies[key]

    async def close(self) -> None:
        """Write what is held in memory (at stop)."""
        await self._background.wait()
        await self.flush()
