"""The evidence history's store on a real SQLite file: retention on insert (the 501st record
prunes the oldest; a 91-day-old record goes, with an injected clock), bounded deletes,
totals and unknown cost, ending a record that was never opened, the change position, and
the real query plan of the history page."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.core.agent import EvidenceCursor, EvidenceEnd, EvidenceOpen, RoundMeta
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.evidence import MAX_AGE_MS, MAX_RECORDS, PRUNE_BATCH, SQL_PAGE, SqliteEvidenceStore
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


async def test_the_501st_record_prunes_the_oldest(store):
    evidence, sql = store
    for n in range(MAX_RECORDS):
        await evidence.open(opened(n), T0 + n)
    assert count(sql) == MAX_RECORDS
    await evidence.open(opened(MAX_RECORDS), T0 + MAX_RECORDS)
    assert count(sql) == MAX_RECORDS
    assert await evidence.get("default", "run-00000") is None
    assert await evidence.get("default", "run-00001") is not None


async def test_a_91_day_old_record_is_pruned_by_the_next_insert(store):
    evidence, sql = store
    await evidence.open(opened(1), T0)
    await evidence.open(opened(2), T0 + 89 * DAY)
    await evidence.open(opened(3), T0 + 90 * DAY)  # exactly 90 days: kept
    assert count(sql) == 3
    await evidence.open(opened(4), T0 + 91 * DAY)  # the device clock says 91 days later
    assert await evidence.get("default", "run-00001") is None
    assert [r.run_id for r in await evidence.page("default", None, 10)] == ["run-00004", "run-00003", "run-00002"]
    assert MAX_AGE_MS == 90 * DAY


async def test_each_insert_deletes_a_bounded_number_of_rows(store):
    evidence, sql = store
    for n in range(40):
        await evidence.open(opened(n), T0 + n)
    await evidence.open(opened(99), T0 + 200 * DAY)  # all 40 are too old, only the oldest few go at once
    assert count(sql) == 41 - PRUNE_BATCH
    for n in range(100, 104):
        await evidence.open(opened(n), T0 + 200 * DAY)
    assert count(sql) == 5  # converged over the next writes


async def test_rounds_add_up_and_an_estimated_round_makes_the_cost_unknown(store):
    evidence, _ = store
    await evidence.open(opened(1), T0)
    assert await evidence.add_round("default", "run-00001", meta(1), 0.25)
    assert await evidence.add_round("default", "run-00001", meta(2), 0.5)
    record = await evidence.get("default", "run-00001")
    assert (record.rounds, record.input_tokens, record.output_tokens, record.cost_usd) == (2, 300, 30, 0.75)
    assert [r.plan for r in record.round_meta] == ["plan 1", "plan 2"]
    assert await evidence.add_round("default", "run-00001", meta(3, estimated=True), None)
    record = await evidence.get("default", "run-00001")
    assert record.usage_estimated and record.cost_usd is None
    assert await evidence.add_round("default", "run-00001", meta(4), 1.0)
    assert (await evidence.get("default", "run-00001")).cost_usd is None  # unknown stays unknown
    assert not await evidence.add_round("default", "elsewhere", meta(1), 1.0)
    assert not await evidence.add_round("other-project", "run-00001", meta(5), 1.0)


async def test_without_prices_the_cost_is_unknown_from_the_start(store):
    evidence, _ = store
    await evidence.open(opened(1, cost_known=False), T0)
    await evidence.add_round("default", "run-00001", meta(1), None)
    assert (await evidence.get("default", "run-00001")).cost_usd is None


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


async def test_pages_are_newest_first_keysets(store):
    evidence, _ = store
    for n in range(5):
        await evidence.open(opened(n), T0 + n // 2)  # equal times: the run id breaks the tie
    first = await evidence.page("default", None, 3)
    assert [r.run_id for r in first] == ["run-00004", "run-00003", "run-00002"]
    after = EvidenceCursor(created_at_ms=first[-1].created_at_ms, run_id=first[-1].run_id)
    assert [r.run_id for r in await evidence.page("default", after, 3)] == ["run-00001", "run-00000"]
    assert await evidence.page("other-project", None, 3) == []


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
