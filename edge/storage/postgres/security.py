"""Credentials, secrets and the security audit on PostgreSQL (as on SQLite: digests only,
write-only secrets, the audit bounded on write). Audit rows carry the node that answered.

While PostgreSQL is unreachable a node still audits every call before it runs: the row goes
to a local spool (0600, fsync'd, bounded), which the heartbeat moves into PostgreSQL once it
is back. So `qledge status` can say that PostgreSQL is down; a full spool fails closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import TYPE_CHECKING

import msgspec

from edge.core.auth import (
    AuditBounds,
    AuditClass,
    AuditEntry,
    AuditRecord,
    Credential,
    RefusalTallies,
    SecretInfo,
    TallyUpdate,
    audit_class,
)
from edge.core.errors import ToolError, conflict, unavailable
from edge.core.ports.stores import AuditPage
from edge.core.reads import SEARCH_BUDGET
from edge.core.tasks import SecretImport
from edge.storage.postgres.db import PgDatabase, Row, Tx

if TYPE_CHECKING:
    from edge.core.ports.runtime import Timers

log = logging.getLogger("qledge.store")

_perm_encoder = msgspec.json.Encoder()
_perm_decoder = msgspec.json.Decoder(list[str] | None)
_reasons = msgspec.json.Encoder()
_COLUMNS = "id, project_id, name, role, permissions, created_at_ms, revoked_at_ms"
PRUNE_BATCH = 64
# The audit's classes and their bounds as on SQLite (edge.storage.sqlite.security): allowed
# calls by id, beyond the newest `max_rows` ids or too old; a small class counted exactly
# through its partial index (named by a literal class, so that every plan can use it).
SQL_PRUNE_CALLS = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
    " WHERE class = 'call' ORDER BY id LIMIT %s) AS oldest WHERE id <= %s OR at_ms < %s)"
)
SQL_COUNT = "SELECT count(*) FROM security_audit WHERE class = '{cls}'"
SQL_PRUNE = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, coalesce(last_at_ms, at_ms) AS t,"
    " row_number() OVER (ORDER BY id) AS n FROM (SELECT id, at_ms, last_at_ms FROM security_audit"
    " WHERE class = '{cls}' ORDER BY id LIMIT %s) AS oldest) AS numbered WHERE n <= %s OR t < %s)"
)
SQL_ADD = (
    "UPDATE security_audit SET count = count + %s, last_at_ms = greatest(coalesce(last_at_ms, at_ms), %s),"
    " request_id = NULL, tool = CASE WHEN %s THEN '*' ELSE tool END,"
    " reasons = CASE WHEN %s THEN %s ELSE reasons END WHERE id = %s"
)


def _credential(row: Row) -> Credential:
    cid, project, name, role, perms, created, revoked = row
    return Credential(id=cid, project_id=project, name=name, role=role,
                      permissions=_perm_decoder.decode(perms) if perms else None,
                      created_at_ms=created, revoked_at_ms=revoked)


async def _create(tx: Tx, cred: Credential, digest: bytes) -> None:
    perms = _perm_encoder.encode(cred.permissions).decode() if cred.permissions is not None else None
    added = await tx.execute(
        f"INSERT INTO credentials ({_COLUMNS}, digest) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (cred.id, cred.project_id, cred.name, cred.role, perms, cred.created_at_ms, None, digest))
    if not added:
        raise conflict("credential id collision; try again")


async def _lookup(tx: Tx, credential_id: str) -> tuple[Credential, bytes] | None:
    row = await tx.row(f"SELECT {_COLUMNS}, digest FROM credentials WHERE id = %s", (credential_id,))
    return (_credential(row[:-1]), bytes(row[-1])) if row else None


async def _for_project(tx: Tx, project: str) -> list[Credential]:
    return [_credential(r) for r in await tx.rows(
        f"SELECT {_COLUMNS} FROM credentials WHERE project_id = %s ORDER BY created_at_ms, id", (project,))]


async def _revoke(tx: Tx, project: str, credential_id: str, now: int) -> Credential | None:
    row = await tx.row(
        "UPDATE credentials SET revoked_at_ms = coalesce(revoked_at_ms, %s) WHERE id = %s AND project_id = %s"
        f" RETURNING {_COLUMNS}", (now, credential_id, project))
    return _credential(row) if row else None


class PgCredentialStore:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def create(self, credential: Credential, digest: bytes) -> None:
        await self._db.tx(_create, credential, digest)

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None:
        return await self._db.tx(_lookup, credential_id)

    async def for_project(self, project: str) -> list[Credential]:
        return await self._db.tx(_for_project, project)

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None:
        return await self._db.tx(_revoke, project, credential_id, now_ms)


async def _set_secret(tx: Tx, project: str, name: str, value: str, now: int) -> SecretInfo:
    created, updated = await tx.one(
        "INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (project_id, name) DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms"
        " RETURNING created_at_ms, updated_at_ms", (project, name, value, now, now))
    return SecretInfo(name=name, created_at_ms=created, updated_at_ms=updated)


async def _list_secrets(tx: Tx, project: str) -> list[SecretInfo]:
    return [SecretInfo(name=n, created_at_ms=c, updated_at_ms=u) for n, c, u in await tx.rows(
        "SELECT name, created_at_ms, updated_at_ms FROM secrets WHERE project_id = %s ORDER BY name", (project,))]


async def _import_secret(tx: Tx, project: str, key: str, name: str, value: str, now: int) -> SecretImport:
    # The record first: a second node importing the same key waits on its primary key.
    if not await tx.execute(
            "INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (%s, %s, 'secret', %s, %s)"
            " ON CONFLICT DO NOTHING", (project, key, name, now)):
        return "exists"
    if not await tx.execute(
            "INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING", (project, name, value, now, now)):
        await tx.execute("DELETE FROM imports WHERE project_id = %s AND key = %s", (project, key))
        return "taken"  # an import never replaces a value
    return "created"


async def _delete_secret(tx: Tx, project: str, name: str) -> bool:
    return await tx.execute("DELETE FROM secrets WHERE project_id = %s AND name = %s", (project, name)) > 0


async def _resolve(tx: Tx, project: str, names: list[str]) -> dict[str, str]:
    return dict(await tx.rows("SELECT name, value FROM secrets WHERE project_id = %s AND name = ANY(%s)",
                              (project, names)))


async def _values(tx: Tx, project: str) -> list[str]:
    return [v for (v,) in await tx.rows("SELECT value FROM secrets WHERE project_id = %s", (project,))]


class PgSecretStore:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def set(self, project: str, name: str, value: str, now_ms: int) -> SecretInfo:
        return await self._db.tx(_set_secret, project, name, value, now_ms)

    async def import_secret(self, project: str, key: str, name: str, value: str, now_ms: int) -> SecretImport:
        return await self._db.tx(_import_secret, project, key, name, value, now_ms)

    async def for_project(self, project: str) -> list[SecretInfo]:
        return await self._db.tx(_list_secrets, project)

    async def delete(self, project: str, name: str) -> bool:
        return await self._db.tx(_delete_secret, project, name)

    async def resolve(self, project: str, names: list[str]) -> dict[str, str]:
        return await self._db.tx(_resolve, project, names)

    async def values(self, project: str) -> list[str]:
        return await self._db.tx(_values, project)


async def _trim(tx: Tx, cls: AuditClass, newest: int, max_rows: int, min_at_ms: int) -> None:
    if cls == "call":
        await tx.execute(SQL_PRUNE_CALLS, (PRUNE_BATCH, newest - max_rows, min_at_ms))
        return
    (rows,) = await tx.one(SQL_COUNT.format(cls=cls))
    await tx.execute(SQL_PRUNE.format(cls=cls), (PRUNE_BATCH, max(0, int(rows) - max_rows), min_at_ms))


async def _append(tx: Tx, record: AuditRecord, node: str | None, count: int, last_at_ms: int | None,
                  bounds: AuditBounds) -> int:
    cls = audit_class(record)
    (newest,) = await tx.one(
        "INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport, request_id,"
        " node_id, class, count, last_at_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (record.at_ms, record.project_id, record.principal, record.tool, record.outcome,
         _reasons.encode(record.reasons).decode(), record.transport, record.request_id, node, cls, count,
         last_at_ms if cls == "refused" else None))
    await _trim(tx, cls, newest, bounds.rows(cls), record.at_ms - bounds.max_age_ms)
    return int(newest)


async def _add(tx: Tx, updates: list[TallyUpdate]) -> None:
    for row_id, count, last_at, mixed, cause in updates:
        await tx.execute(SQL_ADD, (count, last_at, mixed, mixed, _reasons.encode([cause]).decode(), row_id))


class Spooled(AuditRecord, kw_only=True):
    """A row waiting in the spool: a call, or an aggregate of refused calls."""

    count: int = 1
    last_at_ms: int | None = None


SPOOL_MAX_ROWS = 10_000
_spooled = msgspec.json.Decoder(Spooled)
_spool_encoder = msgspec.json.Encoder()


async def _append_many(tx: Tx, records: list[Spooled], node: str | None, bounds: AuditBounds) -> None:
    for r in records:
        await _append(tx, r, node, r.count, r.last_at_ms if r.last_at_ms is not None else r.at_ms, bounds)


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


class PgAuditLog:
    """AuditLog (edge.core.ports.stores) on PostgreSQL, with the local spool above. Refused
    calls are aggregated as on SQLite (edge.core.auth.RefusalTallies); a row whose first
    call went to the spool gets the calls counted after it as a row of its own once its
    minute is over, so a flood while PostgreSQL is unreachable spools a few rows a minute."""

    def __init__(self, db: PgDatabase, node: str | None, bounds: AuditBounds | None = None,
                 spool: str | None = None, timers: Timers | None = None) -> None:
        self._db = db
        self._node = node
        self._bounds = bounds or AuditBounds()
        self._spool = spool
        self._spooled = 0
        self._tallies = RefusalTallies(self._write, self._add, timers, log)

    async def append(self, record: AuditRecord) -> None:
        if audit_class(record) == "refused":
            return await self._tallies.append(record)
        await self._write(record, 1, None)

    async def _write(self, record: AuditRecord, count: int, last_at_ms: int | None) -> int | None:
        """The row's id; None when it went to the spool."""
        if not self._spooled:
            try:
                return await self._db.tx(_append, record, self._node, count, last_at_ms, self._bounds)
            except ToolError:
                if self._spool is None:
                    raise
        self._to_spool(Spooled(**msgspec.structs.asdict(record), count=count, last_at_ms=last_at_ms))
        return None

    async def _add(self, updates: list[TallyUpdate]) -> None:
        await self._db.tx(_add, updates)

    async def flush(self) -> None:
        await self._tallies.flush()

    async def close(self) -> None:
        await self._tallies.close()

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
            await self._db.tx(_append_many, records, self._node, self._bounds)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._spool)
        self._spooled = 0
        return len(records)


# Newest first along the primary key (insertion order): no index of its own, so an audited
# call writes no more than before; `since` is checked on each row, within the page's budget.
SQL_AUDIT_PAGE = (
    "SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id, class, count,"
    " last_at_ms FROM security_audit WHERE id < %s AND project_id = %s ORDER BY id DESC LIMIT %s"
)
_NO_ROW = 1 << 62
_reasons_decoder = msgspec.json.Decoder(list[str])


async def _audit_page(
    tx: Tx, project: str, since_ms: int | None, before_id: int | None, limit: int, budget: int,
) -> AuditPage:
    rows = await tx.rows(SQL_AUDIT_PAGE, (_NO_ROW if before_id is None else before_id, project, budget))
    entries: list[AuditEntry] = []
    for rid, at, proj, principal, tool, outcome, reasons, transport, request_id, cls, count, last in rows:
        if since_ms is not None and (last or at) < since_ms:
            continue
        if len(entries) == limit:
            return AuditPage(entries=entries, next=entries[-1].id)
        entries.append(AuditEntry(
            id=rid, at_ms=at, project_id=proj, principal=principal, tool=tool, outcome=outcome,
            reasons=_reasons_decoder.decode(reasons), transport=transport, request_id=request_id,
            change=cls == "change", count=int(count), last_at_ms=last))
    return AuditPage(entries=entries, next=rows[-1][0] if len(rows) == budget else None)


class PgAuditReader:
    """AuditReader (edge.core.ports.stores) on PostgreSQL: the rows every node wrote (rows a
    node holds in its spool while PostgreSQL is unreachable appear once they are moved)."""

    def __init__(self, db: PgDatabase, budget: int = SEARCH_BUDGET) -> None:
        self._db = db
        self._budget = budget

    async def page(self, project: str, since_ms: int | None, before_id: int | None, limit: int) -> AuditPage:
        return await self._db.tx(_audit_page, project, since_ms, before_id, limit, self._budget)
