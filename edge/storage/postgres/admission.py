"""Admission on PostgreSQL: leaderless and exactly once.

Every node evaluates every trigger. A fire becomes a run in one transaction that locks the
trigger's row (`FOR UPDATE`: a compare-and-set on its cursor, since a second node waits and
then re-reads the moved cursor), inserts the run with its unique idempotency key
`cron:<trigger>:<revision>:<scheduled_for_ms>` (`ON CONFLICT DO NOTHING`), and moves the
cursor; the winner's `run` hint wakes the nodes that may claim it. The overlap policy and
the queue bound are checked under one transaction-scoped advisory lock, so they hold across
nodes; the partial unique index on a `forbid` task's active run backs the policy up.
Misfires, grace and clock marks follow the single-node rules (edge.core.schedule.plan).

`@once` is a shared cursor like any fire (key `once:<trigger>:<revision>`, the trigger
disabled by a new revision in the same transaction). `@reboot` is per node: "once per
boot of the device" means once per boot of each node's machine, on that machine. A node
starting in a new boot (its kernel boot id differs from the one `node_boots` holds for
it) arms a `boot_fires` row per enabled `@reboot` trigger; only that node sees and admits
it (key `boot:<trigger>:<boot id>`), and the run is for that node alone (`for_node`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge.core.errors import ToolError, conflict, not_found
from edge.core.ids import uuid7
from edge.core.notices import run_finished
from edge.core.runs import ActorType, Followers, Run
from edge.core.schedule import ONCE, REBOOT, ScheduleError, plan
from edge.core.tasks import Task
from edge.core.triggers import Admission, EventType, ManualAdmission, SkippedFires, SkipReason, Trigger
from edge.storage import catalog
from edge.storage.postgres import notify
from edge.storage.postgres.sql import CATALOG
from edge.storage.postgres.db import PgDatabase, Tx
from edge.storage.postgres.runs import append_event, get_run, insert_run, lose_untaken

log = logging.getLogger("qledge.cluster")

GATE_LOCK = 0x71_6C_65_67  # serializes the overlap and queue checks of every node, per transaction

# The shared cursors, and the @reboot fires this node's boot armed.
SQL_ARMED = """
SELECT next_fire_at_ms, id FROM triggers WHERE project_id = %s AND next_fire_at_ms IS NOT NULL
UNION ALL
SELECT due_ms, trigger_id FROM boot_fires WHERE project_id = %s AND node_id = %s
ORDER BY 1, 2
"""
SQL_NEW_BOOT = """
INSERT INTO node_boots (project_id, node_id, boot_id, booted_at_ms) VALUES (%s, %s, %s, %s)
ON CONFLICT (project_id, node_id) DO UPDATE SET boot_id = excluded.boot_id, booted_at_ms = excluded.booted_at_ms
    WHERE node_boots.boot_id <> excluded.boot_id
RETURNING 1
"""
SQL_ARM_REBOOTS = """
INSERT INTO boot_fires (project_id, trigger_id, node_id, boot_id, due_ms)
SELECT h.project_id, h.id, %s, %s, %s FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
WHERE h.project_id = %s AND h.enabled AND r.spec::jsonb ->> 'expression' = %s
ON CONFLICT (project_id, node_id, trigger_id) DO UPDATE SET boot_id = excluded.boot_id, due_ms = excluded.due_ms
"""
SQL_BOOT_FIRE = (
    "SELECT boot_id, due_ms FROM boot_fires WHERE project_id = %s AND node_id = %s AND trigger_id = %s FOR UPDATE"
)
SQL_DROP_BOOT_FIRE = "DELETE FROM boot_fires WHERE project_id = %s AND node_id = %s AND trigger_id = %s"
SQL_PINNED_TASK = """
SELECT t.enabled, coalesce(r.spec::jsonb ->> 'overlap', 'forbid')
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
WHERE t.project_id = %s AND t.id = %s AND r.revision = %s
"""
SQL_ACTIVE_FOR_TASK = (
    "SELECT id FROM runs WHERE project_id = %s AND task_id = %s AND status IN ('queued', 'running')"
)
SQL_ACTIVE_COUNT = "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
# Slots of the nodes alive (heartbeat within the lease), for the cluster-wide bound.
SQL_LIVE_SLOTS = "SELECT coalesce(sum(slots), 0) FROM nodes WHERE heartbeat_at > now() - make_interval(secs => %s)"
SQL_BY_KEY = "SELECT id FROM runs WHERE idempotency_key = %s"
SQL_MOVE_CURSOR = (
    "UPDATE triggers SET next_fire_at_ms = %s, last_scheduled_at_ms = %s WHERE project_id = %s AND id = %s"
)
SQL_SAVE_TIME = (
    "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET"
    " value = greatest(meta.value, excluded.value)"
)


class Bound:
    """The shared queue bound: `capacity` (slots + queue of this node) with this node's
    own slots replaced by those of every live node."""

    def __init__(self, capacity: int, own_slots: int, lease_s: float) -> None:
        self.capacity = capacity
        self.own_slots = own_slots
        self.lease_s = lease_s

    async def limit(self, tx: Tx) -> int:
        if not self.own_slots:
            return self.capacity
        (live,) = await tx.one(SQL_LIVE_SLOTS, (self.lease_s,))
        return self.capacity - self.own_slots + max(int(live), self.own_slots)


async def _gate(tx: Tx, project: str, task_id: str, overlap: str, bound: Bound,
                replacing: list[str]) -> tuple[SkipReason | None, str | None]:
    active = [r for (r,) in await tx.rows(SQL_ACTIVE_FOR_TASK, (project, task_id)) if r not in replacing]
    if active and overlap == "forbid":
        return "overlap", active[0]
    if active and overlap == "replace":
        replacing.extend(active)
    (count,) = await tx.one(SQL_ACTIVE_COUNT)
    if count - len(replacing) >= await bound.limit(tx):
        return "queue_full", None
    return None, None


def _scheduled_run(trig: Trigger, fire: int, origin: str, now: int, jitter: int | None, key: str | None = None) -> Run:
    return Run(
        id=uuid7(now), project_id=trig.project_id, task_id=trig.task_id, task_revision=trig.task_revision,
        origin=origin, status="queued", version=1, event_seq=1, created_at_ms=now,  # type: ignore[arg-type]
        trigger_id=trig.id, trigger_revision=trig.revision, queued_at_ms=now, scheduled_for_ms=fire,
        idempotency_key=key or f"cron:{trig.id}:{trig.revision}:{fire}", jitter_ms=jitter,
    )


class NodeLease:
    """Who admits: the node's id (for its own `@reboot` fires) and its lease."""

    def __init__(self, node_id: str, lease_s: float) -> None:
        self.node_id = node_id
        self.lease_s = lease_s


async def _admit_fires(
    tx: Tx, project: str, trigger_id: str, now: int, grace_ms: int, bound: Bound, rng: Callable[[], float],
    node: NodeLease,
) -> Admission:
    trig = catalog.get_trigger(tx._tx, CATALOG, project, trigger_id, lock=True)
    if trig is None:
        return Admission(gone=True)
    if trig.spec.expression == REBOOT:
        return await _admit_boot(tx, trig, now, bound, rng, node)
    if not trig.enabled or trig.next_fire_at_ms is None:
        return Admission(cursor=None)
    try:
        schedule = trig.spec.schedule()
    except ScheduleError:
        due = trig.next_fire_at_ms
        catalog.record_event(tx._tx, CATALOG, project, trig.id, "refused", "timezone_unavailable", due, due, 1, now,
                                   trig.last_scheduled_at_ms)
        refused = SkippedFires(trig.task_id, "refused", "timezone_unavailable", due, due, 1)
        return Admission(cursor=due, retry=True, skipped=[refused])
    if schedule.event == ONCE:
        if now < trig.next_fire_at_ms:
            return Admission(cursor=trig.next_fire_at_ms)  # not due yet (the clock went back)
        return await _admit_event(tx, trig, f"once:{trig.id}:{trig.revision}", now, bound, rng, None)
    todo = plan(schedule, trig.next_fire_at_ms, now, trig.spec.misfire, grace_ms)
    if not todo.admit and todo.missed is None:
        if todo.cursor != trig.next_fire_at_ms:
            await tx.execute(SQL_MOVE_CURSOR, (todo.cursor, trig.last_scheduled_at_ms, project, trig.id))
        return Admission(cursor=todo.cursor)
    last_admitted = trig.last_scheduled_at_ms
    # What this transaction records, for the system log of the node that recorded it.
    skipped: list[SkippedFires] = []
    notified = 0
    if todo.missed is not None:
        m = todo.missed
        if catalog.record_event(tx._tx, CATALOG, project, trig.id, "skipped", "misfire", m.first_ms, m.last_ms, m.fires, now,
                                      last_admitted):
            notified += await notify.queue_skip(tx, project, trig.task_id, trig.task_revision, "misfire", now)
        skipped.append(SkippedFires(trig.task_id, "skipped", "misfire", m.first_ms, m.last_ms, m.fires))
    await tx.execute("SELECT pg_advisory_xact_lock(%s)", (GATE_LOCK,))
    enabled, overlap = await tx.one(SQL_PINNED_TASK, (project, trig.task_id, trig.task_revision))
    admitted: list[Run] = []
    replacing: list[str] = []
    for fire, origin in todo.admit:
        reason: SkipReason | None = "task_disabled" if not enabled else (
            await _gate(tx, project, trig.task_id, overlap, bound, replacing))[0]
        if reason is not None:
            kind: EventType = "refused" if reason == "queue_full" else "skipped"
            if catalog.record_event(tx._tx, CATALOG, project, trig.id, kind, reason, fire, fire, 1, now, last_admitted):
                notified += await notify.queue_skip(tx, project, trig.task_id, trig.task_revision, reason, now)
            skipped.append(SkippedFires(trig.task_id, kind, reason, fire, fire, 1))
            continue
        key = f"cron:{trig.id}:{trig.revision}:{fire}"
        if await tx.row(SQL_BY_KEY, (key,)) is not None:
            continue
        jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
        run = _scheduled_run(trig, fire, origin, now, jitter)
        if not await insert_run(tx, run, "scheduler", overlap == "forbid", now + (jitter or 0)):
            continue  # the key (or the one active forbid run) exists: never admitted twice
        created = await get_run(tx, project, run.id)
        assert created is not None
        admitted.append(created)
        last_admitted = fire
    await tx.execute(SQL_MOVE_CURSOR, (todo.cursor, last_admitted, project, trig.id))
    await tx.execute(SQL_SAVE_TIME, (catalog.CLOCK_KEY, now))
    if admitted:
        await tx.notify("run")
    return Admission(runs=admitted, cancel=replacing, cursor=todo.cursor, skipped=skipped, notified=notified)


async def _admit_boot(tx: Tx, trig: Trigger, now: int, bound: Bound, rng: Callable[[], float],
                      node: NodeLease) -> Admission:
    """This node's fire of a `@reboot` trigger, armed by its boot; other nodes' are theirs."""
    armed = await tx.row(SQL_BOOT_FIRE, (trig.project_id, node.node_id, trig.id))
    if armed is None:
        return Admission(cursor=None)
    boot_id, due = armed
    if not trig.enabled:
        await tx.execute(SQL_DROP_BOOT_FIRE, (trig.project_id, node.node_id, trig.id))
        return Admission(cursor=None)
    try:
        trig.spec.schedule()
    except ScheduleError:
        catalog.record_event(tx._tx, CATALOG, trig.project_id, trig.id, "refused", "timezone_unavailable", due, due, 1, now,
                                   trig.last_scheduled_at_ms)
        refused = SkippedFires(trig.task_id, "refused", "timezone_unavailable", due, due, 1)
        return Admission(cursor=due, retry=True, skipped=[refused])
    if now < due:
        return Admission(cursor=due)  # not due yet (the clock went back)
    await tx.execute(SQL_DROP_BOOT_FIRE, (trig.project_id, node.node_id, trig.id))
    return await _admit_event(tx, trig, f"boot:{trig.id}:{boot_id}", now, bound, rng, node)


async def _admit_event(tx: Tx, trig: Trigger, key: str, now: int, bound: Bound, rng: Callable[[], float],
                       node: NodeLease | None) -> Admission:
    """`@reboot` (for `node` alone) and `@once` (no node): one fire, now, under the same
    gates as any fire; then the shared cursor is cleared, and a one-shot disables itself."""
    project = trig.project_id
    await tx.execute("SELECT pg_advisory_xact_lock(%s)", (GATE_LOCK,))
    enabled, overlap = await tx.one(SQL_PINNED_TASK, (project, trig.task_id, trig.task_revision))
    replacing: list[str] = []
    reason: SkipReason | None = "task_disabled" if not enabled else (
        await _gate(tx, project, trig.task_id, overlap, bound, replacing))[0]
    admitted: list[Run] = []
    skipped: list[SkippedFires] = []
    last_admitted = trig.last_scheduled_at_ms
    notified = 0
    if reason is not None:
        kind: EventType = "refused" if reason == "queue_full" else "skipped"
        if catalog.record_event(tx._tx, CATALOG, project, trig.id, kind, reason, now, now, 1, now, last_admitted):
            notified = await notify.queue_skip(tx, project, trig.task_id, trig.task_revision, reason, now)
        skipped.append(SkippedFires(trig.task_id, kind, reason, now, now, 1))
    elif await tx.row(SQL_BY_KEY, (key,)) is None:
        jitter = int(rng() * trig.spec.jitter_s * 1000) if trig.spec.jitter_s else None
        run = _scheduled_run(trig, now, "scheduled", now, jitter, key)
        if await insert_run(tx, run, "scheduler", overlap == "forbid", now + (jitter or 0),
                            node.node_id if node else None, node.lease_s if node else 0.0):
            created = await get_run(tx, project, run.id)
            assert created is not None
            admitted.append(created)
            last_admitted = now
    await tx.execute(SQL_MOVE_CURSOR, (None, last_admitted, project, trig.id))
    if node is None:  # @once
        current = catalog.get_trigger(tx._tx, CATALOG, project, trig.id)
        assert current is not None
        catalog.disable_fired(tx._tx, CATALOG, current, now)
    await tx.execute(SQL_SAVE_TIME, (catalog.CLOCK_KEY, now))
    if admitted:
        await tx.notify("run")
    return Admission(runs=admitted, cancel=replacing, cursor=None, skipped=skipped, notified=notified)


async def _admit_retry(tx: Tx, project: str, run_id: str, now: int, bound: Bound) -> Admission:
    """The retry of a failed run, once due, on any node (the failed run's row is locked and
    its pending retry cleared: one node admits it): a new run under the same gates as any
    fire, or the refusal on record (as on SQLite, edge.storage.sqlite.admission)."""
    failed = await tx.row("SELECT retry_due_at_ms FROM runs WHERE id = %s AND project_id = %s FOR UPDATE",
                          (run_id, project))
    if failed is None or failed[0] is None:
        return Admission(gone=True)
    if now < failed[0]:
        return Admission(cursor=int(failed[0]))
    await tx.execute("UPDATE runs SET retry_due_at_ms = NULL WHERE id = %s", (run_id,))
    run = await get_run(tx, project, run_id)
    assert run is not None
    await tx.execute("SELECT pg_advisory_xact_lock(%s)", (GATE_LOCK,))
    pinned = await tx.row(SQL_PINNED_TASK, (project, run.task_id, run.task_revision))
    replacing: list[str] = []
    if pinned is None or not pinned[0]:
        reason: str | None = "task_disabled"
    else:
        reason = (await _gate(tx, project, run.task_id, pinned[1], bound, replacing))[0]
    if reason is not None:
        kind = "refused" if reason == "queue_full" else "skipped"
        if run.trigger_id is not None and catalog.get_trigger(tx._tx, CATALOG, project, run.trigger_id) is not None:
            catalog.record_event(tx._tx, CATALOG, project, run.trigger_id, kind, reason, now, now, 1, now, None)
        await append_event(tx, run.id, f"run.retry_{kind}", "scheduler", now, reason)
        notified = await notify.queue_skip(tx, project, run.task_id, run.task_revision, reason, now)
        return Admission(cursor=None, notified=notified)
    retry = Run(
        id=uuid7(now), project_id=project, task_id=run.task_id, task_revision=run.task_revision, origin="retry",
        status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now, trigger_id=run.trigger_id,
        trigger_revision=run.trigger_revision, scheduled_for_ms=now, idempotency_key=f"retry:{run.id}",
        retry_of=run.id, attempt=run.attempt + 1,
    )
    if not await insert_run(tx, retry, "scheduler", pinned is not None and pinned[1] == "forbid", now):
        return Admission(cursor=None)  # admitted before (the key exists)
    await tx.notify("run")
    created = await get_run(tx, project, retry.id)
    assert created is not None
    return Admission(runs=[created], cancel=replacing, cursor=None)


async def _armed_retries(tx: Tx, project: str) -> list[tuple[int, str]]:
    return [(int(due), rid) for due, rid in await tx.rows(
        "SELECT retry_due_at_ms, id FROM runs WHERE project_id = %s AND retry_due_at_ms IS NOT NULL"
        " ORDER BY retry_due_at_ms, id", (project,))]


async def _arm_boot(tx: Tx, project: str, node: NodeLease, boot_id: str, at: int) -> tuple[int, list[Run]]:
    if not await tx.rows(SQL_NEW_BOOT, (project, node.node_id, boot_id, at)):
        return 0, []  # a restart of this node within the same boot
    # Arming first: it waits (on the triggers' rows) only for admissions, before this
    # transaction holds any run an admission could wait for.
    armed = await tx.execute(SQL_ARM_REBOOTS, (node.node_id, boot_id, at, project, REBOOT))
    lost = await lose_untaken(tx, project, node.node_id)
    if lost:
        await tx.notify("run")
    return armed, lost


async def _admit_manual(tx: Tx, task: Task, actor: ActorType, now: int, bound: Bound) -> ManualAdmission:
    await tx.execute("SELECT pg_advisory_xact_lock(%s)", (GATE_LOCK,))
    row = await tx.row(SQL_PINNED_TASK, (task.project_id, task.id, task.revision))
    if row is None:
        raise not_found(f"task {task.id!r} not found")
    if not row[0]:
        raise conflict(f"task {task.id!r} is disabled; enable it first")
    replacing: list[str] = []
    reason, blocking = await _gate(tx, task.project_id, task.id, row[1], bound, replacing)
    if reason == "overlap":
        raise conflict(f"task {task.id!r} already has an active run ({blocking}) and its overlap policy is forbid")
    if reason == "queue_full":
        raise ToolError("resource_exhausted", f"the run queue is full ({await bound.limit(tx)} runs active or waiting)")
    run = Run(id=uuid7(now), project_id=task.project_id, task_id=task.id, task_revision=task.revision,
              origin="manual", status="queued", version=1, event_seq=1, created_at_ms=now, queued_at_ms=now)
    if not await insert_run(tx, run, actor, row[1] == "forbid"):
        raise conflict(f"task {task.id!r} already has an active run and its overlap policy is forbid")
    await tx.notify("run")
    created = await get_run(tx, task.project_id, run.id)
    assert created is not None
    return ManualAdmission(run=created, replaces=replacing)


async def _armed(tx: Tx, project: str, node: str) -> list[tuple[int, str]]:
    return [(int(n), t) for n, t in await tx.rows(SQL_ARMED, (project, project, node))]


async def _newest_time(tx: Tx, project: str) -> int:
    audit = await tx.row(
        "SELECT greatest(at_ms, coalesce(last_at_ms, at_ms)) FROM security_audit ORDER BY id DESC LIMIT 1")
    run = await tx.row("SELECT max(created_at_ms) FROM runs WHERE project_id = %s", (project,))
    return max([catalog.clock_mark(tx._tx, CATALOG)] + [int(r[0]) for r in (audit, run) if r and r[0] is not None])


async def _save_time(tx: Tx, now: int) -> None:
    await tx.execute(SQL_SAVE_TIME, (catalog.CLOCK_KEY, now))


# What age retention and run lists order by: the times of runs, their events and the audit.
RESTAMPED = (
    ("runs", ("created_at_ms", "queued_at_ms", "started_at_ms", "finished_at_ms", "log_dropped_at_ms")),
    ("run_events", ("created_at_ms",)),
    ("security_audit", ("at_ms",)),
)


async def restamp(tx: Tx, after: int, upto: int, shift: int) -> int:
    """Move every time in (after, upto] of RESTAMPED by `shift` (as on SQLite); returns how
    many runs moved."""
    moved = 0
    for table, columns in RESTAMPED:
        # A NULL time stays NULL (CASE: NULL is not inside the range).
        sets = ", ".join(f"{c} = CASE WHEN {c} > %s AND {c} <= %s THEN {c} + %s ELSE {c} END" for c in columns)
        where = " OR ".join(f"({c} > %s AND {c} <= %s)" for c in columns)
        params = [after, upto, shift] * len(columns) + [after, upto] * len(columns)
        count = await tx.execute(f"UPDATE {table} SET {sets} WHERE {where}", params)
        if table == "runs":
            moved = count
    await tx.execute(SQL_SAVE_TIME, (catalog.CLOCK_KEY, upto + shift))
    return moved


async def _restamp_logged(tx: Tx, after: int, upto: int, shift: int) -> None:
    moved = await restamp(tx, after, upto, shift)
    log.info("the clock was set forward by %.0fs: %d runs (with their events) and the audit rows stamped while it"
             " was behind moved by as much", shift / 1000, moved)


class PgAdmission:
    """RunAdmission (edge.core.ports.stores) on PostgreSQL, for node `node_id`. `own_slots`
    > 0 (a cluster node): the queue bound counts the slots of every live node instead of
    this node's alone."""

    def __init__(self, db: PgDatabase, capacity: int, node_id: str, own_slots: int = 0, lease_s: float = 30.0,
                 followers: Followers | None = None) -> None:
        self._db = db
        self._followers = followers or Followers()
        self._bound = Bound(capacity, own_slots, lease_s)
        self._node = NodeLease(node_id, lease_s)

    def set_capacity(self, capacity: int) -> None:
        self._bound.capacity = capacity

    async def armed(self, project: str) -> list[tuple[int, str]]:
        return await self._db.tx(_armed, project, self._node.node_id)

    async def admit_fires(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        return self._followed(await self._db.tx(_admit_fires, project, trigger_id, now_ms, grace_ms, self._bound, rng,
                                                self._node))

    async def admit_manual(self, task: Task, actor: ActorType, now_ms: int) -> ManualAdmission:
        return await self._db.tx(_admit_manual, task, actor, now_ms, self._bound)

    async def armed_retries(self, project: str) -> list[tuple[int, str]]:
        return await self._db.tx(_armed_retries, project)

    async def admit_retry(self, project: str, run_id: str, now_ms: int) -> Admission:
        return self._followed(await self._db.tx(_admit_retry, project, run_id, now_ms, self._bound))

    def _followed(self, admission: Admission) -> Admission:
        if admission.notified:
            self._followers.notify()
        return admission

    async def arm_boot(self, project: str, boot_id: str, at_ms: int) -> int:
        """Per node: the boot on record is this node's, and so are the fires it arms. The
        runs of the boot before that this node never took are lost, each with its line
        (at most one per `@reboot` trigger)."""
        armed, lost = await self._db.tx(_arm_boot, project, self._node, boot_id, at_ms)
        for run in lost:
            level, line = run_finished(run)
            log.log(level, "%s", line)
        return armed

    async def newest_time(self, project: str) -> int:
        return await self._db.tx(_newest_time, project)

    async def save_time(self, now_ms: int) -> None:
        await self._db.tx(_save_time, now_ms)

    def restamp(self, after_ms: int, upto_ms: int, shift_ms: int) -> None:
        """As on SQLite: one transaction, before any call made after this one on this node's
        pool. (A cluster node does not call it: see edge.app.graph.Graph.)"""
        self._db.before_next(_restamp_logged, after_ms, upto_ms, shift_ms)
