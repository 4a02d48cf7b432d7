"""Credentials, secrets and the security audit on the daemon's database (as
edge.storage.postgres.security on a cluster): only an HMAC digest of a credential's secret
is stored; secret values are readable only by the runner and redaction (the database is
0600); the audit is bounded on write (rows and age) per class, never by a sweeper."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import apsw
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
from edge.core.errors import conflict
from edge.core.ports.stores import AuditPage
from edge.core.reads import SEARCH_BUDGET
from edge.core.tasks import SecretImport
from edge.storage.sqlite.db import Database, immediate, one

if TYPE_CHECKING:
    from edge.core.ports.runtime import Timers

# -- credentials --------------------------------------------------------------------

_perm_encoder = msgspec.json.Encoder()
_perm_decoder = msgspec.json.Decoder(list[str] | None)
_COLUMNS = "id, project_id, name, role, permissions, created_at_ms, revoked_at_ms"


def _credential(row: tuple) -> Credential:
    cid, project, name, role, perms, created, revoked = row
    return Credential(
        id=cid, project_id=project, name=name, role=role,
        permissions=_perm_decoder.decode(perms) if perms else None,
        created_at_ms=created, revoked_at_ms=revoked,
    )


def create_credential(conn: apsw.Connection, cred: Credential, digest: bytes) -> None:
    perms = _perm_encoder.encode(cred.permissions).decode() if cred.permissions is not None else None
    with immediate(conn):
        try:
            conn.execute(
                f"INSERT INTO credentials ({_COLUMNS}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (cred.id, cred.project_id, cred.name, cred.role, perms, cred.created_at_ms, None, digest),
            )
        except apsw.ConstraintError:
            raise conflict("credential id collision; try again") from None


def lookup_credential(conn: apsw.Connection, credential_id: str) -> tuple[Credential, bytes] | None:
    row = conn.execute(f"SELECT {_COLUMNS}, digest FROM credentials WHERE id = ?", (credential_id,)).fetchone()
    return (_credential(row[:-1]), row[-1]) if row else None


def list_credentials(conn: apsw.Connection, project: str) -> list[Credential]:
    return [_credential(r) for r in conn.execute(
        f"SELECT {_COLUMNS} FROM credentials WHERE project_id = ? ORDER BY created_at_ms, id", (project,))]


def revoke_credential(conn: apsw.Connection, project: str, credential_id: str, now: int) -> Credential | None:
    with immediate(conn):
        conn.execute(
            "UPDATE credentials SET revoked_at_ms = coalesce(revoked_at_ms, ?) WHERE id = ? AND project_id = ?",
            (now, credential_id, project),
        )
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM credentials WHERE id = ? AND project_id = ?", (credential_id, project)
        ).fetchone()
    return _credential(row) if row else None


class SqliteCredentialStore:
    """CredentialStore (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, credential: Credential, digest: bytes) -> None:
        await self._db.run(create_credential, credential, digest)

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None:
        return await self._db.run(lookup_credential, credential_id)

    async def for_project(self, project: str) -> list[Credential]:
        return await self._db.run(list_credentials, project)

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None:
        return await self._db.run(revoke_credential, project, credential_id, now_ms)


# -- secrets ------------------------------------------------------------------------


def set_secret(conn: apsw.Connection, project: str, name: str, value: str, now: int) -> SecretInfo:
    with immediate(conn):
        conn.execute(
            "INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (project_id, name)"
            " DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms",
            (project, name, value, now, now),
        )
        created, updated = one(
            conn, "SELECT created_at_ms, updated_at_ms FROM secrets WHERE project_id = ? AND name = ?", (project, name))
    return SecretInfo(name=name, created_at_ms=created, updated_at_ms=updated)


def import_secret(conn: apsw.Connection, project: str, key: str, name: str, value: str, now: int) -> SecretImport:
    """Store the secret under its import key, unless the key is on record (`exists`) or a
    secret of that name is there already (`taken`: never replaced by an import)."""
    with immediate(conn):
        if conn.execute("SELECT 1 FROM imports WHERE project_id = ? AND key = ?", (project, key)).fetchone():
            return "exists"
        if conn.execute("SELECT 1 FROM secrets WHERE project_id = ? AND name = ?", (project, name)).fetchone():
            return "taken"
        conn.execute(
            "INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?)",
            (project, name, value, now, now))
        conn.execute("INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (?, ?, 'secret', ?, ?)",
                     (project, key, name, now))
    return "created"


def list_secrets(conn: apsw.Connection, project: str) -> list[SecretInfo]:
    return [
        SecretInfo(name=n, created_at_ms=c, updated_at_ms=u)
        for n, c, u in conn.execute(
            "SELECT name, created_at_ms, updated_at_ms FROM secrets WHERE project_id = ? ORDER BY name", (project,))
    ]


def delete_secret(conn: apsw.Connection, project: str, name: str) -> bool:
    with immediate(conn):
        conn.execute("DELETE FROM secrets WHERE project_id = ? AND name = ?", (project, name))
        return conn.changes() > 0


def resolve_secrets(conn: apsw.Connection, project: str, names: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in names:
        row = conn.execute("SELECT value FROM secrets WHERE project_id = ? AND name = ?", (project, name)).fetchone()
        if row is not None:
            found[name] = row[0]
    return found


def secret_values(conn: apsw.Connection, project: str) -> list[str]:
    return [v for (v,) in conn.execute("SELECT value FROM secrets WHERE project_id = ?", (project,))]


class SqliteSecretStore:
    """SecretStore (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(self, project: str, name: str, value: str, now_ms: int) -> SecretInfo:
        return await self._db.run(set_secret, project, name, value, now_ms)

    async def import_secret(self, project: str, key: str, name: str, value: str, now_ms: int) -> SecretImport:
        return await self._db.run(import_secret, project, key, name, value, now_ms)

    async def for_project(self, project: str) -> list[SecretInfo]:
        return await self._db.run(list_secrets, project)

    async def delete(self, project: str, name: str) -> bool:
        return await self._db.run(delete_secret, project, name)

    async def resolve(self, project: str, names: list[str]) -> dict[str, str]:
        return await self._db.run(resolve_secrets, project, names)

    async def values(self, project: str) -> list[str]:
        return await self._db.run(secret_values, project)


# -- the security audit ---------------------------------------------------------------
#
# Three classes, bounded separately on write (rows and age), never by a sweeper: allowed
# calls (`call`), allowed changes of credentials and secrets (`change`), and refused calls
# (`refused`: denied or unauthenticated), aggregated by edge.core.auth.RefusalTallies into a
# few rows a minute. No volume of one class can push out the rows of another.

log = logging.getLogger("qledge.store")
_reasons = msgspec.json.Encoder()
_reasons_decoder = msgspec.json.Decoder(list[str])
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per call, converges over calls
# Over a bound, the oldest go down to the bound less AUDIT_TRIM (at most a quarter of it) at
# once: deleting one row per call rebalances the oldest pages on every call, about two more
# pages written per call.
AUDIT_TRIM = 32

SQL_INSERT = (
    "INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport, request_id,"
    " class, count, last_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Allowed calls are the bulk: the oldest batch of them by id (only the rows of the small
# classes are passed over on the way), those up to `cut` or too old. Between those ids lie
# rows of the other classes too, so at most `max_rows` calls are kept.
SQL_OLDEST_CALL = "SELECT id FROM security_audit WHERE class = 'call' ORDER BY id LIMIT 1"
SQL_PRUNE_CALLS = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
    " WHERE class = 'call' ORDER BY id LIMIT ?) WHERE id <= ? OR at_ms < ?)"
)
# A small class is counted exactly, through its partial index (the literal class is what
# lets the planner use it): over the bound, the first of its oldest batch go (down to the
# bound less the trim), and any whose last
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


def trim_audit(conn: apsw.Connection, cls: AuditClass, newest: int, max_rows: int, min_at_ms: int) -> None:
    trim = min(AUDIT_TRIM, max_rows // 4)
    if cls == "call":
        oldest = conn.execute(SQL_OLDEST_CALL).fetchone()
        over = oldest is not None and oldest[0] <= newest - max_rows
        conn.execute(SQL_PRUNE_CALLS, (PRUNE_BATCH, newest - max_rows + trim if over else 0, min_at_ms))
        return
    excess = one(conn, SQL_COUNT.format(cls=cls))[0] - max_rows
    conn.execute(SQL_PRUNE.format(cls=cls), (PRUNE_BATCH, excess + trim if excess > 0 else 0, min_at_ms))


def append_audit(
    conn: apsw.Connection, record: AuditRecord, cls: AuditClass, count: int, last_at_ms: int | None,
    max_rows: int, min_at_ms: int,
) -> int:
    """Insert one row and trim its class (a little per write, until its bounds hold); its id."""
    with immediate(conn):
        conn.execute(SQL_INSERT, (
            record.at_ms, record.project_id, record.principal, record.tool, record.outcome,
            _reasons.encode(record.reasons).decode(), record.transport, record.request_id, cls, count, last_at_ms,
        ))
        row_id = conn.last_insert_rowid()
        trim_audit(conn, cls, row_id, max_rows, min_at_ms)
    return row_id


def add_counts(conn: apsw.Connection, updates: list[TallyUpdate]) -> None:
    with immediate(conn):
        for row_id, count, last_at, mixed, cause in updates:
            conn.execute(SQL_ADD, (count, last_at, mixed, mixed, _reasons.encode([cause]).decode(), row_id))


# Newest first along the rowid (insertion order): no index of its own, so an audited call
# writes no more than before; `since` is checked on each row (an aggregate's last call),
# within the page's budget.
SQL_AUDIT_PAGE = (
    "SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id, class, count,"
    " last_at_ms FROM security_audit WHERE id < ? AND project_id = ? ORDER BY id DESC LIMIT ?"
)
_NO_ROW = 1 << 62


def audit_entry(row: tuple) -> AuditEntry:
    rid, at, proj, principal, tool, outcome, reasons, transport, request_id, cls, count, last = row
    return AuditEntry(
        id=rid, at_ms=at, project_id=proj, principal=principal, tool=tool, outcome=outcome,
        reasons=_reasons_decoder.decode(reasons), transport=transport, request_id=request_id,
        change=cls == "change", count=count, last_at_ms=last)


def audit_page(
    conn: apsw.Connection, project: str, since_ms: int | None, before_id: int | None, limit: int,
    budget: int = SEARCH_BUDGET,
) -> AuditPage:
    entries: list[AuditEntry] = []
    scanned, last = 0, None
    cursor = conn.execute(SQL_AUDIT_PAGE, (_NO_ROW if before_id is None else before_id, project, budget))
    try:
        for row in cursor:
            scanned, last = scanned + 1, row[0]
            if since_ms is not None and (row[11] or row[1]) < since_ms:
                continue
            if len(entries) == limit:
                return AuditPage(entries=entries, next=entries[-1].id)
            entries.append(audit_entry(row))
    finally:
        cursor.close()
    return AuditPage(entries=entries, next=last if scanned == budget else None)


class SqliteAuditReader:
    """AuditReader (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def page(self, project: str, since_ms: int | None, before_id: int | None, limit: int) -> AuditPage:
        return await self._db.run(audit_page, project, since_ms, before_id, limit)


class SqliteAuditLog:
    """AuditLog (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database, bounds: AuditBounds | None = None, timers: Timers | None = None) -> None:
        self._db = db
        self._bounds = bounds or AuditBounds()
        self._tallies = RefusalTallies(self._insert_refused, self._add, timers, log)

    async def append(self, record: AuditRecord) -> None:
        cls = audit_class(record)
        if cls == "refused":
            return await self._tallies.append(record)
        await self._db.run(append_audit, record, cls, 1, None, self._bounds.rows(cls),
                           record.at_ms - self._bounds.max_age_ms)

    async def _insert_refused(self, record: AuditRecord, count: int, last_at_ms: int) -> int:
        return await self._db.run(append_audit, record, "refused", count, last_at_ms, self._bounds.refused,
                                  record.at_ms - self._bounds.max_age_ms)

    async def _add(self, updates: list[TallyUpdate]) -> None:
        await self._db.run(add_counts, updates)

    async def flush(self) -> None:
        await self._tallies.flush()

    async def close(self) -> None:
        await self._tallies.close()
