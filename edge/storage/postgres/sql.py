"""PostgreSQL's statements for the storage rules (edge/storage/*.py), one section per port:
the rules are written once for both backends, and SQLite's statements for them are
edge/storage/sqlite/sql.py. Here rows a rule changes are locked (`FOR UPDATE`), so writers
on several nodes serialize per row; tests/test_postgres_plans.py runs the real EXPLAIN of
each hot statement.
"""

from __future__ import annotations

from edge.storage.admission import AdmissionSql, Dialect
from edge.storage.catalog import CatalogSql
from edge.storage.reads import ReadsSql
from edge.storage.runs import COLUMNS, FIELDS, FINISHED, UNSUCCESSFUL_IN, RunsSql
from edge.storage.security import SecuritySql

# -- tasks and triggers (edge.storage.catalog) ----------------------------------------------

_TASK = """
SELECT t.project_id, t.id, t.name, r.revision, r.enabled, r.spec, r.content_digest, t.created_at_ms, t.updated_at_ms,
       r.privileged, r.spec_schema
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
"""
_TRIGGER = """
SELECT h.project_id, h.id, h.revision, h.task_id, h.task_revision, h.enabled, r.spec_schema, r.spec,
       r.content_digest, h.created_at_ms, h.updated_at_ms, h.next_fire_at_ms, h.last_scheduled_at_ms
FROM triggers AS h
JOIN trigger_revisions AS r ON r.project_id = h.project_id AND r.trigger_id = h.id AND r.revision = h.revision
"""
_EVENT = "id, trigger_id, type, reason, scheduled_for_ms, last_scheduled_for_ms, fires, created_at_ms"
_TRIGGER_GET = _TRIGGER + "WHERE h.project_id = %s AND h.id = %s"

CATALOG = CatalogSql(
    task_get=_TASK + "WHERE t.project_id = %s AND t.id = %s AND r.revision = coalesce(%s, t.revision)",
    task_list=_TASK + "WHERE t.project_id = %s AND t.id > %s AND r.revision = t.revision ORDER BY t.id LIMIT %s",
    task_head="SELECT revision FROM tasks WHERE project_id = %s AND id = %s",
    task_lock="SELECT revision FROM tasks WHERE project_id = %s AND id = %s FOR UPDATE",
    task_insert="INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
                " VALUES (%s, %s, %s, 1, %s, %s, %s) ON CONFLICT DO NOTHING",
    task_revision_insert="INSERT INTO task_revisions (project_id, task_id, revision, spec_schema, spec, content_digest,"
                         " enabled, created_at_ms, privileged) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
    task_update="UPDATE tasks SET revision = %s, enabled = %s, name = coalesce(%s, name), updated_at_ms = %s"
                " WHERE project_id = %s AND id = %s",
    task_exists="SELECT 1 FROM tasks WHERE project_id = %s AND id = %s",
    task_exists_locked="SELECT 1 FROM tasks WHERE project_id = %s AND id = %s FOR KEY SHARE",
    task_revision_exists="SELECT 1 FROM task_revisions WHERE project_id = %s AND task_id = %s AND revision = %s",
    task_active_run="SELECT id FROM runs WHERE project_id = %s AND task_id = %s AND status IN ('queued', 'running')"
                    " LIMIT 1",
    task_triggers="SELECT id FROM triggers WHERE project_id = %s AND task_id = %s ORDER BY id",
    task_runs_delete="DELETE FROM runs WHERE project_id = %s AND task_id = %s RETURNING id",
    task_delete="DELETE FROM tasks WHERE project_id = %s AND id = %s",
    imported="SELECT target FROM imports WHERE project_id = %s AND key = %s",
    imports="SELECT key, kind, target, created_at_ms FROM imports WHERE project_id = %s AND key > %s ORDER BY key"
            " LIMIT %s",
    import_claim="INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (%s, %s, %s, %s, %s)"
                 " ON CONFLICT DO NOTHING",
    import_retarget="UPDATE imports SET target = %s WHERE project_id = %s AND key = %s",
    uid_get="SELECT uid FROM task_uids WHERE project_id = %s AND task_id = %s",
    uids_used="SELECT uid FROM task_uids WHERE uid BETWEEN %s AND %s",
    uid_insert="INSERT INTO task_uids (project_id, task_id, uid, created_at_ms) VALUES (%s, %s, %s, %s)",
    meta_get="SELECT value FROM meta WHERE key = %s",
    meta_set="INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    newest_audit="SELECT greatest(at_ms, coalesce(last_at_ms, at_ms)) FROM security_audit ORDER BY id DESC LIMIT 1",
    newest_run="SELECT max(created_at_ms) FROM runs WHERE project_id = %s",
    trigger_get=_TRIGGER_GET,
    trigger_lock=_TRIGGER_GET + " FOR UPDATE OF h",
    trigger_list=_TRIGGER + "WHERE h.project_id = %s AND h.id > %s ORDER BY h.id LIMIT %s",
    trigger_exists="SELECT 1 FROM triggers WHERE project_id = %s AND id = %s",
    trigger_insert="INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
                   " updated_at_ms, next_fire_at_ms) VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
    trigger_revision_insert="INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision,"
                            " enabled, spec_schema, spec, content_digest, created_at_ms)"
                            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
    trigger_update="UPDATE triggers SET revision = %s, enabled = %s, task_revision = %s, updated_at_ms = %s,"
                   " next_fire_at_ms = %s WHERE project_id = %s AND id = %s",
    trigger_delete="DELETE FROM triggers WHERE project_id = %s AND id = %s",
    following="SELECT id FROM triggers WHERE project_id = %s AND task_id = %s AND task_revision = %s ORDER BY id",
    events_trigger=f"SELECT {_EVENT} FROM trigger_events WHERE project_id = %s AND trigger_id = %s AND id < %s"
                   " ORDER BY id DESC LIMIT %s",
    events_project=f"SELECT {_EVENT} FROM trigger_events WHERE project_id = %s AND id < %s ORDER BY id DESC LIMIT %s",
    newest_event="SELECT id, type, reason, coalesce(last_scheduled_for_ms, scheduled_for_ms), fires FROM"
                 " trigger_events WHERE project_id = %s AND trigger_id = %s ORDER BY id DESC LIMIT 1",
    event_merge="UPDATE trigger_events SET fires = %s, last_scheduled_for_ms = %s WHERE id = %s",
    event_insert="INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms,"
                 " last_scheduled_for_ms, fires, created_at_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
    events_prune="DELETE FROM trigger_events WHERE id IN (SELECT id FROM trigger_events WHERE project_id = %s"
                 " AND trigger_id = %s ORDER BY id DESC LIMIT %s OFFSET %s)",
    drop_boot_fires="DELETE FROM boot_fires WHERE project_id = %s AND trigger_id = %s",
)

# -- credentials, secrets, the audit (edge.storage.security) ------------------------------

_CREDENTIAL = "id, project_id, name, role, permissions, created_at_ms, revoked_at_ms"

SECURITY = SecuritySql(
    credential_insert=f"INSERT INTO credentials ({_CREDENTIAL}, digest) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                      " ON CONFLICT DO NOTHING",
    credential_get=f"SELECT {_CREDENTIAL}, digest FROM credentials WHERE id = %s",
    credentials=f"SELECT {_CREDENTIAL} FROM credentials WHERE project_id = %s ORDER BY created_at_ms, id",
    credential_revoke="UPDATE credentials SET revoked_at_ms = coalesce(revoked_at_ms, %s) WHERE id = %s"
                      f" AND project_id = %s RETURNING {_CREDENTIAL}",
    secret_set="INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms)"
               " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (project_id, name) DO UPDATE SET value = excluded.value,"
               " updated_at_ms = excluded.updated_at_ms RETURNING created_at_ms, updated_at_ms",
    secret_insert="INSERT INTO secrets (project_id, name, value, created_at_ms, updated_at_ms)"
                  " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
    secret_exists="SELECT 1 FROM secrets WHERE project_id = %s AND name = %s",
    secret_value="SELECT value FROM secrets WHERE project_id = %s AND name = %s",
    secret_names="SELECT name, created_at_ms, updated_at_ms FROM secrets WHERE project_id = %s ORDER BY name",
    secret_values="SELECT value FROM secrets WHERE project_id = %s",
    secret_delete="DELETE FROM secrets WHERE project_id = %s AND name = %s",
    import_exists="SELECT 1 FROM imports WHERE project_id = %s AND key = %s",
    import_claim="INSERT INTO imports (project_id, key, kind, target, created_at_ms) VALUES (%s, %s, %s, %s, %s)"
                 " ON CONFLICT DO NOTHING",
    import_drop="DELETE FROM imports WHERE project_id = %s AND key = %s",
    audit_insert="INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport,"
                 " request_id, node_id, class, count, last_at_ms) VALUES (%(at_ms)s, %(project_id)s, %(principal)s,"
                 " %(tool)s, %(outcome)s, %(reasons)s, %(transport)s, %(request_id)s, %(node_id)s, %(class)s,"
                 " %(count)s, %(last_at_ms)s) RETURNING id",
    audit_oldest_call="SELECT id FROM security_audit WHERE class = 'call' ORDER BY id LIMIT 1",
    audit_prune_calls="DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
                      " WHERE class = 'call' ORDER BY id LIMIT %s) AS oldest WHERE id <= %s OR at_ms < %s)",
    audit_count="SELECT count(*) FROM security_audit WHERE class = '{cls}'",
    audit_prune="DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, coalesce(last_at_ms, at_ms) AS t,"
                " row_number() OVER (ORDER BY id) AS n FROM (SELECT id, at_ms, last_at_ms FROM security_audit"
                " WHERE class = '{cls}' ORDER BY id LIMIT %s) AS oldest) AS numbered WHERE n <= %s OR t < %s)",
    audit_add="UPDATE security_audit SET count = count + %s, last_at_ms = greatest(coalesce(last_at_ms, at_ms), %s),"
              " request_id = NULL, tool = CASE WHEN %s THEN '*' ELSE tool END,"
              " reasons = CASE WHEN %s THEN %s ELSE reasons END WHERE id = %s",
    audit_page="SELECT id, at_ms, project_id, principal, tool, outcome, reasons, transport, request_id, class, count,"
               " last_at_ms FROM security_audit WHERE id < %s AND project_id = %s ORDER BY id DESC LIMIT %s",
    audit_trim_every=1,
    audit_trim=0,  # a server's pages, not a router's flash: each write keeps the bound exactly
)


# -- runs, their events and retention (edge.storage.runs) ---------------------------------

_RUN_EVENT = (
    "INSERT INTO run_events (run_id, sequence, type, actor_type, created_at_ms, detail) VALUES (%s, %s, %s, %s, %s, %s)"
)
# A run for one node alone holds a lease from when it may start: lost when that node never takes it.
_LEASE = ("CASE WHEN %(for_node)s::text IS NULL THEN NULL ELSE greatest(now(), to_timestamp(%(lease_from)s / 1000.0))"
          " + make_interval(secs => %(lease_s)s) END")

RUNS = RunsSql(
    mark="%s",
    get=f"SELECT {COLUMNS} FROM runs WHERE id = %s AND project_id = %s",
    page_project=f"SELECT {COLUMNS} FROM runs WHERE project_id = %s AND (created_at_ms, id) < (%s, %s)"
                 " ORDER BY created_at_ms DESC, id DESC LIMIT %s",
    page_task=f"SELECT {COLUMNS} FROM runs WHERE project_id = %s AND task_id = %s AND (created_at_ms, id) < (%s, %s)"
              " ORDER BY created_at_ms DESC, id DESC LIMIT %s",
    lock="SELECT project_id, task_id, status, version, event_seq, node_id, fence FROM runs WHERE id = %s FOR UPDATE",
    insert=f"INSERT INTO runs ({COLUMNS}, forbid, not_before_ms, for_node, lease_until)"
           f" VALUES ({', '.join(f'%({f})s' for f in FIELDS)}, %(forbid)s, %(not_before_ms)s, %(for_node)s, {_LEASE})"
           " ON CONFLICT DO NOTHING",
    event_insert=_RUN_EVENT,
    event_bump="UPDATE runs SET event_seq = event_seq + 1 WHERE id = %s RETURNING event_seq",
    fence_bump="UPDATE runs SET event_seq = event_seq + 1 WHERE id = %s",
    on_terminal=", cancel_reason = NULL",
    # Every node can read a finished run's log: its node stores it in the transaction that finishes it.
    log_copy="INSERT INTO run_logs (run_id, data) VALUES (%s, %s) ON CONFLICT (run_id)"
             " DO UPDATE SET data = excluded.data",
    retry_policy="SELECT (spec::jsonb -> 'retry')::text FROM task_revisions WHERE project_id = %s AND task_id = %s"
                 " AND revision = %s",
    retry_due="UPDATE runs SET retry_due_at_ms = %s WHERE id = %s",
    task_rules="SELECT (spec::jsonb -> 'notify')::text FROM task_revisions WHERE project_id = %s AND task_id = %s"
               " AND revision = %s",
    failing="SELECT 1 FROM failing_tasks WHERE project_id = %s AND task_id = %s",
    failing_set="INSERT INTO failing_tasks (project_id, task_id, since_ms) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
    failing_clear="DELETE FROM failing_tasks WHERE project_id = %s AND task_id = %s",
    any_channel="SELECT 1 FROM notify_channels WHERE project_id = %s LIMIT 1",
    notices_waiting="""
SELECT EXISTS (SELECT 1 FROM notifications WHERE state = 'pending' AND project_id = %s)
    OR EXISTS (SELECT 1 FROM notify_attempts AS a WHERE a.project_id = %s AND NOT a.ok
               AND a.id = (SELECT max(b.id) FROM notify_attempts AS b WHERE b.project_id = a.project_id
                           AND b.channel = a.channel))
""",
    excess=f"SELECT id FROM runs WHERE project_id = %s AND task_id = %s AND {FINISHED}"
           " ORDER BY created_at_ms DESC, id DESC LIMIT %s OFFSET %s",
    expired=f"SELECT id FROM runs WHERE project_id = %s AND created_at_ms < %s AND {FINISHED}"
            " ORDER BY created_at_ms, id LIMIT %s",
    logged=f"SELECT id, log_bytes FROM runs WHERE project_id = %s AND log_bytes > 0 AND log_dropped_at_ms IS NULL"
           f" AND {FINISHED} ORDER BY created_at_ms, id LIMIT %s",
    delete="DELETE FROM runs WHERE id = %s",
    drop_log="UPDATE runs SET log_dropped_at_ms = %s, version = version + 1, event_seq = event_seq + 1"
             " WHERE id = %s RETURNING event_seq",
    drop_log_copy="DELETE FROM run_logs WHERE run_id = %s",
    log_total="SELECT value FROM meta WHERE key = %s",
    trim=0,
    # The partial indexes of schema version 4 serve a search when it repeats their predicate.
    unsuccessful=UNSUCCESSFUL_IN,
    scan="SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = %s{terms}"
         " AND (created_at_ms, id) < (%s, %s){since} ORDER BY created_at_ms DESC, id DESC LIMIT %s",
    scan_active="SELECT id, created_at_ms, status, origin FROM runs WHERE project_id = %s{terms}"
                " AND status IN ('queued', 'running') AND (created_at_ms, id) < (%s, %s){since}",
    search_runs=f"SELECT {COLUMNS} FROM runs WHERE project_id = %s AND id = ANY(%s)",
    # A range of the primary key (its C collation orders ids byte by byte, as SQLite does).
    prefix="SELECT id FROM runs WHERE id >= %s AND id < %s AND project_id = %s ORDER BY id LIMIT %s",
    active=f"SELECT {COLUMNS} FROM runs WHERE status IN ('queued', 'running')",
    active_processes=f"SELECT {COLUMNS}, pid, pid_start_ticks FROM runs WHERE node_id = %(node)s"
                     " AND status IN ('queued', 'running')",
    events="SELECT e.run_id, e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail FROM run_events AS e"
           " JOIN runs AS r ON r.id = e.run_id"
           " WHERE e.run_id = %s AND r.project_id = %s AND e.sequence > %s ORDER BY e.sequence LIMIT %s",
    notify="edge.storage.postgres.notify",
)


# -- admission (edge.storage.admission) --------------------------------------------------

ADMISSION = Dialect(
    admission=AdmissionSql(
        named="%({})s",
        # The shared cursors, and the @reboot fires this node's boot armed.
        armed="""
SELECT next_fire_at_ms, id FROM triggers WHERE project_id = %(project)s AND next_fire_at_ms IS NOT NULL
UNION ALL
SELECT due_ms, trigger_id FROM boot_fires WHERE project_id = %(project)s AND node_id = %(node)s
ORDER BY 1, 2
""",
        armed_retries="SELECT retry_due_at_ms, id FROM runs WHERE project_id = %s AND retry_due_at_ms IS NOT NULL"
                      " ORDER BY retry_due_at_ms, id",
        pinned_task="""
SELECT t.enabled, coalesce(r.spec::jsonb ->> 'overlap', 'forbid')
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
WHERE t.project_id = %s AND t.id = %s AND r.revision = %s
""",
        head_task="""
SELECT t.enabled, t.revision, r.spec_schema, r.spec
FROM tasks AS t JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id
    AND r.revision = t.revision
WHERE t.project_id = %s AND t.id = %s
""",
        active_for_task="SELECT id FROM runs WHERE project_id = %s AND task_id = %s"
                        " AND status IN ('queued', 'running')",
        active_count="SELECT count(*) FROM runs WHERE status IN ('queued', 'running')",
        # Slots of the nodes alive (heartbeat within the lease), for the cluster-wide bound.
        live_slots="SELECT coalesce(sum(slots), 0) FROM nodes WHERE heartbeat_at > now() - make_interval(secs => %s)",
        by_key="SELECT id FROM runs WHERE project_id = %s AND idempotency_key = %s",
        move_cursor="UPDATE triggers SET next_fire_at_ms = %s, last_scheduled_at_ms = %s WHERE project_id = %s"
                    " AND id = %s",
        save_time="INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET"
                  " value = greatest(meta.value, excluded.value)",
        retry_due="SELECT retry_due_at_ms FROM runs WHERE id = %s AND project_id = %s FOR UPDATE",
        retry_clear="UPDATE runs SET retry_due_at_ms = NULL WHERE id = %s",
        boot_get=None,  # per node: edge.storage.postgres.node.PgAdmission
        boot_set=None,
        reboot_triggers=None,
        arm=None,
        boot_fire="SELECT boot_id, due_ms FROM boot_fires WHERE project_id = %s AND node_id = %s AND trigger_id = %s"
                  " FOR UPDATE",
        boot_fire_drop="DELETE FROM boot_fires WHERE project_id = %s AND node_id = %s AND trigger_id = %s",
        restamped=(
            ("runs", ("created_at_ms", "queued_at_ms", "started_at_ms", "finished_at_ms", "log_dropped_at_ms")),
            ("run_events", ("created_at_ms",)),
            ("security_audit", ("at_ms",)),
        ),
    ),
    catalog=CATALOG,
    runs=RUNS,
)


# -- the AI read tools and `qledge status` (edge.storage.reads) ---------------------------

_TASK_HEAD = """
SELECT t.project_id, t.id, t.revision, t.name, r.spec::jsonb -> 'command' ->> 'kind', r.spec_schema,
       t.enabled, t.updated_at_ms{extra}
FROM tasks AS t
LEFT JOIN task_revisions AS r ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.revision
"""
_RUN = (
    "SELECT id, project_id, task_id, task_revision, status, origin, created_at_ms, queued_at_ms,"
    " started_at_ms, finished_at_ms, exit_code, log_bytes, retry_of FROM runs"
)

READS = ReadsSql(
    task_list=_TASK_HEAD.format(extra="") + "WHERE t.project_id = %s AND t.id > %s ORDER BY t.id LIMIT %s",
    task_get=_TASK_HEAD.format(extra=", r.content_digest, t.created_at_ms") + "WHERE t.project_id = %s AND t.id = %s",
    # The current-head keyset on the triggers primary key (seed 002).
    trigger_list="""
SELECT g.project_id, g.id, g.revision, g.task_id, g.task_revision, r.spec_schema, g.enabled, g.updated_at_ms
FROM triggers AS g
LEFT JOIN trigger_revisions AS r ON r.project_id = g.project_id AND r.trigger_id = g.id AND r.revision = g.revision
WHERE g.project_id = %s AND g.id > %s ORDER BY g.id LIMIT %s
""",
    run_get=_RUN + " WHERE id = %s AND project_id = %s",
    run_page=_RUN + " WHERE project_id = %s AND (created_at_ms, id) < (%s, %s) ORDER BY created_at_ms DESC, id DESC"
                    " LIMIT %s",
    run_events="""
SELECT e.run_id, r.project_id, e.sequence, e.type, e.actor_type, e.created_at_ms
FROM run_events AS e JOIN runs AS r ON r.id = e.run_id
WHERE e.run_id = %s AND r.project_id = %s AND e.sequence > %s ORDER BY e.sequence LIMIT %s
""",
    window="SELECT id, project_id, task_id, status, created_at_ms FROM runs"
           " WHERE project_id = %s AND task_id = %s ORDER BY created_at_ms DESC, id DESC LIMIT %s",
    counts="""
SELECT (SELECT count(*) FROM tasks WHERE project_id = %(p)s),
       (SELECT count(*) FROM triggers WHERE project_id = %(p)s),
       (SELECT count(*) FROM runs WHERE project_id = %(p)s),
       (SELECT count(*) FROM runs WHERE project_id = %(p)s AND status IN ('queued', 'running')),
       (SELECT count(*) FROM credentials WHERE project_id = %(p)s AND revoked_at_ms IS NULL)
""",
)
