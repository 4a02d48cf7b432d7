"""API credentials: only an HMAC digest of the secret is ever stored."""

from __future__ import annotations

import apsw
import msgspec

from edge.core.auth import Credential
from edge.core.errors import conflict
from edge.storage.sqlite.db import Database, immediate

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


def create(conn: apsw.Connection, cred: Credential, digest: bytes) -> None:
    perms = _perm_encoder.encode(cred.permissions).decode() if cred.permissions is not None else None
    with immediate(conn):
        try:
            conn.execute(
                f"INSERT INTO credentials ({_COLUMNS}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (cred.id, cred.project_id, cred.name, cred.role, perms, cred.created_at_ms, None, digest),
            )
        except apsw.ConstraintError:
            raise conflict("credential id collision; try again") from None


def lookup(conn: apsw.Connection, credential_id: str) -> tuple[Credential, bytes] | None:
    row = conn.execute(f"SELECT {_COLUMNS}, digest FROM credentials WHERE id = ?", (credential_id,)).fetchone()
    return (_credential(row[:-1]), row[-1]) if row else None


def list_credentials(conn: apsw.Connection, project: str) -> list[Credential]:
    return [_credential(r) for r in conn.execute(
        f"SELECT {_COLUMNS} FROM credentials WHERE project_id = ? ORDER BY created_at_ms, id", (project,))]


def revoke(conn: apsw.Connection, project: str, credential_id: str, now: int) -> Credential | None:
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
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, credential: Credential, digest: bytes) -> None:
        await self._db.run(create, credential, digest)

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None:
        return await self._db.run(lookup, credential_id)

    async def for_project(self, project: str) -> list[Credential]:
        return await self._db.run(list_credentials, project)

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None:
        return await self._db.run(revoke, project, credential_id, now_ms)
