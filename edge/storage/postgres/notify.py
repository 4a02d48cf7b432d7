"""Notifications on PostgreSQL: queued inside the transactions that finish runs and admit
fires (as on SQLite, edge.storage.sqlite.runs), and the notifier's side of the queue
(NotifyStore, edge.core.ports.notify) shared by every node.

Each node runs its own notifier. `due` claims what it hands out for this node (`FOR
UPDATE SKIP LOCKED`, then `claimed_by` and a due time at the lease's end), so one node
delivers each message; a node that dies while delivering leaves its claims to run out,
and the message is delivered again then. Rate windows and channel health are each node's
own, rebuilt from the shared attempts log when its notifier starts. A transaction that
queues a message sends the `notify` hint, so every node's notifier looks.
"""

from __future__ import annotations

import msgspec

from edge.core.errors import not_found
from edge.core.ports.notify import (
    ChannelHealth,
    ChannelRow,
    Damping,
    NoticeAttempt,
    NoticeOutcome,
    NoticeRecord,
    PendingNotice,
    Streak,
)
from edge.core.runs import Run
from edge.core.tasks import NotifyRule, notice_targets, run_notices
from edge.storage.postgres.db import PgDatabase, Row, Tx

KEEP_MESSAGES = 1000  # finished messages kept (newest)
KEEP_ATTEMPTS = 2000
PRUNE_BATCH = 64
HEALTH_WINDOW = 20  # attempts per channel looked at for `health`
TRIES_SHOWN = 5
HINT = "notify"

_rules = msgspec.json.Decoder(list[NotifyRule])
_rules_out = msgspec.json.Encoder()

SQL_TASK_RULES = (
    "SELECT (spec::jsonb -> 'notify')::text FROM task_revisions WHERE project_id = %s AND task_id = %s"
    " AND revision = %s"
)
SQL_FAILING = "SELECT 1 FROM failing_tasks WHERE project_id = %s AND task_id = %s"
SQL_ANY_CHANNEL = "SELECT 1 FROM notify_channels WHERE project_id = %s LIMIT 1"
SQL_CHANNEL_EXISTS = "SELECT 1 FROM notify_channels WHERE project_id = %s AND name = %s"
SQL_PROJECT_RULES = "SELECT rules FROM notify_rules WHERE project_id = %s"
# A message not tried yet (nor in flight), for the same channel, task and event: the one a
# new event joins. Locked, so a node claiming it waits for this transaction or skips it.
SQL_JOINABLE = (
    "SELECT id FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
    " AND project_id = %s AND channel = %s AND task_id IS NOT DISTINCT FROM %s AND event = %s"
    " ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED"
)
SQL_JOIN = (
    "UPDATE notifications SET count = count + 1, run_id = %s, status = %s, exit_code = %s, duration_ms = %s,"
    " detail = %s, created_at_ms = %s WHERE id = %s"
)
SQL_INSERT = (
    "INSERT INTO notifications (project_id, channel, event, task_id, run_id, status, exit_code, duration_ms,"
    " detail, count, first_at_ms, created_at_ms, state, due_at_ms, last_error, done_at_ms, claimed_by)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
)
SQL_PRUNE_MESSAGES = (
    "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications WHERE state <> 'pending' AND id <= %s"
    " ORDER BY id LIMIT %s)"
)
SQL_PRUNE_ATTEMPTS = (
    "DELETE FROM notify_attempts WHERE id IN (SELECT id FROM notify_attempts WHERE id <= %s ORDER BY id LIMIT %s)"
)
SQL_DUE = """
SELECT n.id, n.channel, n.event, n.task_id, t.name, n.run_id, n.status, n.exit_code, n.duration_ms, n.detail,
       n.count, n.first_at_ms, n.created_at_ms, n.attempts, c.kind, c.spec
FROM notifications AS n
LEFT JOIN tasks AS t ON t.project_id = n.project_id AND t.id = n.task_id
LEFT JOIN notify_channels AS c ON c.project_id = n.project_id AND c.name = n.channel
WHERE n.state = 'pending' AND n.due_at_ms <= %s AND n.project_id = %s
ORDER BY n.due_at_ms, n.id LIMIT %s FOR UPDATE OF n SKIP LOCKED
"""
SQL_CHANNELS = (
    "SELECT name, kind, spec, created_at_ms, updated_at_ms FROM notify_channels WHERE project_id = %s"
)
SQL_LOG = (
    "SELECT id, channel, event, task_id, run_id, status, count, state, attempts, created_at_ms, done_at_ms,"
    " last_error, merged_into FROM notifications WHERE project_id = %s AND id < %s ORDER BY id DESC LIMIT %s"
)
SQL_TRIES = (
    "SELECT at_ms, ok, detail, elapsed_ms FROM notify_attempts WHERE notification_id = %s ORDER BY id DESC LIMIT %s"
)

Facts = tuple[str | None, int | None, int | None, str | None]  # status, exit code, duration, detail


# -- queueing, inside the writes that produce the events ----------------------------------


async def queue_message(tx: Tx, project: str, channel: str, event: str, task_id: str | None, run_id: str | None,
                        facts: Facts, now: int) -> int:
    """One message for `channel`, joined into an untried one of the same event, task and
    channel; `dropped` on record when no channel has that name. Returns its id."""
    status, exit_code, duration_ms, detail = facts
    if event != "test":
        joinable = await tx.row(SQL_JOINABLE, (project, channel, task_id, event))
        if joinable is not None:
            await tx.execute(SQL_JOIN, (run_id, status, exit_code, duration_ms, detail, now, joinable[0]))
            return int(joinable[0])
    values: tuple[str, int | None, str | None, int | None]  # state, due, last error, done
    if await tx.row(SQL_CHANNEL_EXISTS, (project, channel)) is None:
        # Named by a rule but not configured: on record, never silently nothing.
        values = ("dropped", None, f"no channel named {channel!r}", now)
    else:
        values = ("pending", now, None, None)
    (nid,) = await tx.one(SQL_INSERT, (project, channel, event, task_id, run_id, status, exit_code, duration_ms,
                                       detail, 1, now, now, *values, None))
    await tx.execute(SQL_PRUNE_MESSAGES, (int(nid) - KEEP_MESSAGES, PRUNE_BATCH))
    return int(nid)


async def _applicable(tx: Tx, project: str, own: str | None) -> list[NotifyRule]:
    if own is not None:
        return _rules.decode(own)
    row = await tx.row(SQL_PROJECT_RULES, (project,))
    return _rules.decode(row[0]) if row else []


async def queue_run(tx: Tx, run: Run, now: int, retrying: bool) -> int:
    """In the transaction that finished `run`: keep the task's failing mark and queue what
    its rules ask for (edge.storage.sqlite.runs.queue_run). Returns how many messages."""
    row = await tx.row(SQL_TASK_RULES, (run.project_id, run.task_id, run.task_revision))
    if row is None:
        return 0
    failing = await tx.row(SQL_FAILING, (run.project_id, run.task_id)) is not None
    kinds = run_notices(run.status, retrying, failing)
    if "failure" in kinds and not failing:
        await tx.execute("INSERT INTO failing_tasks (project_id, task_id, since_ms) VALUES (%s, %s, %s)"
                         " ON CONFLICT DO NOTHING", (run.project_id, run.task_id, now))
    elif run.status == "succeeded" and failing:
        await tx.execute("DELETE FROM failing_tasks WHERE project_id = %s AND task_id = %s",
                         (run.project_id, run.task_id))
    if await tx.row(SQL_ANY_CHANNEL, (run.project_id,)) is None:
        return 0
    targets = notice_targets(await _applicable(tx, run.project_id, row[0]), kinds)
    duration = run.finished_at_ms - run.started_at_ms if run.finished_at_ms and run.started_at_ms else None
    for channel, event in sorted(targets.items()):
        await queue_message(tx, run.project_id, channel, event, run.task_id, run.id,
                            (run.status, run.exit_code, duration, run.error_summary), now)
    if targets:
        await tx.notify(HINT)
    return len(targets)


async def queue_skip(tx: Tx, project: str, task_id: str, task_revision: int, reason: str, now: int) -> int:
    """In an admission transaction: a fire or retry of the task did not become a run (not
    for a disabled task)."""
    if reason == "task_disabled" or await tx.row(SQL_ANY_CHANNEL, (project,)) is None:
        return 0
    row = await tx.row(SQL_TASK_RULES, (project, task_id, task_revision))
    if row is None:
        return 0
    targets = notice_targets(await _applicable(tx, project, row[0]), {"skipped"})
    for channel, event in sorted(targets.items()):
        await queue_message(tx, project, channel, event, task_id, None, ("skipped", None, None, reason), now)
    if targets:
        await tx.notify(HINT)
    return len(targets)


# -- the notifier's side -------------------------------------------------------------------


def _channel(row: Row) -> ChannelRow:
    return ChannelRow(name=row[0], kind=row[1], spec=row[2], created_at_ms=row[3], updated_at_ms=row[4])


async def _set_channel(tx: Tx, project: str, name: str, kind: str, spec: str, now: int,
                       create_only: bool) -> tuple[ChannelRow, str]:
    found = await tx.row(SQL_CHANNELS + " AND name = %s FOR UPDATE", (project, name))
    if found is not None and create_only:
        return _channel(found), "exists"
    row = await tx.one(
        "INSERT INTO notify_channels (project_id, name, kind, spec, created_at_ms, updated_at_ms)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (project_id, name)"
        " DO UPDATE SET kind = excluded.kind, spec = excluded.spec, updated_at_ms = excluded.updated_at_ms"
        " RETURNING name, kind, spec, created_at_ms, updated_at_ms",
        (project, name, kind, spec, now, now))
    return _channel(row), "created" if found is None else "updated"


async def _channels(tx: Tx, project: str) -> list[ChannelRow]:
    return [_channel(r) for r in await tx.rows(SQL_CHANNELS + " ORDER BY name", (project,))]


async def _delete_channel(tx: Tx, project: str, name: str) -> bool:
    gone = await tx.execute("DELETE FROM notify_channels WHERE project_id = %s AND name = %s", (project, name)) > 0
    await tx.execute("DELETE FROM notify_streaks WHERE project_id = %s AND channel = %s", (project, name))
    return gone


async def _get_rules(tx: Tx, project: str) -> list[NotifyRule] | None:
    row = await tx.row(SQL_PROJECT_RULES, (project,))
    return _rules.decode(row[0]) if row else None


async def _set_rules(tx: Tx, project: str, rules: list[NotifyRule] | None, now: int) -> None:
    if rules is None:
        await tx.execute("DELETE FROM notify_rules WHERE project_id = %s", (project,))
        return
    await tx.execute("INSERT INTO notify_rules (project_id, rules, updated_at_ms) VALUES (%s, %s, %s)"
                     " ON CONFLICT (project_id) DO UPDATE SET rules = excluded.rules,"
                     " updated_at_ms = excluded.updated_at_ms", (project, _rules_out.encode(rules).decode(), now))


async def _enqueue_test(tx: Tx, project: str, channel: str, now: int) -> int:
    if await tx.row(SQL_CHANNEL_EXISTS, (project, channel)) is None:
        raise not_found(f"no channel named {channel!r}")
    return await queue_message(tx, project, channel, "test", None, None, (None, None, None, None), now)


async def _due(tx: Tx, project: str, now: int, limit: int, lease: int, node: str,
               damping: Damping | None = None) -> list[PendingNotice]:
    found = []
    for r in await tx.rows(SQL_DUE, (now, project, limit)):
        notice = PendingNotice(
            id=r[0], channel=r[1], event=r[2], task_id=r[3], task_name=r[4], run_id=r[5], status=r[6],
            exit_code=r[7], duration_ms=r[8], detail=r[9], count=r[10], first_at_ms=r[11], created_at_ms=r[12],
            attempts=r[13], kind=r[14], spec=r[15])
        if damping is not None and notice.task_id is not None:
            damped = await _damped(tx, project, notice, now, damping)
            if damped is None:
                continue  # a repeat: it waits for the streak's next reminder
            notice = damped
        found.append(notice)
    if found:
        await tx.execute("UPDATE notifications SET claimed_by = %s, due_at_ms = %s WHERE id = ANY(%s)",
                         (node, now + lease, [n.id for n in found]))
    return found


# Damping, as on SQLite (edge.storage.sqlite.notify `_damped`); the streak's row is locked, so
# two nodes handing out a task's failures on one channel take turns.
SQL_STREAK = (
    "SELECT since_ms, failures, repeats, next_at_ms, mark_ms, last_id, last_count FROM notify_streaks"
    " WHERE project_id = %s AND channel = %s AND task_id = %s FOR UPDATE"
)
SQL_MARK = "SELECT since_ms FROM failing_tasks WHERE project_id = %s AND task_id = %s"
# A recovery waiting on the channel for a success after the failure: the failure is folded into it.
SQL_RECOVERY_AFTER = (
    "SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = %s AND channel = %s AND task_id = %s"
    " AND event = 'recovery' AND first_at_ms >= %s LIMIT 1"
)
SQL_PUT_STREAK = (
    "INSERT INTO notify_streaks (project_id, channel, task_id, since_ms, failures, repeats, next_at_ms, mark_ms,"
    " last_id, last_count) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (project_id, channel, task_id)"
    " DO UPDATE SET since_ms = excluded.since_ms, failures = excluded.failures, repeats = excluded.repeats,"
    " next_at_ms = excluded.next_at_ms, mark_ms = excluded.mark_ms, last_id = excluded.last_id,"
    " last_count = excluded.last_count"
)
SQL_WAITING_FAILURES = (
    "SELECT id, count FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
    " AND project_id = %s AND channel = %s AND task_id = %s AND event = 'failure' AND id <> %s"
    " AND first_at_ms <= %s FOR UPDATE SKIP LOCKED"
)


async def _damped(tx: Tx, project: str, n: PendingNotice, now: int, damping: Damping) -> PendingNotice | None:
    """The message as it goes under `damping` (NotifyStore.due), or None when it waits."""
    if n.event not in ("failure", "recovery"):
        return n
    key = (project, n.channel, n.task_id)
    row = await tx.row(SQL_STREAK, key)
    if n.event == "recovery":
        if row is None:
            return n
        since, failures = int(row[0]), int(row[1])
        for nid, count in await tx.rows(SQL_WAITING_FAILURES, (*key, row[5], n.first_at_ms)):
            failures += int(count)
            await tx.execute("UPDATE notifications SET state = 'merged', merged_into = %s, due_at_ms = NULL,"
                             " done_at_ms = %s WHERE id = %s", (n.id, now, nid))
        await tx.execute("DELETE FROM notify_streaks WHERE project_id = %s AND channel = %s AND task_id = %s", key)
        return msgspec.structs.replace(n, streak=Streak(failures=failures, since_ms=since, next_at_ms=None))
    since, failures, repeats, next_at, mark_at, last_id, last_count = (
        tuple(row) if row is not None else (0, 0, 0, 0, None, 0, 0))
    if row is not None and last_id == n.id:  # handed out before: as it was, with what joined it since
        total = int(failures) + n.count - int(last_count)
        await tx.execute("UPDATE notify_streaks SET failures = %s, last_count = %s WHERE project_id = %s"
                         " AND channel = %s AND task_id = %s", (total, n.count, *key))
        if repeats == 0:
            return n
        return msgspec.structs.replace(n, streak=Streak(failures=total, since_ms=int(since), next_at_ms=int(next_at)))
    mark = await tx.row(SQL_MARK, (project, n.task_id))
    mark_now = int(mark[0]) if mark is not None else None
    if row is not None and mark_at != mark_now and await tx.row(SQL_RECOVERY_AFTER, (*key, n.first_at_ms)):
        return None  # the spell it belongs to has ended: the recovery waiting folds it in
    if row is None or mark_now is None or mark_at != mark_now:
        # The first failure of a spell (or one left from a spell that has ended): it goes as it is.
        await tx.execute(SQL_PUT_STREAK, (*key, n.first_at_ms, n.count, 0, now + damping.interval(0), mark_now, n.id,
                                          n.count))
        return n
    if next_at > now:
        await tx.execute("UPDATE notifications SET due_at_ms = %s WHERE id = %s", (next_at, n.id))
        return None
    later = now + damping.interval(int(repeats) + 1)
    total = int(failures) + n.count
    await tx.execute(SQL_PUT_STREAK, (*key, since, total, int(repeats) + 1, later, mark_at, n.id, n.count))
    return msgspec.structs.replace(n, streak=Streak(failures=total, since_ms=int(since), next_at_ms=later))


async def _release(tx: Tx, project: str, ids: list[int], now: int, node: str) -> None:
    await tx.execute("UPDATE notifications SET claimed_by = NULL, due_at_ms = %s WHERE id = ANY(%s)"
                     " AND project_id = %s AND state = 'pending' AND claimed_by = %s", (now, ids, project, node))


async def _recover(tx: Tx, project: str, now: int, node: str) -> int:
    return await tx.execute("UPDATE notifications SET claimed_by = NULL, due_at_ms = least(due_at_ms, %s)"
                            " WHERE project_id = %s AND state = 'pending' AND claimed_by = %s", (now, project, node))


async def _next_due(tx: Tx, project: str, after: int) -> int | None:
    (found,) = await tx.one("SELECT min(due_at_ms) FROM notifications WHERE state = 'pending' AND due_at_ms > %s"
                            " AND project_id = %s", (after, project))
    return int(found) if found is not None else None


async def _record(tx: Tx, project: str, outcomes: list[NoticeOutcome], now: int) -> None:
    last = None
    for o in outcomes:
        row = await tx.row("SELECT channel FROM notifications WHERE id = %s AND project_id = %s AND state = 'pending'"
                           " FOR UPDATE", (o.id, project))
        if row is None:
            continue  # trimmed or recorded meanwhile
        (last,) = await tx.one(
            "INSERT INTO notify_attempts (notification_id, project_id, channel, at_ms, ok, detail, elapsed_ms)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (o.id, project, row[0], now, o.ok, o.detail, o.elapsed_ms))
        if o.ok:
            await tx.execute("UPDATE notifications SET state = 'sent', attempts = attempts + 1, due_at_ms = NULL,"
                             " done_at_ms = %s, last_error = NULL, claimed_by = NULL WHERE id = %s", (now, o.id))
        elif o.retry_at_ms is not None:
            await tx.execute("UPDATE notifications SET attempts = attempts + 1, due_at_ms = %s, last_error = %s,"
                             " claimed_by = NULL WHERE id = %s", (o.retry_at_ms, o.detail, o.id))
        else:
            await tx.execute("UPDATE notifications SET state = 'failed', attempts = attempts + 1, due_at_ms = NULL,"
                             " done_at_ms = %s, last_error = %s, claimed_by = NULL WHERE id = %s",
                             (now, o.detail, o.id))
    if last is not None:
        await tx.execute(SQL_PRUNE_ATTEMPTS, (int(last) - KEEP_ATTEMPTS, PRUNE_BATCH))


async def _merge(tx: Tx, project: str, ids: list[int], channel: str, detail: str, count: int, now: int,
                 lease: int, node: str) -> int:
    (summary,) = await tx.one(SQL_INSERT, (project, channel, "summary", None, None, None, None, None, detail, count,
                                           now, now, "pending", now + lease, None, None, node))
    await tx.execute("UPDATE notifications SET state = 'merged', merged_into = %s, due_at_ms = NULL,"
                     " done_at_ms = %s, claimed_by = NULL WHERE id = ANY(%s) AND project_id = %s"
                     " AND state = 'pending'", (summary, now, ids, project))
    return int(summary)


async def _log(tx: Tx, project: str, before: int | None, limit: int) -> list[NoticeRecord]:
    records = []
    for r in await tx.rows(SQL_LOG, (project, before if before is not None else 1 << 62, limit)):
        tries = [NoticeAttempt(at_ms=t[0], ok=bool(t[1]), detail=t[2], elapsed_ms=t[3])
                 for t in await tx.rows(SQL_TRIES, (r[0], TRIES_SHOWN))]
        records.append(NoticeRecord(
            id=r[0], channel=r[1], event=r[2], task_id=r[3], run_id=r[4], status=r[5], count=r[6], state=r[7],
            attempts=r[8], created_at_ms=r[9], done_at_ms=r[10], last_error=r[11], merged_into=r[12], tries=tries))
    return records


async def _health(tx: Tx, project: str) -> list[ChannelHealth]:
    found = []
    for (name,) in await tx.rows("SELECT DISTINCT channel FROM notify_attempts WHERE project_id = %s"
                                 " ORDER BY channel", (project,)):
        recent = await tx.rows("SELECT at_ms, ok, detail FROM notify_attempts WHERE project_id = %s AND channel = %s"
                               " ORDER BY id DESC LIMIT %s", (project, name, HEALTH_WINDOW))
        failures = 0
        for _, ok, _ in recent:
            if ok:
                break
            failures += 1
        found.append(ChannelHealth(
            channel=name, failures=failures, last_error=recent[0][2] if failures else None,
            failing_since_ms=recent[failures - 1][0] if failures else None,
            last_ok_at_ms=next((at for at, ok, _ in recent if ok), None)))
    return found


async def _recent_attempts(tx: Tx, project: str, since: int) -> list[tuple[str, int]]:
    return [(c, int(at)) for c, at in await tx.rows(
        "SELECT channel, at_ms FROM notify_attempts WHERE project_id = %s AND at_ms >= %s ORDER BY id",
        (project, since))]


class PgNotifyStore:
    """NotifyStore (edge.core.ports.notify) on PostgreSQL, for node `node`: its claims are
    the node's."""

    def __init__(self, db: PgDatabase, node: str) -> None:
        self._db = db
        self._node = node

    async def set_channel(self, project: str, name: str, kind: str, spec: str, now_ms: int,
                          create_only: bool = False) -> tuple[ChannelRow, str]:
        return await self._db.tx(_set_channel, project, name, kind, spec, now_ms, create_only)

    async def channels(self, project: str) -> list[ChannelRow]:
        return await self._db.tx(_channels, project)

    async def delete_channel(self, project: str, name: str) -> bool:
        return await self._db.tx(_delete_channel, project, name)

    async def rules(self, project: str) -> list[NotifyRule] | None:
        return await self._db.tx(_get_rules, project)

    async def set_rules(self, project: str, rules: list[NotifyRule] | None, now_ms: int) -> None:
        await self._db.tx(_set_rules, project, rules, now_ms)

    async def enqueue_test(self, project: str, channel: str, now_ms: int) -> int:
        return await self._db.tx(_enqueue_test, project, channel, now_ms)

    async def due(self, project: str, now_ms: int, limit: int, lease_ms: int,
                  damping: Damping | None = None) -> list[PendingNotice]:
        return await self._db.tx(_due, project, now_ms, limit, lease_ms, self._node, damping)

    async def release(self, project: str, ids: list[int], now_ms: int) -> None:
        if ids:
            await self._db.tx(_release, project, ids, now_ms, self._node)

    async def recover(self, project: str, now_ms: int) -> int:
        return await self._db.tx(_recover, project, now_ms, self._node)

    async def next_due(self, project: str, after_ms: int) -> int | None:
        return await self._db.tx(_next_due, project, after_ms)

    async def record(self, project: str, outcomes: list[NoticeOutcome], now_ms: int) -> None:
        if outcomes:
            await self._db.tx(_record, project, outcomes, now_ms)

    async def merge(self, project: str, ids: list[int], channel: str, detail: str, count: int, now_ms: int,
                    lease_ms: int) -> int:
        return await self._db.tx(_merge, project, ids, channel, detail, count, now_ms, lease_ms, self._node)

    async def log(self, project: str, before_id: int | None, limit: int) -> list[NoticeRecord]:
        return await self._db.tx(_log, project, before_id, limit)

    async def health(self, project: str) -> list[ChannelHealth]:
        return await self._db.tx(_health, project)

    async def recent_attempts(self, project: str, since_ms: int) -> list[tuple[str, int]]:
        return await self._db.tx(_recent_attempts, project, since_ms)
