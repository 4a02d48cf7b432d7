"""PostgreSQL's statements for notifications (edge.storage.notify), and its NotifyStore for
node `node`: the claims are the node's, taken with `FOR UPDATE SKIP LOCKED` so that one
node delivers each message; a streak's row is locked, so two nodes handing out a task's
failures on one channel take turns. Each node runs its own notifier; rate windows and
channel health are each node's own, rebuilt from the shared attempts log when it starts."""

from __future__ import annotations

from edge.storage.notify import NotifySql, SqlNotifyStore
from edge.storage.postgres.db import PgDatabase

_CHANNEL = "SELECT name, kind, spec, created_at_ms, updated_at_ms FROM notify_channels"

NOTIFY = NotifySql(
    channel_exists="SELECT 1 FROM notify_channels WHERE project_id = %s AND name = %s",
    channel_get=_CHANNEL + " WHERE project_id = %s AND name = %s FOR UPDATE",
    channel_set="INSERT INTO notify_channels (project_id, name, kind, spec, created_at_ms, updated_at_ms)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (project_id, name) DO UPDATE SET kind = excluded.kind,"
                " spec = excluded.spec, updated_at_ms = excluded.updated_at_ms"
                " RETURNING name, kind, spec, created_at_ms, updated_at_ms",
    channels=_CHANNEL + " WHERE project_id = %s ORDER BY name",
    channel_delete="DELETE FROM notify_channels WHERE project_id = %s AND name = %s",
    streaks_delete="DELETE FROM notify_streaks WHERE project_id = %s AND channel = %s",
    project_rules="SELECT rules FROM notify_rules WHERE project_id = %s",
    rules_delete="DELETE FROM notify_rules WHERE project_id = %s",
    rules_set="INSERT INTO notify_rules (project_id, rules, updated_at_ms) VALUES (%s, %s, %s)"
              " ON CONFLICT (project_id) DO UPDATE SET rules = excluded.rules, updated_at_ms = excluded.updated_at_ms",
    # Locked, so a node claiming it waits for this transaction or skips it.
    joinable="SELECT id FROM notifications WHERE state = 'pending' AND attempts = 0 AND claimed_by IS NULL"
             " AND project_id = %s AND channel = %s AND task_id IS NOT DISTINCT FROM %s AND event = %s"
             " ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED",
    join="UPDATE notifications SET count = count + 1, run_id = %s, status = %s, exit_code = %s, duration_ms = %s,"
         " detail = %s, created_at_ms = %s WHERE id = %s",
    insert="INSERT INTO notifications (project_id, channel, event, task_id, run_id, status, exit_code, duration_ms,"
           " detail, count, first_at_ms, created_at_ms, state, due_at_ms, last_error, done_at_ms, claimed_by)"
           " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
    prune_messages="DELETE FROM notifications WHERE id IN (SELECT id FROM notifications WHERE state <> 'pending'"
                   " AND id <= %s ORDER BY id LIMIT %s)",
    due="""
SELECT n.id, n.channel, n.event, n.task_id, t.name, n.run_id, n.status, n.exit_code, n.duration_ms, n.detail,
       n.count, n.first_at_ms, n.created_at_ms, n.attempts, c.kind, c.spec
FROM notifications AS n
LEFT JOIN tasks AS t ON t.project_id = n.project_id AND t.id = n.task_id
LEFT JOIN notify_channels AS c ON c.project_id = n.project_id AND c.name = n.channel
WHERE n.state = 'pending' AND n.due_at_ms <= %s AND n.project_id = %s
ORDER BY n.due_at_ms, n.id LIMIT %s FOR UPDATE OF n SKIP LOCKED
""",
    claim="UPDATE notifications SET claimed_by = %s, due_at_ms = %s WHERE id = %s",
    streak="SELECT since_ms, failures, repeats, next_at_ms, mark_ms, last_id, last_count FROM notify_streaks"
           " WHERE project_id = %s AND channel = %s AND task_id = %s FOR UPDATE",
    mark="SELECT since_ms FROM failing_tasks WHERE project_id = %s AND task_id = %s",
    recovery_after="SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = %s AND channel = %s"
                   " AND task_id = %s AND event = 'recovery' AND first_at_ms >= %s LIMIT 1",
    streak_put="INSERT INTO notify_streaks (project_id, channel, task_id, since_ms, failures, repeats, next_at_ms,"
               " mark_ms, last_id, last_count) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
               " ON CONFLICT (project_id, channel, task_id) DO UPDATE SET since_ms = excluded.since_ms,"
               " failures = excluded.failures, repeats = excluded.repeats, next_at_ms = excluded.next_at_ms,"
               " mark_ms = excluded.mark_ms, last_id = excluded.last_id, last_count = excluded.last_count",
    streak_count="UPDATE notify_streaks SET failures = %s, last_count = %s WHERE project_id = %s AND channel = %s"
                 " AND task_id = %s",
    streak_delete="DELETE FROM notify_streaks WHERE project_id = %s AND channel = %s AND task_id = %s",
    waiting_failures="SELECT id, count FROM notifications WHERE state = 'pending' AND attempts = 0"
                     " AND claimed_by IS NULL AND project_id = %s AND channel = %s AND task_id = %s"
                     " AND event = 'failure' AND id <> %s AND first_at_ms <= %s FOR UPDATE SKIP LOCKED",
    merge_into="UPDATE notifications SET state = 'merged', merged_into = %s, due_at_ms = NULL, done_at_ms = %s"
               " WHERE id = %s",
    postpone="UPDATE notifications SET due_at_ms = %s WHERE id = %s",
    release="UPDATE notifications SET claimed_by = NULL, due_at_ms = %s WHERE id = %s AND project_id = %s"
            " AND state = 'pending' AND claimed_by = %s",
    recover="UPDATE notifications SET claimed_by = NULL, due_at_ms = least(due_at_ms, %s) WHERE project_id = %s"
            " AND state = 'pending' AND claimed_by = %s",
    next_due="SELECT min(due_at_ms) FROM notifications WHERE state = 'pending' AND due_at_ms > %s"
             " AND project_id = %s",
    pending_channel="SELECT channel FROM notifications WHERE id = %s AND project_id = %s AND state = 'pending'"
                    " FOR UPDATE",
    attempt_insert="INSERT INTO notify_attempts (notification_id, project_id, channel, at_ms, ok, detail, elapsed_ms)"
                   " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
    sent="UPDATE notifications SET state = 'sent', attempts = attempts + 1, due_at_ms = NULL, done_at_ms = %s,"
         " last_error = NULL, claimed_by = NULL WHERE id = %s",
    retry="UPDATE notifications SET attempts = attempts + 1, due_at_ms = %s, last_error = %s, claimed_by = NULL"
          " WHERE id = %s",
    failed="UPDATE notifications SET state = 'failed', attempts = attempts + 1, due_at_ms = NULL, done_at_ms = %s,"
           " last_error = %s, claimed_by = NULL WHERE id = %s",
    prune_attempts="DELETE FROM notify_attempts WHERE id IN (SELECT id FROM notify_attempts WHERE id <= %s"
                   " ORDER BY id LIMIT %s)",
    merged="UPDATE notifications SET state = 'merged', merged_into = %s, due_at_ms = NULL, done_at_ms = %s,"
           " claimed_by = NULL WHERE id = %s AND project_id = %s AND state = 'pending'",
    log="SELECT id, channel, event, task_id, run_id, status, count, state, attempts, created_at_ms, done_at_ms,"
        " last_error, merged_into FROM notifications WHERE project_id = %s AND id < %s ORDER BY id DESC LIMIT %s",
    tries="SELECT at_ms, ok, detail, elapsed_ms FROM notify_attempts WHERE notification_id = %s ORDER BY id DESC"
          " LIMIT %s",
    attempted_channels="SELECT DISTINCT channel FROM notify_attempts WHERE project_id = %s ORDER BY channel",
    recent="SELECT at_ms, ok, detail FROM notify_attempts WHERE project_id = %s AND channel = %s ORDER BY id DESC"
           " LIMIT %s",
    recent_attempts="SELECT channel, at_ms FROM notify_attempts WHERE project_id = %s AND at_ms >= %s ORDER BY id",
)


class PgNotifyStore(SqlNotifyStore):
    """NotifyStore (edge.core.ports.notify) on PostgreSQL, for node `node`: its claims are the node's."""

    def __init__(self, db: PgDatabase, node: str) -> None:
        super().__init__(db, NOTIFY, node)
