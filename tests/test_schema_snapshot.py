"""The committed schema snapshots (edge/storage/*/schema.sql) are what migrating a fresh
database yields, and the two backends' tables and columns agree but for the differences
listed here on purpose."""

from __future__ import annotations

import asyncio
import importlib.util
import os

import apsw
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("qledge_schema_snapshot",
                                               os.path.join(ROOT, "packaging", "schema_snapshot.py"))
assert _spec is not None and _spec.loader is not None
snapshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot)

REGENERATE = "regenerate: python packaging/schema_snapshot.py --dsn <an empty PostgreSQL database>"

# Tables one backend has and the other has not, and why.
ONLY_SQLITE = {
    # The AI operator's mission ledger is the device's own: cluster mode keeps evidence only.
    "agent_attempts", "agent_constraints", "agent_messages", "agent_missions", "agent_receipts",
    "agent_replies", "agent_work_items",
}
ONLY_POSTGRES = {
    "nodes", "node_boots", "boot_fires",  # cluster membership and once-per-boot fires
    "qledge_schema",  # SQLite keeps the schema version in PRAGMA user_version
    "run_logs",  # a cluster's run logs live in the database; a device's in files
    "run_events",  # a device keeps a run's events in its row (runs.events): no B-tree of their own on flash
}
# Columns one backend's table has and the other's has not, and why.
ONLY_SQLITE_COLUMNS: dict[str, set[str]] = {
    "runs": {"events"},  # the run's events, a JSON array (PostgreSQL has the run_events table)
}
ONLY_POSTGRES_COLUMNS: dict[str, set[str]] = {
    # Claims, leases and fencing of a run between nodes; a run meant for one node; the flag
    # the unique index that keeps a `forbid` task to one active run across nodes needs; the
    # time a claim waits for (the end of the run's jitter, kept as a column so claims can index it); a cancel asked on
    # another node, for the node that runs it.
    "runs": {"node_id", "lease_until", "fence", "for_node", "forbid", "not_before_ms", "cancel_reason"},
    "security_audit": {"node_id"},  # which node wrote the record
}


def _sqlite_columns(conn: apsw.Connection) -> dict[str, set[str]]:
    tables = [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    return {table: {row[1] for row in conn.execute(f"PRAGMA table_info({table})")} for table in tables}


def _migrated_sqlite() -> apsw.Connection:
    from edge.storage.sqlite.schema import migrate

    conn = apsw.Connection(":memory:")
    migrate(conn)
    return conn


def _postgres_columns(dsn: str) -> dict[str, set[str]]:
    import psycopg

    found: dict[str, set[str]] = {}
    with psycopg.connect(dsn) as conn:
        for table, column in conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'"):
            found.setdefault(table, set()).add(column)
    return found


def test_the_sqlite_snapshot_is_what_migrating_a_fresh_database_yields():
    with open(snapshot.SQLITE_SNAPSHOT) as f:
        committed = f.read()
    assert snapshot.sqlite_snapshot() == committed, REGENERATE


def test_the_sqlite_snapshot_builds_the_same_tables_as_the_migrations():
    """The snapshot is the schema, not a description of it: run as a script, it makes the
    same tables and columns, indexes and triggers."""
    with open(snapshot.SQLITE_SNAPSHOT) as f:
        committed = f.read()
    built = apsw.Connection(":memory:")
    built.execute(committed)
    migrated = _migrated_sqlite()
    assert _sqlite_columns(built) == _sqlite_columns(migrated)
    names = "SELECT type, name FROM sqlite_schema ORDER BY type, name"
    assert list(built.execute(names)) == list(migrated.execute(names))


def test_the_postgres_snapshot_is_what_migrating_a_fresh_database_yields(pg_dsn):
    with open(snapshot.POSTGRES_SNAPSHOT) as f:
        committed = f.read()
    assert snapshot.postgres_snapshot(pg_dsn) == committed, REGENERATE


def test_the_backends_tables_and_columns_agree_but_for_the_listed_differences(pg_dsn):
    from edge.storage.postgres.db import PgDatabase
    from edge.storage.postgres.schema import migrate

    async def run() -> None:
        db = PgDatabase(pg_dsn)
        try:
            await migrate(db)
        finally:
            await db.close()

    asyncio.run(run())
    lite = _sqlite_columns(_migrated_sqlite())
    pg = _postgres_columns(pg_dsn)
    assert set(lite) - set(pg) == ONLY_SQLITE
    assert set(pg) - set(lite) == ONLY_POSTGRES
    shared = set(lite) & set(pg)
    only_lite = {t: lite[t] - pg[t] for t in shared if lite[t] - pg[t]}
    only_pg = {t: pg[t] - lite[t] for t in shared if pg[t] - lite[t]}
    assert only_lite == ONLY_SQLITE_COLUMNS
    assert only_pg == ONLY_POSTGRES_COLUMNS


@pytest.mark.parametrize("profile", ["edge", "full"])
def test_no_profile_ships_the_snapshots(profile):
    build_spec = importlib.util.spec_from_file_location("qledge_build", os.path.join(ROOT, "packaging", "build.py"))
    assert build_spec is not None and build_spec.loader is not None
    build = importlib.util.module_from_spec(build_spec)
    build_spec.loader.exec_module(build)
    assert not [path for path in build.profile_files(profile) if path.endswith(".sql")]
