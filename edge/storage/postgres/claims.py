"""Claims and leases of a cluster's runs (RunClaims, edge.core.ports.cluster), and the run
logs every node can read (RunLogReader).

A run is claimed by one node (`node_id`, a fresh `fence`, `lease_until` on PostgreSQL's
clock) and stays `queued` until its process starts; the node presents that fence on every
later transition (edge.storage.runs). A run only one node may run (`for_node`: the fire of
that node's `@reboot`) is claimable by that node alone, and holds a lease from its
admission: a node that never takes it (it died, or was stopped longer than a lease) leaves
it `lost` like a run it held. Nothing is ever re-run.
"""

from __future__ import annotations

import msgspec

from edge.core.ports.runtime import RunInputs
from edge.core.ports.stores import LogRange, RunLogFiles
from edge.core.runs import Run
from edge.storage.catalog import get_task
from edge.storage.postgres.db import PgDatabase
from edge.storage.postgres.sql import CATALOG, RUNS, SECURITY
from edge.storage.runs import COLUMNS, FIELDS, Fences, queue_run, to_run
from edge.storage.security import secret_values
from edge.storage.tx import Row, Tx

BATCH = 64
NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
PREFIXED = ", ".join(f"r.{f}" for f in FIELDS)
# A run recorded lost here rather than by its runner (its node's lease expired): the record
# of an AI run that had started ends with it (edge.storage.postgres.evidence; none: nothing).
SQL_EVIDENCE_LOST = (
    "UPDATE agent_evidence SET state = 'lost', error_code = %s, error = left(%s, 500),"
    " position_after = pg_snapshot_xmax(pg_current_snapshot())::text::bigint, finished_at_ms = %s"
    " WHERE run_id = %s AND state = 'running'"
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
SQL_LOSE = (
    "UPDATE runs SET status = 'lost', version = version + 1, event_seq = event_seq + 1, finished_at_ms = %s,"
    f" error_code = %s, error_summary = %s, cancel_reason = NULL WHERE id = %s RETURNING {COLUMNS}"
)
# Only a run some node holds is asked: one that no node took is cancelled by the caller at
# once (a compare-and-set that a claim meanwhile makes fail), not left to wait for a slot.
SQL_ASK_CANCEL = (
    "UPDATE runs SET cancel_reason = %s WHERE id = %s AND project_id = %s AND status IN ('queued', 'running')"
    " AND node_id IS NOT NULL"
)
SQL_CANCEL_REQUESTS = (
    "SELECT id, cancel_reason FROM runs WHERE id = ANY(%s) AND cancel_reason IS NOT NULL"
    " AND status IN ('queued', 'running')"
)


class Claimed(msgspec.Struct, frozen=True):
    """A run this node claimed, its fence, and what its runner reads before it starts it
    (read in the claiming transaction: no transaction of their own per run)."""

    run: Run
    fence: int
    inputs: RunInputs


def claim_runs(tx: Tx, project: str, node: str, limit: int, lease_s: float, now: int) -> list[Claimed]:
    """The claim (RunClaims.claim) as a step of a transaction: of its own, or an
    admission's (the node that admits a run and has a free slot claims in the same
    transaction)."""
    claimed: list[Claimed] = []
    rows = tx.rows(SQL_CLAIM, (project, node, limit, node, lease_s))
    if not rows:
        return claimed
    # Read at the claim, not at the start a moment later: a secret set in between is
    # redacted from the next run on.
    values = secret_values(tx, SECURITY, project)
    for row in rows:
        run, fence = to_run(row[:-1]), int(row[-1])
        tx.execute(RUNS.event_insert, (run.id, run.event_seq, "run.claimed", "runner", now, f"node {node}"))
        task = get_task(tx, CATALOG, run.project_id, run.task_id, run.task_revision)
        claimed.append(Claimed(run, fence, RunInputs(task, values)))
    return claimed


def _lose(tx: Tx, run_id: str, seq: int, code: str, summary: str, detail: str) -> Run:
    (now,) = tx.one(f"SELECT {NOW_MS}")
    lost = to_run(tx.one(SQL_LOSE, (now, code, summary, run_id)))
    tx.execute(RUNS.event_insert, (run_id, seq + 1, "run.lost", "system", now, detail))
    tx.execute(SQL_EVIDENCE_LOST, (code, summary, now, run_id))
    queue_run(tx, RUNS, lost, now, False)  # its task's `lost` rules (the hint wakes every notifier)
    return lost


def reap_expired(tx: Tx, limit: int) -> list[Run]:
    """RunClaims.reap as a step of a transaction (a heartbeat's)."""
    reaped = []
    for rid, node, status, untaken, seq in tx.rows(SQL_EXPIRED, (limit,)):
        if untaken:
            summary = f"only node {node} may run this run and it did not take it within its lease; it is not run"
        else:
            summary = f"node {node} stopped renewing its lease while this run was {status}; it is not run again"
        reaped.append(_lose(tx, rid, seq, "lease_expired", summary, f"lease of node {node} expired"))
    return reaped


def lose_untaken(tx: Tx, project: str, node: str) -> list[Run]:
    """The runs queued for `node` alone that it never took, recorded `lost`: called when
    the node starts in a new boot, since they belong to a boot that is over."""
    return [_lose(tx, rid, seq, "node_rebooted", f"node {node} booted again before it took this run; it is not run",
                  f"node {node} booted again")
            for rid, seq in tx.rows(SQL_UNTAKEN, (project, node))]


def _ask_cancel(tx: Tx, project: str, run_id: str, reason: str) -> bool:
    asked = tx.execute(SQL_ASK_CANCEL, (reason, run_id, project))
    if asked:
        tx.hint("cancel")
    return asked > 0


def _rows(tx: Tx, query: str, params: tuple[object, ...]) -> list[Row]:
    return tx.rows(query, params)


class PgClaims:
    """RunClaims (edge.core.ports.cluster) for one node."""

    def __init__(self, db: PgDatabase, project: str, fences: Fences, lease_s: float) -> None:
        self._db = db
        self._project = project
        self._node = fences.node
        self._fences = fences
        self._lease_s = lease_s
        self._inputs: dict[str, RunInputs] = {}

    async def claim(self, limit: int, now_ms: int) -> list[Run]:
        if limit <= 0:
            return []
        return self.took(await self._db.write(claim_runs, self._project, self._node, limit, self._lease_s, now_ms))

    def took(self, claimed: list[Claimed]) -> list[Run]:
        """Hold what a committed claim took: its fences, and its runs' inputs until the
        node hands the runs to its runner (`inputs`)."""
        for c in claimed:
            self._fences.held[c.run.id] = c.fence
            self._inputs[c.run.id] = c.inputs
        return [c.run for c in claimed]

    def inputs(self, run_id: str) -> RunInputs | None:
        return self._inputs.pop(run_id, None)

    async def renew(self, run_ids: list[str]) -> list[str]:
        if not run_ids:
            return []
        return [r for (r,) in await self._db.write(_rows, SQL_RENEW, (self._lease_s, self._node, run_ids))]

    async def reap(self) -> list[Run]:
        return await self._db.write(reap_expired, BATCH)

    async def request_cancel(self, project: str, run_id: str, reason: str) -> bool:
        return await self._db.write(_ask_cancel, project, run_id, reason)

    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        if not run_ids:
            return {}
        return {rid: reason for rid, reason in await self._db.read(_rows, SQL_CANCEL_REQUESTS, (run_ids,))}

    def release(self, run_id: str) -> None:
        self._fences.held.pop(run_id, None)
        self._inputs.pop(run_id, None)


# -- run logs (RunLogReader, edge.core.ports.stores) ---------------------------------

SQL_LOG_RANGE = "SELECT substring(data FROM %s FOR %s), octet_length(data) FROM run_logs WHERE run_id = %s"
SQL_LOG_TAIL = (
    "SELECT substring(data FROM greatest(octet_length(data) - %s, 0) + 1), octet_length(data) FROM run_logs"
    " WHERE run_id = %s"
)


def _row(tx: Tx, query: str, params: tuple[object, ...]) -> Row | None:
    return tx.row(query, params)


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
        row = await self._db.read(_row, SQL_LOG_RANGE, (offset + 1, length, run_id))
        return LogRange(data=bytes(row[0]), start=offset, total=int(row[1])) if row else None

    async def tail(self, run_id: str, size: int) -> LogRange | None:
        local = self._files.tail(run_id, size)
        if local is not None:
            return local
        row = await self._db.read(_row, SQL_LOG_TAIL, (size, run_id))
        if row is None:
            return None
        data, total = bytes(row[0]), int(row[1])
        return LogRange(data=data, start=total - len(data), total=total)
