"""The security audit's spool on a cluster node. While PostgreSQL is unreachable a node still
audits every call before it runs: the row goes to a local spool (0600, fsync'd, bounded),
which the heartbeat moves into PostgreSQL once it is back. So `qledge status` can say that
PostgreSQL is down; a full spool fails closed. (Credentials, secrets and the audit itself
are edge.storage.security, with this backend's statements; audit rows carry the node that
answered.)
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING

import msgspec

from edge.core.auth import AuditBounds, AuditRecord, audit_class
from edge.core.errors import ToolError, unavailable
from edge.storage.postgres.db import Carry, PgDatabase
from edge.storage.postgres.sql import SECURITY
from edge.storage.security import SqlAuditLog, append_audit
from edge.storage.tx import Tx

if TYPE_CHECKING:
    from edge.core.ports.runtime import Timers
    from edge.core.ports.stores import AuditTicket

class Spooled(AuditRecord, kw_only=True):
    """A row waiting in the spool: a call, or an aggregate of refused calls."""

    count: int = 1
    last_at_ms: int | None = None


SPOOL_MAX_ROWS = 10_000


# Tools whose handler does nothing before its first storage work (run.start reads the task,
# or admits): a change's row may ride in that transaction (`before_change`).
CARRIED_TOOLS = frozenset({"qledge.run.start"})


class _Carried:
    """The ticket of a row carried by the call's first transaction (AuditTicket)."""

    __slots__ = ("_carry",)

    def __init__(self, carry: Carry) -> None:
        self._carry = carry

    async def committed(self) -> object:
        carry = self._carry
        # Not taken: the call made no transaction. Taken and not written: the transaction
        # that took it did not commit and its fallback failed (or it is a task of the
        # call's still under way): written again, a row twice rather than none.
        if carry.take() or carry.state != "written":
            await carry.fallback()
        return None


_spooled = msgspec.json.Decoder(Spooled)
_spool_encoder = msgspec.json.Encoder()


def _append_many(tx: Tx, records: list[Spooled], node: str | None, bounds: AuditBounds) -> None:
    for r in records:
        append_audit(tx, SECURITY, r, r.count, r.last_at_ms if r.last_at_ms is not None else r.at_ms, bounds, node)


def _read_spool(path: str) -> list[Spooled] | None:
    """The spooled rows ([] when there is no spool); None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError:  # a link (ELOOP) in its place is never followed
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return [_spooled.decode(line) for line in f if line.strip()]
    except (OSError, msgspec.DecodeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


class PgAuditLog(SqlAuditLog):
    """AuditLog (edge.core.ports.stores) on PostgreSQL, with the local spool above. A row
    whose first call went to the spool gets the refused calls counted after it as a row of
    its own once its minute is over (edge.core.auth.RefusalTallies), so a flood while
    PostgreSQL is unreachable spools a few rows a minute."""

    def __init__(self, db: PgDatabase, node: str | None, bounds: AuditBounds | None = None,
                 spool: str | None = None, timers: Timers | None = None) -> None:
        super().__init__(db, SECURITY, bounds, timers, node)
        self._pg = db
        self._spool = spool
        self._spooled = 0

    async def ahead(self, record: AuditRecord) -> AuditTicket:
        """An allowed read's row rides at the head of the call's first transaction."""
        return self._carried(record) or await super().ahead(record)

    async def before_change(self, record: AuditRecord) -> AuditTicket:
        """Carried for the tools whose first storage work precedes all else they do
        (CARRIED_TOOLS); written now for the rest."""
        ticket = self._carried(record) if record.tool in CARRIED_TOOLS else None
        return ticket or await super().before_change(record)

    def _carried(self, record: AuditRecord) -> AuditTicket | None:
        """The row armed to ride at the head of the call's first transaction
        (PgDatabase.carry), committed with it and so before anything the call did; the
        caller's `committed()` writes it on its own (to the spool while PostgreSQL is
        unreachable) when no transaction of the call committed it. None while the spool
        holds rows (then it is written now, so that rows keep their order)."""
        if audit_class(record) != "call" or self._spooled:
            return None
        carry = self._pg.carry(append_audit, SECURITY, record, 1, None, self._bounds, self._node, self._check(),
                               self._every - 1, fallback=lambda: self._fall_back(carry, record))
        return _Carried(carry)

    async def _fall_back(self, carry: Carry, record: AuditRecord) -> None:
        await self._write(record, 1, None)
        carry.state = "written"

    async def _write(self, record: AuditRecord, count: int, last_at_ms: int | None) -> int | None:
        """The row's id; None when it went to the spool."""
        if not self._spooled:
            try:
                return await super()._write(record, count, last_at_ms)
            except ToolError:
                if self._spool is None:
                    raise
        self._to_spool(Spooled(**msgspec.structs.asdict(record), count=count, last_at_ms=last_at_ms))
        return None

    def _to_spool(self, record: Spooled) -> None:
        if self._spool is None or self._spooled >= SPOOL_MAX_ROWS:
            raise unavailable("the security audit could not be written")
        try:
            # Never through a link: the spool is a file of the state directory (edge.app.home).
            fd = os.open(self._spool, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, _spool_encoder.encode(record) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            raise unavailable("the security audit could not be written") from None
        self._spooled += 1

    async def move_spool(self) -> int:
        """Move the spooled rows into PostgreSQL (one transaction); how many moved."""
        if self._spool is None:
            return 0
        records = _read_spool(self._spool)
        if records is None:
            return 0
        if records:
            await self._pg.write(_append_many, records, self._node, self._bounds)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._spool)
        self._spooled = 0
        return len(records)

