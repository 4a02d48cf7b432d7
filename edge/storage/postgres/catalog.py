"""Tasks and triggers on PostgreSQL: heads, immutable revisions, trigger events. The
semantics are those of edge.storage.sqlite.tasks and .triggers (the port contracts in
edge.core.ports.stores); here every write locks the head it changes (`FOR UPDATE`), so
concurrent writers on several nodes serialize per task or trigger. Every trigger change
sends the `trigger` hint so the other nodes' schedulers re-read their heaps.
"""

from __future__ import annotations

import msgspec

from edge.core.errors import conflict, invalid, not_found
from edge.core.ports.stores import RunLogFiles
from edge.core.schedule import ONCE, REBOOT, Schedule, ScheduleError
from edge.core.tasks import spec_schema
from edge.core.tasks import stored_spec as stored_task_spec
from edge.core.tasks import (
    ImportedTask,
    ImportRecord,
    ImportTask,
    Task,
    TaskSpec,
    content_digest,
    has_triggers,
    next_uid,
)
from edge.core.triggers import SPEC_SCHEMA, CronSpec, ImportPlan, PreparedImport, Trigger, TriggerEvent
from edge.core.triggers import stored_spec as stored_cron_spec
from edge.storage.postgres.db import PgDatabase, Row, Tx

_json = msgspec.json.Encoder()

EVENTS_PER_TRIGGER = 100
PRUNE_BATCH = 64
CLOCK_KEY = "clock.newest_ms"
_NO_EVENT = 1 << 62

# -- tasks --------------------------------------------------------------------------

_TASK = """
SELECT t.project_id, t.id, t.name, r.revision, r.enabled, r.spec, r.content_digest, t.created_at_ms, t.updated_at_ms,
       r.privileged, r.spec_schema
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
"""
SQL_TASK_GET = _TASK + "WHERE t.project_id = %s AND t.id = %s AND r.revision = coalesce(%s, t.revision)"
SQL_TASK_LIST = _TASK + "WHERE t.project_id = %s AND t.id > %s AND r.revision = t.revision ORDER BY t.id LIMIT %s"


def _task(row: Row) -> Task:
    project, task_id, name, revision, enabled, spec, digest, created, updated, privileged, schema = row
    return Task(id=task_id, project_id=project, name=name, revision=revision, enabled=enabled,
                spec=stored_task_spec(schema, spec), content_digest=digest, created_at_ms=created,
                updated_at_ms=updated, privileged=privileged)


async def get_task(tx: Tx, project: str, task_id: str, revision: int | None = None) -> Task | None:
    row = await tx.row(SQL_TASK_GET, (project, task_id, revision))
    return _task(row) if row else None


async def _lock_task(tx: Tx, project: str, task_id: str, expected: int | None) -> int:
    row = await tx.row("SELECT revision FROM tasks WHERE project_id = %s AND id = %s FOR UPDATE", (project, task_id))
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if expected is not None and row[0] != expected:
        raise conflict(f"task {task_id!r} is at revision {row[0]}, not {expected}")
    return int(row[0])


async def _insert_task_revision(
    tx: Tx, project: str, task_id: str, revision: int, spec: TaskSpec, enabled: bool, now: int, privileged: bool
) -> None:
    await tx.execute(
        "INSERT INTO task_revisions (project_id, task_id, revision, spec_schema, spec, content_digest, enabled,"
        " created_at_ms, privileged) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (project, task_id, revision, spec_schema(spec), _json.encode(spec).decode(), content_digest(spec), enabled, now,
         privileged),
    )


async def _insert_task(
    tx: Tx, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool, enabled: bool = True
) -> bool:
    """The task at revision 1; False (nothing written) when the id is taken."""
    inserted = await tx.execute(
        "INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
        " VALUES (%s, %s, %s, 1, %s, %s, %s) ON CONFLICT DO NOTHING",
        (project, task_id, name, enabled, now, now),
    )
    if inserted:
        await _insert_task_revision(tx, project, task_id, 1, spec, enabled, now, privileged)
    return inserted > 0


async def _create_task(
    tx: Tx, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool
) -> Task:
    if not await _insert_task(tx, project, task_id, name, spec, now, privileged):
        raise conflict(f"task {task_id!r} already exists")
    task = await get_task(tx, project, task_id)
    assert task is not None
    return task


async def _new_task_revision(
    tx: Tx, project: str, task_id: str, expected: int | None, now: int,
    spec: TaskSpec | None, enabled: bool | None, name: str | None, privileged: bool = False,
) -> Task:
    head = await _lock_task(tx, project, task_id, expected)
    current = await get_task(tx, project, task_id)
    assert current is not None
    if spec is None and name is None and enabled == current.enabled:
        return current
    revision = head + 1
    flag = current.enabled if enabled is None else enabled
    # An unchanged spec keeps its writer's standing; a new one gets this writer's.
    await _insert_task_revision(tx, project, task_id, revision, current.spec if spec is None else spec, flag, now,
                                current.privileged if spec is None else privileged)
    await tx.execute(
        "UPDATE tasks SET revision = %s, enabled = %s, name = coalesce(%s, name), updated_at_ms = %s"
        " WHERE project_id = %s AND id = %s",
        (revision, flag, name, now, project, task_id),
    )
    await follow_task(tx, project, task_id, head, revision, now)
    task = await get_task(tx, project, task_id)
    assert task is not None
    return task


async def _delete_task(tx: Tx, project: str, task_id: str, expected: int | None, with_triggers: bool) -> list[str]:
    await _lock_task(tx, project, task_id, expected)
    active = await tx.row(
        "SELECT id FROM runs WHERE project_id = %s AND task_id = %s AND status IN ('queued', 'running') LIMIT 1",
        (project, task_id))
    if active:
        raise conflict(f"task {task_id!r} has an active run ({active[0]}); cancel it first")
    if not with_triggers:
        # No trigger can appear unseen: a trigger insert's foreign-key check locks the task
        # row (FOR KEY SHARE), which waits for this transaction's FOR UPDATE or holds it off.
        found = [tid for (tid,) in await tx.rows(SQL_TASK_TRIGGERS, (project, task_id))]
        if found:
            raise has_triggers(task_id, found)
    removed = [r for (r,) in await tx.rows(
        "DELETE FROM runs WHERE project_id = %s AND task_id = %s RETURNING id", (project, task_id))]
    await tx.execute("DELETE FROM tasks WHERE project_id = %s AND id = %s", (project, task_id))
    await tx.notify("trigger")
    return removed


SQL_CLAIM_IMPORT = (
    "INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (%s, %s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING"
)
SQL_IMPORTED = "SELECT target FROM imports WHERE project_id = %s AND key = %s"
SQL_IMPORTS = (
    "SELECT key, kind, target, created_at_ms FROM imports WHERE project_id = %s AND key > %s ORDER BY key LIMIT %s"
)
SQL_TASK_TRIGGERS = "SELECT id FROM triggers WHERE project_id = %s AND task_id = %s ORDER BY id"


async def _import_task(
    tx: Tx, project: str, item: ImportTask, triggers: list[CronSpec], now: int, privileged: bool
) -> ImportedTask:
    # The record first: a second node importing the same key waits on its primary key
    # until this transaction ends, then finds it (or, after a rollback, takes it).
    if not await tx.execute(SQL_CLAIM_IMPORT, (project, item.key, "task", item.task_id, now)):
        (target,) = await tx.one(SQL_IMPORTED, (project, item.key))
        ids = [tid for (tid,) in await tx.rows(SQL_TASK_TRIGGERS, (project, target))]
        return ImportedTask(key=item.key, status="exists", task_id=target, trigger_ids=ids)
    task_id = await _insert_free_task(tx, project, item, now, privileged)
    ids = [(await insert_trigger(tx, project, None, task_id, None, spec, now, wanted.enabled)).id
           for spec, wanted in zip(triggers, item.triggers, strict=True)]
    await tx.execute("UPDATE imports SET target = %s WHERE project_id = %s AND key = %s", (task_id, project, item.key))
    return ImportedTask(key=item.key, status="created", task_id=task_id, trigger_ids=ids)


async def _insert_free_task(tx: Tx, project: str, item: ImportTask, now: int, privileged: bool) -> str:
    """The task at `item.task_id`, else `-2`, `-3`…: the first id no task has (an insert
    that loses a race to another node's tries the next)."""
    for n in range(1, 10_000):
        suffix = "" if n == 1 else f"-{n}"
        candidate = item.task_id[: 128 - len(suffix)] + suffix
        if await _insert_task(tx, project, candidate, item.name or candidate, item.spec, now, privileged,
                              item.enabled):
            return candidate
    raise conflict(f"too many tasks are named {item.task_id!r}")


async def _import_tasks(tx: Tx, project: str, items: list[PreparedImport], now: int) -> list[ImportedTask]:
    return [await _import_task(tx, project, p.item, p.triggers, now, p.privileged) for p in items]


async def _imports(tx: Tx, project: str, after: str, limit: int) -> list[ImportRecord]:
    return [ImportRecord(key=k, kind=kind, target=t, created_at_ms=c)
            for k, kind, t, c in await tx.rows(SQL_IMPORTS, (project, after, limit))]


async def _apply_import(tx: Tx, project: str, plan: ImportPlan, now: int) -> None:
    for trigger in plan.triggers:  # as planned, before the tasks' new heads move the triggers that follow them
        if trigger.expected is not None:
            await _head(tx, project, trigger.id, trigger.expected)
    for task in plan.tasks:
        if task.expected is None:
            if not await _insert_task(tx, project, task.id, task.name, task.spec, now, task.privileged, task.enabled):
                raise conflict(f"task {task.id!r} already exists")
        else:
            await _new_task_revision(tx, project, task.id, task.expected, now, task.spec, task.enabled, task.name,
                                     task.privileged)
    for trigger in plan.triggers:
        if trigger.recreate:
            await _delete_trigger(tx, project, trigger.id, None)
        if trigger.expected is None or trigger.recreate:
            await insert_trigger(tx, project, trigger.id, trigger.task_id, None, trigger.spec, now, trigger.enabled)
            continue
        _schedule(trigger.spec)
        await _update_trigger(tx, project, trigger.id, trigger.spec, None, now)
        await _repin(tx, project, trigger.id, None, None, now)  # it runs the head it imports
        await _set_trigger_enabled(tx, project, trigger.id, trigger.enabled, None, now)


UID_CURSOR = "task_uids.next"  # meta: where the next allocation starts looking
_UID_LOCK = 0x7169_6475  # serializes allocations across nodes (a transaction-scoped advisory lock)


async def _task_uid(tx: Tx, project: str, task_id: str) -> int | None:
    row = await tx.row("SELECT uid FROM task_uids WHERE project_id = %s AND task_id = %s", (project, task_id))
    return int(row[0]) if row else None


async def _allocate_task_uid(tx: Tx, project: str, task_id: str, low: int, high: int, taken: frozenset[int],
                             now: int) -> int:
    await tx.execute("SELECT pg_advisory_xact_lock(%s)", (_UID_LOCK,))
    found = await _task_uid(tx, project, task_id)
    if found is not None:
        return found
    if await tx.row("SELECT 1 FROM tasks WHERE project_id = %s AND id = %s FOR KEY SHARE", (project, task_id)) is None:
        raise not_found(f"task {task_id!r} not found")
    used = {int(u) for (u,) in await tx.rows("SELECT uid FROM task_uids WHERE uid BETWEEN %s AND %s", (low, high))}
    row = await tx.row("SELECT value FROM meta WHERE key = %s", (UID_CURSOR,))
    uid = next_uid(int(row[0]) if row else low, low, high, used | taken)
    await tx.execute("INSERT INTO task_uids (project_id, task_id, uid, created_at_ms) VALUES (%s, %s, %s, %s)",
                     (project, task_id, uid, now))
    await tx.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET"
                     " value = excluded.value", (UID_CURSOR, uid + 1))
    return uid


class PgTaskStore:
    """TaskStore (edge.core.ports.stores) on PostgreSQL."""

    def __init__(self, db: PgDatabase, logs: RunLogFiles) -> None:
        self._db = db
        self._logs = logs

    async def create(
        self, project: str, task_id: str, name: str, spec: TaskSpec, now_ms: int, *, privileged: bool
    ) -> Task:
        return await self._db.tx(_create_task, project, task_id, name, spec, now_ms, privileged)

    async def update(
        self, project: str, task_id: str, expected_revision: int, spec: TaskSpec, name: str | None, now_ms: int,
        *, privileged: bool,
    ) -> Task:
        return await self._db.tx(
            _new_task_revision, project, task_id, expected_revision, now_ms, spec, None, name, privileged)

    async def set_enabled(
        self, project: str, task_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Task:
        return await self._db.tx(_new_task_revision, project, task_id, expected_revision, now_ms, None, enabled, None)

    async def get(self, project: str, task_id: str, revision: int | None = None) -> Task | None:
        return await self._db.tx(get_task, project, task_id, revision)

    async def page(self, project: str, after: str | None, limit: int) -> list[Task]:
        return [_task(r) for r in await self._db.tx(_rows, SQL_TASK_LIST, (project, after or "", limit))]

    async def import_task(
        self, project: str, item: ImportTask, triggers: list[CronSpec], now_ms: int, *, privileged: bool
    ) -> ImportedTask:
        return await self._db.tx(_import_task, project, item, triggers, now_ms, privileged)

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        return await self._db.tx(_import_tasks, project, items, now_ms)

    async def imports(self, project: str, after: str | None, limit: int) -> list[ImportRecord]:
        return await self._db.tx(_imports, project, after or "", limit)

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        await self._db.tx(_apply_import, project, plan, now_ms)

    async def task_uid(self, project: str, task_id: str) -> int | None:
        return await self._db.tx(_task_uid, project, task_id)

    async def allocate_task_uid(self, project: str, task_id: str, low: int, high: int,
                                taken: frozenset[int], now_ms: int) -> int:
        return await self._db.tx(_allocate_task_uid, project, task_id, low, high, taken, now_ms)

    async def delete(self, project: str, task_id: str, expected_revision: int | None, with_triggers: bool) -> int:
        removed = await self._db.tx(_delete_task, project, task_id, expected_revision, with_triggers)
        self._logs.remove(removed)
        return len(removed)


async def _rows(tx: Tx, query: str, params: tuple[object, ...]) -> list[Row]:
    return await tx.rows(query, params)


# -- triggers -----------------------------------------------------------------------

_TRIGGER = """
SELECT h.project_id, h.id, h.revision, h.task_id, h.task_revision, h.enabled, r.spec_schema, r.spec,
       r.content_digest, h.created_at_ms, h.updated_at_ms, h.next_fire_at_ms, h.last_scheduled_at_ms
FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
"""
SQL_TRIGGER_GET = _TRIGGER + "WHERE h.project_id = %s AND h.id = %s"
SQL_TRIGGER_LOCK = SQL_TRIGGER_GET + " FOR UPDATE OF h"
SQL_TRIGGER_LIST = _TRIGGER + "WHERE h.project_id = %s AND h.id > %s ORDER BY h.id LIMIT %s"
_EVENT_COLUMNS = "id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms, fires, created_at_ms"
SQL_EVENTS_TRIGGER = (
    f"SELECT {_EVENT_COLUMNS} FROM trigger_events WHERE project_id = %s AND trigger_id = %s AND id < %s"
    " ORDER BY id DESC LIMIT %s"
)
SQL_EVENTS_PROJECT = (
    f"SELECT {_EVENT_COLUMNS} FROM trigger_events WHERE project_id = %s AND id < %s ORDER BY id DESC LIMIT %s"
)


def _trigger(row: Row) -> Trigger:
    project, tid, revision, task_id, task_rev, enabled, schema, spec, digest, created, updated, nxt, last = row
    return Trigger(
        id=tid, project_id=project, revision=revision, task_id=task_id, task_revision=task_rev, enabled=enabled,
        spec_schema=schema, spec=stored_cron_spec(schema, spec), content_digest=digest, created_at_ms=created,
        updated_at_ms=updated, next_fire_at_ms=nxt, last_scheduled_at_ms=last,
    )


async def get_trigger(tx: Tx, project: str, trigger_id: str, lock: bool = False) -> Trigger | None:
    row = await tx.row(SQL_TRIGGER_LOCK if lock else SQL_TRIGGER_GET, (project, trigger_id))
    return _trigger(row) if row else None


def _schedule(spec: CronSpec) -> Schedule:
    try:
        return spec.schedule()
    except ScheduleError as exc:
        raise invalid(str(exc)) from None


async def clock_mark(tx: Tx) -> int:
    row = await tx.row("SELECT value FROM meta WHERE key = %s", (CLOCK_KEY,))
    return int(row[0]) if row else 0


async def _arm(tx: Tx, schedule: Schedule, now: int) -> int | None:
    if schedule.event == REBOOT:
        return None  # armed per node by its next boot (boot_fires), never by a shared cursor
    mark = max(now, await clock_mark(tx))
    if schedule.event == ONCE:
        return mark  # due at once: whichever node admits it first fires it
    return schedule.next_after(mark)


async def _task_revision(tx: Tx, project: str, task_id: str, wanted: int | None) -> int:
    row = await tx.row("SELECT revision FROM tasks WHERE project_id = %s AND id = %s", (project, task_id))
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if wanted is None:
        return int(row[0])
    if await tx.row("SELECT 1 FROM task_revisions WHERE project_id = %s AND task_id = %s AND revision = %s",
                    (project, task_id, wanted)) is None:
        raise not_found(f"task {task_id!r} has no revision {wanted}")
    return wanted


async def _insert_trigger_revision(tx: Tx, t: Trigger) -> None:
    await tx.execute(
        "INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision, enabled,"
        " spec_schema, spec, content_digest, created_at_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (t.project_id, t.id, t.revision, t.task_id, t.task_revision, t.enabled, SPEC_SCHEMA,
         _json.encode(t.spec).decode(), t.content_digest, t.updated_at_ms),
    )


async def _free_id(tx: Tx, project: str, task_id: str) -> str:
    for n in range(1, 10_000):
        suffix = f"-{n}"
        candidate = task_id[: 128 - len(suffix)] + suffix
        if await tx.row("SELECT 1 FROM triggers WHERE project_id = %s AND id = %s", (project, candidate)) is None:
            return candidate
    raise conflict(f"task {task_id!r} has too many triggers")


async def insert_trigger(
    tx: Tx, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec, now: int,
    enabled: bool = True,
) -> Trigger:
    """A new trigger, inside the caller's transaction (its hint is sent on commit)."""
    schedule = _schedule(spec)
    pin = await _task_revision(tx, project, task_id, task_revision)
    tid = trigger_id or await _free_id(tx, project, task_id)
    first = Trigger(
        id=tid, project_id=project, revision=1, task_id=task_id, task_revision=pin, enabled=enabled,
        spec_schema=SPEC_SCHEMA, spec=spec, content_digest=content_digest(spec), created_at_ms=now,
        updated_at_ms=now, next_fire_at_ms=await _arm(tx, schedule, now) if enabled else None,
    )
    inserted = await tx.execute(
        "INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
        " updated_at_ms, next_fire_at_ms) VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (project, tid, task_id, pin, enabled, now, now, first.next_fire_at_ms),
    )
    if not inserted:
        raise conflict(f"trigger {tid!r} already exists")
    await _insert_trigger_revision(tx, first)
    await tx.notify("trigger")
    trigger = await get_trigger(tx, project, tid)
    assert trigger is not None
    return trigger


async def _create_trigger(
    tx: Tx, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec, now: int,
) -> Trigger:
    return await insert_trigger(tx, project, trigger_id, task_id, task_revision, spec, now)


async def _head(tx: Tx, project: str, trigger_id: str, expected: int | None) -> Trigger:
    trigger = await get_trigger(tx, project, trigger_id, lock=True)
    if trigger is None:
        raise not_found(f"trigger {trigger_id!r} not found")
    if expected is not None and trigger.revision != expected:
        raise conflict(f"trigger {trigger_id!r} is at revision {trigger.revision}, not {expected}")
    return trigger


async def _revise(
    tx: Tx, current: Trigger, now: int, enabled: bool, task_revision: int, spec: CronSpec | None = None
) -> Trigger:
    """A new revision with the given flag, pin and (when given) spec; the cursor is re-armed
    on enable and for a new spec."""
    nxt = current.next_fire_at_ms
    if not enabled or spec is not None:
        # a disabled @reboot trigger drops the fires that boots armed and no node admitted;
        # so does a new schedule, armed as a new trigger's would be (@reboot: at the next boot)
        await tx.execute("DELETE FROM boot_fires WHERE project_id = %s AND trigger_id = %s",
                         (current.project_id, current.id))
    if not enabled:
        nxt = None
    elif spec is not None or not current.enabled or nxt is None:
        nxt = await _arm(tx, _schedule(spec or current.spec), now)  # missed while disabled: not missed
    revision = current.revision + 1
    changed = {"spec": spec, "content_digest": content_digest(spec)} if spec is not None else {}
    await _insert_trigger_revision(tx, msgspec.structs.replace(
        current, revision=revision, enabled=enabled, task_revision=task_revision, updated_at_ms=now, **changed))
    await tx.execute(
        "UPDATE triggers SET revision = %s, enabled = %s, task_revision = %s, updated_at_ms = %s,"
        " next_fire_at_ms = %s WHERE project_id = %s AND id = %s",
        (revision, enabled, task_revision, now, nxt, current.project_id, current.id),
    )
    await tx.notify("trigger")
    updated = await get_trigger(tx, current.project_id, current.id)
    assert updated is not None
    return updated


async def _set_trigger_enabled(
    tx: Tx, project: str, trigger_id: str, enabled: bool, expected: int | None, now: int
) -> Trigger:
    current = await _head(tx, project, trigger_id, expected)
    armed = current.next_fire_at_ms is not None or current.spec.expression == REBOOT
    if current.enabled == enabled and (not enabled or armed):
        return current
    return await _revise(tx, current, now, enabled, current.task_revision)


async def _repin(
    tx: Tx, project: str, trigger_id: str, task_revision: int | None, expected: int | None, now: int
) -> Trigger:
    current = await _head(tx, project, trigger_id, expected)
    pin = await _task_revision(tx, project, current.task_id, task_revision)
    if pin == current.task_revision:
        return current
    return await _revise(tx, current, now, current.enabled, pin)


async def _update_trigger(
    tx: Tx, project: str, trigger_id: str, spec: CronSpec, expected: int | None, now: int
) -> Trigger:
    current = await _head(tx, project, trigger_id, expected)
    if current.spec == spec:
        return current
    return await _revise(tx, current, now, current.enabled, current.task_revision, spec)


async def disable_fired(tx: Tx, trigger: Trigger, now: int) -> None:
    """A one-shot (`@once`) that has fired disables itself, by a new revision."""
    await _revise(tx, trigger, now, False, trigger.task_revision)


async def follow_task(tx: Tx, project: str, task_id: str, old: int, new: int, now: int) -> None:
    """Triggers pinned to the task's old head move to the new one (inside its transaction)."""
    for (tid,) in await tx.rows(
            "SELECT id FROM triggers WHERE project_id = %s AND task_id = %s AND task_revision = %s ORDER BY id",
            (project, task_id, old)):
        current = await get_trigger(tx, project, tid, lock=True)
        assert current is not None
        await _revise(tx, current, now, current.enabled, new)


async def _delete_trigger(tx: Tx, project: str, trigger_id: str, expected: int | None) -> None:
    await _head(tx, project, trigger_id, expected)
    await tx.execute("DELETE FROM triggers WHERE project_id = %s AND id = %s", (project, trigger_id))
    await tx.notify("trigger")


async def _trigger_events(
    tx: Tx, project: str, trigger_id: str | None, before: int | None, limit: int
) -> list[TriggerEvent]:
    before = _NO_EVENT if before is None else before
    if trigger_id is None:
        rows = await tx.rows(SQL_EVENTS_PROJECT, (project, before, limit))
    else:
        rows = await tx.rows(SQL_EVENTS_TRIGGER, (project, trigger_id, before, limit))
    return [TriggerEvent(id=r[0], trigger_id=r[1], type=r[2], reason=r[3], scheduled_for_ms=r[4],
                         last_scheduled_for_ms=r[5], fires=r[6], created_at_ms=r[7]) for r in rows]


async def record_event(
    tx: Tx, project: str, trigger_id: str, kind: str, reason: str,
    first: int, last: int | None, fires: int | None, now: int, last_admitted: int | None,
) -> bool:
    """Fires that did not run, merged into the newest event of the same outcome (as on SQLite).
    True when a new event was recorded (not merged into the newest)."""
    newest = await tx.row(
        "SELECT id, type, reason, coalesce(last_scheduled_for_ms, scheduled_for_ms), fires FROM trigger_events"
        " WHERE project_id = %s AND trigger_id = %s ORDER BY id DESC LIMIT 1", (project, trigger_id))
    if newest and newest[1:3] == (kind, reason) and (last_admitted is None or (newest[3] or 0) > last_admitted):
        if newest[3] is not None and newest[3] >= first:
            return False
        count = None if newest[4] is None or fires is None else newest[4] + fires
        await tx.execute("UPDATE trigger_events SET fires = %s, last_scheduled_for_ms = %s WHERE id = %s",
                         (count, last, newest[0]))
        return False
    await tx.execute(
        "INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms,"
        " fires, created_at_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (project, trigger_id, kind, reason, first, last, fires, now),
    )
    await tx.execute(
        "DELETE FROM trigger_events WHERE id IN (SELECT id FROM trigger_events WHERE project_id = %s"
        " AND trigger_id = %s ORDER BY id DESC LIMIT %s OFFSET %s)",
        (project, trigger_id, PRUNE_BATCH, EVENTS_PER_TRIGGER))
    return True


class PgTriggerStore:
    """TriggerStore (edge.core.ports.stores) on PostgreSQL."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec,
        now_ms: int,
    ) -> Trigger:
        return await self._db.tx(_create_trigger, project, trigger_id, task_id, task_revision, spec, now_ms)

    async def get(self, project: str, trigger_id: str) -> Trigger | None:
        return await self._db.tx(get_trigger, project, trigger_id)

    async def page(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        return [_trigger(r) for r in await self._db.tx(_rows, SQL_TRIGGER_LIST, (project, after or "", limit))]

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.tx(_set_trigger_enabled, project, trigger_id, enabled, expected_revision, now_ms)

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.tx(_repin, project, trigger_id, task_revision, expected_revision, now_ms)

    async def update(
        self, project: str, trigger_id: str, spec: CronSpec, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        _schedule(spec)  # refused before the transaction: a spec that cannot fire is never stored
        return await self._db.tx(_update_trigger, project, trigger_id, spec, expected_revision, now_ms)

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None:
        await self._db.tx(_delete_trigger, project, trigger_id, expected_revision)

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        return await self._db.tx(_trigger_events, project, trigger_id, before_id, limit)
