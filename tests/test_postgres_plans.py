"""The real PostgreSQL planner on the hot queries of cluster mode: with 100,000 runs,
2,000 triggers, their @reboot fires on three nodes and 5,000 import records (statistics
gathered), each query walks its intended index, with no sequential scan of a big table and
no sort."""

from __future__ import annotations

import asyncio
import json

import pytest

from edge.core.reads import SEARCH_BUDGET
from edge.core.runs import RunCursor, RunQuery
from edge.storage import runs
from edge.storage.postgres import claims, evidence
from edge.storage.postgres.sql import ADMISSION, CATALOG, READS, RUNS, SECURITY
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
       'task-' || lpad((i % 100)::text, 3, '0'), 1, CASE WHEN i % 53 = 3 THEN 'manual' ELSE 'scheduled' END,
       CASE WHEN i % 20000 = 0 THEN 'queued' WHEN i % 20000 = 1 THEN 'running' WHEN i % 97 = 5 THEN 'failed'
            WHEN i % 389 = 7 THEN 'cancelled' ELSE 'succeeded' END, 3, 3,
       1790000000000 + i * 1000, 'cron:g:1:' || i,
       CASE WHEN i % 20000 = 1 THEN 'n1' END, CASE WHEN i % 20000 = 1 THEN i END,
       CASE WHEN i % 20000 = 1 THEN now() END
FROM generate_series(1, 100000) i;
INSERT INTO triggers SELECT 'default', 'g-' || lpad(i::text, 5, '0'), 1, 'task-' || lpad((i % 100)::text, 3, '0'), 1,
       true, 0, 0, CASE WHEN i % 2 = 0 THEN 1790000000000 + i * 60000 END, NULL FROM generate_series(1, 2000) i;
INSERT INTO trigger_revisions SELECT project_id, id, 1, task_id, 1, true, 'qinglong/cron@v1',
       '{"expression":"0 * * * *","timezone":"UTC"}', 'sha256:00', 0 FROM triggers;
INSERT INTO boot_fires SELECT 'default', id, 'n' || n, 'boot', 0 FROM triggers, generate_series(1, 3) n;
INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport)
SELECT 1790000000000 + i, CASE WHEN i % 10 = 9 THEN 'other' ELSE 'default' END, 'uid:0', 'qledge.status', 'allowed',
       '[]', 'socket' FROM generate_series(1, 20000) i;
INSERT INTO imports SELECT 'default', 'crontab:root:' || i, 'task', 'task-000', 0 FROM generate_series(1, 5000) i;
INSERT INTO agent_evidence (run_id, project_id, task_id, task_revision, state, instruction, provider, model,
                            position_before, created_at_ms)
SELECT 'ai-' || lpad(i::text, 6, '0'), 'default', 'ask', i, 'succeeded', 'why?', 'api.example.com', 'm', i,
       1790000000000 + i * 1000 FROM generate_series(1, 20000) i;
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
    assert_index(filled, READS.window, ("default", "task-007", 65), "runs_task_created_idx")


def test_run_list_keyset_seeks_the_project_index(filled):
    assert_index(filled, READS.run_page, ("default", 1790000050000, "000000050000", 33),
                 "runs_project_created_idx")
    assert_index(filled, RUNS.page_project, ("default", 1790000050000, "x", 33),
                 "runs_project_created_idx")
    assert_index(filled, RUNS.page_task,
                 ("default", "task-007", 1790000050000, "x", 33), "runs_task_created_idx")


def test_trigger_heads_are_a_keyset_on_the_primary_key(filled):
    assert_index(filled, READS.trigger_list, ("default", "g-01000", 33), "triggers_pkey")


def test_admission_queries_use_their_indexes(filled):
    # (`armed` is not here: it returns every armed trigger, once per reload, and reading the
    # whole table is then the planner's right answer.)
    assert_index(filled, CATALOG.trigger_lock, ("default", "g-00042"), "triggers_pkey")
    assert_index(filled, ADMISSION.admission.by_key, ("default", "cron:g:1:500"), "runs_project_key_key")
    assert_index(filled, ADMISSION.admission.active_for_task, ("default", "task-000"), "runs_active_idx")
    assert_index(filled, ADMISSION.admission.active_count, (), "runs_active_idx")


def test_claim_renew_and_reap_use_the_lease_indexes(filled):
    assert_index(filled, claims.SQL_CLAIM, ("default", "n2", 2, "n2", 30.0), "runs_claimable_idx")
    # Any of these reads only active runs (bounded by the queue) or the ids given.
    assert_index(filled, claims.SQL_RENEW, (30.0, "n1", ["000000020001"]),
                 ("runs_leased_idx", "runs_pkey", "runs_active_idx"))
    assert_index(filled, claims.SQL_EXPIRED, (64,), "runs_leased_idx")
    # a node's new boot: its queued runs it never took
    assert_index(filled, claims.SQL_UNTAKEN, ("default", "n2"), "runs_claimable_idx")


def test_boot_fires_and_import_records_are_read_by_their_keys(filled):
    assert_index(filled, ADMISSION.admission.boot_fire, ("default", "n1", "g-00042"), "boot_fires_pkey",
                 big=("runs", "triggers", "boot_fires"))
    assert_index(filled, CATALOG.imported, ("default", "crontab:root:1"), "imports_pkey",
                 big=("runs", "triggers", "imports"))
    assert_index(filled, CATALOG.imports, ("default", "crontab:root:100", 33), "imports_pkey",
                 big=("runs", "triggers", "imports"))


# Every filter of `qledge run list` on the index that serves it (as tests/test_history.py
# checks on SQLite): the rare statuses and origins on their partial indexes (schema version 4).
PLANS = [
    (RunQuery(), "runs_project_created_idx"),
    (RunQuery(task_id="task-007"), "runs_task_created_idx"),
    (RunQuery(statuses=["failed"]), "runs_unsuccessful_idx"),
    (RunQuery(statuses=["failed", "timed_out", "lost", "cancelled"], since_ms=5), "runs_unsuccessful_idx"),
    (RunQuery(task_id="task-007", statuses=["failed", "timed_out", "lost"]), "runs_task_unsuccessful_idx"),
    (RunQuery(statuses=["running"]), "runs_active_idx"),
    (RunQuery(task_id="task-000", statuses=["queued", "running"]), "runs_active_idx"),
    (RunQuery(origins=["manual"]), "runs_unscheduled_idx"),
    (RunQuery(origins=["manual", "agent"], until_ms=1790000050000), "runs_unscheduled_idx"),
    (RunQuery(task_id="task-007", origins=["manual"]), "runs_task_created_idx"),
    (RunQuery(statuses=["succeeded"]), "runs_project_created_idx"),
    (RunQuery(origins=["scheduled"], since_ms=1790000050000), "runs_project_created_idx"),
    (RunQuery(statuses=["failed"], origins=["manual"]), "runs_unsuccessful_idx"),
]


@pytest.mark.parametrize("query,index", PLANS)
def test_every_run_list_filter_is_served_by_its_index(filled, query, index):
    assert_index(filled, runs.scan_sql(RUNS, query), runs.scan_params("default", query, None, SEARCH_BUDGET), index)


def test_run_prefixes_and_audit_pages_are_key_ranges(filled):
    assert_index(filled, RUNS.prefix, ("0000000500", "0000000501", "default", 3), "runs_pkey")
    assert_index(filled, RUNS.search_runs, ("default", ["000000000005", "000000000006"]), "runs_pkey")
    assert_index(filled, SECURITY.audit_page, (15000, "default", SEARCH_BUDGET), "security_audit_pkey",
                 big=("runs", "triggers", "security_audit"))


def test_search_pages_find_exactly_the_matching_runs_whatever_the_budget(filled):
    """Walked page by page with a small budget (pages that examine 50 entries, some with no
    match), the search finds what one plain query finds."""
    queries = [RunQuery(task_id="task-003", origins=["manual"]), RunQuery(statuses=["cancelled"]),
               RunQuery(statuses=["failed"], origins=["manual"], until_ms=1790090000000),
               RunQuery(statuses=["queued", "running"])]

    async def walk(q: RunQuery) -> tuple[list[str], int]:
        db = PgDatabase(filled)
        seen: list[str] = []
        after: RunCursor | None = None
        pages = 0
        try:
            while True:
                page = await db.read(runs.search, RUNS, "default", q, after, 7, 50)
                pages += 1
                assert len(page.runs) <= 7
                seen += [r.id for r in page.runs]
                if page.next is None:
                    return seen, pages
                after = page.next
        finally:
            await db.close()

    for q in queries:
        terms, params = ["project_id = 'default'"], []
        if q.task_id:
            terms.append("task_id = %s")
            params.append(q.task_id)
        if q.statuses:
            terms.append("status = ANY(%s)")
            params.append(list(q.statuses))
        if q.origins:
            terms.append("origin = ANY(%s)")
            params.append(list(q.origins))
        if q.until_ms is not None:
            terms.append("created_at_ms < %s")
            params.append(q.until_ms)
        with psycopg.connect(filled, autocommit=True) as conn:
            want = [r for (r,) in conn.execute(
                f"SELECT id FROM runs WHERE {' AND '.join(terms)} ORDER BY created_at_ms DESC, id DESC",
                params).fetchall()]
        seen, pages = asyncio.run(walk(q))
        assert seen == want and want, q
        assert pages >= len(want) // 7


def test_the_evidence_history_is_read_and_trimmed_on_its_indexes(filled):
    """(Retention keeps 500 records; 20,000 here make the planner show the index it would walk.)"""
    big = ("runs", "triggers", "agent_evidence")
    assert_index(filled, evidence.SQL_PAGE, ("default", 1790000005000, "ai-005000", 33),
                 "agent_evidence_created_idx", big=big)
    assert_index(filled, evidence.SQL_CUT, (500,), "agent_evidence_pkey", big=big)
    assert_index(filled, evidence.SQL_PRUNE, (16, 19500, 1790000000000), "agent_evidence_pkey", big=big)
    assert_index(filled, evidence.SQL_GET, ("ai-000042", "default"), "agent_evidence_run_id_key", big=big)
    assert_index(filled, claims.SQL_EVIDENCE_LOST, ("lease_expired", "gone", 1, "ai-000042"),
                 "agent_evidence_run_id_key", big=big)
