"""Notifications in the daemon's database: the messages the transactions that finish runs
and admit fires queue (called by edge.storage.sqlite.runs `queue_run`, `queue_skip`, which
load this module when a channel is configured), and the notifier's side: channels, the
project's default rules, due messages and their claims, every attempt's outcome,
summaries, the delivery log and each channel's health. Implements NotifyStore
(edge.core.ports.notify). It ships with edge/notify/ (packaging/build.py).

While a message has not been tried (and is not in flight), a new event of the same kind for
the same task and channel joins it (`count` goes up) instead of queueing another: a `*/1`
task failing every second waits as one message. With damping (`due`), a task that keeps
failing has its first failure handed out, then reminders at growing intervals (the
failures between wait, joined, in the next one) until a recovery ends the streak
(`notify_streaks`, migration 14). Finished messages and the attempts log are trimmed on
write, bounded.
"""

from __future__ import annotations

import apsw
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
from edge.core.tasks import NotifyEvent, NotifyRule, notice_targets
from edge.storage.sqlite.db import Database, immediate, one, rows

CLAIMANT = "local"  # one daemon per database: every claim is its own
KEEP_MESSAGES = 1000  # finished messages kept per database (newest)
KEEP_ATTEMPTS = 2000
PRUNE_BATCH = 64
HEALTH_WINDOW = 20  # attempts per channel looked at for `health`
TRIES_SHOWN = 5

_rules = msgspec.json.Decoder(list[NotifyRule])
_rules_out = msgspec.json.Encoder()

SQL_CHANNEL_EXISTS = "SELECT 1 FROM notify_channels WHERE project_id = ? AND name = ?"
SQL_PROJECT_RULES = "SELECT rules FROM notify_rules WHERE project_id = ?"
# A message not tried yet (nor in flight), for the same channel, task and event: the one a
# new event joins.
SQL_JOINABLE = (
    "SELECT id FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
    " AND project_id = ? AND channel = ? AND task_id IS ? AND event = ? ORDER BY id DESC LIMIT 1"
)
SQL_JOIN = (
    "UPDATE notifications SET count = count + 1, run_id = ?, status = ?, exit_code = ?, duration_ms = ?,"
    " detail = ?, created_at_ms = ? WHERE id = ?"
)
SQL_INSERT = (
    "INSERT INTO notifications (project_id, channel, event, task_id, run_id, status, exit_code, duration_ms,"
    " detail, count, first_at_ms, created_at_ms, state, due_at_ms, last_error, done_at_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?)"
)
SQL_PRUNE_MESSAGES = (
    "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications WHERE state != 'pending' AND id <= ?"
    " ORDER BY id LIMIT ?)"
)

SQL_PRUNE_ATTEMPTS = (
    "DELETE FROM notify_attempts WHERE id IN (SELECT id FROM notify_attempts WHERE id <= ? ORDER BY id LIMIT ?)"
)
_PENDING = """
SELECT n.id, n.channel, n.event, n.task_id, t.name, n.run_id, n.status, n.exit_code, n.duration_ms, n.detail,
       n.count, n.first_at_ms, n.created_at_ms, n.attempts, c.kind, c.spec
FROM notifications AS n
LEFT JOIN tasks AS t ON t.project_id = n.project_id AND t.id = n.task_id
LEFT JOIN notify_channels AS c ON c.project_id = n.project_id AND c.name = n.channel
"""
SQL_DUE = _PENDING + (
    "WHERE n.state = 'pending' AND n.due_at_ms <= ? AND n.project_id = ? ORDER BY n.due_at_ms, n.id LIMIT ?")
SQL_NEXT_DUE = "SELECT min(due_at_ms) FROM notifications WHERE state = 'pending' AND due_at_ms > ? AND project_id = ?"
SQL_LOG = (
    "SELECT id, channel, event, task_id, run_id, status, count, state, attempts, created_at_ms, done_at_ms,"
    " last_error, merged_into FROM notifications WHERE project_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
)
SQL_TRIES = (
    "SELECT at_ms, ok, detail, elapsed_ms FROM notify_attempts WHERE notification_id = ? ORDER BY id DESC LIMIT ?"
)


# -- queueing, inside the writes that produce the events ----------------------------------

Facts = tuple[str | None, int | None, int | None, str | None]  # status, exit code, duration, detail


def queue_message(conn: apsw.Connection, project: str, channel: str, event: str, task_id: str | None,
                  run_id: str | None, facts: Facts, now: int) -> None:
    """One message for `channel`, joined into an untried one of the same event, task and
    channel; `dropped` on record when no channel has that name. Trims finished messages."""
    status, exit_code, duration_ms, detail = facts
    if event != "test":
        joinable = conn.execute(SQL_JOINABLE, (project, channel, task_id, event)).fetchone()
        if joinable is not None:
            conn.execute(SQL_JOIN, (run_id, status, exit_code, duration_ms, detail, now, joinable[0]))
            return
    if conn.execute(SQL_CHANNEL_EXISTS, (project, channel)).fetchone() is None:
        # Named by a rule but not configured: on record, never silently nothing.
        conn.execute(SQL_INSERT, (project, channel, event, task_id, run_id, status, exit_code, duration_ms, detail,
                                  now, now, "dropped", None, f"no channel named {channel!r}", now))
    else:
        conn.execute(SQL_INSERT, (project, channel, event, task_id, run_id, status, exit_code, duration_ms, detail,
                                  now, now, "pending", now, None, None))
    conn.execute(SQL_PRUNE_MESSAGES, (conn.last_insert_rowid() - KEEP_MESSAGES, PRUNE_BATCH))


def _applicable(conn: apsw.Connection, project: str, own: str | None) -> list[NotifyRule]:
    if own is not None:
        return _rules.decode(own)
    row = conn.execute(SQL_PROJECT_RULES, (project,)).fetchone()
    return _rules.decode(row[0]) if row else []


def queue_run_messages(conn: apsw.Connection, run: Run, own: str | None, kinds: frozenset[NotifyEvent],
                       now: int) -> int:
    """The messages the end of `run` (what it is: `kinds`) asks for, by the task's own rules
    (`own`, JSON) or the project's; how many."""
    targets = notice_targets(_applicable(conn, run.project_id, own), kinds)
    duration = run.finished_at_ms - run.started_at_ms if run.finished_at_ms and run.started_at_ms else None
    facts = (run.status, run.exit_code, duration, run.error_summary)
    for channel, event in sorted(targets.items()):
        queue_message(conn, run.project_id, channel, event, run.task_id, run.id, facts, now)
    return len(targets)


def queue_skip_messages(conn: apsw.Connection, project: str, task_id: str, own: str | None, reason: str,
                        now: int) -> int:
    """The messages a fire or retry that did not run asks for; how many."""
    targets = notice_targets(_applicable(conn, project, own), {"skipped"})
    for channel, event in sorted(targets.items()):
        queue_message(conn, project, channel, event, task_id, None, ("skipped", None, None, reason), now)
    return len(targets)


# -- channels and rules ------------------------------------------------------------------


def _channel(row: tuple) -> ChannelRow:
    return ChannelRow(name=row[0], kind=row[1], spec=row[2], created_at_ms=row[3], updated_at_ms=row[4])


def set_channel(conn: apsw.Connection, project: str, name: str, kind: str, spec: str, now: int,
                create_only: bool) -> tuple[ChannelRow, str]:
    select = ("SELECT name, kind, spec, created_at_ms, updated_at_ms FROM notify_channels"
              " WHERE project_id = ? AND name = ?")
    with immediate(conn):
        found = conn.execute(select, (project, name)).fetchone()
        if found is not None and create_only:
            return _channel(found), "exists"
        conn.execute(
            "INSERT INTO notify_channels (project_id, name, kind, spec, created_at_ms, updated_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, name)"
            " DO UPDATE SET kind = excluded.kind, spec = excluded.spec, updated_at_ms = excluded.updated_at_ms",
            (project, name, kind, spec, now, now))
        return _channel(one(conn, select, (project, name))), "created" if found is None else "updated"


def channels(conn: apsw.Connection, project: str) -> list[ChannelRow]:
    return [_channel(row) for row in conn.execute(
        "SELECT name, kind, spec, created_at_ms, updated_at_ms FROM notify_channels WHERE project_id = ?"
        " ORDER BY name", (project,))]


def delete_channel(conn: apsw.Connection, project: str, name: str) -> bool:
    with immediate(conn):
        conn.execute("DELETE FROM notify_channels WHERE project_id = ? AND name = ?", (project, name))
        gone = conn.changes() > 0
        conn.execute("DELETE FROM notify_streaks WHERE project_id = ? AND channel = ?", (project, name))
        return gone


def get_rules(conn: apsw.Connection, project: str) -> list[NotifyRule] | None:
    row = conn.execute(SQL_PROJECT_RULES, (project,)).fetchone()
    return _rules.decode(row[0]) if row else None


def set_rules(conn: apsw.Connection, project: str, rules: list[NotifyRule] | None, now: int) -> None:
    with immediate(conn):
        if rules is None:
            conn.execute("DELETE FROM notify_rules WHERE project_id = ?", (project,))
        else:
            conn.execute("INSERT INTO notify_rules (project_id, rules, updated_at_ms) VALUES (?, ?, ?)"
                         " ON CONFLICT (project_id) DO UPDATE SET rules = excluded.rules,"
                         " updated_at_ms = excluded.updated_at_ms",
                         (project, _rules_out.encode(rules).decode(), now))


def enqueue_test(conn: apsw.Connection, project: str, channel: str, now: int) -> int:
    with immediate(conn):
        if conn.execute(SQL_CHANNEL_EXISTS, (project, channel)).fetchone() is None:
            raise not_found(f"no channel named {channel!r}")
        queue_message(conn, project, channel, "test", None, None, (None, None, None, None), now)
        return conn.last_insert_rowid()


# -- delivery ------------------------------------------------------------------------


def due(conn: apsw.Connection, project: str, now: int, limit: int, lease: int,
        damping: Damping | None = None) -> list[PendingNotice]:
    with immediate(conn):
        found = []
        candidates: list[tuple] = list(conn.execute(SQL_DUE, (now, project, limit)))
        for r in candidates:
            notice = PendingNotice(
                id=r[0], channel=r[1], event=r[2], task_id=r[3], task_name=r[4], run_id=r[5], status=r[6],
                exit_code=r[7], duration_ms=r[8], detail=r[9], count=r[10], first_at_ms=r[11], created_at_ms=r[12],
                attempts=r[13], kind=r[14], spec=r[15])
            if damping is not None and notice.task_id is not None:
                damped = _damped(conn, project, notice, now, damping)
                if damped is None:
                    continue  # a repeat: it waits for the streak's next reminder
                notice = damped
            # In flight: nothing joins it, and it is due again only when the claim ends.
            conn.execute("UPDATE notifications SET claimed_by = ?, due_at_ms = ? WHERE id = ?",
                         (CLAIMANT, now + lease, notice.id))
            found.append(notice)
    return found


SQL_STREAK = (
    "SELECT since_ms, failures, repeats, next_at_ms, mark_ms, last_id, last_count FROM notify_streaks"
    " WHERE project_id = ? AND channel = ? AND task_id = ?"
)
SQL_MARK = "SELECT since_ms FROM failing_tasks WHERE project_id = ? AND task_id = ?"
# A recovery waiting on the channel for a success after the failure: the failure is folded into it.
SQL_RECOVERY_AFTER = (
    "SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = ? AND channel = ? AND task_id = ?"
    " AND event = 'recovery' AND first_at_ms >= ? LIMIT 1"
)
SQL_PUT_STREAK = (
    "INSERT INTO notify_streaks (project_id, channel, task_id, since_ms, failures, repeats, next_at_ms, mark_ms,"
    " last_id, last_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, channel, task_id) DO UPDATE"
    " SET since_ms = excluded.since_ms, failures = excluded.failures, repeats = excluded.repeats,"
    " next_at_ms = excluded.next_at_ms, mark_ms = excluded.mark_ms, last_id = excluded.last_id,"
    " last_count = excluded.last_count"
)
SQL_WAITING_FAILURES = (
    "SELECT id, count FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
    " AND project_id = ? AND channel = ? AND task_id = ? AND event = 'failure' AND id != ?"
    " AND first_at_ms <= ?"
)


def _damped(conn: apsw.Connection, project: str, n: PendingNotice, now: int,
            damping: Damping) -> PendingNotice | None:
    """The message as it goes under `damping` (NotifyStore.due), or None when it waits."""
    if n.event not in ("failure", "recovery"):
        return n
    key = (project, n.channel, n.task_id)
    row = conn.execute(SQL_STREAK, key).fetchone()
    if n.event == "recovery":
        if row is None:
            return n
        since, failures = row[0], row[1]
        for nid, count in conn.execute(SQL_WAITING_FAILURES, (*key, row[5], n.first_at_ms)).fetchall():
            failures += count
            conn.execute("UPDATE notifications SET state = 'merged', merged_into = ?, due_at_ms = NULL,"
                         " done_at_ms = ? WHERE id = ?", (n.id, now, nid))
        conn.execute("DELETE FROM notify_streaks WHERE project_id = ? AND channel = ? AND task_id = ?", key)
        return msgspec.structs.replace(n, streak=Streak(failures=failures, since_ms=since, next_at_ms=None))
    since, failures, repeats, next_at, mark_at, last_id, last_count = row if row is not None else (0,) * 7
    if row is not None and last_id == n.id:  # handed out before: as it was, with what joined it since
        conn.execute("UPDATE notify_streaks SET failures = ?, last_count = ? WHERE project_id = ? AND channel = ?"
                     " AND task_id = ?", (failures + n.count - last_count, n.count, *key))
        if repeats == 0:
            return n
        return msgspec.structs.replace(n, streak=Streak(failures=failures + n.count - last_count, since_ms=since,
                                                        next_at_ms=next_at))
    mark = conn.execute(SQL_MARK, (project, n.task_id)).fetchone()
    mark_now = mark[0] if mark is not None else None
    ended = row is not None and mark_at != mark_now
    if ended and conn.execute(SQL_RECOVERY_AFTER, (*key, n.first_at_ms)).fetchone() is not None:
        return None  # the spell it belongs to has ended: the recovery waiting folds it in
    if row is None or mark_now is None or mark_at != mark_now:
        # The first failure of a spell (or one left from a spell that has ended): it goes as it is.
        conn.execute(SQL_PUT_STREAK, (*key, n.first_at_ms, n.count, 0, now + damping.interval(0), mark_now, n.id,
                                      n.count))
        return n
    if next_at > now:
        conn.execute("UPDATE notifications SET due_at_ms = ? WHERE id = ?", (next_at, n.id))
        return None
    later = now + damping.interval(repeats + 1)
    conn.execute(SQL_PUT_STREAK, (*key, since, failures + n.count, repeats + 1, later, mark_at, n.id, n.count))
    return msgspec.structs.replace(n, streak=Streak(failures=failures + n.count, since_ms=since, next_at_ms=later))


def release(conn: apsw.Connection, project: str, ids: list[int], now: int) -> None:
    with immediate(conn):
        for nid in ids:
            conn.execute("UPDATE notifications SET claimed_by = NULL, due_at_ms = ? WHERE id = ? AND project_id = ?"
                         " AND state = 'pending' AND claimed_by IS NOT NULL", (now, nid, project))


def recover(conn: apsw.Connection, project: str, now: int) -> int:
    with immediate(conn):
        conn.execute("UPDATE notifications SET claimed_by = NULL, due_at_ms = min(due_at_ms, ?) WHERE project_id = ?"
                     " AND state = 'pending' AND claimed_by IS NOT NULL", (now, project))
        return conn.changes()


def next_due(conn: apsw.Connection, project: str, after: int) -> int | None:
    return one(conn, SQL_NEXT_DUE, (after, project))[0]


def record(conn: apsw.Connection, project: str, outcomes: list[NoticeOutcome], now: int) -> None:
    with immediate(conn):
        for o in outcomes:
            row = conn.execute("SELECT channel FROM notifications WHERE id = ? AND project_id = ?"
                               " AND state = 'pending'", (o.id, project)).fetchone()
            if row is None:
                continue  # trimmed or recorded meanwhile
            conn.execute("INSERT INTO notify_attempts (notification_id, project_id, channel, at_ms, ok, detail,"
                         " elapsed_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (o.id, project, row[0], now, int(o.ok), o.detail, o.elapsed_ms))
            if o.ok:
                conn.execute("UPDATE notifications SET state = 'sent', attempts = attempts + 1, due_at_ms = NULL,"
                             " done_at_ms = ?, last_error = NULL, claimed_by = NULL WHERE id = ?", (now, o.id))
            elif o.retry_at_ms is not None:
                conn.execute("UPDATE notifications SET attempts = attempts + 1, due_at_ms = ?, last_error = ?,"
                             " claimed_by = NULL WHERE id = ?", (o.retry_at_ms, o.detail, o.id))
            else:
                conn.execute("UPDATE notifications SET state = 'failed', attempts = attempts + 1, due_at_ms = NULL,"
                             " done_at_ms = ?, last_error = ?, claimed_by = NULL WHERE id = ?", (now, o.detail, o.id))
        if outcomes:
            conn.execute(SQL_PRUNE_ATTEMPTS, (conn.last_insert_rowid() - KEEP_ATTEMPTS, PRUNE_BATCH))


def merge(conn: apsw.Connection, project: str, ids: list[int], channel: str, detail: str, count: int,
          now: int, lease: int) -> int:
    with immediate(conn):
        conn.execute(SQL_INSERT, (project, channel, "summary", None, None, None, None, None, detail, now, now,
                                  "pending", now + lease, None, None))
        summary = conn.last_insert_rowid()
        conn.execute("UPDATE notifications SET count = ?, claimed_by = ? WHERE id = ?", (count, CLAIMANT, summary))
        for nid in ids:
            conn.execute("UPDATE notifications SET state = 'merged', merged_into = ?, due_at_ms = NULL, done_at_ms = ?,"
                         " claimed_by = NULL WHERE id = ? AND project_id = ? AND state = 'pending'",
                         (summary, now, nid, project))
        return summary


def log(conn: apsw.Connection, project: str, before: int | None, limit: int) -> list[NoticeRecord]:
    records = []
    for r in rows(conn, SQL_LOG, (project, before if before is not None else 1 << 62, limit)):
        tries = [NoticeAttempt(at_ms=t[0], ok=bool(t[1]), detail=t[2], elapsed_ms=t[3])
                 for t in conn.execute(SQL_TRIES, (r[0], TRIES_SHOWN))]
        records.append(NoticeRecord(
            id=r[0], channel=r[1], event=r[2], task_id=r[3], run_id=r[4], status=r[5], count=r[6], state=r[7],
            attempts=r[8], created_at_ms=r[9], done_at_ms=r[10], last_error=r[11], merged_into=r[12], tries=tries))
    return records


def health(conn: apsw.Connection, project: str) -> list[ChannelHealth]:
    found = []
    names = [n for (n,) in conn.execute(
        "SELECT DISTINCT channel FROM notify_attempts WHERE project_id = ? ORDER BY channel", (project,))]
    for name in names:
        recent = rows(conn, "SELECT at_ms, ok, detail FROM notify_attempts WHERE project_id = ? AND channel = ?"
                      " ORDER BY id DESC LIMIT ?", (project, name, HEALTH_WINDOW))
        failures = 0
        for _, ok, _ in recent:
            if ok:
                break
            failures += 1
        last_ok = next((at for at, ok, _ in recent if ok), None)
        found.append(ChannelHealth(
            channel=name, failures=failures, last_error=recent[0][2] if failures else None,
            failing_since_ms=recent[failures - 1][0] if failures else None, last_ok_at_ms=last_ok))
    return found


def recent_attempts(conn: apsw.Connection, project: str, since: int) -> list[tuple[str, int]]:
    return [(c, at) for c, at in conn.execute(
        "SELECT channel, at_ms FROM notify_attempts WHERE project_id = ? AND at_ms >= ? ORDER BY id", (project, since))]


class SqliteNotifyStore:
    """NotifyStore (edge.core.ports.notify) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def set_channel(self, project: str, name: str, kind: str, spec: str, now_ms: int,
                          create_only: bool = False) -> tuple[ChannelRow, str]:
        return await self._db.run(set_channel, project, name, kind, spec, now_ms, create_only)

    async def channels(self, project: str) -> list[ChannelRow]:
        return await self._db.run(channels, project)

    async def delete_channel(self, project: str, name: str) -> bool:
        return await self._db.run(delete_channel, project, name)

    async def rules(self, project: str) -> list[NotifyRule] | None:
        return await self._db.run(get_rules, project)

    async def set_rules(self, project: str, rules: list[NotifyRule] | None, now_ms: int) -> None:
        await self._db.run(set_rules, project, rules, now_ms)

    async def enqueue_test(self, project: str, channel: str, now_ms: int) -> int:
        return await self._db.run(enqueue_test, project, channel, now_ms)

    async def due(self, project: str, now_ms: int, limit: int, lease_ms: int,
                  damping: Damping | None = None) -> list[PendingNotice]:
        return await self._db.run(due, project, now_ms, limit, lease_ms, damping)

    async def release(self, project: str, ids: list[int], now_ms: int) -> None:
        if ids:
            await self._db.run(release, project, ids, now_ms)

    async def recover(self, project: str, now_ms: int) -> int:
        return await self._db.run(recover, project, now_ms)

    async def next_due(self, project: str, after_ms: int) -> int | None:
        return await self._db.run(next_due, project, after_ms)

    async def record(self, project: str, outcomes: list[NoticeOutcome], now_ms: int) -> None:
        await self._db.run(record, project, outcomes, now_ms)

    async def merge(self, project: str, ids: list[int], channel: str, detail: str, count: int, now_ms: int,
                    lease_ms: int) -> int:
        return await self._db.run(merge, project, ids, channel, detail, count, now_ms, lease_ms)

    async def log(self, project: str, before_id: int | None, limit: int) -> list[NoticeRecord]:
        return await self._db.run(log, project, before_id, limit)

    async def health(self, project: str) -> list[ChannelHealth]:
        return await self._db.run(health, project)

    async def recent_attempts(self, project: str, since_ms: int) -> list[tuple[str, int]]:
        return await self._db.run(recent_attempts, project, since_ms)
