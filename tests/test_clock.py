"""Stamps while the wall clock is unset: the steady clock on an injected clock, the
restamp when the clock is set, age retention after it, and a real daemon whose clock is
behind what its database has seen."""

from __future__ import annotations

import asyncio
import os

import pytest

from edge.app.config import Config
from edge.app.graph import Graph
from edge.core.auth import AuditRecord
from edge.core.clock import EPOCH_FLOOR_MS, SteadyClock
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.storage.sqlite.db import Database

DAY = 86_400_000
SYNCED = 1_780_000_000_000  # 2026-05-28: what NTP says


class FakeClock:
    def __init__(self, wall_ms: int) -> None:
        self.wall = wall_ms
        self.mono = 100.0

    def now_ms(self) -> int:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += int(seconds * 1000)
        self.mono += seconds


def test_behind_the_record_it_counts_on_from_it_then_reports_the_jump():
    wall = FakeClock(5_000)  # 1970
    jumps: list[tuple[int, int, int]] = []
    steady = SteadyClock(wall, lambda *jump: jumps.append(jump))
    floor = SYNCED - 10 * DAY  # the newest time on record
    steady.hold_from(floor)
    first = steady.now_ms()
    wall.advance(2.5)
    second = steady.now_ms()
    assert (first, second) == (floor + 1, floor + 2501)  # newer than the record, and 2.5 s apart
    wall.wall = SYNCED  # NTP answered: the true time of `second` is SYNCED - (time since it)
    wall.mono += 1.0
    assert steady.now_ms() == SYNCED
    assert jumps == [(floor, floor + 2501, SYNCED - (floor + 3501))]
    assert not steady.holding
    wall.advance(1)
    assert steady.now_ms() == SYNCED + 1000 and jumps == [jumps[0]]  # the wall clock from now on


def test_a_clock_that_catches_up_by_itself_never_goes_backwards():
    wall = FakeClock(SYNCED - 3000)  # 3 s behind the record (a clock set from a file date)
    steady = SteadyClock(wall, lambda *jump: pytest.fail("no jump"))
    steady.hold_from(SYNCED)
    stamps = []
    for _ in range(6):
        stamps.append(steady.now_ms())
        wall.advance(1)
    # Held at the record plus elapsed time, then the last stamp until the wall clock
    # passes it: never backwards, then the wall clock.
    assert stamps == sorted(stamps)
    assert stamps[:3] == [SYNCED + 1, SYNCED + 1001, SYNCED + 2001]
    wall.advance(3)
    assert steady.now_ms() == wall.wall


def test_a_clock_ahead_of_the_record_is_not_held():
    wall = FakeClock(SYNCED)
    steady = SteadyClock(wall)
    steady.hold_from(SYNCED - 1000)
    assert not steady.holding and steady.now_ms() == SYNCED


async def _run(graph: Graph, task_id: str) -> str:
    task = await graph.stores.tasks.get("default", task_id)
    assert task is not None
    run = await graph.runner.start(task, "user")
    async with asyncio.timeout(20):
        while (await graph.stores.runs.get("default", run.id)).status != "succeeded":  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
    return run.id


async def test_runs_made_before_the_clock_was_set_keep_their_order_and_survive_age_retention(home):
    """A fresh router at 1970: runs are stamped from EPOCH_FLOOR_MS on, and when NTP sets
    the clock they move to when they happened, so the next finished run (age retention,
    30 days) keeps them and lists show them in order."""
    db = await Database.open(os.path.join(home, "q.db"))
    wall = FakeClock(5_000)
    graph = Graph(Config(), home, os.path.join(home, "s.sock"), "asyncio", db, b"p" * 32, wall)
    try:
        await graph.hold_clock()
        assert graph.stamps.holding
        await graph.stores.tasks.create("default", "t", "t", TaskSpec(command=ArgvCommand(file="true")),
                                        graph.stamps.now_ms(), privileged=True)
        early = [await _run(graph, "t") for _ in range(3)]
        await graph.stores.audit.append(AuditRecord(
            at_ms=graph.stamps.now_ms(), project_id="default", principal="uid:0", tool="qledge.status",
            outcome="allowed", reasons=["tool_qledge_status"], transport="socket"))
        wall.wall, wall.mono = SYNCED, wall.mono + 60  # a minute later NTP answers
        late = await _run(graph, "t")  # stamped by the wall clock: the jump is noticed here
        runs = await graph.stores.runs.page("default", "t", None, 64)
        assert [r.id for r in runs] == [late, *reversed(early)]  # newest first, by time
        moved = [r for r in runs if r.id in early]
        assert len(moved) == 3
        for run in moved:  # within the minute before the clock was set, not in 2024
            assert SYNCED - 61_000 < run.created_at_ms <= run.started_at_ms <= run.finished_at_ms < SYNCED  # type: ignore[operator]
        events = await graph.stores.runs.events("default", early[0], 0, 8)
        assert all(SYNCED - 61_000 < e.created_at_ms < SYNCED for e in events)
        assert await graph.stores.admission.newest_time("default") >= SYNCED
        audited = await db.run(lambda c: c.execute("SELECT at_ms FROM security_audit").fetchall())
        assert [SYNCED - 61_000 < at < SYNCED for (at,) in audited] == [True]
    finally:
        await graph.runner.shutdown()
        await db.close()


async def test_without_the_restamp_age_retention_would_have_dropped_them(home):
    """The same boot, but the jump is not reported: the next finished run removes the
    runs stamped in 2024 (the failure the restamp prevents; this test keeps it honest)."""
    db = await Database.open(os.path.join(home, "q.db"))
    wall = FakeClock(5_000)
    graph = Graph(Config(), home, os.path.join(home, "s.sock"), "asyncio", db, b"p" * 32, wall)
    graph.stamps.on_jump = None
    try:
        await graph.hold_clock()
        await graph.stores.tasks.create("default", "t", "t", TaskSpec(command=ArgvCommand(file="true")),
                                        graph.stamps.now_ms(), privileged=True)
        early = await _run(graph, "t")
        assert (await graph.stores.runs.get("default", early)).created_at_ms < EPOCH_FLOOR_MS + DAY  # type: ignore[union-attr]
        wall.wall = SYNCED
        await _run(graph, "t")
        assert await graph.stores.runs.get("default", early) is None
    finally:
        await graph.runner.shutdown()
        await db.close()


def test_a_daemon_behind_its_record_stamps_after_it_in_order(daemon_factory):
    d = daemon_factory().start()
    d.cli("task", "add", "t", "--overlap", "allow", "--", "true")
    before = d.call("qledge.run.start", {"taskId": "t"})
    d.stop()
    ahead = before["createdAtMs"] + 10 * DAY  # as if an earlier boot had seen a later time
    with d.db() as db:
        db.execute("INSERT INTO meta (key, value) VALUES ('clock.newest_ms', ?)"
                   " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (ahead,))
    d.start()
    made = [d.call("qledge.run.start", {"taskId": "t"}) for _ in range(3)]
    assert all(r["createdAtMs"] > ahead for r in made)
    assert [r["createdAtMs"] for r in made] == sorted(r["createdAtMs"] for r in made)
    listed = d.call("qledge.run.list", {"taskId": "t"})["runs"]
    assert [r["id"] for r in listed] == [r["id"] for r in reversed(made)] + [before["id"]]
    # The age rule counts from the steady clock too: nothing made meanwhile is "old".
    assert len(listed) == 4
