"""Task heads and their immutable revisions."""

from __future__ import annotations

import apsw
import msgspec

from edge.core.errors import conflict, not_found
from edge.core.tasks import ImportedTask, ImportRecord, ImportTask
from edge.core.ports.stores import RunLogFiles
from edge.core.tasks import Task, TaskSpec, content_digest, has_triggers, next_uid, spec_schema, stored_spec
from edge.core.triggers import CronSpec, ImportPlan, PreparedImport
from edge.storage.sqlite import triggers as trigger_sql
from edge.storage.sqlite.db import Database, immediate

_spec_encoder = msgspec.json.Encoder()

_SELECT = """
SELECT t.project_id, t.id, t.name, r.revision, r.enabled, r.spec, r.content_digest,
       t.created_at_ms, t.updated_at_ms, r.privileged, r.spec_schema
FROM tasks AS t
JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
"""
# The head's revision, or a given one (a run executes the revision it was admitted with).
SQL_GET = _SELECT + "WHERE t.project_id = ? AND t.id = ? AND r.revision = coalesce(?, t.revision)"
SQL_LIST = _SELECT + "WHERE t.project_id = ? AND t.id > ? AND r.revision = t.revision ORDER BY t.id LIMIT ?"


def _task(row: tuple) -> Task:
    project, task_id, name, revision, enabled, spec, digest, created, updated, privileged, schema = row
    return Task(
        id=task_id,
        project_id=project,
        name=name,
        revision=revision,
        enabled=bool(enabled),
        spec=stored_spec(schema, spec),
        content_digest=digest,
        created_at_ms=created,
        updated_at_ms=updated,
        privileged=bool(privileged),
    )


def get(conn: apsw.Connection, project: str, task_id: str, revision: int | None = None) -> Task | None:
    row = conn.execute(SQL_GET, (project, task_id, revision)).fetchone()
    return _task(row) if row else None


def _head_revision(conn: apsw.Connection, project: str, task_id: str, expected: int | None) -> int:
    row = conn.execute("SELECT revision FROM tasks WHERE project_id = ? AND id = ?", (project, task_id)).fetchone()
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if expected is not None and row[0] != expected:
        raise conflict(f"task {task_id!r} is at revision {row[0]}, not {expected}")
    return row[0]


def _insert_revision(
    conn: apsw.Connection, project: str, task_id: str, revision: int, spec: TaskSpec, enabled: bool, now: int,
    privileged: bool,
) -> None:
    conn.execute(
        "INSERT INTO task_revisions (project_id, task_id, revision, spec_schema, spec, content_digest,"
        " enabled, created_at_ms, privileged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (project, task_id, revision, spec_schema(spec), _spec_encoder.encode(spec).decode(),
         content_digest(spec), int(enabled), now, int(privileged)),
    )


def _new_revision(
    conn: apsw.Connection, project: str, task_id: str, expected: int | None, now: int,
    spec: TaskSpec | None = None, enabled: bool | None = None, name: str | None = None, privileged: bool = False,
) -> Task:
    with immediate(conn):
        head = _head_revision(conn, project, task_id, expected)
        current = get(conn, project, task_id)
        assert current is not None
        if spec is None and name is None and enabled == current.enabled:
            return current  # enabling an enabled task changes nothing
        revision = head + 1
        # An unchanged spec keeps its writer's standing; a new one gets this writer's.
        _insert_revision(
            conn, project, task_id, revision,
            current.spec if spec is None else spec,
            current.enabled if enabled is None else enabled, now,
            current.privileged if spec is None else privileged,
        )
        conn.execute(
            "UPDATE tasks SET revision = ?, enabled = ?, name = coalesce(?, name), updated_at_ms = ?"
            " WHERE project_id = ? AND id = ?",
            (revision, int(current.enabled if enabled is None else enabled), name, now, project, task_id),
        )
        # Triggers that followed the old head follow the new one (documented default).
        trigger_sql.follow_task(conn, project, task_id, head, revision, now)
        task = get(conn, project, task_id)
    assert task is not None
    return task


def page(conn: apsw.Connection, project: str, after: str, limit: int) -> list[Task]:
    return [_task(row) for row in conn.execute(SQL_LIST, (project, after, limit))]


def _insert(
    conn: apsw.Connection, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool,
    enabled: bool = True,
) -> None:
    try:
        conn.execute(
            "INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
            " VALUES (?, ?, ?, 1, ?, ?, ?)",
            (project, task_id, name, int(enabled), now, now),
        )
    except apsw.ConstraintError:
        raise conflict(f"task {task_id!r} already exists") from None
    _insert_revision(conn, project, task_id, 1, spec, enabled, now, privileged)


def create(
    conn: apsw.Connection, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool
) -> Task:
    with immediate(conn):
        _insert(conn, project, task_id, name, spec, now, privileged)
        task = get(conn, project, task_id)
    assert task is not None
    return task


SQL_IMPORTED = "SELECT kind, target FROM imports WHERE project_id = ? AND key = ?"
SQL_IMPORTS = (
    "SELECT key, kind, target, created_at_ms FROM imports WHERE project_id = ? AND key > ? ORDER BY key LIMIT ?"
)
SQL_RECORD_IMPORT = "INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (?, ?, ?, ?, ?)"
SQL_TASK_TRIGGERS = "SELECT id FROM triggers WHERE project_id = ? AND task_id = ? ORDER BY id"


def _free_task_id(conn: apsw.Connection, project: str, wanted: str) -> str:
    """`wanted`, else `wanted-2`, `wanted-3`…, the first no task has."""
    for n in range(1, 10_000):
        suffix = "" if n == 1 else f"-{n}"
        candidate = wanted[: 128 - len(suffix)] + suffix
        if conn.execute("SELECT 1 FROM tasks WHERE project_id = ? AND id = ?", (project, candidate)).fetchone() is None:
            return candidate
    raise conflict(f"too many tasks are named {wanted!r}")


def import_task(
    conn: apsw.Connection, project: str, item: ImportTask, triggers: list[CronSpec], now: int, privileged: bool,
    mark: int | None = None,
) -> ImportedTask:
    """The task with its triggers and its import key, in one transaction; or, when the key
    is on record already, nothing (status `exists`, with what it became)."""
    with immediate(conn):
        done = conn.execute(SQL_IMPORTED, (project, item.key)).fetchone()
        if done is not None:
            ids = [tid for (tid,) in conn.execute(SQL_TASK_TRIGGERS, (project, done[1]))]
            return ImportedTask(key=item.key, status="exists", task_id=done[1], trigger_ids=ids)
        task_id = _free_task_id(conn, project, item.task_id)
        _insert(conn, project, task_id, item.name or task_id, item.spec, now, privileged, item.enabled)
        ids = [trigger_sql.insert(conn, project, None, task_id, None, spec, now, wanted.enabled, mark).id
               for spec, wanted in zip(triggers, item.triggers, strict=True)]
        conn.execute(SQL_RECORD_IMPORT, (project, item.key, "task", task_id, now))
    return ImportedTask(key=item.key, status="created", task_id=task_id, trigger_ids=ids)


def import_tasks(conn: apsw.Connection, project: str, items: list[PreparedImport], now: int) -> list[ImportedTask]:
    with immediate(conn):  # each import_task is a savepoint of this one transaction
        mark = trigger_sql.arm_mark(conn, project, now)  # nothing in it moves the mark
        return [import_task(conn, project, p.item, p.triggers, now, p.privileged, mark) for p in items]


def imports(conn: apsw.Connection, project: str, after: str, limit: int) -> list[ImportRecord]:
    return [ImportRecord(key=k, kind=kind, target=t, created_at_ms=c)
            for k, kind, t, c in conn.execute(SQL_IMPORTS, (project, after, limit))]


SQL_TASK_ACTIVE = "SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND status IN ('queued', 'running') LIMIT 1"
SQL_DELETE_TASK_RUNS = "DELETE FROM runs WHERE project_id = ? AND task_id = ? RETURNING id"


def _refuse_triggers(conn: apsw.Connection, project: str, task_id: str) -> None:
    found = [tid for (tid,) in conn.execute(SQL_TASK_TRIGGERS, (project, task_id))]
    if found:
        raise has_triggers(task_id, found)


def delete(conn: apsw.Connection, project: str, task_id: str, expected: int | None, with_triggers: bool) -> list[str]:
    """Delete the task and its finished runs; returns the run ids (their logs go after the commit)."""
    with immediate(conn):
        _head_revision(conn, project, task_id, expected)
        active = conn.execute(SQL_TASK_ACTIVE, (project, task_id)).fetchone()
        if active:
            raise conflict(f"task {task_id!r} has an active run ({active[0]}); cancel it first")
        if not with_triggers:
            _refuse_triggers(conn, project, task_id)
        removed = [rid for (rid,) in conn.execute(SQL_DELETE_TASK_RUNS, (project, task_id))]
        conn.execute("DELETE FROM tasks WHERE project_id = ? AND id = ?", (project, task_id))
    return removed


def apply_import(conn: apsw.Connection, project: str, plan: ImportPlan, now: int) -> None:
    with immediate(conn):  # the writes below are savepoints of this one transaction
        for trigger in plan.triggers:  # as planned, before the tasks' new heads move the triggers that follow them
            if trigger.expected is not None:
                trigger_sql.head(conn, project, trigger.id, trigger.expected)
        for task in plan.tasks:
            if task.expected is None:
                _insert(conn, project, task.id, task.name, task.spec, now, task.privileged, task.enabled)
            else:
                _new_revision(conn, project, task.id, task.expected, now, task.spec, task.enabled, task.name,
                              task.privileged)
        for trigger in plan.triggers:
            if trigger.recreate:
                trigger_sql.delete(conn, project, trigger.id, None)
            if trigger.expected is None or trigger.recreate:
                trigger_sql.insert(conn, project, trigger.id, trigger.task_id, None, trigger.spec, now, trigger.enabled)
                continue
            trigger_sql.update(conn, project, trigger.id, trigger.spec, None, now)
            trigger_sql.repin(conn, project, trigger.id, None, None, now)  # it runs the head it imports
            trigger_sql.set_enabled(conn, project, trigger.id, trigger.enabled, None, now)


UID_CURSOR = "task_uids.next"  # meta: where the next allocation starts looking


def task_uid(conn: apsw.Connection, project: str, task_id: str) -> int | None:
    row = conn.execute("SELECT uid FROM task_uids WHERE project_id = ? AND task_id = ?", (project, task_id)).fetchone()
    return int(row[0]) if row else None


def allocate_task_uid(conn: apsw.Connection, project: str, task_id: str, low: int, high: int, taken: frozenset[int],
                      now: int) -> int:
    with immediate(conn):
        found = task_uid(conn, project, task_id)
        if found is not None:
            return found
        if conn.execute("SELECT 1 FROM tasks WHERE project_id = ? AND id = ?", (project, task_id)).fetchone() is None:
            raise not_found(f"task {task_id!r} not found")
        used = {u for (u,) in conn.execute("SELECT uid FROM task_uids WHERE uid BETWEEN ? AND ?", (low, high))}
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (UID_CURSOR,)).fetchone()
        uid = next_uid(row[0] if row and isinstance(row[0], int) else low, low, high, used | taken)
        conn.execute("INSERT INTO task_uids (project_id, task_id, uid, created_at_ms) VALUES (?, ?, ?, ?)",
                     (project, task_id, uid, now))
        conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET"
                     " value = excluded.value", (UID_CURSOR, uid + 1))
    return uid


class SqliteTaskStore:
    """TaskStore (edge.core.ports.stores) on the daemon's database."""

    def __init__(self, db: Database, logs: RunLogFiles) -> None:
        self._db = db
        self._logs = logs

    async def create(
        self, project: str, task_id: str, name: str, spec: TaskSpec, now_ms: int, *, privileged: bool
    ) -> Task:
        return await self._db.run(create, project, task_id, name, spec, now_ms, privileged)

    async def update(
        self, project: str, task_id: str, expected_revision: int, spec: TaskSpec, name: str | None, now_ms: int,
        *, privileged: bool,
    ) -> Task:
        return await self._db.run(
            _new_revision, project, task_id, expected_revision, now_ms, spec, None, name, privileged)

    async def set_enabled(
        self, project: str, task_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Task:
        return await self._db.run(_new_revision, project, task_id, expected_revision, now_ms, None, enabled)

    async def get(self, project: str, task_id: str, revision: int | None = None) -> Task | None:
        return await self._db.run(get, project, task_id, revision)

    async def import_task(
        self, project: str, item: ImportTask, triggers: list[CronSpec], now_ms: int, *, privileged: bool
    ) -> ImportedTask:
        return await self._db.run(import_task, project, item, triggers, now_ms, privileged)

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        return await self._db.run(import_tasks, project, items, now_ms)

    async def imports(self, project: str, after: str | None, limit: int) -> list[ImportRecord]:
        return await self._db.run(imports, project, after or "", limit)

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        await self._db.run(apply_import, project, plan, now_ms)

    async def task_uid(self, project: str, task_id: str) -> int | None:
        return await self._db.run(task_uid, project, task_id)

    async def allocate_task_uid(self, project: str, task_id: str, low: int, high: int,
                                taken: frozenset[int], now_ms: int) -> int:
        return await self._db.run(allocate_task_uid, project, task_id, low, high, taken, now_ms)

    async def page(self, project: str, after: str | None, limit: int) -> list[Task]:
        return await self._db.run(page, project, after or "", limit)

    async def delete(self, project: str, task_id: str, expected_revision: int | None, with_triggers: bool) -> int:
        removed = await self._db.run(delete, project, task_id, expected_revision, with_triggers)
        self._logs.remove(removed)
        return len(removed)
