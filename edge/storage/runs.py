"""Runs and their events, once for both backends. Implements RunStore (edge.core.ports.stores).

Every status change appends an event in the same transaction. A run that finishes also,
in that transaction: gets its retry's due time when its task retries it, keeps its task's
failing mark and queues the notifications its rules ask for, and applies retention (below);
the logs of the runs retention removed go once it has committed.

Retention is enforced there and nowhere else (no sweeper, no start-up pass): runs per task,
run age, and total log bytes. Each step removes at most BATCH rows or logs, and only of
finished runs, so one write's cost stays bounded and repeated writes converge. Every
query walks an index from the oldest end; the log total is a running sum in `meta` kept
by triggers on `runs` (the schema), never a SUM over `runs`.

On a cluster a run is claimed by one node (edge.storage.postgres.claims) and the node that
claimed it presents the claim's fence on every later transition (`Fences`): when another
node has meanwhile recorded the run `lost` (its lease expired), the transition changes
nothing, a `run.fence_refused` event records what was refused, and the caller gets
`conflict`. A finished run's log is copied into the database there, so that every node
can read it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from types import ModuleType

import msgspec

from edge.core.errors import ToolError, conflict, not_found
from edge.core.ports.stores import RunLogFiles
from edge.core.reads import SEARCH_BUDGET
from edge.core.runs import (
    ACTIVE,
    NOT_RETRIED_CODES,
    RETRIED,
    TERMINAL,
    UNSUCCESSFUL,
    ActorType,
    Followers,
    Run,
    RunCursor,
    RunEvent,
    RunProcess,
    RunQuery,
    RunSearch,
    RunStatus,
    RunUpdate,
    check_transition,
    derived_key,
    event_type,
    retry_delay_ms,
)
from edge.core.tasks import RetryPolicy, run_notices
from edge.storage.tx import Db, Row, Tx

log = logging.getLogger("qledge.store")

COLUMNS = (
    "id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,"
    " trigger_id, trigger_revision, queued_at_ms, started_at_ms, finished_at_ms, scheduled_for_ms,"
    " exit_code, error_code, error_summary, log_bytes, log_truncated, idempotency_key, jitter_ms,"
    " log_dropped_at_ms, retry_of, attempt, retry_due_at_ms"
)
FIELDS = [c.strip() for c in COLUMNS.split(",")]
# SQLite evaluates `x IN (…)` of three or more constants through a temporary B-tree it builds
# at every execution of the statement (an 87 KB page-cache allocation and ~6 us each time);
# two constants, or equalities joined by OR, are plain comparisons. A run is finished when it
# is not active (core.runs: every status is one or the other).
FINISHED = f"status NOT IN ({', '.join(repr(s) for s in sorted(ACTIVE))})"
# The unsuccessful runs' partial indexes: a query uses one only when it repeats its WHERE term
# exactly. SQLite's spell it as equalities (see above; every update of a run evaluates them).
UNSUCCESSFUL_IN = "status IN ({})".format(", ".join(f"'{s}'" for s in UNSUCCESSFUL))
UNSUCCESSFUL_OR = "({})".format(" OR ".join(f"status = '{s}'" for s in UNSUCCESSFUL))
BEFORE_EVERY_RUN = RunCursor(1 << 62, "\U0010ffff")  # ahead of every real (created_at_ms, id) in DESC order

BATCH = 64
# A task over its limit loses its oldest finished runs `trim` at a time (down to the limit
# minus that): on flash, deleting neighbours together rewrites each page they share once,
# where one run per finish would rewrite about as many pages as the new run wrote. 32 at a
# time would save about 0.4 page a run more, but a task at the default 100 would then keep
# as few as 68: the history people read matters more. Never below MIN_KEPT, the AI
# comparison's 64-run window plus one.
TRIM = 16
MIN_KEPT = 65


class RunsSql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect."""

    mark: str  # the placeholder of a parameter, for the statements built here
    get: str
    page_project: str
    page_task: str
    lock: str  # project, task, status, version, event_seq, node, fence of a run, locked
    insert: str  # named parameters: the columns and a cluster's (forbid, not_before_ms, for_node,
    #              lease_from, lease_s); ON CONFLICT DO NOTHING
    event_insert: str  # run_id, sequence, type, actor_type, created_at_ms, detail
    event_bump: str  # RETURNING event_seq
    fence_bump: str
    on_terminal: str  # more SET terms of a transition to a terminal status
    log_copy: str | None  # the finished run's log into the database (a cluster's)
    retry_policy: str
    retry_due: str
    task_rules: str
    failing: str
    failing_set: str
    failing_clear: str
    any_channel: str
    notices_waiting: str
    excess: str
    expired: str
    logged: str
    delete: str
    drop_log: str  # RETURNING event_seq (but where seq_after is set)
    drop_log_copy: str | None
    log_total: str
    trim: int  # TRIM on flash, 0 where every write may keep the bound exactly
    unsuccessful: str  # the WHERE term of the unsuccessful runs' partial indexes (UNSUCCESSFUL_IN, _OR)
    scan: str  # {terms} {since}: a search page's key walk
    scan_active: str  # {terms} {since}: every active run
    search_runs: str | None  # the runs of a page's keys at once (a list parameter), else one by one
    prefix: str
    active: str
    active_processes: str  # named parameter `node`: the node's own (a cluster's), else every one
    events: str
    notify: str  # the module of the backend's notification statements (loaded with a channel)
    first_event_in_insert: bool = False  # `insert` writes the run's first event too (named: event_type, actor)
    # Where set, event_bump and drop_log return nothing and this reads the run's event_seq
    # after them (SQLite: RETURNING gathers its rows in a temporary B-tree made each time).
    seq_after: str | None = None


def to_run(row: Row) -> Run:
    values = dict(zip(FIELDS, row, strict=True))
    values["log_truncated"] = bool(values["log_truncated"])
    values["attempt"] = values["attempt"] or 1
    if values["idempotency_key"] is None:  # a cron fire's run: its key is its columns'
        values["idempotency_key"] = derived_key(values["origin"], values["trigger_id"], values["trigger_revision"],
                                                values["scheduled_for_ms"])
    return Run(**values)


def get_run(tx: Tx, q: RunsSql, project: str, run_id: str) -> Run | None:
    row = tx.row(q.get, (run_id, project))
    return to_run(row) if row else None


def insert_run(
    tx: Tx, q: RunsSql, run: Run, actor: ActorType, forbid: bool = False, not_before_ms: int | None = None,
    for_node: str | None = None, lease_s: float = 0.0,
) -> bool:
    """Insert a queued run with its first event; False when its idempotency key (or, on a
    cluster, the one active run a `forbid` task may have) already exists. With `for_node`
    only that node may claim it, within `lease_s` of when it may start."""
    values: dict[str, object] = {f: getattr(run, f) for f in FIELDS}
    values.update(event_seq=1, attempt=run.attempt if run.attempt != 1 else None, forbid=forbid,
                  not_before_ms=not_before_ms, for_node=for_node, lease_from=not_before_ms or 0, lease_s=lease_s)
    if q.first_event_in_insert:
        values.update(event_type=event_type(run.status), actor=actor)
    if not tx.execute(q.insert, values):
        return False
    if not q.first_event_in_insert:
        tx.execute(q.event_insert, (run.id, 1, event_type(run.status), actor, run.created_at_ms, None))
    return True


def create_run(tx: Tx, q: RunsSql, run: Run, actor: ActorType) -> Run:
    if not insert_run(tx, q, run, actor):
        raise conflict(f"run {run.idempotency_key or run.id} already exists")
    tx.hint("run")
    created = get_run(tx, q, run.project_id, run.id)
    assert created is not None
    return created


def append_event(tx: Tx, q: RunsSql, run_id: str, kind: str, actor: ActorType, now: int, detail: str | None) -> None:
    """An event on a run without a status change (a retry scheduled or refused)."""
    seq = _bumped(tx, q, q.event_bump, (run_id,), run_id)
    tx.execute(q.event_insert, (run_id, seq, kind, actor, now, detail))


def _bumped(tx: Tx, q: RunsSql, sql: str, params: tuple[object, ...], run_id: str) -> int:
    """Run an update that moves a run's event_seq on; the new event_seq."""
    if q.seq_after is None:
        (seq,) = tx.one(sql, params)
    else:
        tx.execute(sql, params)
        (seq,) = tx.one(q.seq_after, (run_id,))
    return int(seq)


_retry_policy = msgspec.json.Decoder(RetryPolicy)


def _schedule_retry(tx: Tx, q: RunsSql, run: Run, now: int) -> Run:
    """A failed or timed-out run whose task asks for retries, and has some left, gets its
    retry's due time (the scheduler admits it then, also after a restart; on a cluster the
    `trigger` hint has every node's scheduler arm it)."""
    if run.status not in RETRIED or run.error_code in NOT_RETRIED_CODES:
        return run
    row = tx.row(q.retry_policy, (run.project_id, run.task_id, run.task_revision))
    if row is None or row[0] is None:
        return run
    policy = _retry_policy.decode(row[0])
    if run.attempt > policy.count:
        return run
    due = now + retry_delay_ms(policy.delay_s, policy.backoff, policy.max_delay_s, run.attempt)
    tx.execute(q.retry_due, (due, run.id))
    append_event(tx, q, run.id, "run.retry_scheduled", "system", now, f"retry {run.attempt} of {policy.count}")
    tx.hint("trigger")
    updated = get_run(tx, q, run.project_id, run.id)
    assert updated is not None
    return updated


class Fenced(msgspec.Struct, frozen=True):
    """A transition refused because the claim it came from is no longer the run's."""

    message: str


class Fences:
    """The claims a cluster node holds: run id → fence. Shared by its claims and its run store."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.held: dict[str, int] = {}


def _apply(
    tx: Tx, q: RunsSql, run_id: str, current: RunStatus, seq: int, status: RunStatus, now: int, actor: ActorType,
    update: RunUpdate, detail: str | None,
) -> None:
    """One checked transition of the run at event `seq`: its columns and its event."""
    check_transition(current, status)
    sets = [f"status = {q.mark}", "version = version + 1", "event_seq = event_seq + 1"]
    params: list[object] = [status]
    for field in update.__struct_fields__:
        value = getattr(update, field)
        if value is not None:
            sets.append(f"{field} = {q.mark}")
            params.append(value)
    terms = ", ".join(sets) + (q.on_terminal if status in TERMINAL else "")
    tx.execute(f"UPDATE runs SET {terms} WHERE id = {q.mark}", (*params, run_id))
    tx.execute(q.event_insert, (run_id, seq + 1, event_type(status), actor, now, detail))


def transition(
    tx: Tx, q: RunsSql, run_id: str, expected: int, status: RunStatus, now: int, actor: ActorType,
    update: RunUpdate, detail: str | None, policy: Policy, claim: tuple[str, int] | None = None,
    log_data: bytes | None = None, started: RunUpdate | None = None,
) -> tuple[Run, list[str], int] | Fenced:
    """Compare-and-set on `version` (and, with `claim`, on the node and fence that hold the
    run); the event is appended in the same transaction, after `running` when `started`
    says the start was not recorded yet. Returns the run, the ids of the runs whose logs
    must go once this has committed, and how many notifications were queued."""
    row = tx.row(q.lock, (run_id,))
    if row is None:
        raise not_found(f"run {run_id} not found")
    project, task_id, current, version, seq, node, fence = row
    if claim is not None and ((node, fence) != claim or current not in ACTIVE):
        message = (f"node {claim[0]} (fence {claim[1]}) tried to record {status}; the run is {current}"
                   f"{'' if node == claim[0] else f', claimed by {node}'}: refused")
        tx.execute(q.fence_bump, (run_id,))
        tx.execute(q.event_insert, (run_id, seq + 1, "run.fence_refused", actor, now, message[:500]))
        return Fenced(message)
    if version != expected:
        raise conflict(f"run {run_id} changed (version {version}, expected {expected})")
    if started is not None:
        at = started.started_at_ms if started.started_at_ms is not None else now
        _apply(tx, q, run_id, current, seq, "running", at, "runner", started, None)
        current, seq = "running", seq + 1
    _apply(tx, q, run_id, current, seq, status, now, actor, update, detail)
    run = get_run(tx, q, project, run_id)
    assert run is not None
    if status not in TERMINAL:
        return run, [], 0
    if log_data and q.log_copy is not None:
        tx.execute(q.log_copy, (run_id, log_data))
    run = _schedule_retry(tx, q, run, now)
    queued = queue_run(tx, q, run, now, run.retry_due_at_ms is not None)
    removed = enforce(tx, q, project, task_id, now, policy)
    if run_id in removed:  # retention took its log (or the run itself)
        run = get_run(tx, q, project, run_id) or run
    return run, removed, queued


# -- retention --------------------------------------------------------------------


class Policy(msgspec.Struct, frozen=True):
    runs_per_task: int = 100
    max_age_ms: int = 30 * 86_400_000
    log_quota_bytes: int = 32 << 20


def log_total(tx: Tx, q: RunsSql, project: str) -> int:
    """Bytes of the project's run logs still on disk."""
    row = tx.row(q.log_total, (f"run_log_bytes:{project}",))
    return int(row[0]) if row else 0


def kept_after_trim(runs_per_task: int, trim: int = TRIM) -> int:
    """How many finished runs a task keeps right after it went over `runs_per_task`."""
    return max(runs_per_task - trim, min(runs_per_task, MIN_KEPT))


def enforce(tx: Tx, q: RunsSql, project: str, task_id: str, now: int, policy: Policy) -> list[str]:
    """Apply the policy a bounded step; call inside the write transaction that finished a
    run of `task_id`. Returns the ids of runs whose log files must go once it commits."""
    low = kept_after_trim(policy.runs_per_task, q.trim)
    beyond = [rid for (rid,) in tx.rows(q.excess, (project, task_id, BATCH, low))]
    # Only a task over its limit is trimmed, and then down to `low`.
    removed = beyond if len(beyond) > policy.runs_per_task - low else []
    if len(removed) < BATCH:
        seen = set(removed)
        expired = tx.rows(q.expired, (project, now - policy.max_age_ms, BATCH - len(removed)))
        removed += [rid for (rid,) in expired if rid not in seen]
    for rid in removed:
        tx.execute(q.delete, (rid,))  # its events go by ON DELETE CASCADE
    budget = BATCH - len(removed)
    excess = log_total(tx, q, project) - policy.log_quota_bytes
    if excess > 0 and budget > 0:
        removed += _drop_oldest_logs(tx, q, project, excess, budget, now)
    return removed


def _drop_oldest_logs(tx: Tx, q: RunsSql, project: str, excess: int, budget: int, now: int) -> list[str]:
    """Drop the logs (not the rows) of the oldest finished runs until `excess` bytes are
    freed: the run's history stays, with its log size, when the log went and an event."""
    dropped: list[str] = []
    freed = 0
    for rid, size in tx.rows(q.logged, (project, budget)):
        if freed >= excess:
            break
        seq = _bumped(tx, q, q.drop_log, (now, rid), rid)
        tx.execute(q.event_insert, (rid, seq, "run.log_dropped", "system", now, "log quota"))
        if q.drop_log_copy is not None:
            tx.execute(q.drop_log_copy, (rid,))
        freed += size
        dropped.append(rid)
    return dropped


# -- notifications, queued inside the writes that produce their events ---------------------
#
# A message exists exactly when the outcome it reports does: the transaction that finishes
# a run (or records a fire that did not run) queues it. Here is what every build does (the
# task's failing mark, so its next success is a recovery); the messages themselves are
# queued by edge.storage.notify, which ships with the notifier (packaging/build.py) and is
# loaded, with the backend's statements for it, by the first transaction that finds a
# channel configured.


def queue_run(tx: Tx, q: RunsSql, run: Run, now: int, retrying: bool) -> int:
    """In the transaction that finished `run`: keep the task's failing mark (a final failure
    sets it, a success clears it) and queue what its rules ask for. Returns how many
    messages were queued or joined."""
    row = tx.row(q.task_rules, (run.project_id, run.task_id, run.task_revision))
    if row is None:
        return 0
    failing = tx.row(q.failing, (run.project_id, run.task_id)) is not None
    kinds = run_notices(run.status, retrying, failing)
    if "failure" in kinds and not failing:
        tx.execute(q.failing_set, (run.project_id, run.task_id, now))
    elif run.status == "succeeded" and failing:
        tx.execute(q.failing_clear, (run.project_id, run.task_id))
    if tx.row(q.any_channel, (run.project_id,)) is None:
        return 0  # the common case without channels: one point read, nothing to decode
    found = _messages(q)
    return found[0].queue_run_messages(tx, found[1], run, row[0], kinds, now) if found is not None else 0


def queue_skip(tx: Tx, q: RunsSql, project: str, task_id: str, task_revision: int, reason: str, now: int) -> int:
    """In an admission transaction: a fire or retry of the task did not become a run (a
    disabled task's are not news: whoever disabled it knows)."""
    if reason == "task_disabled" or tx.row(q.any_channel, (project,)) is None:
        return 0
    row = tx.row(q.task_rules, (project, task_id, task_revision))
    found = _messages(q)
    if row is None or found is None:
        return 0
    return found[0].queue_skip_messages(tx, found[1], project, task_id, row[0], reason, now)


def _messages(q: RunsSql) -> tuple[ModuleType, object] | None:
    """edge.storage.notify and the backend's statements for it, or None in a build without
    notifications (which has no channels to send to: nothing is queued)."""
    try:
        return importlib.import_module("edge.storage.notify"), importlib.import_module(q.notify).NOTIFY
    except ModuleNotFoundError as exc:
        if exc.name in ("edge.storage.notify", q.notify):
            return None
        raise


def notices_waiting(tx: Tx, q: RunsSql, project: str) -> bool:
    return bool(tx.one(q.notices_waiting, (project, project))[0])


# -- reading ----------------------------------------------------------------------


def page(tx: Tx, q: RunsSql, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
    bound = after or BEFORE_EVERY_RUN
    if task_id is None:
        rows = tx.rows(q.page_project, (project, bound.created_at_ms, bound.run_id, limit))
    else:
        rows = tx.rows(q.page_task, (project, task_id, bound.created_at_ms, bound.run_id, limit))
    return [to_run(row) for row in rows]


# Each filter is served by the index its terms name: a partial index is used only when the
# query repeats its WHERE term exactly, hence these literal terms (the dialect's `unsuccessful`).
_UNSCHEDULED_TERM = "origin != 'scheduled'"


def active_only(query: RunQuery) -> bool:
    return bool(query.statuses) and set(query.statuses) <= ACTIVE


def scan_sql(q: RunsSql, query: RunQuery) -> str:
    """The key walk of one search page: the terms that pick the index (what they do not
    decide, search checks on each entry) and the cursor bound."""
    terms = "" if query.task_id is None else f" AND task_id = {q.mark}"
    since = "" if query.since_ms is None else f" AND created_at_ms >= {q.mark}"
    if active_only(query):
        # Queued and running runs are few by construction (the admission bound): all of
        # them, from their own index, ordered by search rather than walked in order.
        return q.scan_active.format(terms=terms, since=since)
    statuses = set(query.statuses)
    if statuses and statuses <= set(UNSUCCESSFUL):
        terms += f" AND {q.unsuccessful}"  # runs_unsuccessful_idx, runs_task_unsuccessful_idx
    elif query.task_id is None and query.origins and "scheduled" not in query.origins:
        terms += f" AND {_UNSCHEDULED_TERM}"  # runs_unscheduled_idx
    return q.scan.format(terms=terms, since=since)


def scan_params(project: str, query: RunQuery, after: RunCursor | None, budget: int) -> tuple[object, ...]:
    bound = after or BEFORE_EVERY_RUN
    if query.until_ms is not None and (query.until_ms, "") < (bound.created_at_ms, bound.run_id):
        bound = RunCursor(query.until_ms, "")  # created before `until`: ahead of every id at that ms
    params: list[object] = [project]
    if query.task_id is not None:
        params.append(query.task_id)
    params += [bound.created_at_ms, bound.run_id]
    if query.since_ms is not None:
        params.append(query.since_ms)
    return tuple(params) if active_only(query) else (*params, budget)  # the active runs: all of them


def search(
    tx: Tx, q: RunsSql, project: str, query: RunQuery, after: RunCursor | None, limit: int,
    budget: int = SEARCH_BUDGET,
) -> RunSearch:
    statuses, origins = set(query.statuses), set(query.origins)
    hits: list[RunCursor] = []
    last: RunCursor | None = None
    scanned = 0
    entries = tx.each(scan_sql(q, query), scan_params(project, query, after, budget))
    if active_only(query):
        entries = sorted(entries, key=lambda e: (e[1], e[0]), reverse=True)
    for rid, created, status, origin in entries:
        scanned += 1
        last = RunCursor(created, rid)
        if (not statuses or status in statuses) and (not origins or origin in origins):
            hits.append(last)
            if len(hits) > limit:
                break
    nxt: RunCursor | None = None
    if len(hits) > limit:
        hits = hits[:limit]
        nxt = hits[-1]
    elif scanned == budget and not active_only(query):
        nxt = last  # more entries than one page may look at: go on from here
    if q.search_runs is not None:
        found = {r.id: r for r in map(to_run, tx.rows(q.search_runs, (project, [h.run_id for h in hits])))}
        return RunSearch(runs=[found[h.run_id] for h in hits if h.run_id in found], next=nxt)
    runs = [run for run in (get_run(tx, q, project, h.run_id) for h in hits) if run is not None]
    return RunSearch(runs=runs, next=nxt)


def with_prefix(tx: Tx, q: RunsSql, project: str, prefix: str, limit: int) -> list[str]:
    if not prefix:
        return []
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string after every one with the prefix
    return [rid for (rid,) in tx.rows(q.prefix, (prefix, upper, project, limit))]


def active(tx: Tx, q: RunsSql) -> list[Run]:
    return [to_run(row) for row in tx.rows(q.active)]


def active_processes(tx: Tx, q: RunsSql, node: str | None) -> list[tuple[Run, RunProcess]]:
    return [(to_run(row[:-2]), RunProcess(pid=row[-2], start_ticks=row[-1]))
            for row in tx.rows(q.active_processes, {"node": node})]


def events(tx: Tx, q: RunsSql, project: str, run_id: str, after: int, limit: int) -> list[RunEvent]:
    return [RunEvent(run_id=r[0], sequence=r[1], type=r[2], actor_type=r[3], created_at_ms=r[4], detail=r[5])
            for r in tx.rows(q.events, (run_id, project, after, limit))]


class SqlRunStore:
    """RunStore on `db`, in its dialect `q`; every run that finishes through it applies
    `policy`, and the logs of the runs retention removed go after the commit. With `fences`
    (a cluster node's), transitions of the runs the node claimed are fenced, a finished
    run's log is copied into the database, and a lost connection is retried for `retry_s`
    (every transition is a compare-and-set, so a repeat cannot apply twice)."""

    def __init__(self, db: Db, q: RunsSql, policy: Policy, logs: RunLogFiles, followers: Followers | None = None,
                 fences: Fences | None = None, retry_s: float = 0.0) -> None:
        self._db = db
        self._q = q
        self._policy = policy
        self._logs = logs
        self._followers = followers or Followers()
        self._fences = fences
        self._retry_s = retry_s

    async def create(self, run: Run, actor: ActorType) -> Run:
        return await self._db.write(create_run, self._q, run, actor)

    async def transition(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int,
        actor: ActorType, update: RunUpdate, detail: str | None = None, started: RunUpdate | None = None,
    ) -> Run:
        claim, data = None, None
        if self._fences is not None:
            fence = self._fences.held.get(run_id)
            claim = (self._fences.node, fence) if fence is not None else None
            if status in TERMINAL and update.log_bytes:
                data = await self._log_copy(run_id, update.log_bytes)
        result = await self._record(run_id, expected_version, status, now_ms, actor, update, detail, claim, data,
                                    started)
        if isinstance(result, Fenced):
            assert self._fences is not None
            self._fences.held.pop(run_id, None)
            log.warning("run %s: %s", run_id, result.message)
            raise conflict(result.message)
        run, removed, queued = result
        if not run.terminal:
            return run
        if self._fences is not None:
            self._fences.held.pop(run_id, None)
        self._logs.remove([*removed, run_id] if data is not None else removed)
        if run.retry_due_at_ms is not None:
            self._followers.retry(run.id, run.retry_due_at_ms)
        if queued:
            self._followers.notify()
        return run

    async def _record(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int, actor: ActorType,
        update: RunUpdate, detail: str | None, claim: tuple[str, int] | None, data: bytes | None,
        started: RunUpdate | None,
    ) -> tuple[Run, list[str], int] | Fenced:
        """The transaction of `transition` (a cluster node's may do more in it)."""
        return await self._db.write(transition, self._q, run_id, expected_version, status, now_ms, actor, update,
                                    detail, self._policy, claim, data, started, retry_s=self._retry_s)

    async def _log_copy(self, run_id: str, size: int) -> bytes | None:
        try:
            found = await asyncio.to_thread(self._logs.read, run_id, 0, size)
        except ToolError:  # not a log of ours in its place (a link a task planted): not copied, the run is
            return None  # still recorded, and the log tools keep answering unavailable for it
        return found.data if found is not None else None

    async def notices_waiting(self, project: str) -> bool:
        return await self._db.read(notices_waiting, self._q, project)

    async def get(self, project: str, run_id: str) -> Run | None:
        return await self._db.read(get_run, self._q, project, run_id)

    async def page(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
        return await self._db.read(page, self._q, project, task_id, after, limit)

    async def search(self, project: str, query: RunQuery, after: RunCursor | None, limit: int) -> RunSearch:
        return await self._db.read(search, self._q, project, query, after, limit)

    async def with_prefix(self, project: str, prefix: str, limit: int) -> list[str]:
        return await self._db.read(with_prefix, self._q, project, prefix, limit)

    async def active(self) -> list[Run]:
        return await self._db.read(active, self._q)

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        """The active runs (a cluster node's: those it claimed) a previous life left."""
        node = self._fences.node if self._fences is not None else None
        return await self._db.read(active_processes, self._q, node)

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]:
        return await self._db.read(events, self._q, project, run_id, after_sequence, limit)
