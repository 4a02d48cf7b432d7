"""Secrets: values stored in the (0600) database, readable only by the runner and redaction."""

from __future__ import annotations

import apsw

from edge.core.auth import SecretInfo
from edge.core.tasks import SecretImport
from edge.storage.sqlite.db import Database, immediate, one


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


def resolve(conn: apsw.Connection, project: str, names: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in names:
        row = conn.execute("SELECT value FROM secrets WHERE project_id = ? AND name = ?", (project, name)).fetchone()
        if row is not None:
            found[name] = row[0]
    return found


def values(conn: apsw.Connection, project: str) -> list[str]:
    return [v for (v,) in conn.execute("SELECT value FROM secrets WHERE project_id = ?", (project,))]


class SqliteSecretStore:
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
        return await self._db.run(resolve, project, names)

    async def values(self, project: str) -> list[str]:
        return await self._db.run(values, project)
