"""Tasks and triggers, once for both backends: heads and their immutable revisions (a
trigger's each pinned to one task revision), imports, the uids of tasks that run as their
own, and the events of fires that did not become runs. Implements TaskStore and
TriggerStore (edge.core.ports.stores); admission, which turns fires into runs, is
edge.storage.admission.

Every write reads the head it changes with the dialect's locking read (`FOR UPDATE` on
PostgreSQL, so writers on several nodes serialize per task or trigger; a plain read under
SQLite's `BEGIN IMMEDIATE`), and every trigger change hints `trigger`, so the other nodes'
schedulers read their heaps again.
"""

from __future__ import annotations

import functools

import msgspec

from edge.core.errors import conflict, invalid, not_found
from edge.core.ports.stores import RunLogFiles
from edge.core.schedule import ONCE, REBOOT, Schedule, ScheduleError
from edge.core.tasks import (
    ImportedTask,
    ImportRecord,
    ImportTask,
    Task,
    TaskSpec,
    content_digest,
    has_triggers,
    next_uid,
    spec_schema,
)
from edge.core.tasks import stored_spec as stored_task_spec
from edge.core.triggers import SPEC_SCHEMA, CronSpec, ImportPlan, PreparedImport, Trigger, TriggerEvent
from edge.core.triggers import stored_spec as stored_cron_spec
from edge.storage.tx import NO_ROW, Db, Row, Tx

EVENTS_PER_TRIGGER = 100  # newest events kept per trigger
PRUNE_BATCH = 64  # rows one write may delete: bounded cost per write, converges over writes
CLOCK_KEY = "clock.newest_ms"  # the newest wall-clock time the scheduler saw (meta table)
UID_CURSOR = "task_uids.next"  # meta: where the next uid allocation starts looking
UID_LOCK = 0x7169_6475  # serializes uid allocations (on every node)

_json = msgspec.json.Encoder()


class CatalogSql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect."""

    task_get: str  # the head, or the revision given
    task_list: str
    task_head: str  # the head's revision
    task_lock: str  # the head's revision, locked for the transaction's write
    task_insert: str  # ON CONFLICT DO NOTHING
    task_revision_insert: str
    task_update: str
    task_exists: str
    task_exists_locked: str  # the head held (not changed) until the transaction ends
    task_revision_exists: str
    task_active_run: str
    task_triggers: str
    task_runs_delete: str  # RETURNING id
    task_delete: str
    imported: str
    imports: str
    import_claim: str  # ON CONFLICT DO NOTHING
    import_retarget: str
    uid_get: str
    uids_used: str
    uid_insert: str
    meta_get: str
    meta_set: str
    newest_audit: str
    newest_run: str
    trigger_get: str
    trigger_lock: str  # the head, locked for the transaction's write
    trigger_list: str
    trigger_exists: str
    trigger_insert: str  # ON CONFLICT DO NOTHING
    trigger_revision_insert: str
    trigger_update: str
    trigger_delete: str
    following: str  # triggers pinned to a task revision
    events_trigger: str
    events_project: str
    newest_event: str
    event_merge: str
    event_insert: str
    events_prune: str
    drop_boot_fires: str | None  # the @reboot fires armed per node (a cluster's), when a trigger changes


# -- reading ----------------------------------------------------------------------


def _task(row: Row) -> Task:
    project, task_id, name, revision, enabled, spec, digest, created, updated, privileged, schema = row
    return Task(id=task_id, project_id=project, name=name, revision=revision, enabled=bool(enabled),
                spec=stored_task_spec(schema, spec), content_digest=digest, created_at_ms=created,
                updated_at_ms=updated, privileged=bool(privileged))


def get_task(tx: Tx, q: CatalogSql, project: str, task_id: str, revision: int | None = None) -> Task | None:
    row = tx.row(q.task_get, (project, task_id, revision))
    return _task(row) if row else None


def tasks_page(tx: Tx, q: CatalogSql, project: str, after: str, limit: int) -> list[Task]:
    return [_task(row) for row in tx.rows(q.task_list, (project, after, limit))]


def _trigger(row: Row) -> Trigger:
    project, tid, revision, task_id, task_rev, enabled, schema, spec, digest, created, updated, nxt, last = row
    return Trigger(
        id=tid, project_id=project, revision=revision, task_id=task_id, task_revision=task_rev,
        enabled=bool(enabled), spec_schema=schema, spec=stored_cron_spec(schema, spec), content_digest=digest,
        created_at_ms=created, updated_at_ms=updated, next_fire_at_ms=nxt, last_scheduled_at_ms=last,
    )


def get_trigger(tx: Tx, q: CatalogSql, project: str, trigger_id: str, lock: bool = False) -> Trigger | None:
    row = tx.row(q.trigger_lock if lock else q.trigger_get, (project, trigger_id))
    return _trigger(row) if row else None


def triggers_page(tx: Tx, q: CatalogSql, project: str, after: str, limit: int) -> list[Trigger]:
    return [_trigger(row) for row in tx.rows(q.trigger_list, (project, after, limit))]


def trigger_events(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str | None, before: int | None, limit: int
) -> list[TriggerEvent]:
    before = NO_ROW if before is None else before
    if trigger_id is None:
        rows = tx.rows(q.events_project, (project, before, limit))
    else:
        rows = tx.rows(q.events_trigger, (project, trigger_id, before, limit))
    return [TriggerEvent(id=r[0], trigger_id=r[1], type=r[2], reason=r[3], scheduled_for_ms=r[4],
                         last_scheduled_for_ms=r[5], fires=r[6], created_at_ms=r[7]) for r in rows]


def clock_mark(tx: Tx, q: CatalogSql) -> int:
    """The newest wall-clock time the scheduler saved (0 when none)."""
    row = tx.row(q.meta_get, (CLOCK_KEY,))
    return row[0] if row and isinstance(row[0], int) else 0


def newest_time(tx: Tx, q: CatalogSql, project: str) -> int:
    """The newest wall-clock time on record: saved by the scheduler, or stamped on a run
    or an audit row (every tool call writes one; an aggregate of refused calls: its last)."""
    audit = tx.row(q.newest_audit)
    run = tx.row(q.newest_run, (project,))
    return max([clock_mark(tx, q)] + [r[0] for r in (audit, run) if r and isinstance(r[0], int)])


# -- tasks --------------------------------------------------------------------------


def _head_revision(tx: Tx, q: CatalogSql, project: str, task_id: str, expected: int | None) -> int:
    row = tx.row(q.task_lock, (project, task_id))
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if expected is not None and row[0] != expected:
        raise conflict(f"task {task_id!r} is at revision {row[0]}, not {expected}")
    return int(row[0])


def _insert_task_revision(
    tx: Tx, q: CatalogSql, project: str, task_id: str, revision: int, spec: TaskSpec, enabled: bool, now: int,
    privileged: bool,
) -> None:
    tx.execute(q.task_revision_insert, (project, task_id, revision, spec_schema(spec), _json.encode(spec).decode(),
                                        content_digest(spec), enabled, now, privileged))


def _insert_task(
    tx: Tx, q: CatalogSql, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool,
    enabled: bool = True,
) -> bool:
    """The task at revision 1; False (nothing written) when the id is taken."""
    if not tx.execute(q.task_insert, (project, task_id, name, enabled, now, now)):
        return False
    _insert_task_revision(tx, q, project, task_id, 1, spec, enabled, now, privileged)
    return True


def create_task(
    tx: Tx, q: CatalogSql, project: str, task_id: str, name: str, spec: TaskSpec, now: int, privileged: bool
) -> Task:
    if not _insert_task(tx, q, project, task_id, name, spec, now, privileged):
        raise conflict(f"task {task_id!r} already exists")
    task = get_task(tx, q, project, task_id)
    assert task is not None
    return task


def new_task_revision(
    tx: Tx, q: CatalogSql, project: str, task_id: str, expected: int | None, now: int,
    spec: TaskSpec | None = None, enabled: bool | None = None, name: str | None = None, privileged: bool = False,
) -> Task:
    head = _head_revision(tx, q, project, task_id, expected)
    current = get_task(tx, q, project, task_id)
    assert current is not None
    if spec is None and name is None and enabled == current.enabled:
        return current  # enabling an enabled task changes nothing
    revision = head + 1
    flag = current.enabled if enabled is None else enabled
    # An unchanged spec keeps its writer's standing; a new one gets this writer's.
    _insert_task_revision(tx, q, project, task_id, revision, current.spec if spec is None else spec, flag, now,
                          current.privileged if spec is None else privileged)
    tx.execute(q.task_update, (revision, flag, name, now, project, task_id))
    # Triggers that followed the old head follow the new one (documented default).
    follow_task(tx, q, project, task_id, head, revision, now)
    task = get_task(tx, q, project, task_id)
    assert task is not None
    return task


def delete_task(
    tx: Tx, q: CatalogSql, project: str, task_id: str, expected: int | None, with_triggers: bool
) -> list[str]:
    """Delete the task and its finished runs; returns the run ids (their logs go after the commit)."""
    _head_revision(tx, q, project, task_id, expected)
    active = tx.row(q.task_active_run, (project, task_id))
    if active:
        raise conflict(f"task {task_id!r} has an active run ({active[0]}); cancel it first")
    if not with_triggers:
        # No trigger can appear unseen: on PostgreSQL a trigger insert's foreign-key check
        # locks the task row (FOR KEY SHARE), which waits for the locked head or holds it off.
        found = [tid for (tid,) in tx.rows(q.task_triggers, (project, task_id))]
        if found:
            raise has_triggers(task_id, found)
    removed = [rid for (rid,) in tx.rows(q.task_runs_delete, (project, task_id))]
    tx.execute(q.task_delete, (project, task_id))
    tx.hint("trigger")
    return removed


def _insert_free_task(tx: Tx, q: CatalogSql, project: str, item: ImportTask, now: int, privileged: bool) -> str:
    """The task at `item.task_id`, else `-2`, `-3`…: the first id no task has (an insert
    that loses a race to another node's tries the next)."""
    for n in range(1, 10_000):
        suffix = "" if n == 1 else f"-{n}"
        candidate = item.task_id[: 128 - len(suffix)] + suffix
        if _insert_task(tx, q, project, candidate, item.name or candidate, item.spec, now, privileged, item.enabled):
            return candidate
    raise conflict(f"too many tasks are named {item.task_id!r}")


def _exists(tx: Tx, q: CatalogSql, project: str, key: str) -> ImportedTask:
    (target,) = tx.one(q.imported, (project, key))
    ids = [tid for (tid,) in tx.rows(q.task_triggers, (project, target))]
    return ImportedTask(key=key, status="exists", task_id=target, trigger_ids=ids)


def import_task(
    tx: Tx, q: CatalogSql, project: str, item: ImportTask, triggers: list[CronSpec], now: int, privileged: bool,
    mark: int | None = None,
) -> ImportedTask:
    """The task with its triggers and its import key, in one transaction; or, when the key
    is on record already, nothing (status `exists`, with what it became). The record is
    claimed before the task: a second node importing the same key waits on its primary key
    until this transaction ends, then finds it (or, after a rollback, takes it)."""
    if tx.row(q.imported, (project, item.key)) is not None:
        return _exists(tx, q, project, item.key)
    if not tx.execute(q.import_claim, (project, item.key, "task", item.task_id, now)):
        return _exists(tx, q, project, item.key)
    task_id = _insert_free_task(tx, q, project, item, now, privileged)
    mark = arm_mark(tx, q, project, now) if mark is None and triggers else mark
    ids = [insert_trigger(tx, q, project, None, task_id, None, spec, now, wanted.enabled, mark).id
           for spec, wanted in zip(triggers, item.triggers, strict=True)]
    if task_id != item.task_id:
        tx.execute(q.import_retarget, (task_id, project, item.key))
    return ImportedTask(key=item.key, status="created", task_id=task_id, trigger_ids=ids)


def import_tasks(tx: Tx, q: CatalogSql, project: str, items: list[PreparedImport], now: int) -> list[ImportedTask]:
    mark = arm_mark(tx, q, project, now)  # nothing in the transaction moves it
    return [import_task(tx, q, project, p.item, p.triggers, now, p.privileged, mark) for p in items]


def imports(tx: Tx, q: CatalogSql, project: str, after: str, limit: int) -> list[ImportRecord]:
    return [ImportRecord(key=k, kind=kind, target=t, created_at_ms=c)
            for k, kind, t, c in tx.rows(q.imports, (project, after, limit))]


def apply_import(tx: Tx, q: CatalogSql, project: str, plan: ImportPlan, now: int) -> None:
    for trigger in plan.triggers:  # as planned, before the tasks' new heads move the triggers that follow them
        if trigger.expected is not None:
            _trigger_head(tx, q, project, trigger.id, trigger.expected)
    for task in plan.tasks:
        if task.expected is None:
            if not _insert_task(tx, q, project, task.id, task.name, task.spec, now, task.privileged, task.enabled):
                raise conflict(f"task {task.id!r} already exists")
        else:
            new_task_revision(tx, q, project, task.id, task.expected, now, task.spec, task.enabled, task.name,
                              task.privileged)
    for trigger in plan.triggers:
        if trigger.recreate:
            delete_trigger(tx, q, project, trigger.id, None)
        if trigger.expected is None or trigger.recreate:
            insert_trigger(tx, q, project, trigger.id, trigger.task_id, None, trigger.spec, now, trigger.enabled)
            continue
        update_trigger(tx, q, project, trigger.id, _checked(trigger.spec), None, now)
        repin(tx, q, project, trigger.id, None, None, now)  # it runs the head it imports
        set_trigger_enabled(tx, q, project, trigger.id, trigger.enabled, None, now)


def task_uid(tx: Tx, q: CatalogSql, project: str, task_id: str) -> int | None:
    row = tx.row(q.uid_get, (project, task_id))
    return int(row[0]) if row else None


def allocate_task_uid(tx: Tx, q: CatalogSql, project: str, task_id: str, low: int, high: int,
                      taken: frozenset[int], now: int) -> int:
    tx.lock(UID_LOCK)
    found = task_uid(tx, q, project, task_id)
    if found is not None:
        return found
    if tx.row(q.task_exists_locked, (project, task_id)) is None:
        raise not_found(f"task {task_id!r} not found")
    used = {int(u) for (u,) in tx.rows(q.uids_used, (low, high))}
    row = tx.row(q.meta_get, (UID_CURSOR,))
    uid = next_uid(row[0] if row and isinstance(row[0], int) else low, low, high, used | taken)
    tx.execute(q.uid_insert, (project, task_id, uid, now))
    tx.execute(q.meta_set, (UID_CURSOR, uid + 1))
    return uid


class SqlTaskStore:
    """TaskStore on `db`, in its dialect `q`; the logs of a deleted task's runs go after the commit."""

    def __init__(self, db: Db, q: CatalogSql, logs: RunLogFiles) -> None:
        self._db = db
        self._q = q
        self._logs = logs

    async def create(
        self, project: str, task_id: str, name: str, spec: TaskSpec, now_ms: int, *, privileged: bool
    ) -> Task:
        return await self._db.write(create_task, self._q, project, task_id, name, spec, now_ms, privileged)

    async def update(
        self, project: str, task_id: str, expected_revision: int, spec: TaskSpec, name: str | None, now_ms: int,
        *, privileged: bool,
    ) -> Task:
        return await self._db.write(
            new_task_revision, self._q, project, task_id, expected_revision, now_ms, spec, None, name, privileged)

    async def set_enabled(
        self, project: str, task_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Task:
        return await self._db.write(new_task_revision, self._q, project, task_id, expected_revision, now_ms, None,
                                    enabled)

    async def get(self, project: str, task_id: str, revision: int | None = None) -> Task | None:
        return await self._db.read(get_task, self._q, project, task_id, revision)

    async def page(self, project: str, after: str | None, limit: int) -> list[Task]:
        return await self._db.read(tasks_page, self._q, project, after or "", limit)

    async def import_task(
        self, project: str, item: ImportTask, triggers: list[CronSpec], now_ms: int, *, privileged: bool
    ) -> ImportedTask:
        return await self._db.write(import_task, self._q, project, item, triggers, now_ms, privileged)

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        return await self._db.write(import_tasks, self._q, project, items, now_ms)

    async def imports(self, project: str, after: str | None, limit: int) -> list[ImportRecord]:
        return await self._db.read(imports, self._q, project, after or "", limit)

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        await self._db.write(apply_import, self._q, project, plan, now_ms)

    async def task_uid(self, project: str, task_id: str) -> int | None:
        return await self._db.read(task_uid, self._q, project, task_id)

    async def allocate_task_uid(self, project: str, task_id: str, low: int, high: int,
                                taken: frozenset[int], now_ms: int) -> int:
        return await self._db.write(allocate_task_uid, self._q, project, task_id, low, high, taken, now_ms)

    async def delete(self, project: str, task_id: str, expected_revision: int | None, with_triggers: bool) -> int:
        removed = await self._db.write(delete_task, self._q, project, task_id, expected_revision, with_triggers)
        self._logs.remove(removed)
        return len(removed)


# -- triggers -----------------------------------------------------------------------


def _checked(spec: CronSpec) -> CronSpec:
    """The spec, when it can fire; refused (invalid_argument) before it is ever stored."""
    _schedule(spec)
    return spec


def _schedule(spec: CronSpec) -> Schedule:
    try:
        return spec.schedule()
    except ScheduleError as exc:
        raise invalid(str(exc)) from None


def arm_mark(tx: Tx, q: CatalogSql, project: str, now: int) -> int:
    """From when a trigger made now is armed: the newest time on record, not the wall clock
    (a trigger made while the clock still says 1970 must not count half a century of
    missed fires once it is set)."""
    return max(now, newest_time(tx, q, project))


def _arm(tx: Tx, q: CatalogSql, project: str, schedule: Schedule, now: int, mark: int | None = None) -> int | None:
    if schedule.event == REBOOT:
        return None  # armed by the next boot (admission's arm_boot), not by being created or enabled
    mark = arm_mark(tx, q, project, now) if mark is None else mark
    if schedule.event == ONCE:
        return mark  # due at once, or when the clock has caught up
    return _next_fire(schedule.expression, schedule.zone_name, mark)


@functools.lru_cache(maxsize=64)
def _next_fire(expression: str, zone: str, after_ms: int) -> int | None:
    """Remembered: the triggers an import makes in one transaction share a few schedules and one mark.
    A few: every trigger made one at a time has a mark of its own, never asked for again, and
    each one remembered stays in memory."""
    return Schedule(expression, zone).next_after(after_ms)


def _pinned(tx: Tx, q: CatalogSql, project: str, task_id: str, wanted: int | None) -> int:
    """The task revision a trigger is pinned to: `wanted`, or the head's."""
    row = tx.row(q.task_head, (project, task_id))
    if row is None:
        raise not_found(f"task {task_id!r} not found")
    if wanted is None:
        return int(row[0])
    if tx.row(q.task_revision_exists, (project, task_id, wanted)) is None:
        raise not_found(f"task {task_id!r} has no revision {wanted}")
    return wanted


def _insert_trigger_revision(tx: Tx, q: CatalogSql, t: Trigger) -> None:
    tx.execute(q.trigger_revision_insert, (t.project_id, t.id, t.revision, t.task_id, t.task_revision, t.enabled,
                                           SPEC_SCHEMA, _json.encode(t.spec).decode(), t.content_digest,
                                           t.updated_at_ms))


def _free_id(tx: Tx, q: CatalogSql, project: str, task_id: str) -> str:
    """`<task>-1`, `<task>-2`, …: short names people can type."""
    for n in range(1, 10_000):
        suffix = f"-{n}"
        candidate = task_id[: 128 - len(suffix)] + suffix
        if tx.row(q.trigger_exists, (project, candidate)) is None:
            return candidate
    raise conflict(f"task {task_id!r} has too many triggers")


def insert_trigger(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str | None, task_id: str, task_revision: int | None,
    spec: CronSpec, now: int, enabled: bool = True, mark: int | None = None,
) -> Trigger:
    """A new trigger, inside the caller's transaction (`mark`: arm_mark, when the caller has it)."""
    schedule = _schedule(spec)
    pin = _pinned(tx, q, project, task_id, task_revision)
    tid = trigger_id or _free_id(tx, q, project, task_id)
    first = Trigger(
        id=tid, project_id=project, revision=1, task_id=task_id, task_revision=pin, enabled=enabled,
        spec_schema=SPEC_SCHEMA, spec=spec, content_digest=content_digest(spec), created_at_ms=now,
        updated_at_ms=now, next_fire_at_ms=_arm(tx, q, project, schedule, now, mark) if enabled else None,
    )
    if not tx.execute(q.trigger_insert, (project, tid, task_id, pin, enabled, now, now, first.next_fire_at_ms)):
        raise conflict(f"trigger {tid!r} already exists")
    _insert_trigger_revision(tx, q, first)
    tx.hint("trigger")
    return first  # what was written, as get would read it back


def create_trigger(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str | None, task_id: str, task_revision: int | None,
    spec: CronSpec, now: int,
) -> Trigger:
    return insert_trigger(tx, q, project, trigger_id, task_id, task_revision, spec, now)


def _trigger_head(tx: Tx, q: CatalogSql, project: str, trigger_id: str, expected: int | None) -> Trigger:
    trigger = get_trigger(tx, q, project, trigger_id, lock=True)
    if trigger is None:
        raise not_found(f"trigger {trigger_id!r} not found")
    if expected is not None and trigger.revision != expected:
        raise conflict(f"trigger {trigger_id!r} is at revision {trigger.revision}, not {expected}")
    return trigger


def _revise(
    tx: Tx, q: CatalogSql, current: Trigger, now: int, enabled: bool, task_revision: int,
    spec: CronSpec | None = None,
) -> Trigger:
    """A new revision with the given flag, pin and (when given) spec; the cursor is re-armed
    on enable and for a new spec."""
    if q.drop_boot_fires is not None and (not enabled or spec is not None):
        # a disabled @reboot trigger drops the fires that boots armed and no node admitted;
        # so does a new schedule, armed as a new trigger's would be (@reboot: at the next boot)
        tx.execute(q.drop_boot_fires, (current.project_id, current.id))
    nxt = current.next_fire_at_ms
    if not enabled:
        nxt = None
    elif spec is not None or not current.enabled or nxt is None:
        nxt = _arm(tx, q, current.project_id, _schedule(spec or current.spec), now)  # missed while disabled: not missed
    revision = current.revision + 1
    changed = {"spec": spec, "content_digest": content_digest(spec)} if spec is not None else {}
    _insert_trigger_revision(tx, q, msgspec.structs.replace(
        current, revision=revision, enabled=enabled, task_revision=task_revision, updated_at_ms=now, **changed))
    tx.execute(q.trigger_update, (revision, enabled, task_revision, now, nxt, current.project_id, current.id))
    tx.hint("trigger")
    updated = get_trigger(tx, q, current.project_id, current.id)
    assert updated is not None
    return updated


def set_trigger_enabled(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str, enabled: bool, expected: int | None, now: int
) -> Trigger:
    current = _trigger_head(tx, q, project, trigger_id, expected)
    armed = current.next_fire_at_ms is not None or current.spec.expression == REBOOT
    if current.enabled == enabled and (not enabled or armed):
        return current
    return _revise(tx, q, current, now, enabled, current.task_revision)


def repin(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str, task_revision: int | None, expected: int | None, now: int
) -> Trigger:
    current = _trigger_head(tx, q, project, trigger_id, expected)
    pin = _pinned(tx, q, project, current.task_id, task_revision)
    if pin == current.task_revision:
        return current
    return _revise(tx, q, current, now, current.enabled, pin)


def update_trigger(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str, spec: CronSpec, expected: int | None, now: int
) -> Trigger:
    current = _trigger_head(tx, q, project, trigger_id, expected)
    if current.spec == spec:
        return current
    return _revise(tx, q, current, now, current.enabled, current.task_revision, spec)


def disable_fired(tx: Tx, q: CatalogSql, trigger: Trigger, now: int) -> None:
    """A one-shot (`@once`) that has fired disables itself, by a new revision."""
    _revise(tx, q, trigger, now, False, trigger.task_revision)


def follow_task(tx: Tx, q: CatalogSql, project: str, task_id: str, old: int, new: int, now: int) -> None:
    """Triggers pinned to a task's current revision move with it (inside the task's
    transaction), each by a new trigger revision. Triggers pinned elsewhere stay."""
    for (tid,) in tx.rows(q.following, (project, task_id, old)):
        current = get_trigger(tx, q, project, tid, lock=True)
        assert current is not None
        _revise(tx, q, current, now, current.enabled, new)


def delete_trigger(tx: Tx, q: CatalogSql, project: str, trigger_id: str, expected: int | None) -> None:
    _trigger_head(tx, q, project, trigger_id, expected)
    tx.execute(q.trigger_delete, (project, trigger_id))
    tx.hint("trigger")


def record_event(
    tx: Tx, q: CatalogSql, project: str, trigger_id: str, kind: str, reason: str,
    first: int, last: int | None, fires: int | None, now: int, last_admitted: int | None,
) -> bool:
    """Record fires that did not run, merged into the newest event when that one has the
    same outcome and no run was admitted since (a disabled task skips quietly, once).
    Call inside the admission transaction; prunes the trigger's oldest events, bounded.
    True when a new event was recorded (not merged into the newest)."""
    newest = tx.row(q.newest_event, (project, trigger_id))
    if newest and tuple(newest[1:3]) == (kind, reason) and (last_admitted is None or (newest[3] or 0) > last_admitted):
        if newest[3] is not None and newest[3] >= first:
            return False  # the same fire again (a retry): already on record
        count = None if newest[4] is None or fires is None else newest[4] + fires
        tx.execute(q.event_merge, (count, last, newest[0]))
        return False
    tx.execute(q.event_insert, (project, trigger_id, kind, reason, first, last, fires, now))
    tx.execute(q.events_prune, (project, trigger_id, PRUNE_BATCH, EVENTS_PER_TRIGGER))
    return True


class SqlTriggerStore:
    """TriggerStore on `db`, in its dialect `q`."""

    def __init__(self, db: Db, q: CatalogSql) -> None:
        self._db = db
        self._q = q

    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec,
        now_ms: int,
    ) -> Trigger:
        return await self._db.write(create_trigger, self._q, project, trigger_id, task_id, task_revision,
                                    _checked(spec), now_ms)

    async def get(self, project: str, trigger_id: str) -> Trigger | None:
        return await self._db.read(get_trigger, self._q, project, trigger_id)

    async def page(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        return await self._db.read(triggers_page, self._q, project, after or "", limit)

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.write(set_trigger_enabled, self._q, project, trigger_id, enabled, expected_revision,
                                    now_ms)

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.write(repin, self._q, project, trigger_id, task_revision, expected_revision, now_ms)

    async def update(
        self, project: str, trigger_id: str, spec: CronSpec, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        return await self._db.write(update_trigger, self._q, project, trigger_id, _checked(spec), expected_revision,
                                    now_ms)

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None:
        await self._db.write(delete_trigger, self._q, project, trigger_id, expected_revision)

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        return await self._db.read(trigger_events, self._q, project, trigger_id, before_id, limit)
