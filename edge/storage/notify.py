"""Notifications, once for both backends: the messages the transactions that finish runs and
admit fires queue (edge.storage.runs `queue_run`, `queue_skip`, which load this module when
a channel is configured), and the notifier's side: channels, the project's default rules,
due messages and their claims, every attempt's outcome, summaries, the delivery log and
each channel's health. Implements NotifyStore (edge.core.ports.notify). It ships with
edge/notify/ (packaging/build.py).

While a message has not been tried (and is not in flight), a new event of the same kind for
the same task and channel joins it (`count` goes up) instead of queueing another: a `*/1`
task failing every second waits as one message. With damping (`due`), a task that keeps
failing has its first failure handed out, then reminders at growing intervals (the
failures between wait, joined, in the next one) until a recovery ends the streak
(`notify_streaks`). Finished messages and the attempts log are trimmed on write, bounded.

`due` claims what it hands out for its claimant (one daemon: `local`; on a cluster the node,
which locks the rows it takes with `SKIP LOCKED`, so one node delivers each message, and
locks a streak's row, so two nodes handing out a task's failures take turns). A claim ends
with its lease: a notifier that dies while delivering has the message delivered again then.
A transaction that queues a message hints `notify`, so every node's notifier looks.
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
from edge.core.tasks import NotifyEvent, NotifyRule, notice_targets
from edge.storage.tx import NO_ROW, Db, Row, Tx

KEEP_MESSAGES = 1000  # finished messages kept (newest)
KEEP_ATTEMPTS = 2000
PRUNE_BATCH = 64
HEALTH_WINDOW = 20  # attempts per channel looked at for `health`
TRIES_SHOWN = 5

_rules = msgspec.json.Decoder(list[NotifyRule])
_rules_out = msgspec.json.Encoder()


class NotifySql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect."""

    channel_exists: str
    channel_get: str  # locked for the transaction's write
    channel_set: str  # an upsert RETURNING the row
    channels: str
    channel_delete: str
    streaks_delete: str
    project_rules: str
    rules_delete: str
    rules_set: str
    joinable: str  # a message not tried yet (nor in flight) of the same channel, task and event
    join: str
    insert: str  # RETURNING id
    prune_messages: str
    due: str
    claim: str
    streak: str  # locked for the transaction's write
    mark: str
    recovery_after: str
    streak_put: str
    streak_count: str
    streak_delete: str
    waiting_failures: str
    merge_into: str
    postpone: str
    release: str
    recover: str
    next_due: str
    pending_channel: str  # locked for the transaction's write
    attempt_insert: str  # RETURNING id
    sent: str
    retry: str
    failed: str
    prune_attempts: str
    merged: str
    log: str
    tries: str
    attempted_channels: str
    recent: str
    recent_attempts: str


Facts = tuple[str | None, int | None, int | None, str | None]  # status, exit code, duration, detail


# -- queueing, inside the writes that produce the events ----------------------------------


def queue_message(tx: Tx, q: NotifySql, project: str, channel: str, event: str, task_id: str | None,
                  run_id: str | None, facts: Facts, now: int) -> int:
    """One message for `channel`, joined into an untried one of the same event, task and
    channel; `dropped` on record when no channel has that name. Trims finished messages.
    Returns its id."""
    status, exit_code, duration_ms, detail = facts
    if event != "test":
        joinable = tx.row(q.joinable, (project, channel, task_id, event))
        if joinable is not None:
            tx.execute(q.join, (run_id, status, exit_code, duration_ms, detail, now, joinable[0]))
            return int(joinable[0])
    values: tuple[str, int | None, str | None, int | None]  # state, due, last error, done
    if tx.row(q.channel_exists, (project, channel)) is None:
        # Named by a rule but not configured: on record, never silently nothing.
        values = ("dropped", None, f"no channel named {channel!r}", now)
    else:
        values = ("pending", now, None, None)
    (nid,) = tx.one(q.insert, (project, channel, event, task_id, run_id, status, exit_code, duration_ms, detail, 1,
                               now, now, *values, None))
    tx.execute(q.prune_messages, (int(nid) - KEEP_MESSAGES, PRUNE_BATCH))
    return int(nid)


def _applicable(tx: Tx, q: NotifySql, project: str, own: str | None) -> list[NotifyRule]:
    if own is not None:
        return _rules.decode(own)
    row = tx.row(q.project_rules, (project,))
    return _rules.decode(row[0]) if row else []


def queue_run_messages(tx: Tx, q: NotifySql, run: Run, own: str | None, kinds: frozenset[NotifyEvent],
                       now: int) -> int:
    """The messages the end of `run` (what it is: `kinds`) asks for, by the task's own rules
    (`own`, JSON) or the project's; how many."""
    targets = notice_targets(_applicable(tx, q, run.project_id, own), kinds)
    duration = run.finished_at_ms - run.started_at_ms if run.finished_at_ms and run.started_at_ms else None
    facts = (run.status, run.exit_code, duration, run.error_summary)
    for channel, event in sorted(targets.items()):
        queue_message(tx, q, run.project_id, channel, event, run.task_id, run.id, facts, now)
    if targets:
        tx.hint("notify")
    return len(targets)


def queue_skip_messages(tx: Tx, q: NotifySql, project: str, task_id: str, own: str | None, reason: str,
                        now: int) -> int:
    """The messages a fire or retry that did not run asks for; how many."""
    targets = notice_targets(_applicable(tx, q, project, own), {"skipped"})
    for channel, event in sorted(targets.items()):
        queue_message(tx, q, project, channel, event, task_id, None, ("skipped", None, None, reason), now)
    if targets:
        tx.hint("notify")
    return len(targets)


# -- channels and rules ------------------------------------------------------------------


def _channel(row: Row) -> ChannelRow:
    return ChannelRow(name=row[0], kind=row[1], spec=row[2], created_at_ms=row[3], updated_at_ms=row[4])


def set_channel(tx: Tx, q: NotifySql, project: str, name: str, kind: str, spec: str, now: int,
                create_only: bool) -> tuple[ChannelRow, str]:
    found = tx.row(q.channel_get, (project, name))
    if found is not None and create_only:
        return _channel(found), "exists"
    row = tx.one(q.channel_set, (project, name, kind, spec, now, now))
    return _channel(row), "created" if found is None else "updated"


def channels(tx: Tx, q: NotifySql, project: str) -> list[ChannelRow]:
    return [_channel(row) for row in tx.rows(q.channels, (project,))]


def delete_channel(tx: Tx, q: NotifySql, project: str, name: str) -> bool:
    gone = tx.execute(q.channel_delete, (project, name)) > 0
    tx.execute(q.streaks_delete, (project, name))
    return gone


def get_rules(tx: Tx, q: NotifySql, project: str) -> list[NotifyRule] | None:
    row = tx.row(q.project_rules, (project,))
    return _rules.decode(row[0]) if row else None


def set_rules(tx: Tx, q: NotifySql, project: str, rules: list[NotifyRule] | None, now: int) -> None:
    if rules is None:
        tx.execute(q.rules_delete, (project,))
    else:
        tx.execute(q.rules_set, (project, _rules_out.encode(rules).decode(), now))


def enqueue_test(tx: Tx, q: NotifySql, project: str, channel: str, now: int) -> int:
    if tx.row(q.channel_exists, (project, channel)) is None:
        raise not_found(f"no channel named {channel!r}")
    return queue_message(tx, q, project, channel, "test", None, None, (None, None, None, None), now)


# -- delivery ------------------------------------------------------------------------


def due(tx: Tx, q: NotifySql, claimant: str, project: str, now: int, limit: int, lease: int,
        damping: Damping | None = None) -> list[PendingNotice]:
    found = []
    for r in tx.rows(q.due, (now, project, limit)):
        notice = PendingNotice(
            id=r[0], channel=r[1], event=r[2], task_id=r[3], task_name=r[4], run_id=r[5], status=r[6],
            exit_code=r[7], duration_ms=r[8], detail=r[9], count=r[10], first_at_ms=r[11], created_at_ms=r[12],
            attempts=r[13], kind=r[14], spec=r[15])
        if damping is not None and notice.task_id is not None:
            damped = _damped(tx, q, project, notice, now, damping)
            if damped is None:
                continue  # a repeat: it waits for the streak's next reminder
            notice = damped
        # In flight: nothing joins it, and it is due again only when the claim ends.
        tx.execute(q.claim, (claimant, now + lease, notice.id))
        found.append(notice)
    return found


def _damped(tx: Tx, q: NotifySql, project: str, n: PendingNotice, now: int,
            damping: Damping) -> PendingNotice | None:
    """The message as it goes under `damping` (NotifyStore.due), or None when it waits."""
    if n.event not in ("failure", "recovery"):
        return n
    key = (project, n.channel, n.task_id)
    row = tx.row(q.streak, key)
    if n.event == "recovery":
        if row is None:
            return n
        since, failures = int(row[0]), int(row[1])
        for nid, count in tx.rows(q.waiting_failures, (*key, row[5], n.first_at_ms)):
            failures += int(count)
            tx.execute(q.merge_into, (n.id, now, nid))
        tx.execute(q.streak_delete, key)
        return msgspec.structs.replace(n, streak=Streak(failures=failures, since_ms=since, next_at_ms=None))
    since, failures, repeats, next_at, mark_at, last_id, last_count = (
        tuple(row) if row is not None else (0, 0, 0, 0, None, 0, 0))
    if row is not None and last_id == n.id:  # handed out before: as it was, with what joined it since
        total = int(failures) + n.count - int(last_count)
        tx.execute(q.streak_count, (total, n.count, *key))
        if repeats == 0:
            return n
        return msgspec.structs.replace(n, streak=Streak(failures=total, since_ms=int(since), next_at_ms=int(next_at)))
    mark = tx.row(q.mark, (project, n.task_id))
    mark_now = int(mark[0]) if mark is not None else None
    if row is not None and mark_at != mark_now and tx.row(q.recovery_after, (*key, n.first_at_ms)) is not None:
        return None  # the spell it belongs to has ended: the recovery waiting folds it in
    if row is None or mark_now is None or mark_at != mark_now:
        # The first failure of a spell (or one left from a spell that has ended): it goes as it is.
        tx.execute(q.streak_put, (*key, n.first_at_ms, n.count, 0, now + damping.interval(0), mark_now, n.id, n.count))
        return n
    if next_at > now:
        tx.execute(q.postpone, (next_at, n.id))
        return None
    later = now + damping.interval(int(repeats) + 1)
    total = int(failures) + n.count
    tx.execute(q.streak_put, (*key, since, total, int(repeats) + 1, later, mark_at, n.id, n.count))
    return msgspec.structs.replace(n, streak=Streak(failures=total, since_ms=int(since), next_at_ms=later))


def release(tx: Tx, q: NotifySql, claimant: str, project: str, ids: list[int], now: int) -> None:
    for nid in ids:
        tx.execute(q.release, (now, nid, project, claimant))


def recover(tx: Tx, q: NotifySql, claimant: str, project: str, now: int) -> int:
    return tx.execute(q.recover, (now, project, claimant))


def next_due(tx: Tx, q: NotifySql, project: str, after: int) -> int | None:
    (found,) = tx.one(q.next_due, (after, project))
    return int(found) if found is not None else None


def record(tx: Tx, q: NotifySql, project: str, outcomes: list[NoticeOutcome], now: int) -> None:
    last = None
    for o in outcomes:
        row = tx.row(q.pending_channel, (o.id, project))
        if row is None:
            continue  # trimmed or recorded meanwhile
        (last,) = tx.one(q.attempt_insert, (o.id, project, row[0], now, o.ok, o.detail, o.elapsed_ms))
        if o.ok:
            tx.execute(q.sent, (now, o.id))
        elif o.retry_at_ms is not None:
            tx.execute(q.retry, (o.retry_at_ms, o.detail, o.id))
        else:
            tx.execute(q.failed, (now, o.detail, o.id))
    if last is not None:
        tx.execute(q.prune_attempts, (int(last) - KEEP_ATTEMPTS, PRUNE_BATCH))


def merge(tx: Tx, q: NotifySql, claimant: str, project: str, ids: list[int], channel: str, detail: str, count: int,
          now: int, lease: int) -> int:
    (summary,) = tx.one(q.insert, (project, channel, "summary", None, None, None, None, None, detail, count, now, now,
                                   "pending", now + lease, None, None, claimant))
    for nid in ids:
        tx.execute(q.merged, (summary, now, nid, project))
    return int(summary)


def log(tx: Tx, q: NotifySql, project: str, before: int | None, limit: int) -> list[NoticeRecord]:
    records = []
    for r in tx.rows(q.log, (project, before if before is not None else NO_ROW, limit)):
        tries = [NoticeAttempt(at_ms=t[0], ok=bool(t[1]), detail=t[2], elapsed_ms=t[3])
                 for t in tx.rows(q.tries, (r[0], TRIES_SHOWN))]
        records.append(NoticeRecord(
            id=r[0], channel=r[1], event=r[2], task_id=r[3], run_id=r[4], status=r[5], count=r[6], state=r[7],
            attempts=r[8], created_at_ms=r[9], done_at_ms=r[10], last_error=r[11], merged_into=r[12], tries=tries))
    return records


def health(tx: Tx, q: NotifySql, project: str) -> list[ChannelHealth]:
    found = []
    for (name,) in tx.rows(q.attempted_channels, (project,)):
        recent = tx.rows(q.recent, (project, name, HEALTH_WINDOW))
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


def recent_attempts(tx: Tx, q: NotifySql, project: str, since: int) -> list[tuple[str, int]]:
    return [(c, int(at)) for c, at in tx.rows(q.recent_attempts, (project, since))]


class SqlNotifyStore:
    """NotifyStore on `db`, in its dialect `q`; its claims are `claimant`'s."""

    def __init__(self, db: Db, q: NotifySql, claimant: str) -> None:
        self._db = db
        self._q = q
        self._claimant = claimant

    async def set_channel(self, project: str, name: str, kind: str, spec: str, now_ms: int,
                          create_only: bool = False) -> tuple[ChannelRow, str]:
        return await self._db.write(set_channel, self._q, project, name, kind, spec, now_ms, create_only)

    async def channels(self, project: str) -> list[ChannelRow]:
        return await self._db.read(channels, self._q, project)

    async def delete_channel(self, project: str, name: str) -> bool:
        return await self._db.write(delete_channel, self._q, project, name)

    async def rules(self, project: str) -> list[NotifyRule] | None:
        return await self._db.read(get_rules, self._q, project)

    async def set_rules(self, project: str, rules: list[NotifyRule] | None, now_ms: int) -> None:
        await self._db.write(set_rules, self._q, project, rules, now_ms)

    async def enqueue_test(self, project: str, channel: str, now_ms: int) -> int:
        return await self._db.write(enqueue_test, self._q, project, channel, now_ms)

    async def due(self, project: str, now_ms: int, limit: int, lease_ms: int,
                  damping: Damping | None = None) -> list[PendingNotice]:
        return await self._db.write(due, self._q, self._claimant, project, now_ms, limit, lease_ms, damping)

    async def release(self, project: str, ids: list[int], now_ms: int) -> None:
        if ids:
            await self._db.write(release, self._q, self._claimant, project, ids, now_ms)

    async def recover(self, project: str, now_ms: int) -> int:
        return await self._db.write(recover, self._q, self._claimant, project, now_ms)

    async def next_due(self, project: str, after_ms: int) -> int | None:
        return await self._db.read(next_due, self._q, project, after_ms)

    async def record(self, project: str, outcomes: list[NoticeOutcome], now_ms: int) -> None:
        if outcomes:
            await self._db.write(record, self._q, project, outcomes, now_ms)

    async def merge(self, project: str, ids: list[int], channel: str, detail: str, count: int, now_ms: int,
                    lease_ms: int) -> int:
        return await self._db.write(merge, self._q, self._claimant, project, ids, channel, detail, count, now_ms,
                                    lease_ms)

    async def log(self, project: str, before_id: int | None, limit: int) -> list[NoticeRecord]:
        return await self._db.read(log, self._q, project, before_id, limit)

    async def health(self, project: str) -> list[ChannelHealth]:
        return await self._db.read(health, self._q, project)

    async def recent_attempts(self, project: str, since_ms: int) -> list[tuple[str, int]]:
        return await self._db.read(recent_attempts, self._q, project, since_ms)
