"""The task outcome window of qinglong.task.runs.compare: one bounded read, five columns.

A reader of its own beside the feature rather than a new method on the general run
store: it rides the existing runs_task_created_idx (no new index, no migration) and can
return nothing but run id, project, task, status and creation time.
"""

from __future__ import annotations

import apsw

from edge.core.reads import OutcomeRow
from edge.storage.sqlite.db import Database

SQL_WINDOW = (
    "SELECT id, project_id, task_id, status, created_at_ms FROM runs"
    " WHERE project_id = ? AND task_id = ? ORDER BY created_at_ms DESC, id DESC LIMIT ?"
)


def window(conn: apsw.Connection, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
    return [OutcomeRow(*row) for row in conn.execute(SQL_WINDOW, (project, task_id, limit))]


class SqliteOutcomeWindowReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        return await self._db.run(window, project, task_id, limit)
