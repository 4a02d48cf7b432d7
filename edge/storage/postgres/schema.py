"""The cluster schema, versioned like SQLite's: MIGRATIONS[n - 1] takes the database to
version n, each in one transaction, under an advisory lock so that nodes starting
together migrate once. Text keys use the "C" collation: ids sort byte by byte, as on
SQLite, whatever the database's locale.
"""

from __future__ import annotations

from edge.core.errors import ToolError
from edge.storage.postgres.db import PgDatabase
from edge.storage.tx import Tx

MIGRATE_LOCK = 0x71_6C_65_64  # "qled": one key per database, held only while migrating

_V1 = """
CREATE TABLE meta (
    key text COLLATE "C" PRIMARY KEY,
    value bigint NOT NULL
);

CREATE TABLE tasks (
    project_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    name text NOT NULL,
    revision integer NOT NULL,
    enabled boolean NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, id)
);

CREATE TABLE task_revisions (
    project_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    revision integer NOT NULL,
    spec_schema text NOT NULL,
    spec text NOT NULL,
    content_digest text NOT NULL,
    enabled boolean NOT NULL,
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, task_id, revision),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
);

CREATE TABLE triggers (
    project_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    revision integer NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    task_revision integer NOT NULL,
    enabled boolean NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    next_fire_at_ms bigint,
    last_scheduled_at_ms bigint,
    PRIMARY KEY (project_id, id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
);
CREATE INDEX triggers_task_idx ON triggers (project_id, task_id, task_revision);
CREATE INDEX triggers_armed_idx ON triggers (project_id, next_fire_at_ms) WHERE next_fire_at_ms IS NOT NULL;

CREATE TABLE trigger_revisions (
    project_id text COLLATE "C" NOT NULL,
    trigger_id text COLLATE "C" NOT NULL,
    revision integer NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    task_revision integer NOT NULL,
    enabled boolean NOT NULL,
    spec_schema text NOT NULL,
    spec text NOT NULL,
    content_digest text NOT NULL,
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, trigger_id, revision),
    FOREIGN KEY (project_id, trigger_id) REFERENCES triggers (project_id, id) ON DELETE CASCADE
);

CREATE TABLE trigger_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id text COLLATE "C" NOT NULL,
    trigger_id text COLLATE "C" NOT NULL,
    type text NOT NULL,
    reason text,
    scheduled_for_ms bigint,
    last_scheduled_for_ms bigint,
    fires integer DEFAULT 1,
    created_at_ms bigint NOT NULL,
    FOREIGN KEY (project_id, trigger_id) REFERENCES triggers (project_id, id) ON DELETE CASCADE
);
CREATE INDEX trigger_events_trigger_idx ON trigger_events (project_id, trigger_id, id DESC);
CREATE INDEX trigger_events_project_idx ON trigger_events (project_id, id DESC);

-- Every claim draws a new fence: a completion must present the fence of the claim it ends.
CREATE SEQUENCE run_fence;

CREATE TABLE runs (
    id text COLLATE "C" PRIMARY KEY,
    project_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    task_revision integer NOT NULL,
    trigger_id text COLLATE "C",
    trigger_revision integer,
    origin text NOT NULL,
    status text NOT NULL,
    version integer NOT NULL,
    event_seq integer NOT NULL,
    created_at_ms bigint NOT NULL,
    queued_at_ms bigint,
    started_at_ms bigint,
    finished_at_ms bigint,
    scheduled_for_ms bigint,
    exit_code integer,
    error_code text,
    error_summary text,
    log_bytes bigint NOT NULL DEFAULT 0,
    log_truncated boolean NOT NULL DEFAULT false,
    idempotency_key text COLLATE "C" UNIQUE,
    jitter_ms integer,
    log_dropped_at_ms bigint,
    pid integer,
    pid_start_ticks bigint,
    forbid boolean NOT NULL DEFAULT false,    -- its task revision's overlap policy is forbid
    not_before_ms bigint,                     -- jitter: not claimed before this time
    node_id text COLLATE "C",                 -- the node that claimed it
    fence bigint,
    lease_until timestamptz,                  -- PostgreSQL's clock, never a node's
    cancel_reason text                        -- a cancel asked on another node, for the owner
);
CREATE INDEX runs_task_created_idx ON runs (project_id, task_id, created_at_ms DESC, id DESC);
CREATE INDEX runs_project_created_idx ON runs (project_id, created_at_ms DESC, id DESC);
CREATE INDEX runs_active_idx ON runs (project_id, task_id) WHERE status IN ('queued', 'running');
-- Overlap `forbid` across nodes: one active run per forbid task, whatever raced.
CREATE UNIQUE INDEX runs_forbid_active_idx ON runs (project_id, task_id)
    WHERE forbid AND status IN ('queued', 'running');
CREATE INDEX runs_claimable_idx ON runs (project_id, created_at_ms, id) WHERE status = 'queued' AND node_id IS NULL;
CREATE INDEX runs_leased_idx ON runs (lease_until) WHERE status IN ('queued', 'running') AND node_id IS NOT NULL;
CREATE INDEX runs_log_idx ON runs (project_id, created_at_ms, id) WHERE log_bytes > 0 AND log_dropped_at_ms IS NULL;

CREATE TABLE run_events (
    run_id text COLLATE "C" NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    sequence integer NOT NULL,
    type text NOT NULL,
    actor_type text NOT NULL,
    created_at_ms bigint NOT NULL,
    detail text,
    PRIMARY KEY (run_id, sequence)
);

-- A finished run's log (head + tail within the run's cap), readable from every node.
CREATE TABLE run_logs (
    run_id text COLLATE "C" PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    data bytea NOT NULL
);

-- The running total of log bytes per project has one owner: this trigger.
CREATE FUNCTION runs_log_total() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta bigint := 0;
    project text;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.log_dropped_at_ms IS NULL THEN
        delta := delta - OLD.log_bytes;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.log_dropped_at_ms IS NULL THEN
        delta := delta + NEW.log_bytes;
    END IF;
    IF delta <> 0 THEN
        project := CASE WHEN TG_OP = 'DELETE' THEN OLD.project_id ELSE NEW.project_id END;
        INSERT INTO meta (key, value) VALUES ('run_log_bytes:' || project, delta)
            ON CONFLICT (key) DO UPDATE SET value = meta.value + excluded.value;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER runs_log_total AFTER INSERT OR DELETE OR UPDATE OF log_bytes, log_dropped_at_ms ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_log_total();

CREATE TABLE credentials (
    id text COLLATE "C" PRIMARY KEY,
    project_id text COLLATE "C" NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    permissions text,
    digest bytea NOT NULL,
    created_at_ms bigint NOT NULL,
    revoked_at_ms bigint
);

CREATE TABLE secrets (
    project_id text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value text NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, name)
);

CREATE TABLE security_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms bigint NOT NULL,
    project_id text NOT NULL,
    principal text NOT NULL,
    tool text NOT NULL,
    outcome text NOT NULL,
    reasons text NOT NULL,
    transport text NOT NULL,
    request_id text,
    node_id text                              -- which node answered the call
);

CREATE TABLE nodes (
    id text COLLATE "C" PRIMARY KEY,
    project_id text COLLATE "C" NOT NULL,
    slots integer NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);
"""

# Imports from crond and qinglong (as SQLite's version 5): each imported entry's key and
# what it became; a record goes with its task or secret. @reboot per node: the kernel boot
# id each node last started in, the fires its boot armed and it has not admitted yet, and
# the run such a fire made, which only that node may claim (`for_node`; it holds a lease
# from admission, so it is lost if its node never takes it).
_V2 = """
CREATE TABLE imports (
    project_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    kind text NOT NULL,
    target text COLLATE "C" NOT NULL,
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, key)
);
CREATE INDEX imports_target_idx ON imports (project_id, kind, target);
CREATE FUNCTION imports_follow_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM imports WHERE project_id = OLD.project_id AND kind = 'task' AND target = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER imports_follow_task AFTER DELETE ON tasks FOR EACH ROW EXECUTE FUNCTION imports_follow_task();
CREATE FUNCTION imports_follow_secret() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM imports WHERE project_id = OLD.project_id AND kind = 'secret' AND target = OLD.name;
    RETURN NULL;
END $$;
CREATE TRIGGER imports_follow_secret AFTER DELETE ON secrets FOR EACH ROW EXECUTE FUNCTION imports_follow_secret();

CREATE TABLE node_boots (
    project_id text COLLATE "C" NOT NULL,
    node_id text COLLATE "C" NOT NULL,
    boot_id text NOT NULL,
    booted_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, node_id)
);
CREATE TABLE boot_fires (
    project_id text COLLATE "C" NOT NULL,
    trigger_id text COLLATE "C" NOT NULL,
    node_id text COLLATE "C" NOT NULL,
    boot_id text NOT NULL,
    due_ms bigint NOT NULL,
    PRIMARY KEY (project_id, node_id, trigger_id),
    FOREIGN KEY (project_id, trigger_id) REFERENCES triggers (project_id, id) ON DELETE CASCADE
);
CREATE INDEX boot_fires_trigger_idx ON boot_fires (project_id, trigger_id);
ALTER TABLE runs ADD COLUMN for_node text COLLATE "C";
-- The reaper also finds a node's own queued runs it never took: any run with a lease.
DROP INDEX runs_leased_idx;
CREATE INDEX runs_leased_idx ON runs (lease_until) WHERE status IN ('queued', 'running') AND lease_until IS NOT NULL;
"""

# Task users (as SQLite's version 6): each revision records whether its writer held
# task.privileged (only such a revision may run as root, the daemon's user or a user outside
# [runner] task_users). Revisions written before then ran as the daemon's user by design and
# keep doing so; from now on every insert must say (no default: a node still running an
# older qledge fails to write a revision rather than mark it privileged). QLEDGE_* variables
# are the runner's own: they are removed from stored environments.
_V3 = """
ALTER TABLE task_revisions ADD COLUMN privileged boolean NOT NULL DEFAULT true;
ALTER TABLE task_revisions ALTER COLUMN privileged DROP DEFAULT;
UPDATE task_revisions SET spec = jsonb_set(spec::jsonb, '{env}', coalesce((
    SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(spec::jsonb -> 'env') AS e
    WHERE left(e.key, 7) <> 'QLEDGE_'), '{}'::jsonb))::text
WHERE EXISTS (SELECT 1 FROM jsonb_each(spec::jsonb -> 'env') AS e WHERE left(e.key, 7) = 'QLEDGE_');
"""

# Browsing history (as SQLite's version 7): run lists filtered by status or origin, each on
# an index of its own. Only the rare values are indexed (finished but not succeeded; not
# scheduled), so a quiet scheduled run that succeeds writes none of these.
_V4 = """
CREATE INDEX runs_unsuccessful_idx ON runs (project_id, created_at_ms DESC, id DESC)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_task_unsuccessful_idx ON runs (project_id, task_id, created_at_ms DESC, id DESC)
    WHERE status IN ('failed', 'timed_out', 'lost', 'cancelled');
CREATE INDEX runs_unscheduled_idx ON runs (project_id, created_at_ms DESC, id DESC) WHERE origin <> 'scheduled';
"""

# The evidence history of AI runs (as SQLite's version 8, seed 001): one row per run, `seq`
# its insertion order (retention trims the oldest), listed newest first by creation time.
_V5 = """
CREATE TABLE agent_evidence (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text COLLATE "C" NOT NULL UNIQUE,
    project_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    task_revision integer NOT NULL,
    state text NOT NULL,
    error_code text,
    budget text,
    error text,
    instruction text NOT NULL,
    provider text NOT NULL,
    model text NOT NULL,
    rounds jsonb NOT NULL DEFAULT '[]',
    round_count integer NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    usage_estimated boolean NOT NULL DEFAULT false,
    cost_usd double precision,
    answer_summary text,
    position_before bigint NOT NULL,
    position_after bigint,
    created_at_ms bigint NOT NULL,
    finished_at_ms bigint
);
CREATE INDEX agent_evidence_created_idx ON agent_evidence (project_id, created_at_ms DESC, run_id DESC);
"""

# Retries and notifications (as SQLite's version 11): a failed run's pending retry and the run
# a retry retries; tasks whose last final outcome was a failure; channels (their spec names
# secrets, never holds them), the default rules, the delivery queue (`claimed_by`: the node
# delivering it, until its due time, the claim's end) and every attempt's outcome.
_V6 = """
ALTER TABLE runs ADD COLUMN retry_of text COLLATE "C";
ALTER TABLE runs ADD COLUMN attempt integer;
ALTER TABLE runs ADD COLUMN retry_due_at_ms bigint;
CREATE INDEX runs_retry_due_idx ON runs (project_id, retry_due_at_ms) WHERE retry_due_at_ms IS NOT NULL;
CREATE TABLE failing_tasks (
    project_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    since_ms bigint NOT NULL,
    PRIMARY KEY (project_id, task_id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
);
CREATE TABLE notify_channels (
    project_id text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    kind text NOT NULL,
    spec text NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, name)
);
CREATE TABLE notify_rules (
    project_id text COLLATE "C" PRIMARY KEY,
    rules text NOT NULL,
    updated_at_ms bigint NOT NULL
);
CREATE TABLE notifications (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    event text NOT NULL,
    task_id text COLLATE "C",
    run_id text COLLATE "C",
    status text,
    exit_code integer,
    duration_ms bigint,
    detail text,
    count integer NOT NULL DEFAULT 1,
    first_at_ms bigint NOT NULL,
    created_at_ms bigint NOT NULL,
    state text NOT NULL,
    due_at_ms bigint,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    done_at_ms bigint,
    merged_into bigint,
    claimed_by text COLLATE "C"
);
CREATE INDEX notifications_pending_idx ON notifications (project_id, due_at_ms) WHERE state = 'pending';
CREATE INDEX notifications_join_idx ON notifications (project_id, channel, event, task_id)
    WHERE state = 'pending' AND attempts = 0;
CREATE INDEX notifications_project_idx ON notifications (project_id, id);
CREATE TABLE notify_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id bigint NOT NULL,
    project_id text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    at_ms bigint NOT NULL,
    ok boolean NOT NULL,
    detail text,
    elapsed_ms bigint
);
CREATE INDEX notify_attempts_channel_idx ON notify_attempts (project_id, channel, id);
CREATE INDEX notify_attempts_notification_idx ON notify_attempts (notification_id);
"""

# The audit in three classes, each with its own bounds (as SQLite's version 12): `call`
# (allowed calls), `change` (allowed changes of credentials and secrets) and `refused`
# (denied or unauthenticated calls, one row per principal, cause, outcome, transport and
# minute, counting its calls from `at_ms` to `last_at_ms`). The two small classes have
# partial indexes of their own, which an allowed call never writes.
_V7 = """
ALTER TABLE security_audit ADD COLUMN class text NOT NULL DEFAULT 'call';
ALTER TABLE security_audit ADD COLUMN count bigint NOT NULL DEFAULT 1;
ALTER TABLE security_audit ADD COLUMN last_at_ms bigint;
UPDATE security_audit SET class = 'refused', last_at_ms = at_ms WHERE outcome <> 'allowed';
UPDATE security_audit SET class = 'change' WHERE outcome = 'allowed' AND tool IN (
    'qledge.credential.create', 'qledge.credential.revoke', 'qledge.secret.set', 'qledge.secret.delete',
    'qledge.import.secret', 'qledge.secret.import');
CREATE INDEX security_audit_change_idx ON security_audit (id) WHERE class = 'change';
CREATE INDEX security_audit_refused_idx ON security_audit (id) WHERE class = 'refused';
"""

# As SQLite's version 13: a revision under a spec schema this version does not know is
# refused when written (rows already there are checked when read); the uid each task that
# runs as its own has, never two tasks' (the next to hand out: meta `task_uids.next`).
_V8 = """
ALTER TABLE task_revisions ADD CONSTRAINT task_revisions_known_schema
    CHECK (spec_schema IN ('qinglong/command@v1', 'qinglong/agent@v1')) NOT VALID;
ALTER TABLE trigger_revisions ADD CONSTRAINT trigger_revisions_known_schema
    CHECK (spec_schema = 'qinglong/cron@v1') NOT VALID;
CREATE TABLE task_uids (
    project_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    uid bigint NOT NULL UNIQUE,
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (project_id, task_id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
);
"""

# A task's failure streak on a channel, for damping repeated failure messages
# (edge.storage.postgres.notify `due`; as SQLite's version 14).
_V9 = """
CREATE TABLE notify_streaks (
    project_id text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    since_ms bigint NOT NULL,
    failures bigint NOT NULL,
    repeats integer NOT NULL,
    next_at_ms bigint NOT NULL,
    mark_ms bigint,
    last_id bigint NOT NULL,
    last_count bigint NOT NULL,
    PRIMARY KEY (project_id, channel, task_id),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, id) ON DELETE CASCADE
);
"""

# The limits an AI run had, kept with its evidence record (as SQLite's version 16); NULL for
# records written before: not known.
_V10 = """
ALTER TABLE agent_evidence ADD COLUMN limits jsonb;
"""

# A run's stored key is unique within its project, not across projects (as SQLite's
# version 19): a one-shot or boot trigger of the same id in two projects fires in each.
_V11 = """
ALTER TABLE runs DROP CONSTRAINT runs_idempotency_key_key;
ALTER TABLE runs ADD CONSTRAINT runs_project_key_key UNIQUE (project_id, idempotency_key);
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11)

SQL_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS qledge_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL)"
)


def _migrate(tx: Tx) -> int:
    tx.lock(MIGRATE_LOCK)
    tx.execute(SQL_VERSION_TABLE)
    (version,) = tx.one("SELECT coalesce(max(version), 0) FROM qledge_schema")
    if version > len(MIGRATIONS):
        raise ToolError("unavailable", f"database schema version {version} is newer than this qledge "
                                       f"({len(MIGRATIONS)})")
    if version < len(MIGRATIONS):
        tx.execute(MIGRATIONS[version])
        tx.execute("INSERT INTO qledge_schema (version, applied_at) VALUES (%s, now())", (version + 1,))
    return version + (version < len(MIGRATIONS))


async def migrate(db: PgDatabase) -> int:
    """Bring the schema to the newest version, one migration per transaction."""
    while True:
        before = len(MIGRATIONS)
        version = await db.write(_migrate)
        if version >= before:
            return version
