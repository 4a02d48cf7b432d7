"""Credentials, secrets and the security audit on the daemon's database (as
edge.storage.postgres.security on a cluster): only an HMAC digest of a credential's secret
is stored; secret values are readable only by the runner and redaction (the database is
0600); the audit is bounded on write (rows and age), never by a sweeper."""

from __future__ import annotations

import apsw
import msgspec

from edge.core.auth import AuditEntry, AuditRecord, Credential, SecretInfo
from edge.core.errors import conflict
from edge.core.ports.stores import AuditPage
from edge.core.reads import SEARCH_BUDGET
from edge.core.tasks import SecretImport
from edge.storage.sqlite.db import Database, immediate, one

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

_reasons = msgspec.json.Encoder()
_reasons_decoder = msgspec.json.Decoder(list[str])
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per call, converges over calls
# Over max_rows, the oldest go down to max_rows - AUDIT_TRIM at once: deleting one row per
# call rebalances the oldest pages on every call, about two more pages written per call.
AUDIT_TRIM = 32
SQL_PRUNE = (
    "DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
    " ORDER BY id LIMIT ?) WHERE id <= ? OR at_ms < ?)"
)


def append_audit(conn: apsw.Connection, record: AuditRecord, max_rows: int, min_at_ms: int) -> None:
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
        cut = newest - max_rows + min(AUDIT_TRIM, max_rows // 4) if over else 0
        conn.execute(SQL_PRUNE, (PRUNE_BATCH, cut, min_at_ms))


# Newest first along the rowid (insertion order): no index of its own, so an audited call
# writes no more than before; `since` is checked on each row, within the page's budget.
SQL_AUDIT_PAGE = (
    "SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id FROM security_audit"
    " WHERE id < ? AND project_id = ? ORDER BY id DESC LIMIT ?"
)
_NO_ROW = 1 << 62


def audit_page(
    conn: apsw.Connection, project: str, since_ms: int | None, before_id: int | None, limit: int,
    budget: int = SEARCH_BUDGET,
) -> AuditPage:
    entries: list[AuditEntry] = []
    scanned, last = 0, None
    cursor = conn.execute(SQL_AUDIT_PAGE, (_NO_ROW if before_id is None else before_id, project, budget))
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
        return await self._db.run(audit_page, project, since_ms, before_id, limit)


class SqliteAuditLog:
    """AuditLog (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database, max_rows: int = 10_000, max_age_days: int = 30) -> None:
        self._db = db
        self._max_rows = max_rows
        self._max_age_ms = max_age_days * 86_400_000

    async def append(self, record: AuditRecord) -> None:
        await self._db.run(append_audit, record, self._max_rows, record.at_ms - self._max_age_ms)
