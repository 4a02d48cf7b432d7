"""SQLite's statements for the storage rules (edge/storage/*.py), one section per port.

Every hot statement here rides an index; tests run the real EXPLAIN QUERY PLAN of each
(tests/test_store.py, test_scheduler.py, test_history.py, test_ai_plans.py). The rules that
use them are written once for both backends; PostgreSQL's statements for the same rules
are edge/storage/postgres/sql.py. (One module for every port: the `edge` zipapp profile
counts its files.)
"""

from __future__ import annotations

from edge.storage.admission import AdmissionSql, Dialect
from edge.storage.catalog import CatalogSql
from edge.storage.reads import ReadsSql
from edge.storage.runs import COLUMNS, FIELDS, FINISHED, TRIM, UNSUCCESSFUL_OR, RunsSql
from edge.storage.security import POSITIONAL_ORDER, SecuritySql

# -- tasks and triggers (edge.storage.catalog) ----------------------------------------------

_TASK = """
SELECT t.project_id, t.id, t.name, r.revision, r.enabled, r.spec, r.content_digest,
       t.created_at_ms, t.updated_at_ms, r.privileged, r.spec_schema
FROM tasks AS t
JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
"""
_TRIGGER = """
SELECT h.project_id, h.id, h.revision, h.task_id, h.task_revision, h.enabled, r.spec_schema, r.spec,
       r.content_digest, h.created_at_ms, h.updated_at_ms, h.next_fire_at_ms, h.last_scheduled_at_ms
FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
"""
_EVENT = "id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms, fires, created_at_ms"
_HEAD = "SELECT revision FROM tasks WHERE project_id = ? AND id = ?"
_TASK_EXISTS = "SELECT 1 FROM tasks WHERE project_id = ? AND id = ?"

CATALOG = CatalogSql(
    # The head's revision, or a given one (a run executes the revision it was admitted with).
    task_get=_TASK + "WHERE t.project_id = ? AND t.id = ? AND r.revision = coalesce(?, t.revision)",
    task_list=_TASK + "WHERE t.project_id = ? AND t.id > ? AND r.revision = t.revision ORDER BY t.id LIMIT ?",
    task_head=_HEAD,
    task_lock=_HEAD,  # BEGIN IMMEDIATE holds every writer off already
    task_insert="INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
                " VALUES (?, ?, ?, 1, ?, ?, ?) ON CONFLICT DO NOTHING",
    task_revision_insert="INSERT INTO task_revisions (project_id, task_id, revision, spec_schema, spec, content_digest,"
                         " enabled, created_at_ms, privileged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    task_update="UPDATE tasks SET revision = ?, enabled = ?, name = coalesce(?, name), updated_at_ms = ?"
                " WHERE project_id = ? AND id = ?",
    task_exists=_TASK_EXISTS,
    task_exists_locked=_TASK_EXISTS,
    task_revision_exists="SELECT 1 FROM task_revisions WHERE project_id = ? AND task_id = ? AND revision = ?",
    task_active_run="SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND status IN ('queued', 'running')"
                    " LIMIT 1",
    task_triggers="SELECT id FROM triggers WHERE project_id = ? AND task_id = ? ORDER BY id",
    task_runs_delete="DELETE FROM runs WHERE project_id = ? AND task_id = ? RETURNING id",
    task_delete="DELETE FROM tasks WHERE project_id = ? AND id = ?",
    imported="SELECT target FROM imports WHERE project_id = ? AND key = ?",
    imports="SELECT key, kind, target, created_at_ms FROM imports WHERE project_id = ? AND key > ? ORDER BY key"
            " LIMIT ?",
    import_claim="INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (?, ?, ?, ?, ?)"
                 " ON CONFLICT DO NOTHING",
    import_retarget="UPDATE imports SET target = ? WHERE project_id = ? AND key = ?",
    uid_get="SELECT uid FROM task_uids WHERE project_id = ? AND task_id = ?",
    uids_used="SELECT uid FROM task_uids WHERE uid BETWEEN ? AND ?",
    uid_insert="INSERT INTO task_uids (project_id, task_id, uid, created_at_ms) VALUES (?, ?, ?, ?)",
    meta_get="SELECT value FROM meta WHERE key = ?",
    meta_set="INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    # An aggregate of refused calls: its last call.
    newest_audit="SELECT max(at_ms, coalesce(last_at_ms, at_ms)) FROM security_audit ORDER BY id DESC LIMIT 1",
    newest_run="SELECT max(created_at_ms) FROM runs WHERE project_id = ?",
    trigger_get=_TRIGGER + "WHERE h.project_id = ? AND h.id = ?",
    trigger_lock=_TRIGGER + "WHERE h.project_id = ? AND h.id = ?",
    trigger_list=_TRIGGER + "WHERE h.project_id = ? AND h.id > ? ORDER BY h.id LIMIT ?",
    trigger_exists="SELECT 1 FROM triggers WHERE project_id = ? AND id = ?",
    trigger_insert="INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
                   " updated_at_ms, next_fire_at_ms) VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
    trigger_revision_insert="INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision,"
                            " enabled, spec_schema, spec, content_digest, created_at_ms)"
                            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    trigger_update="UPDATE triggers SET revision = ?, enabled = ?, task_revision = ?, updated_at_ms = ?,"
                   " next_fire_at_ms = ? WHERE project_id = ? AND id = ?",
    trigger_delete="DELETE FROM triggers WHERE project_id = ? AND id = ?",
    following="SELECT id FROM triggers WHERE project_id = ? AND task_id = ? AND task_revision = ?",
    events_trigger=f"SELECT {_EVENT} FROM trigger_events WHERE project_id = ? AND trigger_id = ? AND id < ?"
                   " ORDER BY id DESC LIMIT ?",
    events_project=f"SELECT {_EVENT} FROM trigger_events WHERE project_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
    newest_event="SELECT id, type, reason, coalesce(last_scheduled_for_ms, scheduled_for_ms), fires FROM"
                 " trigger_events WHERE project_id = ? AND trigger_id = ? ORDER BY id DESC LIMIT 1",
    event_merge="UPDATE trigger_events SET fires = ?, last_scheduled_for_ms = ? WHERE id = ?",
    event_insert="INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms,"
                 " last_scheduled_for_ms, fires, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    events_prune="DELETE FROM trigger_events WHERE id IN (SELECT id FROM trigger_events WHERE project_id = ?"
                 " AND trigger_id = ? ORDER BY id DESC LIMIT ? OFFSET ?)",
    drop_boot_fires=None,  # @reboot is armed per device (meta), by admission
)

# -- credentials, secrets, the audit (edge.storage.security) ------------------------------

_CREDENTIAL = "id, project_id, name, role, permissions, created_at_ms, revoked_at_ms"

_AUDIT_INSERT = (f"INSERT INTO security_audit ({', '.join(POSITIONAL_ORDER)})"
                 f" VALUES ({', '.join('?' * len(POSITIONAL_ORDER))})")

SECURITY = SecuritySql(
    credential_insert=f"INSERT INTO credentials ({_CREDENTIAL}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                      " ON CONFLICT DO NOTHING",
    credential_get=f"SELECT {_CREDENTIAL}, digest FROM credentials WHERE id = ?",
    credentials=f"SELECT {_CREDENTIAL} FROM credentials WHERE project_id = ? ORDER BY created_at_ms, id",
    credential_revoke="UPDATE credentials SET revoked_at_ms = coalesce(revoked_at_ms, ?) WHERE id = ?"
                      f" AND project_id = ? RETURNING {_CREDENTIAL}",
    secret_set="INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?)"
               " ON CONFLICT (project_id, name) DO UPDATE SET value = excluded.value,"
               " updated_at_ms = excluded.updated_at_ms RETURNING created_at_ms, updated_at_ms",
    secret_insert="INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?)"
                  " ON CONFLICT DO NOTHING",
    secret_exists="SELECT 1 FROM secrets WHERE project_id = ? AND name = ?",
    secret_value="SELECT value FROM secrets WHERE project_id = ? AND name = ?",
    secret_names="SELECT name, created_at_ms, updated_at_ms FROM secrets WHERE project_id = ? ORDER BY name",
    secret_values="SELECT value FROM secrets WHERE project_id = ?",
    secret_delete="DELETE FROM secrets WHERE project_id = ? AND name = ?",
    import_exists="SELECT 1 FROM imports WHERE project_id = ? AND key = ?",
    import_claim="INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (?, ?, ?, ?, ?)"
                 " ON CONFLICT DO NOTHING",
    import_drop="DELETE FROM imports WHERE project_id = ? AND key = ?",
    audit_insert=_AUDIT_INSERT,
    audit_insert_id="SELECT last_insert_rowid()",
    audit_by_position=True,
    audit_insert_call=_AUDIT_INSERT,
    audit_oldest_call="SELECT id FROM security_audit WHERE class = 'call' ORDER BY id LIMIT 1",
    # Of the oldest batch of calls, those under the cut or too old; the batch as an id range
    # (its newest id), not `id IN (SELECT …)`, which fills a temporary B-tree first.
    audit_prune_calls="DELETE FROM security_audit WHERE class = 'call' AND id <= (SELECT max(id) FROM (SELECT id"
                      " FROM security_audit WHERE class = 'call' ORDER BY id LIMIT ?)) AND (id <= ? OR at_ms < ?)",
    audit_count="SELECT count(*) FROM security_audit WHERE class = '{cls}'",
    audit_prune="DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, coalesce(last_at_ms, at_ms) AS t,"
                " row_number() OVER (ORDER BY id) AS n FROM (SELECT id, at_ms, last_at_ms FROM security_audit"
                " WHERE class = '{cls}' ORDER BY id LIMIT ?)) WHERE n <= ? OR t < ?)",
    audit_add="UPDATE security_audit SET count = count + ?, last_at_ms = max(coalesce(last_at_ms, at_ms), ?),"
              " request_id = NULL, tool = CASE WHEN ? THEN '*' ELSE tool END,"
              " reasons = CASE WHEN ? THEN ? ELSE reasons END WHERE id = ?",
    # Newest first along the rowid: no index of its own (an audited call writes no more).
    audit_page="SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id, class, count,"
               " last_at_ms FROM security_audit WHERE id < ? AND project_id = ? ORDER BY id DESC LIMIT ?",
    audit_trim=32,
    audit_trim_every=16,
)


# -- runs, their events and retention (edge.storage.runs) ---------------------------------

# A run's events are a JSON array in its row (schema migrations 15 and 18): [sequence, type
# without its `run.` prefix, actor_type, ms after the run's created_at_ms, detail (left out
# when there is none)] each, appended in sequence order, so that a quiet run's row fits in
# half a page. The parameters are those of a row of PostgreSQL's run_events (run_id,
# sequence, type, actor_type, created_at_ms, detail); every run event type begins with
# `run.` (edge.core.runs), one that did not would be stored and read whole.
_STORED_TYPE = "iif({0} GLOB 'run.*', substr({0}, 5), {0})"
_RUN_EVENT = (
    "UPDATE runs SET events = json_insert(events, '$[#]', json(iif(?6 IS NULL,"
    f" json_array(?2, {_STORED_TYPE.format('?3')}, ?4, ?5 - created_at_ms),"
    f" json_array(?2, {_STORED_TYPE.format('?3')}, ?4, ?5 - created_at_ms, ?6)))) WHERE id = ?1"
)
# The events of one run, in sequence order, as rows of run_events would be: one row read by
# its key, then json_each walks its array from the first element (no ORDER BY: a sort step
# would only repeat the order the array has).
_EVENTS = "runs AS r, json_each(r.events) AS e"
# sequence, type, actor_type and created_at_ms of an element `e` of a row `r`'s events; then its detail
_EVENT_HEAD = ("e.value ->> 0, iif(e.value ->> 1 GLOB '*.*', e.value ->> 1, 'run.' || (e.value ->> 1)),"
               " e.value ->> 2, r.created_at_ms + (e.value ->> 3)")
_EVENT_COLUMNS = _EVENT_HEAD + ", e.value ->> 4"

RUNS = RunsSql(
    mark="?",
    get=f"SELECT {COLUMNS} FROM runs WHERE id = ? AND project_id = ?",
    # Keyset pages in (created_at_ms DESC, id DESC); row values let the index seek to the cursor.
    page_project=f"SELECT {COLUMNS} FROM runs WHERE project_id = ? AND (created_at_ms, id) < (?, ?)"
                 " ORDER BY created_at_ms DESC, id DESC LIMIT ?",
    page_task=f"SELECT {COLUMNS} FROM runs WHERE project_id = ? AND task_id = ? AND (created_at_ms, id) < (?, ?)"
              " ORDER BY created_at_ms DESC, id DESC LIMIT ?",
    lock="SELECT project_id, task_id, status, version, event_seq, NULL, NULL FROM runs WHERE id = ?",
    # The run with its first event: one cell written once (growing it in the same
    # transaction would rebalance its page with its neighbours).
    insert=f"INSERT INTO runs ({COLUMNS}, events) VALUES ({', '.join(':' + f for f in FIELDS)},"
           f" json_array(json_array(:event_seq, {_STORED_TYPE.format(':event_type')}, :actor, 0)))"
           " ON CONFLICT DO NOTHING",
    first_event_in_insert=True,
    event_insert=_RUN_EVENT,
    event_bump="UPDATE runs SET event_seq = event_seq + 1 WHERE id = ?",
    seq_after="SELECT event_seq FROM runs WHERE id = ?",
    fence_bump="UPDATE runs SET event_seq = event_seq + 1 WHERE id = ?",
    on_terminal="",
    log_copy=None,  # the log stays in its file, beside the database
    retry_policy="SELECT json_extract(spec, '$.retry') FROM task_revisions WHERE project_id = ? AND task_id = ?"
                 " AND revision = ?",
    retry_due="UPDATE runs SET retry_due_at_ms = ? WHERE id = ?",
    task_rules="SELECT json_extract(spec, '$.notify') FROM task_revisions WHERE project_id = ? AND task_id = ?"
               " AND revision = ?",
    failing="SELECT 1 FROM failing_tasks WHERE project_id = ? AND task_id = ?",
    failing_set="INSERT INTO failing_tasks (project_id, task_id, since_ms) VALUES (?, ?, ?)",
    failing_clear="DELETE FROM failing_tasks WHERE project_id = ? AND task_id = ?",
    any_channel="SELECT 1 FROM notify_channels WHERE project_id = ? LIMIT 1",
    # Work for the notifier: a message pending (or in flight), or a channel whose latest attempt failed.
    notices_waiting="""
SELECT EXISTS (SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = ?)
    OR EXISTS (SELECT 1 FROM notify_attempts AS a WHERE a.project_id = ? AND NOT a.ok
               AND a.id = (SELECT max(b.id) FROM notify_attempts AS b WHERE b.project_id = a.project_id
                           AND b.channel = a.channel))
""",
    # Retention walks the time indexes in their own order: time, then the order the runs were
    # stored (rowid; the indexes hold no id, and putting one millisecond's runs in id order
    # would sort them in a temporary B-tree on every run's end). Which of two runs of the same
    # millisecond goes first does not change how many are kept.
    # Finished runs of a task beyond the newest kept (newest first).
    excess=f"SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND {FINISHED}"
           " ORDER BY created_at_ms DESC, rowid DESC LIMIT ? OFFSET ?",
    expired=f"SELECT id FROM runs WHERE project_id = ? AND created_at_ms < ? AND {FINISHED}"
            " ORDER BY created_at_ms, rowid LIMIT ?",
    # The partial index holds exactly the runs that still have a log (set when they finish).
    logged=f"SELECT id, log_bytes FROM runs WHERE project_id = ? AND log_bytes > 0 AND log_dropped_at_ms IS NULL"
           f" AND {FINISHED} ORDER BY created_at_ms, rowid LIMIT ?",
    delete="DELETE FROM runs WHERE id = ?",
    drop_log="UPDATE runs SET log_dropped_at_ms = ?, version = version + 1, event_seq = event_seq + 1"
             " WHERE id = ?",
    drop_log_copy=None,
    log_total="SELECT value FROM meta WHERE key = ?",
    trim=TRIM,
    unsuccessful=UNSUCCESSFUL_OR,
    scan="SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = ?{terms}"
         " AND (created_at_ms, id) < (?, ?){since} ORDER BY created_at_ms DESC, id DESC LIMIT ?",
    scan_active="SELECT id, created_at_ms, status, origin FROM runs INDEXED BY runs_active_idx"
                " WHERE project_id = ?{terms} AND status IN ('queued', 'running') AND (created_at_ms, id) < (?, ?)"
                "{since}",
    search_runs=None,  # point reads, in the worker: no round trips to save
    # `+project_id`: the primary key's range, never a walk of a project index and a sort.
    prefix="SELECT id FROM runs WHERE id >= ? AND id < ? AND +project_id = ? ORDER BY id LIMIT ?",
    active=f"SELECT {COLUMNS} FROM runs WHERE status IN ('queued', 'running')",
    active_processes=f"SELECT {COLUMNS}, pid, pid_start_ticks FROM runs WHERE status IN ('queued', 'running')",
    events=f"SELECT r.id, {_EVENT_COLUMNS} FROM {_EVENTS} WHERE r.id = ? AND r.project_id = ? AND e.value ->> 0 > ?"
           " LIMIT ?",
    notify="edge.storage.sqlite.notify",
)


# -- admission (edge.storage.admission) --------------------------------------------------

# +1 when an event's time is in the restamped range and its run's creation is not, -1 the other way round.
_IN_RANGE = "({0} > :after AND {0} <= :upto)"
_EVENT_MOVES = (f"{_IN_RANGE.format('runs.created_at_ms + (e.value ->> 3)')}"
                f" - {_IN_RANGE.format('runs.created_at_ms')}")

ADMISSION = Dialect(
    admission=AdmissionSql(
        named=":{}",
        # The project's triggers along their key (no index on the cursor: every fire would
        # rewrite it), sorted by `armed`.
        armed="SELECT next_fire_at_ms, id FROM triggers WHERE project_id = :project AND next_fire_at_ms IS NOT NULL",
        armed_retries="SELECT retry_due_at_ms, id FROM runs WHERE project_id = ? AND retry_due_at_ms IS NOT NULL"
                      " ORDER BY retry_due_at_ms",
        pinned_task="""
SELECT t.enabled, coalesce(json_extract(r.spec, '$.overlap'), 'forbid')
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
WHERE t.project_id = ? AND t.id = ? AND r.revision = ?
""",
        head_task="""
SELECT t.enabled, t.revision, r.spec_schema, r.spec
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
    AND r.revision = t.revision
WHERE t.project_id = ? AND t.id = ?
""",
        active_for_task="SELECT id FROM runs WHERE project_id = ? AND task_id = ? AND status IN ('queued', 'running')",
        active_count="SELECT count(*) FROM runs WHERE status IN ('queued', 'running')",
        live_slots=None,
        by_key="SELECT id FROM runs WHERE project_id = ? AND idempotency_key = ?",
        move_cursor="UPDATE triggers SET next_fire_at_ms = ?, last_scheduled_at_ms = ? WHERE project_id = ? AND id = ?",
        save_time="INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET"
                  " value = max(value, excluded.value)",
        retry_due="SELECT retry_due_at_ms FROM runs WHERE id = ? AND project_id = ?",
        retry_clear="UPDATE runs SET retry_due_at_ms = NULL WHERE id = ?",
        boot_get="SELECT value FROM meta WHERE key = ?",
        boot_set="INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        reboot_triggers="""
SELECT h.id FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
WHERE h.project_id = ? AND h.enabled = 1 AND json_extract(r.spec, '$.expression') = ?
""",
        arm="UPDATE triggers SET next_fire_at_ms = ? WHERE project_id = ? AND id = ?",
        boot_fire=None,
        boot_fire_drop=None,
        restamped=(
            ("runs", ("created_at_ms", "queued_at_ms", "started_at_ms", "finished_at_ms", "log_dropped_at_ms",
                      "retry_due_at_ms")),
            ("security_audit", ("at_ms",)),
            ("notifications", ("first_at_ms", "created_at_ms", "due_at_ms", "done_at_ms")),
            ("notify_attempts", ("at_ms",)),
            ("failing_tasks", ("since_ms",)),
        ),
        # The events' times, inside the runs' rows, are offsets from created_at_ms: one moves
        # when its time moves and its run's creation does not, or the other way round (read
        # before created_at_ms moves).
        restamp_more=(f"""
UPDATE runs SET events = (
    SELECT json_group_array(json_replace(e.value, '$[3]', (e.value ->> 3) + :shift * ({_EVENT_MOVES})))
    FROM json_each(runs.events) AS e)
WHERE EXISTS (SELECT 1 FROM json_each(runs.events) AS e WHERE {_EVENT_MOVES} != 0)
""",),
    ),
    catalog=CATALOG,
    runs=RUNS,
)


# -- the AI read tools and `qledge status` (edge.storage.reads) ---------------------------

_TASK_HEAD = """
SELECT t.project_id, t.id, t.revision, t.name, json_extract(r.spec, '$.command.kind'), r.spec_schema,
       t.enabled, t.updated_at_ms{extra}
FROM tasks AS t
LEFT JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.revision
"""
_RUN = (
    "SELECT id, project_id, task_id, task_revision, status, origin, created_at_ms, queued_at_ms,"
    " started_at_ms, finished_at_ms, exit_code, log_bytes, retry_of FROM runs"
)

READS = ReadsSql(
    task_list=_TASK_HEAD.format(extra="") + "WHERE t.project_id = ? AND t.id > ? ORDER BY t.id LIMIT ?",
    task_get=_TASK_HEAD.format(extra=", r.content_digest, t.created_at_ms") + "WHERE t.project_id = ? AND t.id = ?",
    trigger_list="""
SELECT g.project_id, g.id, g.revision, g.task_id, g.task_revision, r.spec_schema, g.enabled, g.updated_at_ms
FROM triggers AS g
LEFT JOIN trigger_revisions AS r ON r.project_id = g.project_id AND r.trigger_id = g.id AND r.revision = g.revision
WHERE g.project_id = ? AND g.id > ? ORDER BY g.id LIMIT ?
""",
    run_get=_RUN + " WHERE id = ? AND project_id = ?",
    # Row values let runs_project_created_idx seek straight to the cursor.
    run_page=_RUN + " WHERE project_id = ? AND (created_at_ms, id) < (?, ?) ORDER BY created_at_ms DESC, id DESC"
                    " LIMIT ?",
    run_events=f"""
SELECT r.id, r.project_id, {_EVENT_HEAD}
FROM {_EVENTS}
WHERE r.id = ? AND r.project_id = ? AND e.value ->> 0 > ? LIMIT ?
""",
    window="SELECT id, project_id, task_id, status, created_at_ms FROM runs"
           " WHERE project_id = ? AND task_id = ? ORDER BY created_at_ms DESC, id DESC LIMIT ?",
    counts="""
SELECT (SELECT count(*) FROM tasks WHERE project_id = :p),
       (SELECT count(*) FROM triggers WHERE project_id = :p),
       (SELECT count(*) FROM runs WHERE project_id = :p),
       (SELECT count(*) FROM runs WHERE project_id = :p AND status IN ('queued', 'running')),
       (SELECT count(*) FROM credentials WHERE project_id = :p AND revoked_at_ms IS NULL)
""",
)
