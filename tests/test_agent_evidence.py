"""The evidence history's SQLite store beyond the contract every backend meets
(tests/test_port_contracts.py: retention on insert, bounded deletes, totals and unknown
cost, ending a record never opened, pages): the change position's arithmetic on the
daemon's connection, across daemons, and the real query plan of the history page."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.core.agent import EvidenceEnd, EvidenceOpen, RoundMeta
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.evidence import SQL_PAGE, SqliteEvidenceStore
from support import assert_uses_index

DAY = 86_400_000
T0 = 1_800_000_000_000


def opened(n: int, cost_known: bool = True) -> EvidenceOpen:
    return EvidenceOpen(project_id="default", run_id=f"run-{n:05d}", task_id="ask", task_revision=1,
                        instruction=f"question {n}", provider="api.example.com", model="m", cost_known=cost_known)


def meta(n: int, estimated: bool = False) -> RoundMeta:
    return RoundMeta(round=n, model="m", input_tokens=100 * n, output_tokens=10 * n, usage_estimated=estimated,
                     response_chars=42, tools=["qinglong.run.list"], plan=f"plan {n}")


@pytest.fixture
async def store(home):
    db = await Database.open(os.path.join(home, "qledge.db"))
    sql = apsw.Connection(os.path.join(home, "qledge.db"))
    evidence = SqliteEvidenceStore(db)
    evidence.db = db  # for writes through the daemon's own connection
    yield evidence, sql
    sql.close()
    await db.close()


def count(sql: apsw.Connection) -> int:
    return sql.execute("SELECT count(*) FROM agent_evidence").fetchone()[0]


def _three_changes(conn: apsw.Connection) -> None:
    conn.execute("INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
                 " VALUES ('default', 't', 't', 1, 1, 1, 1)")
    conn.execute("UPDATE tasks SET name = 'u' WHERE id = 't'")
    conn.execute("DELETE FROM tasks WHERE id = 't'")


async def test_end_finishes_once_and_inserts_a_record_that_was_never_opened(store):
    evidence, sql = store
    await evidence.open(opened(1), T0)
    before = (await evidence.get("default", "run-00001")).position_before
    await evidence.db.run(_three_changes)
    await evidence.end(EvidenceEnd(project_id="default", run_id="run-00001", state="succeeded",
                                   answer_summary="all fine"), opened(1), T0 + 5)
    await evidence.end(EvidenceEnd(project_id="default", run_id="run-00001", state="lost"), opened(1), T0 + 6)
    record = await evidence.get("default", "run-00001")
    assert (record.state, record.answer_summary, record.finished_at_ms) == ("succeeded", "all fine", T0 + 5)
    assert record.position_after == before + 4  # the record's own insert and the three changes
    await evidence.end(EvidenceEnd(project_id="default", run_id="run-00002", state="cancelled",
                                   error="cancelled: user"), opened(2), T0 + 7)
    record = await evidence.get("default", "run-00002")
    assert (record.state, record.error, record.instruction, record.rounds) == (
        "cancelled", "cancelled: user", "question 2", 0)


async def test_the_history_page_rides_its_index(store):
    _, sql = store
    assert_uses_index(sql, SQL_PAGE, ("default", 1 << 62, "\U0010ffff", 33), "agent_evidence_created_idx",
                      big_tables=("agent_evidence",))


async def test_positions_only_grow_across_daemons(home):
    path = os.path.join(home, "qledge.db")
    db = await Database.open(path)
    first = SqliteEvidenceStore(db)
    await first.open(opened(1), T0)
    await first.end(EvidenceEnd(project_id="default", run_id="run-00001", state="succeeded"), opened(1), T0)
    highest = (await first.get("default", "run-00001")).position_after
    await db.close()
    db = await Database.open(path)  # the next daemon: its connection starts counting from zero again
    try:
        second = SqliteEvidenceStore(db)
        await second.open(opened(2), T0 + 1)
        assert (await second.get("default", "run-00002")).position_before == highest + 1
    finally:
        await db.close()
