"""Admission, once for both backends: the one transaction in which a fire, a retry or a
manual start becomes a queued run, is skipped, or is refused; and the clock mark that
keeps scheduling sane across a router's 1970 boot. Implements RunAdmission
(edge.core.ports.stores).

A fire becomes a run in one transaction that reads the trigger with the dialect's locking
read (on PostgreSQL `FOR UPDATE`: a compare-and-set on its cursor, since a second node
waits and then re-reads the moved cursor), inserts the run under the id the fire names
(edge.core.runs.fire_run_id, of the project and the key
`cron:<trigger>:<revision>:<scheduled_for_ms>`: never twice, `ON CONFLICT DO NOTHING` on the
primary key; the key itself is derived from the run's columns when read, not stored), and
moves the cursor. The overlap policy and the queue bound are checked under the gate's lock
(`Tx.lock`: PostgreSQL's advisory lock holds it across nodes, SQLite's `BEGIN IMMEDIATE`
already); on a cluster the partial unique index on a `forbid` task's active run backs the
policy up, and the queue bound counts the slots of every live node. Misfires and grace
follow edge.core.schedule.plan.

`@once` is a cursor like any fire (key `once:<trigger>:<revision>`, the trigger disabled by
a new revision in the same transaction). `@reboot` is once per boot of the device: on one
device the boot id is in `meta` and arms the trigger's cursor (key
`boot:<trigger>:<boot id>`); on a cluster it is once per boot of each node's machine, on
that machine (edge.storage.postgres.node.PgAdmission arms a `boot_fires` row per node, which
only that node admits, for itself alone).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from edge.core.errors import ToolError, conflict, not_found
from edge.core.ids import uuid7
from edge.core.runs import ActorType, Followers, Run, cron_key, fire_run_id
from edge.core.schedule import ONCE, REBOOT, ScheduleError, plan
from edge.core.tasks import Task, TaskRef, stored_spec
from edge.core.triggers import Admission, EventType, ManualAdmission, SkippedFires, SkipReason, Trigger
from edge.storage import catalog
from edge.storage.catalog import CatalogSql
from edge.storage.runs import RunsSql, append_event, get_run, insert_run, queue_skip
from edge.storage.tx import Db, Tx

log = logging.getLogger("qledge.store")

GATE_LOCK = 0x71_6C_65_67  # serializes the overlap and queue checks (of every node)


class AdmissionSql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect."""

    named: str  # a named parameter, for the statements built here (`{}`: its name)
    armed: str  # named parameters `project` and `node`
    armed_retries: str
    pinned_task: str  # the task revision a run will execute: its enabled flag (the head's) and overlap policy
    head_task: str  # the task's enabled flag, its current revision, and that revision's schema and spec
    active_for_task: str
    active_count: str  # the runner's slots and queue are shared by every project it runs
    live_slots: str | None  # the slots of the nodes alive, for a cluster's bound
    by_key: str  # a run of the project by its stored key (unique within a project)
    move_cursor: str
    save_time: str
    retry_due: str  # the failed run's pending retry, locked for the transaction's write
    retry_clear: str
    boot_get: str | None  # the boot id on record (one device's)
    boot_set: str | None
    reboot_triggers: str | None  # the enabled @reboot triggers, armed once per boot
    arm: str | None
    boot_fire: str | None  # this node's fire of a @reboot trigger (a cluster's), locked
    boot_fire_drop: str | None
    # What age retention and run lists order by: the times of runs, their events and the audit.
    restamped: tuple[tuple[str, tuple[str, ...]], ...]
    # Statements (named: after, upto, shift) for times the columns do not hold; they run
    # first, reading the columns' times as they were.
    restamp_more: tuple[str, ...] = ()


class NodeLease(msgspec.Struct, frozen=True):
    """Who admits on a cluster: the node (its own `@reboot` fires) and its lease."""

    node_id: str
    lease_s: float


class Bound:
    """The queue bound: `capacity` (slots + queue); on a cluster (`own_slots` > 0) with this
    node's own slots replaced by those of every live node."""

    def __init__(self, capacity: int, own_slots: int = 0, lease_s: float = 0.0) -> None:
        self.capacity = capacity
        self.own_slots = own_slots
        self.lease_s = lease_s

    def limit(self, tx: Tx, q: AdmissionSql) -> int:
        if not self.own_slots or q.live_slots is None:
            return self.capacity
        (live,) = tx.one(q.live_slots, (self.lease_s,))
        return self.capacity - self.own_slots + max(int(live), self.own_slots)


class Dialect(msgspec.Struct, frozen=True):
    """The statements admission reads and writes through: its own, and those of the
    triggers and runs it changes."""

    admission: AdmissionSql
    catalog: CatalogSql
    runs: RunsSql


def armed(tx: Tx, d: Dialect, project: str, node: str | None) -> list[tuple[int, str]]:
    """The armed triggers by cursor (the scheduler's heap): sorted here, as a dialect may
    read them in another order (SQLite has no index on the cursor)."""
    return sorted((int(nxt), tid) for nxt, tid in tx.rows(d.admission.armed, {"project": project, "node": node}))


def armed_retries(tx: Tx, d: Dialect, project: str) -> list[tuple[int, str]]:
    return [(int(due), rid) for due, rid in tx.rows(d.admission.armed_retries, (project,))]


def save_time(tx: Tx, d: Dialect, now: int) -> None:
    tx.execute(d.admission.save_time, (catalog.CLOCK_KEY, now))


def restamp(tx: Tx, d: Dialect, after: int, upto: int, shift: int) -> int:
    """Move every time in (after, upto] of the restamped columns by `shift`, in one
    transaction; returns how many runs moved. Rare (once per boot with an unset clock), so
    it may walk those tables."""
    moved = 0
    lo, hi, by = (d.admission.named.format(n) for n in ("after", "upto", "shift"))
    for statement in d.admission.restamp_more:
        tx.execute(statement, {"after": after, "upto": upto, "shift": shift})
    for table, columns in d.admission.restamped:
        # A NULL time stays NULL (it is not inside the range).
        sets = ", ".join(f"{c} = CASE WHEN {c} > {lo} AND {c} <= {hi} THEN {c} + {by} ELSE {c} END" for c in columns)
        where = " OR ".join(f"({c} > {lo} AND {c} <= {hi})" for c in columns)
        count = tx.execute(f"UPDATE {table} SET {sets} WHERE {where}", {"after": after, "upto": upto, "shift": shift})
        if table == "runs":
            moved = count
    save_time(tx, d, upto + shift)
    return moved


def _restamp_logged(tx: Tx, d: Dialect, after: int, upto: int, shift: int) -> None:
    moved = restamp(tx, d, after, upto, shift)
    log.info("the clock was set forward by %.0fs: %d runs (with their events) and the audit rows stamped while it"
             " was behind moved by as much", shift / 1000, moved)


def _gate(
    tx: Tx, d: Dialect, project: str, task_id: str, overlap: str, bound: Bound, replacing: list[str]
) -> tuple[SkipReason | None, str | None]:
    """(None, None) when a new run may be queued, else (reason, blocking run id).
    Under `replace` the active runs are added to `replacing` instead."""
    q = d.admission
    active = [r for (r,) in tx.rows(q.active_for_task, (project, task_id)) if r not in replacing]
    if active and overlap == "forbid":
        return "overlap", active[0]
    if active and overlap == "replace":
        replacing.extend(active)
    if int(tx.one(q.active_count)[0]) - len(replacing) >= bound.limit(tx, q):
        return "queue_full", None
    return None, None


def _scheduled_run(trig: Trigger, fire: int, origin: str, now: int, jitter: int | None, key: str | None = None) -> Run:
    """A fire's run: a cron fire's named by the fire (its key derived, not stored), an
    event's (`key`: `@once`, `@reboot`) with its key."""
    return Run(
        id=uuid7(now) if key else fire_run_id(trig.project_id, trig.id, trig.revision, fire),
        project_id=trig.project_id, task_id=trig.task_id, task_revision=trig.task_revision,
        origin=origin, status="queued", version=1, event_seq=1, created_at_ms=now,  # type: ignore[arg-type]
        trigger_id=trig.id, trigger_revision=trig.revision, queued_at_ms=now, scheduled_for_ms=fire,
        idempotency_key=key, jitter_ms=jitter,
    )


def _refused(tx: Tx, d: Dialect, trig: Trigger, due: int, now: int) -> Admission:
    """Zone data went missing: keep the cursor, say so once, retry later."""
    catalog.record_event(tx, d.catalog, trig.project_id, trig.id, "refused", "timezone_unavailable", due, due, 1, now,
                         trig.last_scheduled_at_ms)
    refused = SkippedFires(trig.task_id, "refused", "timezone_unavailable", due, due, 1)
    return Admission(cursor=due, retry=True, skipped=[refused])


def _skip(tx: Tx, d: Dialect, trig: Trigger, reason: SkipReason, first: int, last: int | None, fires: int | None,
          now: int, last_admitted: int | None, skipped: list[SkippedFires]) -> int:
    """Fires of `trig` that did not run, on record (and in `skipped`); the messages queued."""
    kind: EventType = "refused" if reason == "queue_full" else "skipped"
    notified = 0
    if catalog.record_event(tx, d.catalog, trig.project_id, trig.id, kind, reason, first, last, fires, now,
                            last_admitted):
        notified = queue_skip(tx, d.runs, trig.project_id, trig.task_id, trig.task_revision, reason, now)
    skipped.append(SkippedFires(trig.task_id, kind, reason, first, last, fires))
    return notified


def _admit(tx: Tx, d: Dialect, run: Run, forbid: bool, node: NodeLease | None = None) -> Run | None:
    """The run inserted (None: its key, or a forbid task's one active run, exists)."""
    not_before = run.created_at_ms + (run.jitter_ms or 0)
    if not insert_run(tx, d.runs, run, "scheduler", forbid, not_before, node.node_id if node else None,
                      node.lease_s if node else 0.0):
        return None
    created = get_run(tx, d.runs, run.project_id, run.id)
    assert created is not None
    return created


def _admit_event(
    tx: Tx, d: Dialect, trig: Trigger, event: str, key: str, now: int, bound: Bound, rng: Callable[[], float],
    node: NodeLease | None,
) -> Admission:
    """`@reboot` and `@once`: one fire, now (after the clock-sync hold, which kept it from
    being due earlier), under the same gates as any fire; then the trigger is unarmed, and
    a one-shot disables itself. `node`: the one a cluster's `@reboot` fire is for."""
    project = trig.project_id
    tx.lock(GATE_LOCK)
    enabled, overlap = tx.one(d.admission.pinned_task, (project, trig.task_id, trig.task_revision))
    replacing: list[str] = []
    reason: SkipReason | None = "task_disabled" if not enabled else _gate(
        tx, d, project, trig.task_id, overlap, bound, replacing)[0]
    admitted: list[Run] = []
    skipped: list[SkippedFires] = []
    last_admitted = trig.last_scheduled_at_ms
    notified = 0
    if reason is not None:
        notified = _skip(tx, d, trig, reason, now, now, 1, now, last_admitted, skipped)
    elif tx.row(d.admission.by_key, (project, key)) is None:
        jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
        created = _admit(tx, d, _scheduled_run(trig, now, "scheduled", now, jitter, key), overlap == "forbid", node)
        if created is not None:
            admitted.append(created)
            last_admitted = now
    tx.execute(d.admission.move_cursor, (None, last_admitted, project, trig.id))
    if event == ONCE:
        current = catalog.get_trigger(tx, d.catalog, project, trig.id)
        assert current is not None
        catalog.disable_fired(tx, d.catalog, current, now)
    return _done(tx, d, now, Admission(runs=admitted, cancel=replacing, cursor=None, skipped=skipped,
                                       notified=notified))


def _done(tx: Tx, d: Dialect, now: int, admission: Admission) -> Admission:
    if admission.runs:
        tx.hint("run")
    else:  # an admitted run carries the time itself (newest_time reads it): one page less
        save_time(tx, d, now)
    return admission


def _admit_boot(tx: Tx, d: Dialect, trig: Trigger, now: int, bound: Bound, rng: Callable[[], float],
                node: NodeLease) -> Admission:
    """A cluster node's fire of a `@reboot` trigger, armed by its boot; other nodes' are theirs."""
    q = d.admission
    assert q.boot_fire is not None and q.boot_fire_drop is not None
    armed = tx.row(q.boot_fire, (trig.project_id, node.node_id, trig.id))
    if armed is None:
        return Admission(cursor=None)
    boot_id, due = armed
    if not trig.enabled:
        tx.execute(q.boot_fire_drop, (trig.project_id, node.node_id, trig.id))
        return Admission(cursor=None)
    try:
        trig.spec.schedule()
    except ScheduleError:
        return _refused(tx, d, trig, due, now)
    if now < due:
        return Admission(cursor=due)  # not due yet (the clock went back)
    tx.execute(q.boot_fire_drop, (trig.project_id, node.node_id, trig.id))
    return _admit_event(tx, d, trig, REBOOT, f"boot:{trig.id}:{boot_id}", now, bound, rng, node)


def _boot_key(project: str) -> str:
    return f"boot.id:{project}"


def seen_boot(tx: Tx, d: Dialect, project: str) -> object:
    assert d.admission.boot_get is not None
    row = tx.row(d.admission.boot_get, (_boot_key(project),))
    return row[0] if row else None


def admit_fires(
    tx: Tx, d: Dialect, project: str, trigger_id: str, now: int, grace_ms: int, bound: Bound,
    rng: Callable[[], float], node: NodeLease | None,
) -> Admission:
    """Admit what is due of one trigger: plan, runs with their events, skipped and
    refused fires, the cursor and the clock mark, all in one transaction."""
    trig = catalog.get_trigger(tx, d.catalog, project, trigger_id, lock=True)
    if trig is None:
        return Admission(gone=True)
    if node is not None and trig.spec.expression == REBOOT:
        return _admit_boot(tx, d, trig, now, bound, rng, node)
    if not trig.enabled or trig.next_fire_at_ms is None:
        return Admission(cursor=None)
    try:
        schedule = trig.spec.schedule()
    except ScheduleError:
        return _refused(tx, d, trig, trig.next_fire_at_ms, now)
    if schedule.event is not None:
        if now < trig.next_fire_at_ms:
            return Admission(cursor=trig.next_fire_at_ms)  # not due yet (the clock went back)
        if schedule.event == REBOOT:
            key = f"boot:{trig.id}:{seen_boot(tx, d, project)}"  # once per boot, whatever the revision
        else:
            key = f"once:{trig.id}:{trig.revision}"  # re-enabling makes a new revision, and a new shot
        return _admit_event(tx, d, trig, schedule.event, key, now, bound, rng, None)
    todo = plan(schedule, trig.next_fire_at_ms, now, trig.spec.misfire, grace_ms)
    if not todo.admit and todo.missed is None:
        if todo.cursor != trig.next_fire_at_ms:  # the cursor was no fire time (zone rules changed)
            tx.execute(d.admission.move_cursor, (todo.cursor, trig.last_scheduled_at_ms, project, trig.id))
        return Admission(cursor=todo.cursor)  # nothing due yet
    last_admitted = trig.last_scheduled_at_ms
    # What this transaction records, for the system log of the daemon that recorded it.
    notified = 0
    skipped: list[SkippedFires] = []
    if todo.missed is not None:
        m = todo.missed
        notified += _skip(tx, d, trig, "misfire", m.first_ms, m.last_ms, m.fires, now, last_admitted, skipped)
    tx.lock(GATE_LOCK)
    enabled, overlap = tx.one(d.admission.pinned_task, (project, trig.task_id, trig.task_revision))
    admitted: list[Run] = []
    replacing: list[str] = []
    for fire, origin in todo.admit:
        reason: SkipReason | None = "task_disabled" if not enabled else _gate(
            tx, d, project, trig.task_id, overlap, bound, replacing)[0]
        if reason is not None:
            notified += _skip(tx, d, trig, reason, fire, fire, 1, now, last_admitted, skipped)
            continue
        if tx.row(d.admission.by_key, (project, cron_key(trig.id, trig.revision, fire))) is not None:
            continue  # admitted before fires named their runs (a run of an upgraded database), by its stored key
        jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
        created = _admit(tx, d, _scheduled_run(trig, fire, origin, now, jitter), overlap == "forbid")
        if created is None:
            continue  # the run the fire names (or the one active forbid run) exists: never admitted twice
        admitted.append(created)
        last_admitted = fire
    tx.execute(d.admission.move_cursor, (todo.cursor, last_admitted, project, trig.id))
    return _done(tx, d, now, Admission(runs=admitted, cancel=replacing, cursor=todo.cursor, skipped=skipped,
                                       notified=notified))


def admit_retry(tx: Tx, d: Dialect, project: str, run_id: str, now: int, bound: Bound) -> Admission:
    """The retry of a failed run, once due: a new run under the same gates as any fire, or
    the refusal on record (a trigger event when the run came from a trigger, and an event
    on the failed run). The pending retry is cleared either way; the failed run's row is
    locked, so on a cluster one node admits it."""
    q = d.admission
    pending = tx.row(q.retry_due, (run_id, project))
    if pending is None or pending[0] is None:
        return Admission(gone=True)
    if now < pending[0]:
        return Admission(cursor=int(pending[0]))
    tx.execute(q.retry_clear, (run_id,))
    failed = get_run(tx, d.runs, project, run_id)
    assert failed is not None
    tx.lock(GATE_LOCK)
    pinned = tx.row(q.pinned_task, (project, failed.task_id, failed.task_revision))
    replacing: list[str] = []
    if pinned is None or not pinned[0]:
        reason: str | None = "task_disabled"
    else:
        reason = _gate(tx, d, project, failed.task_id, pinned[1], bound, replacing)[0]
    key = f"retry:{failed.id}"
    if reason is not None:
        kind = "refused" if reason == "queue_full" else "skipped"
        if failed.trigger_id is not None and catalog.get_trigger(tx, d.catalog, project, failed.trigger_id) is not None:
            catalog.record_event(tx, d.catalog, project, failed.trigger_id, kind, reason, now, now, 1, now, None)
        append_event(tx, d.runs, failed.id, f"run.retry_{kind}", "scheduler", now, reason)
        notified = queue_skip(tx, d.runs, project, failed.task_id, failed.task_revision, reason, now)
        return Admission(cursor=None, notified=notified)
    if tx.row(q.by_key, (project, key)) is not None:
        return Admission(cursor=None)  # admitted before
    retry = Run(
        id=uuid7(now), project_id=project, task_id=failed.task_id, task_revision=failed.task_revision,
        origin="retry", status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now,
        trigger_id=failed.trigger_id, trigger_revision=failed.trigger_revision, scheduled_for_ms=now,
        idempotency_key=key, retry_of=failed.id, attempt=failed.attempt + 1,
    )
    created = _admit(tx, d, retry, pinned is not None and pinned[1] == "forbid")
    if created is None:
        return Admission(cursor=None)  # admitted before (the key exists)
    tx.hint("run")
    return Admission(runs=[created], cancel=replacing, cursor=None)


def admit_manual(tx: Tx, d: Dialect, task: Task | TaskRef, actor: ActorType, now: int, bound: Bound) -> ManualAdmission:
    """A manual start under the task's overlap policy and the shared queue bound: of the
    revision `task` names, or of the task's current one (a TaskRef)."""
    tx.lock(GATE_LOCK)
    if isinstance(task, TaskRef):
        head = tx.row(d.admission.head_task, (task.project_id, task.id))
        if head is None:
            raise not_found(f"task {task.id!r} not found")
        enabled, revision, schema, spec = head
        # A revision under a schema this qledge does not know fails closed here, as for every reader.
        overlap = stored_spec(schema, spec).overlap
    else:
        pinned = tx.row(d.admission.pinned_task, (task.project_id, task.id, task.revision))
        if pinned is None:
            raise not_found(f"task {task.id!r} not found")
        enabled, overlap = pinned
        revision = task.revision
    if not enabled:
        raise conflict(f"task {task.id!r} is disabled; enable it first")
    replacing: list[str] = []
    reason, blocking = _gate(tx, d, task.project_id, task.id, overlap, bound, replacing)
    if reason == "overlap":
        raise conflict(f"task {task.id!r} already has an active run ({blocking}) and its overlap policy is forbid")
    if reason == "queue_full":
        limit = bound.limit(tx, d.admission)
        raise ToolError("resource_exhausted", f"the run queue is full ({limit} runs active or waiting)")
    run = Run(id=uuid7(now), project_id=task.project_id, task_id=task.id, task_revision=revision,
              origin="manual", status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now)
    if not insert_run(tx, d.runs, run, actor, overlap == "forbid"):
        raise conflict(f"task {task.id!r} already has an active run and its overlap policy is forbid")
    tx.hint("run")
    created = get_run(tx, d.runs, task.project_id, run.id)
    assert created is not None
    return ManualAdmission(run=created, replaces=replacing)


def arm_boot(tx: Tx, d: Dialect, project: str, boot_id: str, at: int) -> int:
    """Once per boot of one device: when `boot_id` is not the one on record, record it and
    arm every enabled `@reboot` trigger to fire at `at`; returns how many were armed. A
    daemon that dies after arming finds the cursors armed and fires them then (once: the
    fire clears the cursor)."""
    q = d.admission
    assert q.boot_set is not None and q.reboot_triggers is not None and q.arm is not None
    if seen_boot(tx, d, project) == boot_id:
        return 0
    tx.execute(q.boot_set, (_boot_key(project), boot_id))
    ids = [tid for (tid,) in tx.rows(q.reboot_triggers, (project, REBOOT))]
    for tid in ids:
        tx.execute(q.arm, (at, project, tid))
    return len(ids)


class SqlAdmission:
    """RunAdmission on `db`, in its dialect `d`. `capacity`: how many runs may be queued or
    running at once, the runner's slots plus its queue; on a cluster node (`node`, with
    `own_slots` > 0) the bound counts the slots of every live node instead of its own."""

    def __init__(self, db: Db, d: Dialect, capacity: int, followers: Followers | None = None,
                 node: NodeLease | None = None, own_slots: int = 0) -> None:
        self._db = db
        self._d = d
        self._followers = followers or Followers()
        self._node = node
        self._bound = Bound(capacity, own_slots, node.lease_s if node else 0.0)

    def set_capacity(self, capacity: int) -> None:
        self._bound.capacity = capacity

    async def armed(self, project: str) -> list[tuple[int, str]]:
        return await self._db.read(armed, self._d, project, self._node.node_id if self._node else None)

    async def admit_fires(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        return self._followed(await self._db.write(admit_fires, self._d, project, trigger_id, now_ms, grace_ms,
                                                   self._bound, rng, self._node))

    async def armed_retries(self, project: str) -> list[tuple[int, str]]:
        return await self._db.read(armed_retries, self._d, project)

    async def admit_retry(self, project: str, run_id: str, now_ms: int) -> Admission:
        return self._followed(await self._db.write(admit_retry, self._d, project, run_id, now_ms, self._bound))

    def _followed(self, admission: Admission) -> Admission:
        if admission.notified:
            self._followers.notify()
        return admission

    async def admit_manual(self, task: Task | TaskRef, actor: ActorType, now_ms: int) -> ManualAdmission:
        return await self._db.write(admit_manual, self._d, task, actor, now_ms, self._bound)

    async def arm_boot(self, project: str, boot_id: str, at_ms: int) -> int:
        if await self._db.read(seen_boot, self._d, project) == boot_id:
            return 0  # a restart within the boot: a read, no write
        return await self._db.write(arm_boot, self._d, project, boot_id, at_ms)

    async def newest_time(self, project: str) -> int:
        return await self._db.read(catalog.newest_time, self._d.catalog, project)

    async def save_time(self, now_ms: int) -> None:
        await self._db.write(save_time, self._d, now_ms)

    def restamp(self, after_ms: int, upto_ms: int, shift_ms: int) -> None:
        """One transaction, before any call made after this one (a cluster node does not
        call it: see edge.app.graph.Graph)."""
        self._db.before_next(_restamp_logged, self._d, after_ms, upto_ms, shift_ms)
