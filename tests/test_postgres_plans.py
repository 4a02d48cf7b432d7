"""The real PostgreSQL planner on the hot queries of cluster mode: with 100,000 runs,
2,000 triggers, their @reboot fires on three nodes and 5,000 import records (statistics
gathered), each query walks its intended index, with no sequential scan of a big table and
no sort."""

from __future__ import annotations

import asyncio
import json

import pytest

from edge.storage.postgres import admission, catalog, reads, runs
from edge.storage.postgres.db import PgDatabase
from edge.storage.postgres.schema import migrate

psycopg = pytest.importorskip("psycopg")

FILL = """
INSERT INTO tasks SELECT 'default', 'task-' || lpad(i::text, 3, '0'), 'n', 1, true, 0, 0 FROM generate_series(0, 99) i;
INSERT INTO task_revisions SELECT 'default', id, 1, 'qinglong/command@v1',
    '{"command":{"kind":"argv","file":"true"},"overlap":"allow"}', 'sha256:00', true, 0, false FROM tasks;
INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,
                  idempotency_key, node_id, fence, lease_until)
SELECT lpad(i::text, 12, '0'), CASE WHEN i % 10 = 9 THEN 'other' ELSE 'default' END,
       'task-' || lpad((i % 100)::text, 3, '0'), 1, 'scheduled',
       CASE WHEN i % 20000 = 0 THEN 'queued' WHEN i % 20000 = 1 THEN 'running' ELSE 'succeeded' END, 3, 3,
       1790000000000 + i * 1000, 'cron:g:1:' || i,
       CASE WHEN i % 20000 = 1 THEN 'n1' END, CASE WHEN i % 20000 = 1 THEN i END,
       CASE WHEN i % 20000 = 1 THEN now() END
FROM generate_series(1, 100000) i;
INSERT INTO triggers SELECT 'default', 'g-' || lpad(i::text, 5, '0'), 1, 'task-' || lpad((i % 100)::text, 3, '0'), 1,
       true, 0, 0, CASE WHEN i % 2 = 0 THEN 1790000000000 + i * 60000 END, NULL FROM generate_series(1, 2000) i;
INSERT INTO trigger_revisions SELECT project_id, id, 1, task_id, 1, true, 'qinglong/cron@v1',
       '{"expression":"0 * * * *","timezone":"UTC"}', 'sha256:00', 0 FROM triggers;
INSERT INTO boot_fires SELECT 'default', id, 'n' || n, 'boot', 0 FROM triggers, generate_series(1, 3) n;
INSERT INTO imports SELECT 'default', 'crontab:root:' || i, 'task', 'task-000', 0 FROM generate_series(1, 5000) i;
ANALYZE;
"""


@pytest.fixture(scope="module")
def filled(pg_server):
    dsn = pg_server.create_database()

    async def prepare() -> None:
        db = PgDatabase(dsn)
        await migrate(db)
        await db.close()

    asyncio.run(prepare())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FILL)
    return dsn


def _nodes(plan: dict) -> list[dict]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def plan_of(dsn: str, query: str, params: tuple) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        try:
            (raw,) = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
        finally:
            conn.execute("ROLLBACK")  # EXPLAIN of the claim must not need a claim
    tree = raw if isinstance(raw, list) else json.loads(raw)
    return _nodes(tree[0]["Plan"])


def assert_index(dsn: str, query: str, params: tuple, index: str | tuple[str, ...], big=("runs", "triggers")) -> None:
    nodes = plan_of(dsn, query, params)
    described = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    wanted = (index,) if isinstance(index, str) else index
    assert any(n.get("Index Name") in wanted for n in nodes), described
    for n in nodes:
        assert n["Node Type"] not in ("Sort", "Incremental Sort"), described
        assert not (n["Node Type"] == "Seq Scan" and n.get("Relation Name") in big), described


def test_outcome_window_is_one_bounded_read_on_the_task_index(filled):
    assert_index(filled, reads.SQL_WINDOW, ("default", "task-007", 65), "runs_task_created_idx")


def test_run_list_keyset_seeks_the_project_index(filled):
    assert_index(filled, reads.SQL_RUN_PAGE, ("default", 1790000050000, "000000050000", 33),
                 "runs_project_created_idx")
    assert_index(filled, reads.SQL_RUN_FIRST, ("default", 33), "runs_project_created_idx")
    assert_index(filled, runs.SQL_PAGE_PROJECT.format(after=runs.AFTER), ("default", 1790000050000, "x", 33),
                 "runs_project_created_idx")
    assert_index(filled, runs.SQL_PAGE_TASK.format(after=runs.AFTER),
                 ("default", "task-007", 1790000050000, "x", 33), "runs_task_created_idx")


def test_trigger_heads_are_a_keyset_on_the_primary_key(filled):
    assert_index(filled, reads.SQL_TRIGGER_LIST, ("default", "g-01000", 33), "triggers_pkey")


def test_admission_queries_use_their_indexes(filled):
    # (`armed` is not here: it returns every armed trigger, once per reload, and reading the
    # whole table is then the planner's right answer.)
    assert_index(filled, catalog.SQL_TRIGGER_LOCK, ("default", "g-00042"), "triggers_pkey")
    assert_index(filled, admission.SQL_BY_KEY, ("cron:g:1:500",), "runs_idempotency_key_key")
    assert_index(filled, admission.SQL_ACTIVE_FOR_TASK, ("default", "task-000"), "runs_active_idx")
    assert_index(filled, admission.SQL_ACTIVE_COUNT, (), "runs_active_idx")


def test_claim_renew_and_reap_use_the_lease_indexes(filled):
    assert_index(filled, runs.SQL_CLAIM, ("default", "n2", 2, "n2", 30.0), "runs_claimable_idx")
    # Any of these reads only active runs (bounded by the queue) or the ids given.
    assert_index(filled, runs.SQL_RENEW, (30.0, "n1", ["000000020001"]),
                 ("runs_leased_idx", "runs_pkey", "runs_active_idx"))
    assert_index(filled, runs.SQL_EXPIRED, (64,), "runs_leased_idx")
    # a node's new boot: its queued runs it never took
    assert_index(filled, runs.SQL_UNTAKEN, ("default", "n2"), "runs_claimable_idx")


def test_boot_fires_and_import_records_are_read_by_their_keys(filled):
    assert_index(filled, admission.SQL_BOOT_FIRE, ("default", "n1", "g-00042"), "boot_fires_pkey",
                 big=("runs", "triggers", "boot_fires"))
    assert_index(filled, catalog.SQL_IMPORTED, ("default", "crontab:root:1"), "imports_pkey",
                 big=("runs", "triggers", "imports"))
    assert_index(filled, catalog.SQL_IMPORTS, ("default", "crontab:root:100", 33), "imports_pkey",
                 big=("runs", "triggers", "imports"))
