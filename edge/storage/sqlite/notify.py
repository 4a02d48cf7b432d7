"""SQLite's statements for notifications (edge.storage.notify), and its NotifyStore: one
daemon per database, so every claim is its own (`local`). It ships with edge/notify/
(packaging/build.py)."""

from __future__ import annotations

from edge.storage.notify import NotifySql, SqlNotifyStore
from edge.storage.sqlite.db import Database

CLAIMANT = "local"

_PENDING = """
SELECT n.id, n.channel, n.event, n.task_id, t.name, n.run_id, n.status, n.exit_code, n.duration_ms, n.detail,
       n.count, n.first_at_ms, n.created_at_ms, n.attempts, c.kind, c.spec
FROM notifications AS n
LEFT JOIN tasks AS t ON t.project_id = n.project_id AND t.id = n.task_id
LEFT JOIN notify_channels AS c ON c.project_id = n.project_id AND c.name = n.channel
"""
_CHANNEL = "SELECT name, kind, spec, created_at_ms, updated_at_ms FROM notify_channels"

NOTIFY = NotifySql(
    channel_exists="SELECT 1 FROM notify_channels WHERE project_id = ? AND name = ?",
    channel_get=_CHANNEL + " WHERE project_id = ? AND name = ?",
    channel_set="INSERT INTO notify_channels (project_id, name, kind, spec, created_at_ms, updated_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, name) DO UPDATE SET kind = excluded.kind,"
                " spec = excluded.spec, updated_at_ms = excluded.updated_at_ms"
                " RETURNING name, kind, spec, created_at_ms, updated_at_ms",
    channels=_CHANNEL + " WHERE project_id = ? ORDER BY name",
    channel_delete="DELETE FROM notify_channels WHERE project_id = ? AND name = ?",
    streaks_delete="DELETE FROM notify_streaks WHERE project_id = ? AND channel = ?",
    project_rules="SELECT rules FROM notify_rules WHERE project_id = ?",
    rules_delete="DELETE FROM notify_rules WHERE project_id = ?",
    rules_set="INSERT INTO notify_rules (project_id, rules, updated_at_ms) VALUES (?, ?, ?) ON CONFLICT (project_id)"
              " DO UPDATE SET rules = excluded.rules, updated_at_ms = excluded.updated_at_ms",
    joinable="SELECT id FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
             " AND project_id = ? AND channel = ? AND task_id IS ? AND event = ? ORDER BY id DESC LIMIT 1",
    join="UPDATE notifications SET count = count + 1, run_id = ?, status = ?, exit_code = ?, duration_ms = ?,"
         " detail = ?, created_at_ms = ? WHERE id = ?",
    insert="INSERT INTO notifications (project_id, channel, event, task_id, run_id, status, exit_code, duration_ms,"
           " detail, count, first_at_ms, created_at_ms, state, due_at_ms, last_error, done_at_ms, claimed_by)"
           " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    prune_messages="DELETE FROM notifications WHERE id IN (SELECT id FROM notifications WHERE state != 'pending'"
                   " AND id <= ? ORDER BY id LIMIT ?)",
    due=_PENDING + "WHERE n.state = 'pending' AND n.due_at_ms <= ? AND n.project_id = ? ORDER BY n.due_at_ms, n.id"
                   " LIMIT ?",
    claim="UPDATE notifications SET claimed_by = ?, due_at_ms = ? WHERE id = ?",
    streak="SELECT since_ms, failures, repeats, next_at_ms, mark_ms, last_id, last_count FROM notify_streaks"
           " WHERE project_id = ? AND channel = ? AND task_id = ?",
    mark="SELECT since_ms FROM failing_tasks WHERE project_id = ? AND task_id = ?",
    # A recovery waiting on the channel for a success after the failure: the failure is folded into it.
    recovery_after="SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = ? AND channel = ?"
                   " AND task_id = ? AND event = 'recovery' AND first_at_ms >= ? LIMIT 1",
    streak_put="INSERT INTO notify_streaks (project_id, channel, task_id, since_ms, failures, repeats, next_at_ms,"
               " mark_ms, last_id, last_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
               " ON CONFLICT (project_id, channel, task_id) DO UPDATE SET since_ms = excluded.since_ms,"
               " failures = excluded.failures, repeats = excluded.repeats, next_at_ms = excluded.next_at_ms,"
               " mark_ms = excluded.mark_ms, last_id = excluded.last_id, last_count = excluded.last_count",
    streak_count="UPDATE notify_streaks SET failures = ?, last_count = ? WHERE project_id = ? AND channel = ?"
                 " AND task_id = ?",
    streak_delete="DELETE FROM notify_streaks WHERE project_id = ? AND channel = ? AND task_id = ?",
    waiting_failures="SELECT id, count FROM notifications WHERE state = 'pending' AND attempts = 0"
                     " AND claimed_by IS NULL AND project_id = ? AND channel = ? AND task_id = ? AND event = 'failure'"
                     " AND id != ? AND first_at_ms <= ?",
    merge_into="UPDATE notifications SET state = 'merged', merged_into = ?, due_at_ms = NULL, done_at_ms = ?"
               " WHERE id = ?",
    postpone="UPDATE notifications SET due_at_ms = ? WHERE id = ?",
    release="UPDATE notifications SET claimed_by = NULL, due_at_ms = ? WHERE id = ? AND project_id = ?"
            " AND state = 'pending' AND claimed_by = ?",
    recover="UPDATE notifications SET claimed_by = NULL, due_at_ms = min(due_at_ms, ?) WHERE project_id = ?"
            " AND state = 'pending' AND claimed_by = ?",
    next_due="SELECT min(due_at_ms) FROM notifications WHERE state = 'pending' AND due_at_ms > ? AND project_id = ?",
    pending_channel="SELECT channel FROM notifications WHERE id = ? AND project_id = ? AND state = 'pending'",
    attempt_insert="INSERT INTO notify_attempts (notification_id, project_id, channel, at_ms, ok, detail, elapsed_ms)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
    sent="UPDATE notifications SET state = 'sent', attempts = attempts + 1, due_at_ms = NULL, done_at_ms = ?,"
         " last_error = NULL, claimed_by = NULL WHERE id = ?",
    retry="UPDATE notifications SET attempts = attempts + 1, due_at_ms = ?, last_error = ?, claimed_by = NULL"
          " WHERE id = ?",
    failed="UPDATE notifications SET state = 'failed', attempts = attempts + 1, due_at_ms = NULL, done_at_ms = ?,"
           " last_error = ?, claimed_by = NULL WHERE id = ?",
    prune_attempts="DELETE FROM notify_attempts WHERE id IN (SELECT id FROM notify_attempts WHERE id <= ?"
                   " ORDER BY id LIMIT ?)",
    merged="UPDATE notifications SET state = 'merged', merged_into = ?, due_at_ms = NULL, done_at_ms = ?,"
           " claimed_by = NULL WHERE id = ? AND project_id = ? AND state = 'pending'",
    log="SELECT id, channel, event, task_id, run_id, status, count, state, attempts, created_at_ms, done_at_ms,"
        " last_error, merged_into FROM notifications WHERE project_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
    tries="SELECT at_ms, ok, detail, elapsed_ms FROM notify_attempts WHERE notification_id = ? ORDER BY id DESC"
          " LIMIT ?",
    attempted_channels="SELECT DISTINCT channel FROM notify_attempts WHERE project_id = ? ORDER BY channel",
    recent="SELECT at_ms, ok, detail FROM notify_attempts WHERE project_id = ? AND channel = ? ORDER BY id DESC"
           " LIMIT ?",
    recent_attempts="SELECT channel, at_ms FROM notify_attempts WHERE project_id = ? AND at_ms >= ? ORDER BY id",
)


class SqliteNotifyStore(SqlNotifyStore):
    """NotifyStore (edge.core.ports.notify) on the daemon's database."""

    def __init__(self, db: Database) -> None:
        super().__init__(db, NOTIFY, CLAIMANT)
