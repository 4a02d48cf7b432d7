"""The evidence history's SQLite store beyond the contract every backend meets
(tests/test_port_contracts.py: retention on insert, bounded deletes, the whole record written
once, pages): the change position's arithmetic on the daemon's connection, across daemons, a
run's start that writes nothing, and the real query plan of the history page."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.core.agent import EvidenceOpen, EvidenceRecord, RoundMeta
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


async def test_a_start_writes_nothing_and_the_end_writes_the_whole_record_once(store):
    evidence, sql = store
    before = await evidence.start(opened(1), T0)
    assert count(sql) == 0  # seed 001: nothing is written until the terminal state
    await evidence.db.run(_three_changes)
    await evidence.finish(EvidenceRecord(started=opened(1), state="succeeded", rounds=[meta(1)], input_tokens=100,
                                         output_tokens=10, position_before=before, created_at_ms=T0,
                                         answer_summary="all fine"), T0 + 5)
    await evidence.finish(EvidenceRecord(started=opened(1), state="lost"), T0 + 6)  # written: left as it is
    record = await evidence.get("default", "run-00001")
    assert (record.state, record.answer_summary, record.created_at_ms, record.finished_at_ms) == (
        "succeeded", "all fine", T0, T0 + 5)
    assert record.position_after == before + 3  # the three changes in between
    # A run a crashed daemon left: what is known, the recovery's position for both.
    await evidence.finish(EvidenceRecord(started=opened(2), state="lost", error="daemon_lost"), T0 + 7)
    record = await evidence.get("default", "run-00002")
    assert (record.state, record.instruction, record.rounds, record.created_at_ms) == ("lost", "question 2", 0, T0 + 7)
    assert record.position_before == record.position_after


async def test_the_history_page_rides_its_index(store):
    _, sql = store
    assert_uses_index(sql, SQL_PAGE, ("default", 1 << 62, "\U0010ffff", 33), "agent_evidence_created_idx",
                      big_tables=("agent_evidence",))


async def test_positions_only_grow_across_daemons(home):
    path = os.path.join(home, "qledge.db")
    db = await Database.open(path)
    first = SqliteEvidenceStore(db)
    await first.finish(EvidenceRecord(started=opened(1), state="succeeded"), T0)
    highest = (await first.get("default", "run-00001")).position_after
    await db.close()
    db = await Database.open(path)  # the next daemon: its connection starts counting from zero again
    try:
        second = SqliteEvidenceStore(db)
        assert await second.start(opened(2), T0 + 1) == highest + 1
    finally:
        await db.close()
