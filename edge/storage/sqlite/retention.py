"""Run retention, enforced in the transaction that finishes a run (no sweeper, no
start-up pass): runs per task, run age, and total log bytes.

Each call removes at most `BATCH` rows or logs, and only of finished runs, so one write's
cost stays bounded and repeated writes converge. Every query walks an index from the
oldest end; the log total is a running sum in `meta` kept by triggers on `runs`
(edge.storage.sqlite.schema), never a SUM over `runs`.
"""

from __future__ import annotations

import apsw
import msgspec

from edge.core.runs import TERMINAL
from edge.storage.sqlite.db import one, rows

BATCH = 64
# A task over its limit loses its oldest finished runs TRIM at a time (down to the limit
# minus TRIM): deleting neighbours together rewrites each page they share once, where one
# run per finish would rewrite about as many pages as the new run wrote (on flash, every
# page counts). Never below MIN_KEPT, the AI comparison's 64-run window plus one.
TRIM = 16
MIN_KEPT = 65
_FINISHED = f"status IN ({', '.join(repr(s) for s in sorted(TERMINAL))})"

# Finished runs of a task beyond the newest `runs_per_task` (index order, newest first).
SQL_EXCESS = (
    "SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND " + _FINISHED +
    " ORDER BY created_at_ms DESC, id DESC LIMIT ? OFFSET ?"
)
SQL_EXPIRED = (
    "SELECT id FROM runs WHERE project_id = ? AND created_at_ms < ? AND " + _FINISHED +
    " ORDER BY created_at_ms, id LIMIT ?"
)
# The partial index holds exactly the runs that still have a log (set when they finish).
SQL_LOGGED = (
    "SELECT id, log_bytes FROM runs WHERE project_id = ? AND log_bytes > 0 AND log_dropped_at_ms IS NULL AND "
    + _FINISHED +
    " ORDER BY created_at_ms, id LIMIT ?"
)
SQL_DELETE = "DELETE FROM runs WHERE id = ?"
SQL_DROP_LOG = (
    "UPDATE runs SET log_dropped_at_ms = ?, version = version + 1, event_seq = event_seq + 1"
    " WHERE id = ? RETURNING event_seq"
)


class Policy(msgspec.Struct, frozen=True):
    runs_per_task: int = 100
    max_age_ms: int = 30 * 86_400_000
    log_quota_bytes: int = 32 << 20


def log_total(conn: apsw.Connection, project: str) -> int:
    """Bytes of the project's run logs still on disk."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (f"run_log_bytes:{project}",)).fetchone()
    return int(row[0]) if row else 0


def kept_after_trim(runs_per_task: int) -> int:
    """How many finished runs a task keeps right after it went over `runs_per_task`."""
    return max(runs_per_task - TRIM, min(runs_per_task, MIN_KEPT))


def enforce(conn: apsw.Connection, project: str, task_id: str, now_ms: int, policy: Policy) -> list[str]:
    """Apply the policy a bounded step; call inside the write transaction that finished a
    run of `task_id`. Returns the ids of runs whose log files must go once it commits."""
    low = kept_after_trim(policy.runs_per_task)
    beyond = [rid for (rid,) in conn.execute(SQL_EXCESS, (project, task_id, BATCH, low))]
    # Only a task over its limit is trimmed, and then down to `low`.
    removed = beyond if len(beyond) > policy.runs_per_task - low else []
    if len(removed) < BATCH:
        seen = set(removed)
        expired = conn.execute(SQL_EXPIRED, (project, now_ms - policy.max_age_ms, BATCH - len(removed)))
        removed += [rid for (rid,) in expired if rid not in seen]
    for rid in removed:
        conn.execute(SQL_DELETE, (rid,))  # its events go by ON DELETE CASCADE
    budget = BATCH - len(removed)
    excess = log_total(conn, project) - policy.log_quota_bytes
    if excess > 0 and budget > 0:
        removed += _drop_oldest_logs(conn, project, excess, budget, now_ms)
    return removed


def _drop_oldest_logs(conn: apsw.Connection, project: str, excess: int, budget: int, now_ms: int) -> list[str]:
    """Drop the logs (not the rows) of the oldest finished runs until `excess` bytes are
    freed: the run's history stays, with its log size, when the log went and an event."""
    dropped: list[str] = []
    freed = 0
    for rid, size in rows(conn, SQL_LOGGED, (project, budget)):
        if freed >= excess:
            break
        (seq,) = one(conn, SQL_DROP_LOG, (now_ms, rid))
        conn.execute(
            "INSERT INTO run_events (run_id, sequence, type, actor_type, created_at_ms, detail)"
            " VALUES (?, ?, 'run.log_dropped', 'system', ?, 'log quota')",
            (rid, seq, now_ms),
        )
        freed += size
        dropped.append(rid)
    return dropped
