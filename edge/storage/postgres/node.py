"""A cluster node: the clock it takes from PostgreSQL, its row in `nodes`, its boots, the
heartbeat that renews its leases and reaps expired ones, the claim loop that feeds the local
runner, the listener for wake-up hints, and the runner as tools and the scheduler see it.

Hints (LISTEN/NOTIFY, sent in the writing transaction) only shorten waits: every loop also
polls (`poll_s`, bounded), and re-polls after every reconnect, so a lost notification
delays a run by at most one poll and never loses it. So a node that was the only one alive
at its last heartbeat sends no `run` hint for the runs it admits (each NOTIFY costs the
listening sessions a transaction to read it): it wakes its own claim loop, and a node that
joined since claims when it starts and at its polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
import psycopg

from edge.core.errors import ToolError, conflict, not_found
from edge.core.handoff import Background, ManualStart
from edge.core.notices import Notices, run_finished
from edge.core.ports.cluster import NodeRegistry, RunClaims
from edge.core.ports.runtime import Clock, RunController, RunInputs
from edge.core.ports.stores import RunAdmission, RunLogFiles, RunStore
from edge.core.runs import TERMINAL, ActorType, Followers, Run, RunStatus, RunUpdate
from edge.core.schedule import REBOOT
from edge.core.tasks import Task, TaskRef
from edge import moment
from edge.core.triggers import Admission, ManualAdmission
from edge.storage.admission import Bound, Dialect, NodeLease, SqlAdmission, admit_fires, admit_manual
from edge.storage.postgres.claims import (
    BATCH, NOW_MS, SQL_CANCEL_REQUESTS, SQL_RENEW, Claimed, PgClaims, claim_runs, lose_untaken, reap_expired,
)
from edge.storage.postgres.db import PgDatabase
from edge.storage.postgres.sql import ADMISSION, RUNS
from edge.storage.runs import Fenced, Fences, Policy, RunsSql, SqlRunStore, transition
from edge.storage.tx import Params, Row, Tx

if TYPE_CHECKING:
    from edge.core.ports.agent import AgentRuns

log = logging.getLogger("qledge.cluster")

FOREVER_S = 30 * 86_400.0
POLL_RUN_S = 0.25  # waiting on a run another node holds: its row is read this often
RECONNECT_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class NodeSettings(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    project: str
    slots: int  # the runner's concurrency: how many runs this node holds at once
    lease_s: float = 30.0
    heartbeat_s: float = 5.0
    poll_s: float = 2.0
    cancel_wait_s: float = 45.0


class DbClock:
    """Clock (edge.core.ports.runtime) following PostgreSQL's: each heartbeat samples the
    server's time and the reading runs on the local monotonic clock from there, so a node
    booted with a wrong wall clock schedules, stamps and expires on the cluster's time.
    It never goes backwards."""

    def __init__(self) -> None:
        self._base_ms: int | None = None
        self._base_mono = 0.0
        self._last = 0

    def sync(self, server_ms: int, sent: float, received: float) -> None:
        self._base_ms = server_ms
        self._base_mono = (sent + received) / 2

    @property
    def synced(self) -> bool:
        return self._base_ms is not None

    def now_ms(self) -> int:
        if self._base_ms is None:
            value = time.time_ns() // 1_000_000
        else:
            value = self._base_ms + int((time.monotonic() - self._base_mono) * 1000)
        self._last = value = max(value, self._last)
        return value

    def monotonic(self) -> float:
        return time.monotonic()


def _heartbeat(tx: Tx, node: str, project: str, slots: int, host: str, pid: int) -> int:
    (now,) = tx.one(
        "INSERT INTO nodes (id, project_id, slots, host, pid, started_at, heartbeat_at)"
        " VALUES (%s, %s, %s, %s, %s, now(), now())"
        " ON CONFLICT (id) DO UPDATE SET slots = excluded.slots, host = excluded.host, pid = excluded.pid,"
        f" heartbeat_at = excluded.heartbeat_at RETURNING {NOW_MS}", (node, project, slots, host, pid))
    return int(now)


def _alive(tx: Tx, lease_s: float) -> int:
    (count,) = tx.one("SELECT count(*) FROM nodes WHERE heartbeat_at > now() - make_interval(secs => %s)",
                            (lease_s,))
    return int(count)


def _leave(tx: Tx, node: str) -> None:
    tx.execute("DELETE FROM nodes WHERE id = %s", (node,))


class Beat(msgspec.Struct, frozen=True):
    """What one heartbeat's transaction found."""

    now_ms: int  # PostgreSQL's time
    cancels: dict[str, str]  # run id → reason: cancels asked of runs this node holds
    reaped: list[Run]  # runs whose lease expired, recorded lost here
    alive: int  # nodes alive


def _beat(tx: Tx, node: str, project: str, slots: int, host: str, pid: int, lease_s: float, held: list[str],
          asked_of: list[str], reap: bool) -> Beat:
    """The heartbeat of a node and everything it does each interval, in one transaction:
    its row, the leases of the runs it holds (an expired lease is never renewed), the
    cancel requests for them, the reaping of expired leases (`reap`) and the count of
    live nodes. The node's row comes first: PostgreSQL's time is read there."""
    now = _heartbeat(tx, node, project, slots, host, pid)
    if held:
        tx.rows(SQL_RENEW, (lease_s, node, held))
    cancels = {rid: reason for rid, reason in tx.rows(SQL_CANCEL_REQUESTS, (asked_of,))} if asked_of else {}
    reaped = reap_expired(tx, BATCH) if reap else []
    return Beat(now, cancels, reaped, _alive(tx, lease_s))


def server_ms(tx: Tx) -> int:
    (now,) = tx.one(f"SELECT {NOW_MS}")
    return int(now)


class PgNodes:
    """NodeRegistry (edge.core.ports.cluster) for one node."""

    def __init__(self, db: PgDatabase, settings: NodeSettings) -> None:
        self._db = db
        self._settings = settings
        self._host = socket.gethostname()

    async def heartbeat(self, slots: int) -> int:
        s = self._settings
        return await self._db.write(_heartbeat, s.node_id, s.project, slots, self._host, os.getpid())

    async def alive(self) -> int:
        return await self._db.read(_alive, self._settings.lease_s)

    async def leave(self) -> None:
        await self._db.write(_leave, self._settings.node_id)


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


def _arm_boot(tx: Tx, project: str, node: str, boot_id: str, at: int) -> tuple[int, list[Run]]:
    if not tx.rows(SQL_NEW_BOOT, (project, node, boot_id, at)):
        return 0, []  # a restart of this node within the same boot
    # Arming first: it waits (on the triggers' rows) only for admissions, before this
    # transaction holds any run an admission could wait for.
    armed = tx.execute(SQL_ARM_REBOOTS, (node, boot_id, at, project, REBOOT))
    lost = lose_untaken(tx, project, node)
    if lost:
        tx.hint("run")
    return armed, lost


class _HeldHints:
    """A transaction whose hints wait for the rule that wraps it to decide on them."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self.topics: list[str] = []

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        return self._tx.rows(sql, params)

    def each(self, sql: str, params: Params = ()) -> list[Row]:
        return self._tx.rows(sql, params)

    def row(self, sql: str, params: Params = ()) -> Row | None:
        return self._tx.row(sql, params)

    def one(self, sql: str, params: Params = ()) -> Row:
        return self._tx.one(sql, params)

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._tx.execute(sql, params)

    def lock(self, key: int) -> None:
        self._tx.lock(key)

    def hint(self, topic: str) -> None:
        if topic not in self.topics:
            self.topics.append(topic)

    def after_commit(self, fn: Callable[[], None]) -> None:
        self._tx.after_commit(fn)


def _replay(tx: Tx, held: _HeldHints, runs_left: bool) -> None:
    """The hints a wrapped rule asked for; `run` only when it left runs for other nodes."""
    for topic in held.topics:
        if topic != "run" or runs_left:
            tx.hint(topic)


def _admit_only(tx: Tx, d: Dialect, task: Task | TaskRef, actor: ActorType, now: int, bound: Bound,
                others: bool) -> ManualAdmission:
    """A manual admission on a node without a free slot; other nodes are told of its run
    only when some are alive (`others`)."""
    held = _HeldHints(tx)
    admitted = admit_manual(held, d, task, actor, now, bound)
    _replay(tx, held, others)
    return admitted


def _admit_and_claim(tx: Tx, d: Dialect, task: Task | TaskRef, actor: ActorType, now: int, bound: Bound, node: str,
                     lease_s: float, limit: int, others: bool) -> tuple[ManualAdmission, list[Claimed] | None]:
    """A manual admission on a node with a free slot: the claim loop's claim (the oldest
    claimable runs, usually this one) in the same transaction; none (None) when the run
    replaces active ones, which it starts after, once they are cancelled (ManualStart).
    Other nodes are told of new runs only when one is left for them and some are alive
    (`others`)."""
    held = _HeldHints(tx)
    admitted = admit_manual(held, d, task, actor, now, bound)
    if admitted.replaces:
        _replay(tx, held, others)
        return admitted, None
    claimed = claim_runs(tx, task.project_id, node, limit, lease_s, now)
    mine = next((c.run for c in claimed if c.run.id == admitted.run.id), None)
    _replay(tx, held, others and mine is None)
    if mine is not None:
        admitted = ManualAdmission(run=mine, replaces=admitted.replaces)
    return admitted, claimed


def _finish_and_claim(
    tx: Tx, q: RunsSql, run_id: str, expected: int, status: RunStatus, now: int, actor: ActorType,
    update: RunUpdate, detail: str | None, policy: Policy, claim: tuple[str, int] | None, data: bytes | None,
    started: RunUpdate | None, project: str, lease_s: float, limit: int,
) -> tuple[tuple[Run, list[str], int] | Fenced, list[Claimed]]:
    """A completion on this node, then the claim loop's claim into the slot it frees, in one
    transaction (a refused, fenced completion claims nothing)."""
    result = transition(tx, q, run_id, expected, status, now, actor, update, detail, policy, claim, data, started)
    if isinstance(result, Fenced) or claim is None:
        return result, []
    return result, claim_runs(tx, project, claim[0], limit, lease_s, now)


class PgRunStore(SqlRunStore):
    """RunStore of a cluster node: once its runtime is built (`claim_with`), the
    completion of a run it holds claims the next run in the same transaction."""

    def __init__(self, db: PgDatabase, policy: Policy, files: RunLogFiles, followers: Followers, fences: Fences,
                 retry_s: float, lease_s: float) -> None:
        super().__init__(db, RUNS, policy, files, followers, fences, retry_s)
        self._pg = db
        self._lease_s = lease_s
        self._project = ""
        self._claims: PgClaims | None = None
        self._taker: Node | None = None

    def claim_with(self, node: Node, claims: PgClaims, project: str) -> None:
        self._taker, self._claims, self._project = node, claims, project

    async def _record(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int, actor: ActorType,
        update: RunUpdate, detail: str | None, claim: tuple[str, int] | None, data: bytes | None,
        started: RunUpdate | None,
    ) -> tuple[Run, list[str], int] | Fenced:
        node, claims = self._taker, self._claims
        ending = run_id if node is not None and node.holds(run_id) else None
        reserved = node.reserve(run_id) if node is not None and claim is not None and status in TERMINAL else 0
        if not reserved or node is None or claims is None:
            return await super()._record(run_id, expected_version, status, now_ms, actor, update, detail, claim,
                                         data, started)
        claimed: list[Claimed] = []
        finished: str | None = None
        try:
            result, claimed = await self._pg.write(
                _finish_and_claim, RUNS, run_id, expected_version, status, now_ms, actor, update, detail,
                self._policy, claim, data, started, self._project, self._lease_s, reserved, retry_s=self._retry_s)
            finished = None if isinstance(result, Fenced) else run_id
        finally:  # nothing claimed when it failed (an unknown outcome: its lease expires, never run twice)
            node.adopt(claims.took(claimed), reserved, finished, claimed=finished is not None, ending=ending)
        return result


def _fires_only(tx: Tx, d: Dialect, project: str, trigger_id: str, now: int, grace_ms: int, bound: Bound,
                rng: Callable[[], float], lease: NodeLease, others: bool) -> Admission:
    """A trigger's admission on a node without a free slot; other nodes are told of its
    runs only when some are alive (`others`)."""
    held = _HeldHints(tx)
    admission = admit_fires(held, d, project, trigger_id, now, grace_ms, bound, rng, lease)
    _replay(tx, held, others)
    return admission


def _fires_and_claim(tx: Tx, d: Dialect, project: str, trigger_id: str, now: int, grace_ms: int, bound: Bound,
                     rng: Callable[[], float], lease: NodeLease, limit: int,
                     others: bool) -> tuple[Admission, list[Claimed]]:
    """A trigger's admission on a node with a free slot: when it admitted runs (and
    replaces none: those start once the runs they replace are cancelled), the claim loop's
    claim in the same transaction. Other nodes are told of new runs only when one is left
    for them and some are alive (`others`)."""
    held = _HeldHints(tx)
    admission = admit_fires(held, d, project, trigger_id, now, grace_ms, bound, rng, lease)
    claimed = (claim_runs(tx, project, lease.node_id, limit, lease.lease_s, now)
               if admission.runs and not admission.cancel else [])
    mine = {c.run.id for c in claimed}
    _replay(tx, held, others and any(run.id not in mine for run in admission.runs))
    return admission, claimed


class PgAdmission(SqlAdmission):
    """RunAdmission (edge.core.ports.stores) of cluster node `node_id`: the queue bound
    counts the slots of every live node (`own_slots` > 0), and `@reboot` is per node.
    Once the node's runtime is built (`claim_with`), a manual start on a node with a
    free slot claims in its admission's transaction."""

    def __init__(self, db: PgDatabase, capacity: int, node_id: str, own_slots: int = 0, lease_s: float = 30.0,
                 followers: Followers | None = None) -> None:
        super().__init__(db, ADMISSION, capacity, followers, NodeLease(node_id, lease_s), own_slots)
        self._pg = db
        self._node_id = node_id
        self._lease_s = lease_s
        self._project = ""
        self._claims: PgClaims | None = None
        self._taker: Node | None = None

    def claim_with(self, node: Node, claims: PgClaims, project: str) -> None:
        self._taker, self._claims, self._project = node, claims, project

    async def admit_fires(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        node, claims = self._taker, self._claims
        reserved = node.reserve() if node is not None and project == self._project else 0
        if node is None or claims is None:
            return await super().admit_fires(project, trigger_id, now_ms, grace_ms, rng)
        lease = NodeLease(self._node_id, self._lease_s)
        if not reserved:
            return self._followed(await self._pg.write(
                _fires_only, self._d, project, trigger_id, now_ms, grace_ms, self._bound, rng, lease, node.others))
        claimed: list[Claimed] = []
        failed = True
        try:
            admission, claimed = await self._pg.write(
                _fires_and_claim, self._d, project, trigger_id, now_ms, grace_ms, self._bound, rng, lease, reserved,
                node.others)
            failed = False
        finally:  # nothing claimed when it failed (an unknown outcome: its lease expires, never run twice)
            node.adopt(claims.took(claimed), reserved, wake=failed,
                       claimed=not failed and bool(admission.runs) and not admission.cancel)
        return self._followed(admission)

    async def admit_manual(self, task: Task | TaskRef, actor: ActorType, now_ms: int) -> ManualAdmission:
        node, claims = self._taker, self._claims
        folds = node is not None and task.project_id == self._project
        reserved = node.reserve() if folds and node is not None else 0
        if node is None or claims is None:
            return await super().admit_manual(task, actor, now_ms)
        if not reserved:
            return await self._pg.write(_admit_only, self._d, task, actor, now_ms, self._bound, node.others)
        claimed: list[Claimed] | None = None
        try:
            admitted, claimed = await self._pg.write(_admit_and_claim, self._d, task, actor, now_ms, self._bound,
                                                     self._node_id, self._lease_s, reserved, node.others)
        finally:  # nothing claimed when it failed (an unknown outcome: its lease expires, never run twice)
            node.adopt(claims.took(claimed or []), reserved, claimed=claimed is not None)
        return admitted

    async def arm_boot(self, project: str, boot_id: str, at_ms: int) -> int:
        """The boot on record is this node's (`node_boots`), and so are the fires it arms
        (`boot_fires`). The runs of the boot before that this node never took are lost,
        each with its line (at most one per `@reboot` trigger)."""
        armed, lost = await self._pg.write(_arm_boot, project, self._node_id, boot_id, at_ms)
        for run in lost:
            level, line = run_finished(run)
            log.log(level, "%s", line)
        return armed


class Node:
    """ClusterNode (edge.core.ports.cluster): heartbeat, claim loop and hint listener."""

    def __init__(self, db: PgDatabase, claims: RunClaims, nodes: NodeRegistry, clock: DbClock,
                 settings: NodeSettings, local: RunController, notices: Notices,
                 after_reconnect: Callable[[], Awaitable[int]] | None = None) -> None:
        self._db = db
        self._notices = notices  # the runner's: one rate limit per task for every line of this daemon
        self._claims = claims
        self._nodes = nodes
        self._clock = clock
        self._settings = settings
        self._local = local
        self._after_reconnect = after_reconnect
        self._held: set[str] = set()  # runs this node claimed and its runner still has
        self._cancelling: set[str] = set()
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._background = Background(log)
        self._changed: Callable[[], None] = lambda: None
        self._queued: Callable[[], None] = lambda: None  # notifications were queued (the notify hint)
        self._up_since: float | None = None  # monotonic time of the first heartbeat since (re)connecting
        self._alive = 0
        self._claiming = False
        self._host = socket.gethostname()
        self._reserved = 0  # free slots an admission or completion in progress may claim into
        self._ending: set[str] = set()  # held runs whose completion, in progress, claims into their slot
        self._settled: set[str] = set()  # ended runs whose completion claimed what there was for their slot
        self._drained_at = -FOREVER_S  # monotonic time a claim last found fewer runs than it could take

    def holds(self, run_id: str) -> bool:
        return run_id in self._held

    @property
    def others(self) -> bool:
        """Whether other nodes may be alive (as far as the last heartbeat saw): then the
        runs this node admits and leaves are hinted to them."""
        return self._alive != 1

    def wake(self) -> None:
        self._wake.set()

    async def start(self, triggers_changed: Callable[[], None],
                    notices_queued: Callable[[], None] | None = None) -> None:
        self._changed = triggers_changed
        if notices_queued is not None:
            self._queued = notices_queued
        self._claiming = True
        await self._beat()
        for loop in (self._heartbeat_loop(), self._claim_loop(), self._listen_loop()):
            self._loops.append(asyncio.create_task(loop))

    async def stop(self) -> None:
        self._claiming = False
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops.clear()

    async def close(self) -> None:
        await self._background.wait()
        with contextlib.suppress(ToolError):
            await self._nodes.leave()

    def status(self) -> dict[str, str]:
        s = self._settings
        down = self._db.down_since
        if down is not None:
            since = moment(int(down * 1000))
            return {"cluster": f"node {s.node_id}: PostgreSQL {self._db.location} unreachable since {since}"
                               f" ({self._db.down_reason}); new runs are refused, running ones go on"}
        return {"cluster": f"node {s.node_id}: PostgreSQL {self._db.location} reachable; {self._alive} nodes alive,"
                           f" {len(self._held)} of {s.slots} slots busy here"}

    # -- heartbeat ------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.heartbeat_s)
            await self._beat()

    async def _beat(self) -> None:
        s = self._settings
        try:
            if self._up_since is None:  # (re)connected: look at everything again
                sent = time.monotonic()
                now = await self._nodes.heartbeat(s.slots)
                self._clock.sync(now, sent, time.monotonic())
                if self._after_reconnect is not None:
                    await self._after_reconnect()
                self._up_since = time.monotonic()
                self._changed()
                self.wake()
            # After a reconnect the other nodes get a lease to renew theirs before anything
            # of theirs is taken for lost.
            reap = time.monotonic() - self._up_since >= s.lease_s
            sent = time.monotonic()
            beat = await self._db.write(_beat, s.node_id, s.project, s.slots, self._host, os.getpid(), s.lease_s,
                                        sorted(self._held), sorted(self._held - self._cancelling), reap)
            self._clock.sync(beat.now_ms, sent, time.monotonic())
            self._cancel_asked(beat.cancels)
            for run in beat.reaped:  # said by the node that recorded it, once
                level, line = run_finished(run)
                self._notices.say(log, run.task_id, level, line, run.status)
            self._alive = beat.alive
        except ToolError:
            self._up_since = None

    async def _apply_cancels(self) -> None:
        self._cancel_asked(await self._claims.cancel_requests(sorted(self._held - self._cancelling)))

    def _cancel_asked(self, asked: dict[str, str]) -> None:
        for run_id, reason in asked.items():
            if run_id in self._cancelling:
                continue
            self._cancelling.add(run_id)
            self._background.spawn(self._cancel_local(run_id, reason), f"cancel-{run_id}")

    async def _cancel_local(self, run_id: str, reason: str) -> None:
        try:
            await self._local.cancel(self._settings.project, run_id, reason)
        except ToolError:
            pass
        finally:
            self._cancelling.discard(run_id)

    # -- claims ---------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        """Claims when woken, and polls: every `poll_s` since a claim (of this loop, an
        admission or a completion) last found fewer claimable runs than it could take; a
        claim that did is as good as a poll."""
        looked = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, max(looked, self._drained_at) + self._settings.poll_s
                                               - time.monotonic())):
                    await self._wake.wait()
            if not self._wake.is_set() and self._drained_at + self._settings.poll_s > time.monotonic():
                continue  # a claim found the queue drained while this waited: no poll due yet
            self._wake.clear()
            looked = time.monotonic()
            await self._claim_some()

    def _free(self) -> int:
        """Slots to claim into. A slot whose run's completion is being written counts as
        free: a run claimed into it waits in the runner's queue only for that commit (at
        most one a slot waits so, when that completion claims too), and the admission that
        claims it needs no claim of its own after."""
        return self._settings.slots - len(self._held) - self._reserved + len(self._ending)

    def reserve(self, finishing: str | None = None) -> int:
        """A free slot for a transaction to claim into (1), or none (0); `adopt` ends it.
        `finishing`: a run this node holds whose completion is that transaction: its slot
        is the one (held until then, not counted twice)."""
        if not self._claiming:
            return 0
        if finishing is not None and finishing in self._held:
            if finishing in self._ending:
                return 0
            self._ending.add(finishing)
            return 1
        if self._free() <= 0:
            return 0
        self._reserved += 1
        return 1

    def adopt(self, runs: list[Run], reserved: int, finished: str | None = None, wake: bool = True,
              claimed: bool = True, ending: str | None = None) -> None:
        """The runs a transaction (an admission, a completion) claimed, and the end of its
        reservation (`claimed`: its claim committed). `finished`: the run whose completion
        committed with the claim: no longer held, and its end needs no claim of its own:
        its slot took the oldest claimable run, or the queue was empty then (a run queued
        later wakes the loop: its admission here, or its hint). Runs queued while every
        slot was busy are taken by completions, one a slot; another node's, by the poll
        when its hint was lost.
        `wake`: whether a reservation that claimed nothing has the claim loop look again.
        `ending`: the run whose slot the reservation was (`reserve(finishing)`)."""
        if ending is None:
            self._reserved -= reserved
        else:
            self._ending.discard(ending)
        if claimed and len(runs) < reserved:
            self._drained_at = time.monotonic()
        if finished is not None:
            self._held.discard(finished)
            self._settled.add(finished)
        for run in runs:
            self._take(run)
        if not runs and finished is None and wake:
            self.wake()  # the slot it kept may be wanted

    def _take(self, run: Run) -> None:
        self._held.add(run.id)
        self._local.submit(run, self._claims.inputs(run.id))
        self._background.spawn(self._follow(run), f"follow-{run.id}")

    async def _claim_some(self) -> None:
        while self._claiming and (free := self._free()) > 0:
            try:
                runs = await self._claims.claim(free, self._clock.now_ms())
            except ToolError:
                return
            for run in runs:
                self._take(run)
            if len(runs) < free:
                self._drained_at = time.monotonic()
                return

    async def _follow(self, run: Run) -> None:
        """Until the runner has recorded the run: then its slot is free for the next claim."""
        try:
            await self._local.wait(run.project_id, run.id, FOREVER_S)
        except ToolError:
            pass
        finally:
            self._held.discard(run.id)
            self._claims.release(run.id)
            if run.id in self._settled:
                self._settled.discard(run.id)
            else:
                self.wake()

    # -- hints ----------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        attempt = 0
        while True:
            conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
            try:
                conn = await self._db.connect()
                await conn.execute("LISTEN qledge")
                attempt = 0
                self._changed()  # re-poll after every reconnect: hints sent meanwhile are gone
                self._queued()
                self.wake()
                async for note in conn.notifies():
                    if note.payload == "run":
                        self.wake()
                    elif note.payload == "trigger":
                        self._changed()
                    elif note.payload == "notify":
                        self._queued()
                    elif note.payload == "cancel":
                        with contextlib.suppress(ToolError):
                            await self._apply_cancels()
            except (psycopg.Error, OSError) as exc:
                log.debug("hint listener: %s", type(exc).__name__)
            finally:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error, OSError):
                        await conn.close()
            await asyncio.sleep(RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)])
            attempt += 1


class ClusterRunner:
    """RunController (edge.core.ports.runtime) of a cluster node: admitted runs go to the
    cluster (any node with a free slot claims them), and cancel and wait work on runs held
    by any node."""

    def __init__(self, local: RunController, node: Node, admission: RunAdmission, runs: RunStore,
                 claims: RunClaims, clock: Clock, settings: NodeSettings, notices: Notices,
                 agents: AgentRuns | None = None) -> None:
        self._local = local
        self._notices = notices
        self._agents = agents  # an AI run cancelled before any node took it still gets its record
        self._node = node
        self._runs = runs
        self._claims = claims
        self._clock = clock
        self._settings = settings
        self._starts = ManualStart(self, admission, clock, notices, Background(log), log)

    def submit(self, run: Run, inputs: RunInputs | None = None) -> None:
        if not self._node.holds(run.id):  # claimed by its admission here, or not yet:
            self._node.wake()  # queued in PostgreSQL already: whichever node has a slot claims it

    async def start(self, task: Task | TaskRef, actor: ActorType) -> Run:
        return await self._starts.start(task, actor)

    async def cancel(self, project: str, run_id: str, reason: str) -> Run:
        for _ in range(8):
            if self._node.holds(run_id):
                return await self._local.cancel(project, run_id, reason)
            run = await self._runs.get(project, run_id)
            if run is None:
                raise not_found(f"run {run_id} not found")
            if run.terminal:
                raise conflict(f"run {run_id} already finished ({run.status})")
            if await self._claims.request_cancel(project, run_id, reason):
                return await self._until_finished(project, run, self._settings.cancel_wait_s)
            try:  # queued and claimed by nobody: cancelled here (a claim meanwhile moves its version)
                now = self._clock.now_ms()
                cancelled = await self._runs.transition(
                    run.id, run.version, "cancelled", now, "user",
                    RunUpdate(finished_at_ms=now, error_summary=f"cancelled: {reason}"), reason)
            except ToolError as exc:
                if exc.code != "conflict":
                    raise
                continue
            level, line = run_finished(cancelled, reason)
            self._notices.say(log, cancelled.task_id, level, line, cancelled.status)
            if self._agents is not None:
                await self._agents.ended(cancelled, None)
            return cancelled
        raise conflict(f"run {run_id} kept changing; try again")

    async def wait(self, project: str, run_id: str, timeout_s: float) -> Run | None:
        if self._node.holds(run_id):
            return await self._local.wait(project, run_id, timeout_s)
        run = await self._runs.get(project, run_id)
        if run is None or run.terminal:
            return run
        return await self._until_finished(project, run, timeout_s)

    async def output_mark(self, project: str, run_id: str, seen: int | None, timeout_s: float) -> int | None:
        """The local runner's, for a run this node executes; None for one another node holds
        (its log is readable here once it has finished: a follower reads on until then)."""
        if self._node.holds(run_id):
            return await self._local.output_mark(project, run_id, seen, timeout_s)
        return None

    def disk_shortfall(self) -> str | None:
        """This node's: a start asked of it is refused as on a single device when its own
        state directory (where the run's log would be written, were it to claim the run)
        lacks the reserve; a node with room can be asked instead. Runs it does claim are
        checked again by its runner, as everywhere."""
        return self._local.disk_shortfall()

    async def _until_finished(self, project: str, run: Run, timeout_s: float) -> Run:
        deadline = time.monotonic() + timeout_s
        latest: Run | None = run
        while latest is not None and not latest.terminal and time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_RUN_S, max(0.0, deadline - time.monotonic())))
            latest = await self._runs.get(project, run.id) or latest
        return latest or run
