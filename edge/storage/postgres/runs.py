"""Runs, their events, retention, fenced completion, claims and leases, and run logs on
PostgreSQL.

A run is claimed by one node (`node_id`, a fresh `fence`, `lease_until` on PostgreSQL's
clock) and stays `queued` until its process starts. The node that claimed it must present
that fence on every later transition: when another node has meanwhile recorded it `lost`
(the lease expired), the transition changes nothing, a `run.fence_refused` event records
what was refused, and the caller gets `conflict`. Nothing is ever re-run.

A run only one node may run (`for_node`: the fire of that node's `@reboot`) is claimable by
that node alone, and holds a lease from its admission: a node that never takes it (it died,
or was stopped longer than a lease) leaves it `lost` like a run it held.

A finished run's log goes into `run_logs` in the transaction that finishes it, so every
node can read it; the local file is removed after the commit.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from edge.core.errors import ToolError, conflict, not_found
from edge.core.ports.stores import LogRange, RunLogFiles
from edge.core.reads import SEARCH_BUDGET
from edge.core.runs import (
    ACTIVE,
    TERMINAL,
    UNSUCCESSFUL,
    ActorType,
    Run,
    RunCursor,
    RunEvent,
    RunProcess,
    RunQuery,
    RunSearch,
    RunStatus,
    RunUpdate,
    check_transition,
    event_type,
)
from edge.storage.postgres.db import PgDatabase, Row, Tx

log = logging.getLogger("qledge.cluster")

COLUMNS = (
    "id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,"
    " trigger_id, trigger_revision, queued_at_ms, started_at_ms, finished_at_ms, scheduled_for_ms,"
    " exit_code, error_code, error_summary, log_bytes, log_truncated, idempotency_key, jitter_ms,"
    " log_dropped_at_ms"
)
FIELDS = [c.strip() for c in COLUMNS.split(",")]
PREFIXED = ", ".join(f"r.{f}" for f in FIELDS)
BATCH = 64
_FINISHED = "status IN ('cancelled', 'failed', 'lost', 'succeeded', 'timed_out')"
NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# A run recorded lost here rather than by its runner (its node's lease expired): the record
# of an AI run that had started ends with it (edge.storage.postgres.evidence; none: nothing).
SQL_EVIDENCE_LOST = (
    "UPDATE agent_evidence SET state = 'lost', error_code = %s, error = left(%s, 500),"
    " position_after = pg_snapshot_xmax(pg_current_snapshot())::text::bigint, finished_at_ms = %s"
    " WHERE run_id = %s AND state = 'running'"
)

SQL_GET = f"SELECT {COLUMNS} FROM runs WHERE id = %s AND project_id = %s"
SQL_PAGE_PROJECT = (
    f"SELECT {COLUMNS} FROM runs WHERE project_id = %s{{after}} ORDER BY created_at_ms DESC, id DESC LIMIT %s"
)
SQL_PAGE_TASK = (
    f"SELECT {COLUMNS} FROM runs WHERE project_id = %s AND task_id = %s{{after}}"
    " ORDER BY created_at_ms DESC, id DESC LIMIT %s"
)
AFTER = " AND (created_at_ms, id) < (%s, %s)"
SQL_EVENTS = (
    "SELECT e.run_id, e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail FROM run_events AS e"
    " JOIN runs AS r ON r.id = e.run_id"
    " WHERE e.run_id = %s AND r.project_id = %s AND e.sequence > %s ORDER BY e.sequence LIMIT %s"
)
SQL_LOCK = "SELECT project_id, task_id, status, version, event_seq, node_id, fence FROM runs WHERE id = %s FOR UPDATE"
SQL_EVENT = (
    "INSERT INTO run_events (run_id, sequence, type, actor_type, created_at_ms, detail) VALUES (%s, %s, %s, %s, %s, %s)"
)
# The claim: the oldest claimable runs of the project, skipping rows other nodes are
# claiming right now, one statement (runs_claimable_idx).
SQL_CLAIM = f"""
WITH picked AS (
    SELECT id FROM runs
    WHERE project_id = %s AND status = 'queued' AND node_id IS NULL AND coalesce(not_before_ms, 0) <= {NOW_MS}
        AND (for_node IS NULL OR for_node = %s)
    ORDER BY created_at_ms, id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE runs AS r SET node_id = %s, fence = nextval('run_fence'), lease_until = now() + make_interval(secs => %s),
    version = r.version + 1, event_seq = r.event_seq + 1
FROM picked WHERE r.id = picked.id
RETURNING {PREFIXED}, r.fence
"""
SQL_RENEW = """
UPDATE runs SET lease_until = now() + make_interval(secs => %s)
WHERE node_id = %s AND id = ANY(%s) AND status IN ('queued', 'running') AND lease_until > now()
RETURNING id
"""
# Claimed runs and runs for one node it has not claimed yet: both hold a lease.
SQL_EXPIRED = """
SELECT id, coalesce(node_id, for_node), status, node_id IS NULL, event_seq FROM runs
WHERE status IN ('queued', 'running') AND lease_until < now()
ORDER BY lease_until LIMIT %s FOR UPDATE SKIP LOCKED
"""
# A node's runs of a boot that is over: queued for it, never taken.
SQL_UNTAKEN = (
    "SELECT id, event_seq FROM runs WHERE project_id = %s AND for_node = %s AND status = 'queued'"
    " AND node_id IS NULL FOR UPDATE"
)
SQL_EXCESS = (
    f"SELECT id FROM runs WHERE project_id = %s AND task_id = %s AND {_FINISHED}"
    " ORDER BY created_at_ms DESC, id DESC LIMIT %s OFFSET %s"
)
SQL_EXPIRED_RUNS = (
    f"SELECT id FROM runs WHERE project_id = %s AND created_at_ms < %s AND {_FINISHED}"
    " ORDER BY created_at_ms, id LIMIT %s"
)
SQL_LOGGED = (
    f"SELECT id, log_bytes FROM runs WHERE project_id = %s AND log_bytes > 0 AND log_dropped_at_ms IS NULL"
    f" AND {_FINISHED} ORDER BY created_at_ms, id LIMIT %s"
)


class Policy(msgspec.Struct, frozen=True):
    runs_per_task: int = 100
    max_age_ms: int = 30 * 86_400_000
    log_quota_bytes: int = 32 << 20


def to_run(row: Row) -> Run:
    return Run(**dict(zip(FIELDS, row, strict=True)))


async def get_run(tx: Tx, project: str, run_id: str) -> Run | None:
    row = await tx.row(SQL_GET, (run_id, project))
    return to_run(row) if row else None


async def insert_run(
    tx: Tx, run: Run, actor: ActorType, forbid: bool = False, not_before_ms: int | None = None,
    for_node: str | None = None, lease_s: float = 0.0,
) -> bool:
    """Insert a queued run with its first event; False when its idempotency key (or the
    one active run a `forbid` task may have) already exists. With `for_node` only that
    node may claim it, within `lease_s` of when it may start."""
    values = [getattr(run, f) for f in FIELDS]
    values[FIELDS.index("event_seq")] = 1
    lease = (
        "greatest(now(), to_timestamp(%s / 1000.0)) + make_interval(secs => %s)" if for_node is not None else "%s"
    )
    lease_params = (not_before_ms or 0, lease_s) if for_node is not None else (None,)
    added = await tx.execute(
        f"INSERT INTO runs ({COLUMNS}, forbid, not_before_ms, for_node, lease_until)"
        f" VALUES ({', '.join(['%s'] * (len(FIELDS) + 3))}, {lease}) ON CONFLICT DO NOTHING",
        (*values, forbid, not_before_ms, for_node, *lease_params))
    if not added:
        return False
    await tx.execute(SQL_EVENT, (run.id, 1, event_type(run.status), actor, run.created_at_ms, None))
    return True


async def _create(tx: Tx, run: Run, actor: ActorType) -> Run:
    if not await insert_run(tx, run, actor):
        raise conflict(f"run {run.idempotency_key or run.id} already exists")
    await tx.notify("run")
    created = await get_run(tx, run.project_id, run.id)
    assert created is not None
    return created


class Fenced(msgspec.Struct, frozen=True):
    """A transition refused because the claim it came from is no longer the run's."""

    message: str


async def _apply(
    tx: Tx, run_id: str, current: RunStatus, seq: int, status: RunStatus, now: int, actor: ActorType,
    update: RunUpdate, detail: str | None,
) -> None:
    """One checked transition of the locked row at event `seq`: its columns and its event."""
    check_transition(current, status)
    sets = ["status = %s", "version = version + 1", "event_seq = event_seq + 1"]
    params: list[object] = [status]
    for field in update.__struct_fields__:
        value = getattr(update, field)
        if value is not None:
            sets.append(f"{field} = %s")
            params.append(value)
    if status in TERMINAL:
        sets.append("cancel_reason = NULL")
    await tx.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = %s", (*params, run_id))
    await tx.execute(SQL_EVENT, (run_id, seq + 1, event_type(status), actor, now, detail))


async def _transition(
    tx: Tx, run_id: str, expected: int, status: RunStatus, now: int, actor: ActorType, update: RunUpdate,
    detail: str | None, policy: Policy, claim: tuple[str, int] | None, log_data: bytes | None,
    started: RunUpdate | None = None,
) -> tuple[Run, list[str]] | Fenced:
    row = await tx.row(SQL_LOCK, (run_id,))
    if row is None:
        raise not_found(f"run {run_id} not found")
    project, task_id, current, version, seq, node, fence = row
    if claim is not None and ((node, fence) != claim or current not in ACTIVE):
        message = (f"node {claim[0]} (fence {claim[1]}) tried to record {status}; the run is {current}"
                   f"{'' if node == claim[0] else f', claimed by {node}'}: refused")
        await tx.execute("UPDATE runs SET event_seq = event_seq + 1 WHERE id = %s", (run_id,))
        await tx.execute(SQL_EVENT, (run_id, seq + 1, "run.fence_refused", actor, now, message[:500]))
        return Fenced(message)
    if version != expected:
        raise conflict(f"run {run_id} changed (version {version}, expected {expected})")
    if started is not None:  # the start the runner did not record yet, first (as on SQLite)
        at = started.started_at_ms if started.started_at_ms is not None else now
        await _apply(tx, run_id, current, seq, "running", at, "runner", started, None)
        current, seq = "running", seq + 1
    await _apply(tx, run_id, current, seq, status, now, actor, update, detail)
    removed: list[str] = []
    if status in TERMINAL:
        if log_data:
            await tx.execute("INSERT INTO run_logs (run_id, data) VALUES (%s, %s)"
                             " ON CONFLICT (run_id) DO UPDATE SET data = excluded.data", (run_id, log_data))
        removed = await enforce(tx, project, task_id, now, policy)
    updated = await get_run(tx, project, run_id)
    assert updated is not None
    return updated, removed


async def enforce(tx: Tx, project: str, task_id: str, now: int, policy: Policy) -> list[str]:
    """Retention, a bounded step, inside the transaction that finished a run (as on SQLite)."""
    removed = [r for (r,) in await tx.rows(SQL_EXCESS, (project, task_id, BATCH, policy.runs_per_task))]
    if len(removed) < BATCH:
        seen = set(removed)
        expired = await tx.rows(SQL_EXPIRED_RUNS, (project, now - policy.max_age_ms, BATCH - len(removed)))
        removed += [r for (r,) in expired if r not in seen]
    if removed:
        await tx.execute("DELETE FROM runs WHERE id = ANY(%s)", (removed,))
    budget = BATCH - len(removed)
    total = await tx.row("SELECT value FROM meta WHERE key = %s", (f"run_log_bytes:{project}",))
    excess = (int(total[0]) if total else 0) - policy.log_quota_bytes
    if excess > 0 and budget > 0:
        freed = 0
        for rid, size in await tx.rows(SQL_LOGGED, (project, budget)):
            if freed >= excess:
                break
            (seq,) = await tx.one(
                "UPDATE runs SET log_dropped_at_ms = %s, version = version + 1, event_seq = event_seq + 1"
                " WHERE id = %s RETURNING event_seq", (now, rid))
            await tx.execute(SQL_EVENT, (rid, seq, "run.log_dropped", "system", now, "log quota"))
            await tx.execute("DELETE FROM run_logs WHERE run_id = %s", (rid,))
            freed += size
            removed.append(rid)
    return removed


async def _page(tx: Tx, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
    cursor = (after.created_at_ms, after.run_id) if after else ()
    where = AFTER if after else ""
    if task_id is None:
        rows = await tx.rows(SQL_PAGE_PROJECT.format(after=where), (project, *cursor, limit))
    else:
        rows = await tx.rows(SQL_PAGE_TASK.format(after=where), (project, task_id, *cursor, limit))
    return [to_run(r) for r in rows]


# -- search: filtered pages, one index each, a bounded walk per page (as on SQLite) ----

# The partial indexes of schema version 4 are used when the query repeats their predicate:
# hence these literal terms.
_UNSUCCESSFUL_TERM = "status IN ({})".format(", ".join(f"'{s}'" for s in UNSUCCESSFUL))
_ACTIVE_TERM = "status IN ('queued', 'running')"
_UNSCHEDULED_TERM = "origin <> 'scheduled'"
_BEFORE_EVERY_RUN = RunCursor(1 << 62, "\U0010ffff")  # ahead of every (created_at_ms, id) in DESC order
SQL_SEARCH_RUNS = f"SELECT {COLUMNS} FROM runs WHERE project_id = %s AND id = ANY(%s)"


def _active_only(query: RunQuery) -> bool:
    return bool(query.statuses) and set(query.statuses) <= ACTIVE


def scan_sql(query: RunQuery) -> str:
    """The key walk of one search page: the terms that pick the index (what they do not
    decide, search checks on each entry) and the cursor bound."""
    terms = "" if query.task_id is None else " AND task_id = %s"
    since = "" if query.since_ms is None else " AND created_at_ms >= %s"
    if _active_only(query):
        # Queued and running runs are few (the admission bound): all of them, from their own
        # index, ordered here rather than walked in order.
        return (f"SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = %s{terms} AND {_ACTIVE_TERM}"
                f" AND (created_at_ms, id) < (%s, %s){since}")
    statuses = set(query.statuses)
    if statuses and statuses <= set(UNSUCCESSFUL):
        terms += f" AND {_UNSUCCESSFUL_TERM}"  # runs_unsuccessful_idx, runs_task_unsuccessful_idx
    elif query.task_id is None and query.origins and "scheduled" not in query.origins:
        terms += f" AND {_UNSCHEDULED_TERM}"  # runs_unscheduled_idx
    return (f"SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = %s{terms}"
            f" AND (created_at_ms, id) < (%s, %s){since} ORDER BY created_at_ms DESC, id DESC LIMIT %s")


def scan_params(project: str, query: RunQuery, after: RunCursor | None, budget: int) -> tuple[object, ...]:
    bound = after or _BEFORE_EVERY_RUN
    if query.until_ms is not None and (query.until_ms, "") < (bound.created_at_ms, bound.run_id):
        bound = RunCursor(query.until_ms, "")  # created before `until`: ahead of every id at that ms
    params: list[object] = [project]
    if query.task_id is not None:
        params.append(query.task_id)
    params += [bound.created_at_ms, bound.run_id]
    if query.since_ms is not None:
        params.append(query.since_ms)
    return tuple(params) if _active_only(query) else (*params, budget)


async def _search(
    tx: Tx, project: str, query: RunQuery, after: RunCursor | None, limit: int, budget: int = SEARCH_BUDGET,
) -> RunSearch:
    statuses, origins = set(query.statuses), set(query.origins)
    entries = await tx.rows(scan_sql(query), scan_params(project, query, after, budget))
    if _active_only(query):
        entries.sort(key=lambda e: (e[1], e[0]), reverse=True)
    hits: list[RunCursor] = []
    last: RunCursor | None = None
    for rid, created, status, origin in entries:
        last = RunCursor(created, rid)
        if (not statuses or status in statuses) and (not origins or origin in origins):
            hits.append(last)
            if len(hits) > limit:
                break
    nxt: RunCursor | None = None
    if len(hits) > limit:
        hits = hits[:limit]
        nxt = hits[-1]
    elif len(entries) == budget and not _active_only(query):
        nxt = last  # more entries than one page may look at: go on from here
    found = {r.id: r for r in map(to_run, await tx.rows(SQL_SEARCH_RUNS, (project, [h.run_id for h in hits])))}
    return RunSearch(runs=[found[h.run_id] for h in hits if h.run_id in found], next=nxt)


# A range of the primary key (its C collation orders ids byte by byte, as SQLite does).
SQL_PREFIX = "SELECT id FROM runs WHERE id >= %s AND id < %s AND project_id = %s ORDER BY id LIMIT %s"


async def _with_prefix(tx: Tx, project: str, prefix: str, limit: int) -> list[str]:
    if not prefix:
        return []
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string after every one with the prefix
    return [rid for (rid,) in await tx.rows(SQL_PREFIX, (prefix, upper, project, limit))]


async def _active(tx: Tx) -> list[Run]:
    return [to_run(r) for r in await tx.rows(f"SELECT {COLUMNS} FROM runs WHERE status IN ('queued', 'running')")]


async def _node_active(tx: Tx, node: str) -> list[tuple[Run, RunProcess]]:
    rows = await tx.rows(
        f"SELECT {COLUMNS}, pid, pid_start_ticks FROM runs WHERE node_id = %s AND status IN ('queued', 'running')",
        (node,))
    return [(to_run(r[:-2]), RunProcess(pid=r[-2], start_ticks=r[-1])) for r in rows]


async def _events(tx: Tx, project: str, run_id: str, after: int, limit: int) -> list[RunEvent]:
    return [RunEvent(run_id=r[0], sequence=r[1], type=r[2], actor_type=r[3], created_at_ms=r[4], detail=r[5])
            for r in await tx.rows(SQL_EVENTS, (run_id, project, after, limit))]


class Fences:
    """The claims this node holds: run id → fence. Shared by the claim and the run store."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}


class PgRunStore:
    """RunStore (edge.core.ports.stores) on PostgreSQL, for one node. Transitions of runs
    this node claimed are fenced; a lost connection is retried for `retry_s` (every
    transition is a compare-and-set, so a repeat cannot apply twice)."""

    def __init__(self, db: PgDatabase, policy: Policy, files: RunLogFiles, node: str, fences: Fences,
                 retry_s: float = 0.0) -> None:
        self._db = db
        self._policy = policy
        self._files = files
        self._node = node
        self._fences = fences
        self._retry_s = retry_s

    async def create(self, run: Run, actor: ActorType) -> Run:
        return await self._db.tx(_create, run, actor)

    async def transition(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int,
        actor: ActorType, update: RunUpdate, detail: str | None = None, started: RunUpdate | None = None,
    ) -> Run:
        fence = self._fences.held.get(run_id)
        claim = (self._node, fence) if fence is not None else None
        data = None
        if status in TERMINAL and update.log_bytes:
            try:
                found = await asyncio.to_thread(self._files.read, run_id, 0, update.log_bytes)
            except ToolError:  # not a log of ours in its place (a link a task planted): not copied, the run is
                found = None  # still recorded, and the log tools keep answering unavailable for it
            data = found.data if found is not None else None
        result = await self._db.tx(_transition, run_id, expected_version, status, now_ms, actor, update, detail,
                                   self._policy, claim, data, started, retry_s=self._retry_s)
        if isinstance(result, Fenced):
            self._fences.held.pop(run_id, None)
            log.warning("run %s: %s", run_id, result.message)
            raise conflict(result.message)
        run, removed = result
        if run.terminal:
            self._fences.held.pop(run_id, None)
            self._files.remove([*removed, run_id] if data is not None else removed)
        return run

    async def get(self, project: str, run_id: str) -> Run | None:
        return await self._db.tx(get_run, project, run_id)

    async def page(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
        return await self._db.tx(_page, project, task_id, after, limit)

    async def search(self, project: str, query: RunQuery, after: RunCursor | None, limit: int) -> RunSearch:
        return await self._db.tx(_search, project, query, after, limit)

    async def with_prefix(self, project: str, prefix: str, limit: int) -> list[str]:
        return await self._db.tx(_with_prefix, project, prefix, limit)

    async def active(self) -> list[Run]:
        return await self._db.tx(_active)

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        """The active runs this node claimed: what a previous life of this node left."""
        return await self._db.tx(_node_active, self._node)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]:
        return await self._db.tx(_events, project, run_id, after_sequence, limit)


# -- claims and leases (RunClaims, edge.core.ports.cluster) ---------------------------


async def _claim(tx: Tx, project: str, node: str, limit: int, lease_s: float, now: int) -> list[tuple[Run, int]]:
    claimed = []
    for row in await tx.rows(SQL_CLAIM, (project, node, limit, node, lease_s)):
        run, fence = to_run(row[:-1]), int(row[-1])
        await tx.execute(SQL_EVENT, (run.id, run.event_seq, "run.claimed", "runner", now, f"node {node}"))
        claimed.append((run, fence))
    return claimed


async def _lose(tx: Tx, run_id: str, seq: int, code: str, summary: str, detail: str) -> Run:
    (now,) = await tx.one(f"SELECT {NOW_MS}")
    lost = await tx.one(
        "UPDATE runs SET status = 'lost', version = version + 1, event_seq = event_seq + 1, finished_at_ms = %s,"
        f" error_code = %s, error_summary = %s, cancel_reason = NULL WHERE id = %s RETURNING {COLUMNS}",
        (now, code, summary, run_id))
    await tx.execute(SQL_EVENT, (run_id, seq + 1, "run.lost", "system", now, detail))
    await tx.execute(SQL_EVIDENCE_LOST, (code, summary, now, run_id))
    return to_run(lost)


async def _reap(tx: Tx, limit: int) -> list[Run]:
    reaped = []
    for rid, node, status, untaken, seq in await tx.rows(SQL_EXPIRED, (limit,)):
        if untaken:
            summary = f"only node {node} may run this run and it did not take it within its lease; it is not run"
        else:
            summary = f"node {node} stopped renewing its lease while this run was {status}; it is not run again"
        reaped.append(await _lose(tx, rid, seq, "lease_expired", summary, f"lease of node {node} expired"))
    return reaped


async def lose_untaken(tx: Tx, project: str, node: str) -> list[Run]:
    """The runs queued for `node` alone that it never took, recorded `lost`: called when
    the node starts in a new boot, since they belong to a boot that is over."""
    lost = []
    for rid, seq in await tx.rows(SQL_UNTAKEN, (project, node)):
        lost.append(await _lose(tx, rid, seq, "node_rebooted",
                                f"node {node} booted again before it took this run; it is not run",
                                f"node {node} booted again"))
    return lost


async def _ask_cancel(tx: Tx, project: str, run_id: str, reason: str) -> bool:
    # Only a run some node holds is asked: one that no node took is cancelled by the caller
    # at once (a compare-and-set that a claim meanwhile makes fail), not left to wait for a slot.
    asked = await tx.execute(
        "UPDATE runs SET cancel_reason = %s WHERE id = %s AND project_id = %s AND status IN ('queued', 'running')"
        " AND node_id IS NOT NULL",
        (reason, run_id, project))
    if asked:
        await tx.notify("cancel")
    return asked > 0


class PgClaims:
    """RunClaims (edge.core.ports.cluster) for one node."""

    def __init__(self, db: PgDatabase, project: str, node: str, fences: Fences, lease_s: float) -> None:
        self._db = db
        self._project = project
        self._node = node
        self._fences = fences
        self._lease_s = lease_s

    async def claim(self, limit: int, now_ms: int) -> list[Run]:
        if limit <= 0:
            return []
        claimed = await self._db.tx(_claim, self._project, self._node, limit, self._lease_s, now_ms)
        for run, fence in claimed:
            self._fences.held[run.id] = fence
        return [run for run, _ in claimed]

    async def renew(self, run_ids: list[str]) -> list[str]:
        if not run_ids:
            return []
        return [r for (r,) in await self._db.tx(_rows, SQL_RENEW, (self._lease_s, self._node, run_ids))]

    async def reap(self) -> list[Run]:
        return await self._db.tx(_reap, BATCH)

    async def request_cancel(self, project: str, run_id: str, reason: str) -> bool:
        return await self._db.tx(_ask_cancel, project, run_id, reason)

    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        if not run_ids:
            return {}
        rows = await self._db.tx(_rows, "SELECT id, cancel_reason FROM runs WHERE id = ANY(%s)"
                                        " AND cancel_reason IS NOT NULL AND status IN ('queued', 'running')",
                                 (run_ids,))
        return {rid: reason for rid, reason in rows}

    def release(self, run_id: str) -> None:
        self._fences.held.pop(run_id, None)


async def _rows(tx: Tx, query: str, params: tuple[object, ...]) -> list[Row]:
    return await tx.rows(query, params)


# -- run logs (RunLogReader, edge.core.ports.stores) ---------------------------------


async def _log_range(tx: Tx, run_id: str, offset: int, length: int) -> Row | None:
    return await tx.row("SELECT substring(data FROM %s FOR %s), octet_length(data) FROM run_logs WHERE run_id = %s",
                        (offset + 1, length, run_id))


async def _log_tail(tx: Tx, run_id: str, size: int) -> Row | None:
    return await tx.row(
        "SELECT substring(data FROM greatest(octet_length(data) - %s, 0) + 1), octet_length(data) FROM run_logs"
        " WHERE run_id = %s", (size, run_id))


class PgRunLogReader:
    """Logs readable from every node: this node's file while its run is running (or was
    never uploaded), else the copy in `run_logs` that its node stored when it finished."""

    def __init__(self, db: PgDatabase, files: RunLogFiles) -> None:
        self._db = db
        self._files = files

    async def read(self, run_id: str, offset: int, length: int) -> LogRange | None:
        local = self._files.read(run_id, offset, length)
        if local is not None:
            return local
        row = await self._db.tx(_log_range, run_id, offset, length)
        return LogRange(data=bytes(row[0]), start=offset, total=int(row[1])) if row else None

    async def tail(self, run_id: str, size: int) -> LogRange | None:
        local = self._files.tail(run_id, size)
        if local is not None:
            return local
        row = await self._db.tx(_log_tail, run_id, size)
        if row is None:
            return None
        data, total = bytes(row[0]), int(row[1])
        return LogRange(data=data, start=total - len(data), total=total)
