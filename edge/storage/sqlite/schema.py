"""Schema migrations, tracked by `PRAGMA user_version`; each one is one transaction."""

from __future__ import annotations

import os

import apsw

_V1 = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value ANY
) STRICT, WITHOUT ROWID;

CREATE TABLE tasks (
    project_id TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    revision INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE task_revisions (
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    spec_schema TEXT NOT NULL,
    spec TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id, revision),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;

CREATE TABLE triggers (
    project_id TEXT NOT NULL,
    id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    next_fire_at_ms INTEGER,
    last_scheduled_at_ms INTEGER,
    PRIMARY KEY (project_id, id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;

CREATE INDEX triggers_task_idx ON triggers (project_id, task_id);

CREATE TABLE trigger_revisions (
    project_id TEXT NOT NULL,
    trigger_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    spec_schema TEXT NOT NULL,
    spec TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, trigger_id, revision),
    FOREIGN KEY (project_id, trigger_id) REFERENCES triggers (project_id, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;

CREATE TABLE trigger_events (
    id INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    trigger_id TEXT NOT NULL,
    type TEXT NOT NULL,
    reason TEXT,
    scheduled_for_ms INTEGER,
    created_at_ms INTEGER NOT NULL
) STRICT;

CREATE INDEX trigger_events_trigger_idx ON trigger_events (project_id, trigger_id, id DESC);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    trigger_id TEXT,
    trigger_revision INTEGER,
    origin TEXT NOT NULL,
    status TEXT NOT NULL,
    version INTEGER NOT NULL,
    event_seq INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    queued_at_ms INTEGER,
    started_at_ms INTEGER,
    finished_at_ms INTEGER,
    scheduled_for_ms INTEGER,
    exit_code INTEGER,
    error_code TEXT,
    error_summary TEXT,
    log_bytes INTEGER NOT NULL DEFAULT 0,
    log_truncated INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT UNIQUE,
    jitter_ms INTEGER,
    pid INTEGER,
    pid_start_ticks INTEGER
) STRICT;

CREATE INDEX runs_task_created_idx ON runs (project_id, task_id, created_at_ms DESC, id DESC);
CREATE INDEX runs_project_created_idx ON runs (project_id, created_at_ms DESC, id DESC);
-- Small by construction: only runs that are not finished yet.
CREATE INDEX runs_active_idx ON runs (project_id, task_id) WHERE status IN ('queued', 'running');

CREATE TABLE run_events (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    sequence INTEGER NOT NULL,
    type TEXT NOT NULL,
    actor_type TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    detail TEXT,
    PRIMARY KEY (run_id, sequence)
) STRICT, WITHOUT ROWID;

CREATE TABLE credentials (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    permissions TEXT,
    digest BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER
) STRICT, WITHOUT ROWID;

CREATE TABLE secrets (
    project_id TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, name)
) STRICT, WITHOUT ROWID;

CREATE TABLE security_audit (
    id INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    project_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    tool TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reasons TEXT NOT NULL,
    transport TEXT NOT NULL,
    request_id TEXT
) STRICT;
"""

# Retention on write: when the log quota drops a run's log its row stays and says when;
# the runs that still have a log, oldest first (a run's log bytes are set when it
# finishes, so this holds finished runs only); and the running total of the bytes of
# those logs per project, so no write ever sums the runs table.
_V2 = """
ALTER TABLE runs ADD COLUMN log_dropped_at_ms INTEGER;
CREATE INDEX runs_log_idx ON runs (project_id, created_at_ms, id) WHERE log_bytes > 0 AND log_dropped_at_ms IS NULL;
INSERT INTO meta (key, value)
    SELECT 'run_log_bytes:' || project_id, sum(log_bytes) FROM runs GROUP BY project_id
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# Trigger events: consecutive fires with the same outcome share one row (`fires` counts
# them, NULL when too many to count); the scheduler finds armed triggers by cursor; a
# task update finds the triggers pinned to its old revision; a deleted trigger (also
# through its task's cascade) takes its events along.
_V3 = """
DROP INDEX triggers_task_idx;
CREATE INDEX triggers_task_idx ON triggers (project_id, task_id, task_revision);
ALTER TABLE trigger_events ADD COLUMN fires INTEGER DEFAULT 1;
ALTER TABLE trigger_events ADD COLUMN last_scheduled_for_ms INTEGER;
CREATE INDEX trigger_events_project_idx ON trigger_events (project_id, id DESC);
CREATE INDEX triggers_armed_idx ON triggers (project_id, next_fire_at_ms) WHERE next_fire_at_ms IS NOT NULL;
CREATE TRIGGER trigger_events_follow_delete AFTER DELETE ON triggers BEGIN
    DELETE FROM trigger_events WHERE project_id = old.project_id AND trigger_id = old.id;
END;
"""

# The running total of log bytes on disk per project has one owner: these triggers. Every
# insert, log-size change, log drop and delete of a run adjusts it in the same statement,
# whichever code path wrote the row.
_LOG_ON_DISK = "{row}.log_bytes * ({row}.log_dropped_at_ms IS NULL)"
_ADD = (
    "INSERT INTO meta (key, value) VALUES ('run_log_bytes:' || {row}.project_id, {delta})"
    " ON CONFLICT (key) DO UPDATE SET value = value + excluded.value;"
)
_NEW, _OLD = _LOG_ON_DISK.format(row="new"), _LOG_ON_DISK.format(row="old")
_V4 = f"""
CREATE TRIGGER runs_log_total_insert AFTER INSERT ON runs WHEN {_NEW} != 0 BEGIN
    {_ADD.format(row="new", delta=_NEW)}
END;
CREATE TRIGGER runs_log_total_update AFTER UPDATE OF log_bytes, log_dropped_at_ms ON runs
WHEN {_NEW} != {_OLD} BEGIN
    {_ADD.format(row="new", delta=f"{_NEW} - {_OLD}")}
END;
CREATE TRIGGER runs_log_total_delete AFTER DELETE ON runs WHEN {_OLD} != 0 BEGIN
    {_ADD.format(row="old", delta=f"-{_OLD}")}
END;
DELETE FROM meta WHERE key LIKE 'run_log_bytes:%';
INSERT INTO meta (key, value)
    SELECT 'run_log_bytes:' || project_id, sum(log_bytes * (log_dropped_at_ms IS NULL)) FROM runs GROUP BY project_id;
"""

# Imports from crond and qinglong: the key of each imported entry and what it became, so a
# second import of the same source creates nothing. A record goes with its task or secret.
_V5 = """
CREATE TABLE imports (
    project_id TEXT NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX imports_target_idx ON imports (project_id, kind, target);
CREATE TRIGGER imports_follow_task_delete AFTER DELETE ON tasks BEGIN
    DELETE FROM imports WHERE project_id = old.project_id AND kind = 'task' AND target = old.id;
END;
CREATE TRIGGER imports_follow_secret_delete AFTER DELETE ON secrets BEGIN
    DELETE FROM imports WHERE project_id = old.project_id AND kind = 'secret' AND target = old.name;
END;
"""

# Task users: each revision records whether its writer held task.privileged (only such a
# revision may run as root, the daemon's user or a user outside [runner] task_users).
# Revisions written before then ran as the daemon's user by design and keep doing so.
# QLEDGE_* variables are the runner's own: they are removed from stored environments.
_V6 = """
ALTER TABLE task_revisions ADD COLUMN privileged INTEGER NOT NULL DEFAULT 1;
UPDATE task_revisions SET spec = json_set(spec, '$.env', json((
    SELECT json_group_object(key, value) FROM json_each(task_revisions.spec, '$.env')
    WHERE key NOT GLOB 'QLEDGE_*')))
WHERE EXISTS (SELECT 1 FROM json_each(task_revisions.spec, '$.env') WHERE key GLOB 'QLEDGE_*');
"""

# Browsing history: run lists filtered by status or origin, each on an index of its own.
# Only the rare values are indexed (finished but not succeeded; not scheduled), so a quiet
# scheduled run that succeeds writes none of these; the common values are served by the
# general indexes, where nearly every entry matches.
_V7 = """
CREATE INDEX runs_unsuccessful_idx ON runs (project_id, created_at_ms DESC, id DESC)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_task_unsuccessful_idx ON runs (project_id, task_id, created_at_ms DESC, id DESC)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_unscheduled_idx ON runs (project_id, created_at_ms DESC, id DESC) WHERE origin != 'scheduled';
"""

# Ascending time indexes: SQLite walks an index backwards for ORDER BY ... DESC just as well,
# but a new row lands at the right edge of an ascending index, where a full leaf costs one
# new page, while at the left edge of a descending one it rebalances three (about three
# times the pages written per insert, on flash). The history filters' partial indexes too:
# a run enters them near the newest end as well.
_V8 = """
DROP INDEX runs_task_created_idx;
DROP INDEX runs_project_created_idx;
DROP INDEX trigger_events_trigger_idx;
DROP INDEX trigger_events_project_idx;
DROP INDEX runs_unsuccessful_idx;
DROP INDEX runs_task_unsuccessful_idx;
DROP INDEX runs_unscheduled_idx;
CREATE INDEX runs_task_created_idx ON runs (project_id, task_id, created_at_ms, id);
CREATE INDEX runs_project_created_idx ON runs (project_id, created_at_ms, id);
CREATE INDEX trigger_events_trigger_idx ON trigger_events (project_id, trigger_id, id);
CREATE INDEX trigger_events_project_idx ON trigger_events (project_id, id);
CREATE INDEX runs_unsuccessful_idx ON runs (project_id, created_at_ms, id)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_task_unsuccessful_idx ON runs (project_id, task_id, created_at_ms, id)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_unscheduled_idx ON runs (project_id, created_at_ms, id) WHERE origin != 'scheduled';
"""

# The evidence history of AI runs (seed 001): one row per run, `seq` its insertion order
# (retention trims the oldest), listed newest first by creation time.
_V9 = """
CREATE TABLE agent_evidence (
    seq INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    error_code TEXT,
    budget TEXT,
    error TEXT,
    instruction TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    rounds TEXT NOT NULL DEFAULT '[]',
    round_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    usage_estimated INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    answer_summary TEXT,
    position_before INTEGER NOT NULL,
    position_after INTEGER,
    created_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER
) STRICT;
CREATE INDEX agent_evidence_created_idx ON agent_evidence (project_id, created_at_ms, run_id);
"""

# The mission ledger of AI runs (seed 003). A mission is what its attempts (AI runs) share:
# per specialist (`child`) its constraints, work items, the parent's messages with a
# receipt per consumption, and the child's replies. Ledger ids are one sequence per
# mission (`next_id`), which also orders the history; `seq` is insertion order, for
# retention. Deleting a mission deletes its ledger. Every index ascends (see _V8): ledger ids
# grow, so new entries land at the right edge; the history is read backwards.
_V10 = """
CREATE TABLE agent_missions (
    seq INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    goal TEXT NOT NULL,
    next_id INTEGER NOT NULL DEFAULT 1,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (project_id, id)
) STRICT;
CREATE TABLE agent_attempts (
    run_id TEXT PRIMARY KEY,
    mission INTEGER NOT NULL REFERENCES agent_missions (seq) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    UNIQUE (mission, attempt)
) STRICT, WITHOUT ROWID;
CREATE TABLE agent_constraints (
    mission INTEGER NOT NULL REFERENCES agent_missions (seq) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    child TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    version INTEGER NOT NULL,
    status TEXT NOT NULL,
    replaces INTEGER,
    superseded_by INTEGER,
    source_attempt INTEGER NOT NULL,
    source_round INTEGER NOT NULL,
    source_call TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (mission, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX agent_constraints_child_idx ON agent_constraints (mission, child, status, id);
CREATE TABLE agent_work_items (
    mission INTEGER NOT NULL REFERENCES agent_missions (seq) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    child TEXT NOT NULL,
    text TEXT NOT NULL,
    acceptance TEXT,
    status TEXT NOT NULL,
    source_attempt INTEGER NOT NULL,
    source_round INTEGER NOT NULL,
    source_call TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (mission, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX agent_work_items_child_idx ON agent_work_items (mission, child, status, id);
CREATE TABLE agent_messages (
    mission INTEGER NOT NULL REFERENCES agent_missions (seq) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    child TEXT NOT NULL,
    text TEXT NOT NULL,
    status TEXT NOT NULL,
    consumed_seq INTEGER,
    source_attempt INTEGER NOT NULL,
    source_round INTEGER NOT NULL,
    source_call TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (mission, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX agent_messages_pending_idx ON agent_messages (mission, child, id) WHERE status = 'pending';
CREATE INDEX agent_messages_history_idx ON agent_messages (mission, child, consumed_seq) WHERE status = 'consumed';
CREATE TABLE agent_receipts (
    mission INTEGER NOT NULL,
    message INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    PRIMARY KEY (mission, message, request_id),
    FOREIGN KEY (mission, message) REFERENCES agent_messages (mission, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
CREATE TABLE agent_replies (
    mission INTEGER NOT NULL REFERENCES agent_missions (seq) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    child TEXT NOT NULL,
    text TEXT NOT NULL,
    request_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (mission, id),
    UNIQUE (mission, request_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX agent_replies_child_idx ON agent_replies (mission, child, id);
"""

# Retries and notifications. A failed run whose retry is pending carries its due time (a
# small partial index: the scheduler reads it at start); a retry names the run it retries.
# `failing_tasks`: tasks whose last final outcome was a failure, so their next success is a
# recovery (a row is written when that changes, not per run). Channels (their spec JSON
# names secrets, never holds them), the project's default rules, the delivery queue (one
# row per message, coalesced while untried; `claimed_by` while a delivery is in flight)
# and every attempt's outcome. Queue rows and attempts are trimmed on write.
_V11 = """
ALTER TABLE runs ADD COLUMN retry_of TEXT;
ALTER TABLE runs ADD COLUMN attempt INTEGER;
ALTER TABLE runs ADD COLUMN retry_due_at_ms INTEGER;
CREATE INDEX runs_retry_due_idx ON runs (project_id, retry_due_at_ms) WHERE retry_due_at_ms IS NOT NULL;
CREATE TABLE failing_tasks (
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER failing_tasks_follow_delete AFTER DELETE ON tasks BEGIN
    DELETE FROM failing_tasks WHERE project_id = old.project_id AND task_id = old.id;
END;
CREATE TABLE notify_channels (
    project_id TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, name)
) STRICT, WITHOUT ROWID;
CREATE TABLE notify_rules (
    project_id TEXT PRIMARY KEY,
    rules TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    event TEXT NOT NULL,
    task_id TEXT,
    run_id TEXT,
    status TEXT,
    exit_code INTEGER,
    duration_ms INTEGER,
    detail TEXT,
    count INTEGER NOT NULL DEFAULT 1,
    first_at_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    due_at_ms INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    done_at_ms INTEGER,
    merged_into INTEGER,
    claimed_by TEXT
) STRICT;
CREATE INDEX notifications_pending_idx ON notifications (due_at_ms) WHERE state = 'pending';
CREATE INDEX notifications_join_idx ON notifications (project_id, channel, event, task_id)
    WHERE state = 'pending' AND attempts = 0;
CREATE INDEX notifications_project_idx ON notifications (project_id, id);
CREATE TABLE notify_attempts (
    id INTEGER PRIMARY KEY,
    notification_id INTEGER NOT NULL,
    project_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    detail TEXT,
    elapsed_ms INTEGER
) STRICT;
CREATE INDEX notify_attempts_channel_idx ON notify_attempts (project_id, channel, id);
CREATE INDEX notify_attempts_notification_idx ON notify_attempts (notification_id);
"""

# The audit log in three classes, each with its own bounds, so that no volume of one can
# push out another: `call` (allowed calls), `change` (allowed changes of credentials and
# secrets) and `refused` (denied or unauthenticated calls, one row per principal, cause,
# outcome, transport and minute, counting its calls from `at_ms` to `last_at_ms`). The two
# small classes have partial indexes of their own, which an allowed call never writes.
_V12 = """
ALTER TABLE security_audit ADD COLUMN class TEXT NOT NULL DEFAULT 'call';
ALTER TABLE security_audit ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE security_audit ADD COLUMN last_at_ms INTEGER;
UPDATE security_audit SET class = 'refused', last_at_ms = at_ms WHERE outcome != 'allowed';
UPDATE security_audit SET class = 'change' WHERE outcome = 'allowed' AND tool IN (
    'qledge.credential.create', 'qledge.credential.revoke', 'qledge.secret.set', 'qledge.secret.delete',
    'qledge.import.secret', 'qledge.secret.import');
CREATE INDEX security_audit_change_idx ON security_audit (id) WHERE class = 'change';
CREATE INDEX security_audit_refused_idx ON security_audit (id) WHERE class = 'refused';
"""

# The file says it is qledge's (`PRAGMA application_id`, "qled"): a database another
# program made is refused before anything is written to it. Older files are recognised by
# their tables and get the mark here. A revision under a spec schema this version does not
# know is refused when written (and fails closed when read: edge.core.tasks.stored_spec).
# `task_uids`: the uid each task that runs as its own has (TaskUsers.for_task), one per
# task and never two tasks'; the next to hand out is `meta` `task_uids.next`.
APPLICATION_ID = 0x716C6564
_V13 = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TRIGGER task_revisions_known_schema BEFORE INSERT ON task_revisions
WHEN new.spec_schema NOT IN ('qinglong/command@v1', 'qinglong/agent@v1') BEGIN
    SELECT RAISE(ABORT, 'unknown task spec schema');
END;
CREATE TRIGGER task_revisions_schema_kept BEFORE UPDATE OF spec_schema ON task_revisions BEGIN
    SELECT RAISE(ABORT, 'a revision keeps its spec schema');
END;
CREATE TRIGGER trigger_revisions_known_schema BEFORE INSERT ON trigger_revisions
WHEN new.spec_schema != 'qinglong/cron@v1' BEGIN
    SELECT RAISE(ABORT, 'unknown trigger spec schema');
END;
CREATE TRIGGER trigger_revisions_schema_kept BEFORE UPDATE OF spec_schema ON trigger_revisions BEGIN
    SELECT RAISE(ABORT, 'a revision keeps its spec schema');
END;
CREATE TABLE task_uids (
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    uid INTEGER NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
"""

# A task's failure streak on a channel, for damping repeated failure messages
# (edge.storage.sqlite.notify `due`): since when, how many failures were reported, how many
# reminders went and when the next may; the failing mark it belongs to (failing_tasks.since_ms);
# the message last handed out for it and its count then.
_V14 = """
CREATE TABLE notify_streaks (
    project_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    task_id TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    repeats INTEGER NOT NULL,
    next_at_ms INTEGER NOT NULL,
    mark_ms INTEGER,
    last_id INTEGER NOT NULL,
    last_count INTEGER NOT NULL,
    PRIMARY KEY (project_id, channel, task_id)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER notify_streaks_follow_delete AFTER DELETE ON tasks BEGIN
    DELETE FROM notify_streaks WHERE project_id = old.project_id AND task_id = old.id;
END;
"""

# A run's events live in its row (`events`: a JSON array of [sequence, type, actor_type,
# created_at_ms, detail], in sequence order) instead of a table of their own: on flash an
# event appended to the row the same transaction rewrites anyway costs no page, where a row
# of `run_events` (an index B-tree, rebalanced with its siblings on nearly every insert)
# cost about two pages an event, some 3 KB of a quiet run's 15 KB.
_V15 = """
ALTER TABLE runs ADD COLUMN events TEXT NOT NULL DEFAULT '[]';
UPDATE runs SET events = coalesce((
    SELECT json_group_array(json(v)) FROM (
        SELECT json_array(sequence, type, actor_type, created_at_ms, detail) AS v FROM run_events
        WHERE run_id = runs.id ORDER BY sequence)), '[]')
WHERE id IN (SELECT run_id FROM run_events);
DROP TABLE run_events;
"""

# The limits an AI run had (a JSON object of its numbers), kept with its evidence record;
# NULL for records written before: not known.
_V16 = """
ALTER TABLE agent_evidence ADD COLUMN limits TEXT;
"""

# The armed triggers are read only when the scheduler loads its heap (at start and after a
# change to the triggers), never per fire; an index on the cursor was rewritten by every fire
# (its entry moves with the cursor): one flash page a scheduled run for a read that walks the
# project's triggers by their key instead.
_V17 = """
DROP INDEX triggers_armed_idx;
"""

# A quiet scheduled run's row small enough that two share a 512-byte page (a page taken,
# its parent and the free list and file header with it, every other run instead of every
# run), and no unique index entry for a key the row's columns already say:
# - a cron fire's run is named by its fire (edge.core.runs.fire_run_id: the primary key
#   makes a repeat impossible) and its key `cron:…` is derived when read, so `idempotency_key`
#   holds only the keys that are not (`@once`, `@reboot`, retries, and the cron keys of runs
#   admitted before), in a partial unique index; the column's UNIQUE goes with a rebuild
#   of the table (SQLite cannot drop a constraint; rowids kept), its other indexes and its
#   triggers as they were, in the order they were made (the planner's ties follow it). The
#   rows go through a plain copy, each index dropped on its own, and no ALTER TABLE RENAME:
#   SQLite's memory peaks at about 0.45 MiB that way (as earlier migrations), where a
#   rename and a drop of the indexed table took it to 1.4 MiB, which the daemon's
#   resident size keeps;
# - an event is [sequence, type without its `run.` prefix, actor_type, ms after the run's
#   created_at_ms, detail], its detail left out when there is none (the reads add them
#   back): 40 bytes a quiet run's row no longer holds.
_EVENT_V18 = "json_array(e.value ->> 0, iif(e.value ->> 1 GLOB 'run.*', substr(e.value ->> 1, 5), e.value ->> 1)," \
    " e.value ->> 2, (e.value ->> 3) - runs.created_at_ms{detail})"
_RUN_COLUMNS_V18 = (
    "id, project_id, task_id, task_revision, trigger_id, trigger_revision, origin, status, version, "
    "event_seq, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, scheduled_for_ms, "
    "exit_code, error_code, error_summary, log_bytes, log_truncated, idempotency_key, jitter_ms, "
    "pid, pid_start_ticks, log_dropped_at_ms, retry_of, attempt, retry_due_at_ms"
)
_V18 = f"""
CREATE TABLE runs_copy AS SELECT rowid AS copied_rowid, COLS, (
        SELECT json_group_array(json(CASE WHEN e.value ->> 4 IS NULL THEN {_EVENT_V18.format(detail="")}
                                          ELSE {_EVENT_V18.format(detail=", e.value ->> 4")} END))
        FROM json_each(runs.events) AS e) AS events
    FROM runs;
DROP INDEX runs_active_idx;
DROP INDEX runs_log_idx;
DROP INDEX runs_task_created_idx;
DROP INDEX runs_project_created_idx;
DROP INDEX runs_unsuccessful_idx;
DROP INDEX runs_task_unsuccessful_idx;
DROP INDEX runs_unscheduled_idx;
DROP INDEX runs_retry_due_idx;
DROP TRIGGER runs_log_total_insert;
DROP TRIGGER runs_log_total_update;
DROP TRIGGER runs_log_total_delete;
DROP TABLE runs;
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_revision INTEGER NOT NULL,
    trigger_id TEXT,
    trigger_revision INTEGER,
    origin TEXT NOT NULL,
    status TEXT NOT NULL,
    version INTEGER NOT NULL,
    event_seq INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    queued_at_ms INTEGER,
    started_at_ms INTEGER,
    finished_at_ms INTEGER,
    scheduled_for_ms INTEGER,
    exit_code INTEGER,
    error_code TEXT,
    error_summary TEXT,
    log_bytes INTEGER NOT NULL DEFAULT 0,
    log_truncated INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT,
    jitter_ms INTEGER,
    pid INTEGER,
    pid_start_ticks INTEGER,
    log_dropped_at_ms INTEGER,
    retry_of TEXT,
    attempt INTEGER,
    retry_due_at_ms INTEGER,
    events TEXT NOT NULL DEFAULT '[]'
) STRICT;
INSERT INTO runs (rowid, COLS, events) SELECT copied_rowid, COLS, events FROM runs_copy;
DROP TABLE runs_copy;
CREATE UNIQUE INDEX runs_key_idx ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_active_idx ON runs (project_id, task_id) WHERE status IN ('queued', 'running');
CREATE INDEX runs_log_idx ON runs (project_id, created_at_ms, id) WHERE log_bytes > 0 AND log_dropped_at_ms IS NULL;
CREATE TRIGGER runs_log_total_insert AFTER INSERT ON runs WHEN {_NEW} != 0 BEGIN
    {_ADD.format(row="new", delta=_NEW)}
END;
CREATE TRIGGER runs_log_total_update AFTER UPDATE OF log_bytes, log_dropped_at_ms ON runs
WHEN {_NEW} != {_OLD} BEGIN
    {_ADD.format(row="new", delta=f"{_NEW} - {_OLD}")}
END;
CREATE TRIGGER runs_log_total_delete AFTER DELETE ON runs WHEN {_OLD} != 0 BEGIN
    {_ADD.format(row="old", delta=f"-{_OLD}")}
END;
CREATE INDEX runs_task_created_idx ON runs (project_id, task_id, created_at_ms, id);
CREATE INDEX runs_project_created_idx ON runs (project_id, created_at_ms, id);
CREATE INDEX runs_unsuccessful_idx ON runs (project_id, created_at_ms, id)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_task_unsuccessful_idx ON runs (project_id, task_id, created_at_ms, id)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_unscheduled_idx ON runs (project_id, created_at_ms, id) WHERE origin != 'scheduled';
CREATE INDEX runs_retry_due_idx ON runs (project_id, retry_due_at_ms) WHERE retry_due_at_ms IS NOT NULL;
""".replace("COLS", _RUN_COLUMNS_V18)

# A run's stored key (`@once`, `@reboot`, a retry) is unique within its project, not across
# projects: a one-shot or boot trigger of the same id in two projects fires in each.
_V19 = """
DROP INDEX runs_key_idx;
CREATE UNIQUE INDEX runs_key_idx ON runs (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
"""

# The time indexes of runs hold a run's project, task and time, not its 36-character id: a
# quiet run's entries are half as big, so their 512-byte pages split half as often (about 1.6
# fewer WAL frames a scheduled run, 0.9 KB). Runs of the same millisecond are still read in id
# order: SQLite sorts that millisecond's runs alone ("USE TEMP B-TREE FOR LAST TERM OF ORDER
# BY"). Recreated in their old order (the planner's ties follow it). The unsuccessful runs'
# condition is spelled as equalities: SQLite evaluates an IN of four constants, at every update
# of a run, through a temporary B-tree it builds each time (edge.storage.runs.UNSUCCESSFUL_OR).
_V20 = """
DROP INDEX runs_log_idx;
DROP INDEX runs_task_created_idx;
DROP INDEX runs_project_created_idx;
DROP INDEX runs_unsuccessful_idx;
DROP INDEX runs_task_unsuccessful_idx;
DROP INDEX runs_unscheduled_idx;
CREATE INDEX runs_log_idx ON runs (project_id, created_at_ms) WHERE log_bytes > 0 AND log_dropped_at_ms IS NULL;
CREATE INDEX runs_task_created_idx ON runs (project_id, task_id, created_at_ms);
CREATE INDEX runs_project_created_idx ON runs (project_id, created_at_ms);
CREATE INDEX runs_unsuccessful_idx ON runs (project_id, created_at_ms)
    WHERE (status = 'failed' OR status = 'timed_out' OR status = 'lost' OR status = 'cancelled');
CREATE INDEX runs_task_unsuccessful_idx ON runs (project_id, task_id, created_at_ms)
    WHERE (status = 'failed' OR status = 'timed_out' OR status = 'lost' OR status = 'cancelled');
CREATE INDEX runs_unscheduled_idx ON runs (project_id, created_at_ms) WHERE origin != 'scheduled';
"""

MIGRATIONS: tuple[str, ...] = (
    _V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12, _V13, _V14, _V15, _V16, _V17, _V18, _V19,
    _V20,
)


class SchemaTooNew(apsw.SQLError):
    """The database was written by a newer qledge; its message is the line to show."""


class NotOurs(apsw.SQLError):
    """The file is a SQLite database of another program; its message is the line to show."""


def check_owned(conn: apsw.Connection) -> int:
    """Refuse, reading only, a database this qledge must not write: a newer schema, another
    program's file. Returns its schema version (0: new and empty). Call before anything
    that writes (the page size, the journal mode, a migration)."""
    version = conn.pragma("user_version")
    if version > len(MIGRATIONS):
        raise SchemaTooNew(
            f"database schema version {version} is newer than this qledge ({len(MIGRATIONS)}):"
            " upgrade qledge or restore a backup"
        )
    app = conn.pragma("application_id")
    name = os.path.basename(conn.filename)
    if app not in (0, APPLICATION_ID):
        raise NotOurs(f"{name} belongs to another program (application id {app:#x}), not qledge:"
                      " move it away (or point home at another directory)")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    if app == 0 and (tables if version == 0 else not {"meta", "tasks", "runs"} <= tables):
        shown = ", ".join(sorted(tables)[:3]) + (", …" if len(tables) > 3 else "")
        raise NotOurs(f"{name} is not a qledge database (schema version {version}, tables {shown or 'none'}):"
                      " move it away (or point home at another directory)")
    return int(version)


def migrate(conn: apsw.Connection) -> int:
    """Bring the schema to the newest version; returns the version now in place."""
    version = check_owned(conn)
    for number in range(version + 1, len(MIGRATIONS) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Not cached: each statement runs once, and apsw's cache would keep up to 100 of
            # them prepared (about 0.3 MiB for a new database's) long after.
            conn.execute(MIGRATIONS[number - 1], can_cache=False)
            conn.pragma("user_version", number)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return len(MIGRATIONS)
