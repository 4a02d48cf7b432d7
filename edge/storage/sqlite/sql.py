"""SQLite's statements for the storage rules (edge/storage/*.py), one section per port.

Every hot statement here rides an index; tests run the real EXPLAIN QUERY PLAN of each
(tests/test_store.py, test_scheduler.py, test_history.py, test_ai_plans.py). The rules that
use them are written once for both backends; PostgreSQL's statements for the same rules
are edge/storage/postgres/sql.py. (One module for every port: the `edge` zipapp profile
counts its files.)
"""

from __future__ import annotations

from edge.storage.security import SecuritySql

# -- credentials, secrets, the audit (edge.storage.security) ------------------------------

_CREDENTIAL = "id, project_id, name, role, permissions, created_at_ms, revoked_at_ms"

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
    audit_insert="INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport,"
                 " request_id, class, count, last_at_ms) VALUES (:at_ms, :project_id, :principal, :tool, :outcome,"
                 " :reasons, :transport, :request_id, :class, :count, :last_at_ms) RETURNING id",
    audit_oldest_call="SELECT id FROM security_audit WHERE class = 'call' ORDER BY id LIMIT 1",
    audit_prune_calls="DELETE FROM security_audit WHERE id IN (SELECT id FROM (SELECT id, at_ms FROM security_audit"
                      " WHERE class = 'call' ORDER BY id LIMIT ?) WHERE id <= ? OR at_ms < ?)",
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
)
