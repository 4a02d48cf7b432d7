"""PostgreSQL's statements for the storage rules (edge/storage/*.py), one section per port:
the rules are written once for both backends, and SQLite's statements for them are
edge/storage/sqlite/sql.py. Here rows a rule changes are locked (`FOR UPDATE`), so writers
on several nodes serialize per row; tests/test_postgres_plans.py runs the real EXPLAIN of
each hot statement.
"""

from __future__ import annotations

from edge.storage.security import SecuritySql

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
    audit_trim=0,  # a server's pages, not a router's flash: each write keeps the bound exactly
)
