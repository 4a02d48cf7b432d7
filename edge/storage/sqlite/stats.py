"""Counts for `qledge status`."""

from __future__ import annotations

import apsw

from edge.storage.sqlite.db import Database
from edge.core.ports import Counts


def counts(conn: apsw.Connection, project: str) -> Counts:
    one = lambda sql: conn.execute(sql, (project,)).fetchone()[0]  # noqa: E731
    return Counts(
        tasks=one("SELECT count(*) FROM tasks WHERE project_id = ?"),
        triggers=one("SELECT count(*) FROM triggers WHERE project_id = ?"),
        runs=one("SELECT count(*) FROM runs WHERE project_id = ?"),
        active_runs=one("SELECT count(*) FROM runs WHERE project_id = ? AND status IN ('queued', 'running')"),
        credentials=one("SELECT count(*) FROM credentials WHERE project_id = ? AND revoked_at_ms IS NULL"),
    )


async def read_counts(db: Database, project: str) -> Counts:
    return await db.run(counts, project)
