"""The scheduler in-process: an injected clock, a real SQLite file, real admission.

The runner is replaced by an executor that records what it is handed and leaves the
runs queued, so overlap and queue decisions are deterministic; the replace and manual
start tests use the real runner with real processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime

import apsw
import pytest

from edge.app.config import Config
from edge.app.graph import Stores, build_stores, build_workers
from edge.core.errors import ToolError
from edge.core.runs import Run, RunUpdate
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.core.triggers import CronSpec
from edge.scheduler.loop import MAX_SLEEP_S, Scheduler, Triggers
from edge.storage import catalog as trigger_sql
from edge.storage.sqlite.db import SqliteTx, immediate
from edge.storage.sqlite.sql import ADMISSION, CATALOG
from edge.storage.sqlite.db import Database
from edge.storage.runs import SqlRunStore
from edge.storage.sqlite.schema import migrate
from support import ManualTimers, assert_uses_index


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def at(hms: str) -> int:
    return ms(f"2024-05-01T{hms}Z")


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.ms = now_ms

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000


class Executor:
    """Stands in for the runner: records submissions; cancels like the runner does for
    runs it does not hold (a compare-and-set transition in the store)."""

    def __init__(self, runs: SqlRunStore, clock: FakeClock) -> None:
        self._runs = runs
        self._clock = clock
        self.submitted: list[Run] = []
        self.cancelled: list[tuple[str, str]] = []

    def submit(self, run: Run) -> None:
        self.submitted.append(run)

    async def cancel(self, project: str, run_id: str, reason: str) -> Run:
        self.cancelled.append((run_id, reason))
        run = await self._runs.get(project, run_id)
        assert run is not None
        return await self._runs.transition(run.id, run.version, "cancelled", self._clock.ms, "user",
                                           RunUpdate(finished_at_ms=self._clock.ms), reason)


def stores(db: Database, home: str, capacity: int = 34) -> Stores:
    made = build_stores(db, Config(), home)
    made.admission.set_capacity(capacity)
    return made


class Env:
    def __init__(self, db: Database, home: str, clock: FakeClock, capacity: int = 34, boot: str | None = None) -> None:
        self.db, self.clock = db, clock
        made = stores(db, home, capacity)
        self.tasks, self.runs, self.store, self.admission = made.tasks, made.runs, made.triggers, made.admission
        self.executor = Executor(self.runs, clock)
        self.timers = ManualTimers()
        # The kernel's boot id, from a file the test controls (`boot`: its path).
        boot_kw = {} if boot is None else {"boot_id_path": boot}
        self.scheduler = Scheduler(self.admission, self.runs, self.executor, clock, "default", rng=lambda: 0.25,
                                   timers=self.timers, **boot_kw)

    async def task(self, task_id: str = "t", overlap: str = "forbid") -> None:
        spec = TaskSpec(command=ArgvCommand(file="true"), overlap=overlap)  # type: ignore[arg-type]
        await self.tasks.create("default", task_id, task_id, spec, self.clock.ms, privileged=True)

    async def trigger(self, expression: str, task_id: str = "t", trigger_id: str | None = None, **spec):
        cron = CronSpec(expression=expression, timezone=spec.pop("timezone", "UTC"), **spec)
        return await self.store.create("default", trigger_id, task_id, None, cron, self.clock.ms)

    async def tick(self, when: int) -> float:
        self.clock.ms = when
        delay = await self.scheduler.tick()
        await self.settle()
        return delay

    async def settle(self) -> None:
        await self.scheduler.settle()

    async def all_runs(self) -> list[Run]:
        rows = await self.db.run(lambda c: [r[0] for r in c.execute(
            "SELECT id FROM runs ORDER BY scheduled_for_ms, created_at_ms, id")])
        return [await self.runs.get("default", r) for r in rows]

    async def finish(self, run: Run) -> None:
        run = await self.runs.get("default", run.id)
        running = await self.runs.transition(run.id, run.version, "running", self.clock.ms, "runner", RunUpdate())
        await self.runs.transition(running.id, running.version, "succeeded", self.clock.ms, "runner", RunUpdate())

    async def events(self, trigger_id: str | None = None):
        return list(reversed(await self.store.events("default", trigger_id, None, 64)))

    async def cursor(self, trigger_id: str) -> int | None:
        return (await self.store.get("default", trigger_id)).next_fire_at_ms


@pytest.fixture
async def env(home):
    db = await Database.open(os.path.join(home, "q.db"))
    e = Env(db, home, FakeClock(at("09:59:00")))
    await e.task()
    await e.scheduler.load()
    yield e
    await e.scheduler.stop()
    await db.close()


def scheduled_for(runs: list[Run]) -> list[int]:
    return [r.scheduled_for_ms for r in runs]


# -- firing -----------------------------------------------------------------------


async def test_fires_on_time_and_sleeps_until_the_next_fire(env):
    trig = await env.trigger("*/15 * * * *")
    assert trig.next_fire_at_ms == at("10:00:00")
    assert await env.tick(at("09:59:30")) == pytest.approx(30.001)
    assert await env.tick(at("10:00:00.200")) == MAX_SLEEP_S  # next fire is 15 minutes away
    [run] = await env.all_runs()
    assert (run.origin, run.status, run.scheduled_for_ms) == ("scheduled", "queued", at("10:00:00"))
    assert run.task_revision == 1
    assert run.idempotency_key == f"cron:{trig.id}:1:{at('10:00:00')}"
    assert (run.trigger_id, run.trigger_revision, run.jitter_ms) == (trig.id, 1, None)
    assert env.executor.submitted == [run]
    assert [e.type for e in await env.runs.events("default", run.id, 0, 10)] == ["run.queued"]
    assert await env.cursor(trig.id) == at("10:15:00")
    stored = await env.store.get("default", trig.id)
    assert stored.last_scheduled_at_ms == at("10:00:00")
    await env.finish(run)
    assert await env.tick(at("10:14:59.500")) == pytest.approx(0.501)
    await env.tick(at("10:15:00"))
    assert scheduled_for(await env.all_runs()) == [at("10:00:00"), at("10:15:00")]


async def test_idle_wakes_at_most_once_a_minute(env):
    assert await env.tick(at("09:59:30")) == MAX_SLEEP_S  # nothing armed
    await env.trigger("0 0 1 1 *")
    env.scheduler.changed()
    for minute in range(3):
        assert await env.tick(at(f"10:0{minute}:00")) == MAX_SLEEP_S


async def test_reread_returns_once_a_tick_has_read_the_triggers(env):
    """A SIGHUP's reload (Graph.reload) waits on this: when it returns, a trigger another
    writer added is armed."""
    assert await env.tick(at("09:59:30")) == MAX_SLEEP_S  # nothing armed
    await env.trigger("0 10 * * *")  # behind the scheduler's back: no changed()
    assert await env.tick(at("09:59:31")) == MAX_SLEEP_S
    reread = asyncio.ensure_future(env.scheduler.reread())
    await asyncio.sleep(0)
    assert not reread.done()  # the reads happen in the scheduler's own pass
    assert await env.tick(at("09:59:32")) == pytest.approx(28.001)
    await asyncio.wait_for(reread, 1)


async def test_clock_mark_is_saved_with_each_admission(env):
    await env.trigger("* * * * *")
    await env.tick(at("10:00:00"))
    assert await env.admission.newest_time("default") == at("10:00:00")


# -- restarts ---------------------------------------------------------------------


async def test_restart_after_admission_does_not_fire_again(env, home):
    await env.trigger("* * * * *")
    await env.tick(at("10:00:01"))  # admitted, cursor moved... then the daemon dies
    # A new daemon on the same file: same fire time still in the grace window.
    db2 = await Database.open(os.path.join(home, "q.db"))
    again = Env(db2, home, FakeClock(at("10:00:02")))
    await again.scheduler.load()
    await again.tick(at("10:00:02"))
    assert again.executor.submitted == []
    assert scheduled_for(await again.all_runs()) == [at("10:00:00")]
    await db2.close()


@pytest.mark.parametrize("other", [
    ("p", "t", 1, 60_000),  # the same fire: the same id
    ("q", "t", 1, 60_000),  # another project
    ("p", "u", 1, 60_000),  # another trigger
    ("p", "t", 2, 60_000),  # another revision
    ("p", "t", 1, 120_000),  # another fire
])
def test_a_fire_names_its_run(other):
    from edge.core.runs import fire_run_id

    mine = fire_run_id("p", "t", 1, 60_000)
    assert (fire_run_id(*other) == mine) == (other == ("p", "t", 1, 60_000))
    # A UUIDv7 of the fire's time: it sorts with the ids of the runs made about then.
    assert (mine[14], int(mine[:8] + mine[9:13], 16)) == ("7", 60_000)


async def test_idempotency_key_stops_a_repeat_even_with_a_stale_cursor(env):
    trig = await env.trigger("* * * * *")
    await env.tick(at("10:00:01"))
    await env.finish((await env.all_runs())[0])
    # The cursor is wound back by hand: the run's id, named by the fire, still refuses a second run.
    await env.db.run(lambda c: c.execute("UPDATE triggers SET next_fire_at_ms = ? WHERE id = ?",
                                         (at("10:00:00"), trig.id)))
    env.scheduler.changed()
    await env.tick(at("10:00:05"))
    assert scheduled_for(await env.all_runs()) == [at("10:00:00")]
    assert await env.cursor(trig.id) == at("10:01:00")


# -- misfires ---------------------------------------------------------------------


@pytest.mark.parametrize("misfire,runs,skipped", [
    ("skip", [], (at("10:00:00"), at("12:00:00"), 3)),
    ("fire_once", [(at("10:00:00"), "fire_once")], (at("11:00:00"), at("12:00:00"), 2)),
])
async def test_downtime_over_three_fires(env, home, misfire, runs, skipped):
    trig = await env.trigger("0 * * * *", misfire=misfire)
    await env.tick(at("09:59:59"))
    # The daemon is down from before 10:00 to 12:30; a new one starts.
    db2 = await Database.open(os.path.join(home, "q.db"))
    later = Env(db2, home, FakeClock(at("12:30:00")))
    await later.scheduler.load()
    await later.tick(at("12:30:00"))
    assert [(r.scheduled_for_ms, r.origin) for r in await later.all_runs()] == runs
    [event] = await later.events(trig.id)
    assert (event.type, event.reason) == ("skipped", "misfire")
    assert (event.scheduled_for_ms, event.last_scheduled_for_ms, event.fires) == skipped
    assert await later.cursor(trig.id) == at("13:00:00")
    await db2.close()


async def test_clock_jump_forward_skips_what_it_jumped_over(env):
    trig = await env.trigger("* * * * *")
    await env.tick(at("10:00:00"))
    await env.finish((await env.all_runs())[0])
    await env.tick(at("10:45:40"))  # 10:01 .. 10:45 are all more than 30 s late
    assert scheduled_for(await env.all_runs()) == [at("10:00:00")]
    [event] = await env.events(trig.id)
    assert (event.reason, event.scheduled_for_ms, event.last_scheduled_for_ms, event.fires) == (
        "misfire", at("10:01:00"), at("10:45:00"), 45)
    await env.tick(at("10:46:00"))
    assert scheduled_for(await env.all_runs()) == [at("10:00:00"), at("10:46:00")]


async def test_clock_jump_backward_holds_and_never_repeats(env):
    trig = await env.trigger("* * * * *")
    await env.tick(at("10:00:00"))
    await env.finish((await env.all_runs())[0])
    assert await env.tick(at("09:30:00")) == MAX_SLEEP_S  # behind the newest time seen: hold
    assert env.scheduler.status()["clock"].startswith("waiting for sync")
    assert await env.tick(at("09:59:59.500")) == pytest.approx(0.501)
    await env.tick(at("10:00:30"))  # caught up: 10:00 is not fired again
    assert "clock" not in env.scheduler.status()
    assert scheduled_for(await env.all_runs()) == [at("10:00:00")]
    await env.tick(at("10:01:00"))
    assert scheduled_for(await env.all_runs()) == [at("10:00:00"), at("10:01:00")]
    assert await env.cursor(trig.id) == at("10:02:00")


@pytest.fixture
def utc_here(monkeypatch):
    """Status lines show the daemon's local time: make that UTC for exact assertions."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def test_boot_at_1970_holds_until_the_clock_is_set(env, home, utc_here):
    trig = await env.trigger("*/5 * * * *")
    await env.tick(at("10:00:00"))
    await env.finish((await env.all_runs())[0])
    # Reboot: the router's clock says 1970 until NTP answers.
    db2 = await Database.open(os.path.join(home, "q.db"))
    boot = Env(db2, home, FakeClock(5_000))
    await boot.scheduler.load()
    assert await boot.tick(5_000) == MAX_SLEEP_S
    assert await boot.tick(65_000) == MAX_SLEEP_S
    status = boot.scheduler.status()
    assert status["clock"] == ("waiting for sync (wall clock 1970-01-01 00:01:05 UTC is behind 2024-05-01 10:00:00 UTC,"
                               " the newest time seen; scheduling resumes when it catches up)")
    # A trigger made meanwhile counts from the newest time on record, not from 1970.
    made = await boot.trigger("0 * * * *", trigger_id="new")
    assert made.next_fire_at_ms == at("11:00:00")
    assert boot.executor.submitted == []
    await boot.tick(at("10:07:00"))  # NTP set the clock: resume; 10:05 is 2 minutes late
    assert "clock" not in boot.scheduler.status()
    [event] = await boot.events(trig.id)
    assert (event.reason, event.scheduled_for_ms, event.fires) == ("misfire", at("10:05:00"), 1)
    await boot.tick(at("10:10:00"))
    assert scheduled_for(await boot.all_runs()) == [at("10:00:00"), at("10:10:00")]
    await db2.close()


# -- overlap and the queue --------------------------------------------------------


async def test_overlap_forbid_skips_and_merges_consecutive_skips(env):
    trig = await env.trigger("* * * * *")
    await env.tick(at("10:00:00"))
    await env.tick(at("10:01:00"))
    await env.tick(at("10:02:00"))
    first, = await env.all_runs()
    [event] = await env.events(trig.id)
    assert (event.type, event.reason, event.scheduled_for_ms, event.last_scheduled_for_ms, event.fires) == (
        "skipped", "overlap", at("10:01:00"), at("10:02:00"), 2)
    await env.finish(first)
    await env.tick(at("10:03:00"))
    await env.tick(at("10:04:00"))  # a run was admitted since the last skip: a new event
    events = await env.events(trig.id)
    assert [(e.reason, e.scheduled_for_ms, e.fires) for e in events] == [
        ("overlap", at("10:01:00"), 2), ("overlap", at("10:04:00"), 1)]
    assert scheduled_for(await env.all_runs()) == [at("10:00:00"), at("10:03:00")]


@pytest.fixture
def berlin():
    """The process's zone set to Europe/Berlin: a log line's times are in the device's zone."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


async def test_skipped_fires_are_logged_once_per_streak(env, caplog, berlin):
    caplog.set_level(logging.INFO, "qledge.scheduler")
    trig = await env.trigger("* * * * *")
    for minute in range(4):  # 10:00 runs; 10:01-10:03 are skipped: one line now, one at the end
        await env.tick(at(f"10:0{minute}:00"))
    lines = lambda: [(r.levelname, r.getMessage()) for r in caplog.records if "fire" in r.getMessage()]  # noqa: E731
    assert lines() == [("WARNING", f"fire skipped: task=t trigger={trig.id} reason=overlap"
                                   " scheduled=\"2024-05-01 12:01:00 CEST\"")]
    await env.finish((await env.all_runs())[0])
    await env.tick(at("10:04:00"))  # admitted: the streak is over
    assert lines()[1:] == [("WARNING", f"fire skipped: task=t trigger={trig.id} reason=overlap 2 more in a row"
                                       " last=\"2024-05-01 12:03:00 CEST\"")]
    await env.tick(at("10:05:00"))  # a new streak, a new first line
    assert len(lines()) == 3 and lines()[2][1].endswith("scheduled=\"2024-05-01 12:05:00 CEST\"")
    await env.scheduler.stop()  # an open streak is closed by the stop; this one has no more fires
    assert len(lines()) == 3
    await env.tasks.set_enabled("default", "t", False, None, env.clock.ms)
    await env.scheduler.load()
    await env.tick(at("10:06:00"))
    await env.tick(at("10:07:00"))
    await env.scheduler.stop()
    assert lines()[3:] == [
        ("INFO", f"fire skipped: task=t trigger={trig.id} reason=task_disabled scheduled=\"2024-05-01 12:06:00 CEST\""),
        ("INFO", f"fire skipped: task=t trigger={trig.id} reason=task_disabled 1 more in a row"
                 " last=\"2024-05-01 12:07:00 CEST\""),
    ]


async def test_overlap_allow_runs_side_by_side(env):
    await env.task("a", overlap="allow")
    await env.trigger("* * * * *", task_id="a")
    await env.tick(at("10:00:00"))
    await env.tick(at("10:01:00"))
    assert [r.status for r in await env.all_runs()] == ["queued", "queued"]
    assert await env.events() == []


async def test_overlap_replace_cancels_the_active_run_first(env):
    await env.task("r", overlap="replace")
    trig = await env.trigger("* * * * *", task_id="r")
    await env.tick(at("10:00:00"))
    await env.tick(at("10:01:00"))
    old, new = await env.all_runs()
    assert (old.status, old.error_summary, new.status) == ("cancelled", None, "queued")
    assert env.executor.cancelled == [(old.id, "replaced")]
    assert env.executor.submitted[-1].id == new.id
    assert [e.detail for e in await env.runs.events("default", old.id, 0, 10)] == [None, "replaced"]
    assert await env.events(trig.id) == []


async def test_queue_overflow_is_recorded_as_refused(home):
    db = await Database.open(os.path.join(home, "q.db"))
    e = Env(db, home, FakeClock(at("09:59:00")), capacity=2)  # e.g. 1 slot + a queue of 1
    for name in ("a", "b", "c"):
        await e.task(name, overlap="allow")
        await e.trigger("* * * * *", task_id=name, trigger_id=name)
    await e.scheduler.load()
    await e.tick(at("10:00:00"))
    assert sorted(r.task_id for r in await e.all_runs()) == ["a", "b"]
    [refused] = await e.events()
    assert (refused.trigger_id, refused.type, refused.reason, refused.scheduled_for_ms) == (
        "c", "refused", "queue_full", at("10:00:00"))
    # Every fire is accounted for: two runs and one refusal.
    await e.scheduler.stop()
    await db.close()


async def test_disabled_task_skips_once_per_stretch(env):
    trig = await env.trigger("* * * * *")
    await env.tasks.set_enabled("default", "t", False, None, env.clock.ms)
    for minute in range(3):
        await env.tick(at(f"10:0{minute}:00"))
    [event] = await env.events(trig.id)
    assert (event.reason, event.fires, event.last_scheduled_for_ms) == ("task_disabled", 3, at("10:02:00"))
    assert await env.all_runs() == []


# -- pins -------------------------------------------------------------------------


async def test_task_update_repins_following_triggers_with_a_new_revision(env):
    trig = await env.trigger("* * * * *")
    spec = TaskSpec(command=ArgvCommand(file="echo", args=["v2"]))
    await env.tasks.update("default", "t", 1, spec, None, env.clock.ms, privileged=True)
    moved = await env.store.get("default", trig.id)
    assert (moved.revision, moved.task_revision) == (2, 2)
    revisions = await env.db.run(lambda c: c.execute(
        "SELECT revision, task_revision FROM trigger_revisions WHERE trigger_id = ? ORDER BY revision",
        (trig.id,)).fetchall())
    assert revisions == [(1, 1), (2, 2)]  # revisions stay immutable: the pin moved by a new one
    await env.tick(at("10:00:00"))
    [run] = await env.all_runs()
    assert (run.task_revision, run.trigger_revision) == (2, 2)
    assert run.idempotency_key == f"cron:{trig.id}:2:{at('10:00:00')}"


async def test_a_trigger_pinned_elsewhere_keeps_its_pin_until_repinned(env):
    trig = await env.trigger("* * * * *")
    spec = TaskSpec(command=ArgvCommand(file="echo", args=["v2"]))
    await env.tasks.update("default", "t", 1, spec, None, env.clock.ms, privileged=True)  # trigger follows to 2
    pinned = await env.store.repin("default", trig.id, 1, None, env.clock.ms)  # back to 1 on purpose
    # head 3: the trigger stays at 1
    await env.tasks.update("default", "t", 2, spec, None, env.clock.ms, privileged=True)
    assert (await env.store.get("default", trig.id)).task_revision == 1
    await env.tick(at("10:00:00"))
    assert [r.task_revision for r in await env.all_runs()] == [1]  # exactly what it names
    repinned = await env.store.repin("default", trig.id, None, pinned.revision, env.clock.ms)
    assert (repinned.task_revision, repinned.revision) == (3, pinned.revision + 1)
    with pytest.raises(ToolError) as stale:
        await env.store.repin("default", trig.id, 2, pinned.revision, env.clock.ms)
    assert stale.value.code == "conflict"
    with pytest.raises(ToolError) as missing:
        await env.store.repin("default", trig.id, 9, None, env.clock.ms)
    assert missing.value.code == "not_found"


async def test_disable_and_enable_do_not_catch_up(env):
    trig = await env.trigger("* * * * *")
    off = await env.store.set_enabled("default", trig.id, False, None, env.clock.ms)
    assert (off.revision, off.enabled, off.next_fire_at_ms) == (2, False, None)
    env.scheduler.changed()
    await env.tick(at("10:00:00"))
    await env.tick(at("10:05:00"))
    env.clock.ms = at("10:05:10")
    on = await env.store.set_enabled("default", trig.id, True, None, env.clock.ms)
    assert (on.revision, on.next_fire_at_ms) == (3, at("10:06:00"))
    env.scheduler.changed()
    await env.tick(at("10:06:00"))
    assert scheduled_for(await env.all_runs()) == [at("10:06:00")]
    assert await env.events() == []


# -- jitter -----------------------------------------------------------------------


async def test_jitter_is_recorded_and_delays_the_start(env):
    await env.trigger("* * * * *", jitter_s=1)  # rng 0.25 → 250 ms
    await env.tick(at("10:00:00"))
    [run] = await env.all_runs()
    assert run.jitter_ms == 250 and env.executor.submitted == []
    assert env.timers.advance(0.2) == 0
    assert env.timers.advance(0.05) == 1
    await env.settle()
    assert [r.id for r in env.executor.submitted] == [run.id]


async def test_a_run_cancelled_during_its_jitter_never_starts(env):
    await env.trigger("* * * * *", jitter_s=1)
    await env.tick(at("10:00:00"))
    [run] = await env.all_runs()
    await env.executor.cancel("default", run.id, "user")
    assert env.timers.advance(1.0) == 1
    await env.settle()
    assert env.executor.submitted == []


async def test_stop_cancels_runs_still_waiting_out_their_jitter(env):
    await env.trigger("* * * * *", jitter_s=60)
    await env.tick(at("10:00:00"))
    await env.scheduler.stop()
    [run] = await env.all_runs()
    assert run.status == "cancelled" and env.executor.cancelled == [(run.id, "shutdown")]


# -- zones ------------------------------------------------------------------------


async def test_missing_zone_data_refuses_once_and_keeps_the_cursor(env):
    trig = await env.trigger("* * * * *")
    await env.db.run(lambda c: c.execute(
        "UPDATE trigger_revisions SET spec = json_set(spec, '$.timezone', 'Mars/Olympus') WHERE trigger_id = ?",
        (trig.id,)))
    assert await env.tick(at("10:00:00")) == MAX_SLEEP_S
    env.scheduler.changed()
    await env.tick(at("10:00:30"))
    [event] = await env.events(trig.id)
    assert (event.type, event.reason, event.fires) == ("refused", "timezone_unavailable", 1)
    assert await env.cursor(trig.id) == at("10:00:00") and await env.all_runs() == []


# -- the real loop, the real runner -----------------------------------------------


async def test_loop_wakes_when_triggers_change(env, utc_here):
    """The loop sleeps up to a minute at a time: only the wake-up a change sends lets it see
    the change within the 20 s each step waits here."""
    await env.scheduler.start()
    await _status_becomes(env, "0 triggers armed")
    facade = Triggers(env.store, env.scheduler, "UTC")
    spec = CronSpec(expression="0 12 * * *", timezone="UTC")
    await facade.create("default", "noon", "t", None, spec, env.clock.ms)
    await _status_becomes(env, "1 triggers armed, next fire 2024-05-01 12:00:00 UTC")
    await facade.delete("default", "noon", None)
    await _status_becomes(env, "0 triggers armed")


async def _status_becomes(env, line: str, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while env.scheduler.status()["scheduler"] != line:
            await asyncio.sleep(0.005)


async def test_replace_and_manual_starts_with_the_real_runner(home):
    db = await Database.open(os.path.join(home, "q.db"))
    clock = FakeClock(at("09:59:00"))
    made = stores(db, home, capacity=3)
    tasks, runs, store = made.tasks, made.runs, made.triggers
    workers = build_workers(Config(), home, made, clock)
    runner, scheduler = workers.runner, workers.scheduler
    workers.settings.kill_grace_s = 1
    sleepy = TaskSpec(command=ArgvCommand(file="sleep", args=["60"]), overlap="replace")
    await tasks.create("default", "r", "r", sleepy, clock.ms, privileged=True)
    await tasks.create("default", "f", "f", TaskSpec(command=ArgvCommand(file="sleep", args=["60"])), clock.ms,
                       privileged=True)
    await store.create("default", "r1", "r", None, CronSpec(expression="* * * * *", timezone="UTC"), clock.ms)
    await scheduler.load()
    try:
        clock.ms = at("10:00:00")
        await scheduler.tick()
        first = (await runs.page("default", "r", None, 5))[0]
        await _until(lambda: runs.get("default", first.id), "running")
        clock.ms = at("10:01:00")
        await scheduler.tick()
        await scheduler.settle()
        old = await runs.get("default", first.id)
        assert (old.status, old.error_summary) == ("cancelled", "cancelled: replaced")
        new = (await runs.page("default", "r", None, 5))[0]
        await _until(lambda: runs.get("default", new.id), "running")
        # Manual starts obey the same policies: replace cancels, forbid refuses, the queue is bounded.
        manual = await runner.start(await tasks.get("default", "r"), "user")
        assert (await runs.get("default", new.id)).status == "cancelled"
        f_task = await tasks.get("default", "f")
        await runner.start(f_task, "user")
        with pytest.raises(ToolError) as busy:
            await runner.start(f_task, "user")
        assert busy.value.code == "conflict" and "overlap policy is forbid" in busy.value.message
        await tasks.update("default", "f", 1, TaskSpec(command=ArgvCommand(file="sleep", args=["60"]),
                                                       overlap="allow"), None, clock.ms, privileged=True)
        await runner.start(await tasks.get("default", "f"), "user")  # third active run: at capacity
        with pytest.raises(ToolError) as full:
            await runner.start(await tasks.get("default", "f"), "user")
        assert full.value.code == "resource_exhausted"
        assert manual.origin == "manual"
    finally:
        await scheduler.stop()
        await runner.shutdown()
        await db.close()


async def _until(read, status: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while (await read()).status != status:
            await asyncio.sleep(0.02)


# -- `cron next` agrees with the scheduler ----------------------------------------


@pytest.mark.parametrize("expr,tz,start", [
    ("*/30 1 * * *", "America/New_York", "2024-11-02T12:00:00Z"),
    ("0 * * * *", "America/New_York", "2024-11-03T03:00:00Z"),
    ("0 30 2 * * *", "Europe/Berlin", "2024-03-30T12:00:00Z"),
    ("*/20 * * * *", "Europe/Berlin", "2024-10-27T00:00:00Z"),
    ("*/2 * * * * *", "Asia/Shanghai", "2024-01-01T00:00:00Z"),
])
async def test_cron_next_agrees_with_the_scheduler(home, expr, tz, start):
    db = await Database.open(os.path.join(home, "agree.db"))
    e = Env(db, home, FakeClock(ms(start)))
    await e.task("a", overlap="allow")
    trig = await e.trigger(expr, task_id="a", timezone=tz)
    await e.scheduler.load()
    for _ in range(6):  # wake exactly at each cursor, as the loop does
        await e.tick(await e.cursor(trig.id))
    fired = scheduled_for(await e.all_runs())
    await db.close()
    out = subprocess.run([sys.executable, "-m", "edge", "cron", "next", expr, "--tz", tz, "--after", start,
                          "--count", "6", "--json"], capture_output=True, text=True, timeout=30)
    assert [f["atMs"] for f in json.loads(out.stdout)] == fired


# -- store details ----------------------------------------------------------------


async def test_events_are_bounded_per_trigger(env):
    trig = await env.trigger("* * * * *")

    def spam(conn: apsw.Connection) -> int:
        for i in range(300):  # alternate reasons: nothing merges
            with immediate(conn):
                trigger_sql.record_event(SqliteTx(conn), CATALOG, "default", trig.id, "skipped",
                                         ("overlap", "task_disabled")[i % 2], i, i, 1, i, None)
        return conn.execute("SELECT count(*) FROM trigger_events").fetchone()[0]

    assert await env.db.run(spam) == trigger_sql.EVENTS_PER_TRIGGER


async def test_deleting_a_trigger_or_its_task_takes_the_events(env):
    trig = await env.trigger("* * * * *")
    await env.tasks.set_enabled("default", "t", False, None, env.clock.ms)
    await env.tick(at("10:00:00"))
    assert len(await env.events()) == 1
    await env.tasks.delete("default", "t", None, True)
    assert await env.store.get("default", trig.id) is None and await env.events() == []
    await env.tick(at("10:01:00"))  # the heap still held it: admission finds it gone
    assert env.scheduler.status()["scheduler"] == "0 triggers armed"


async def test_trigger_ids_and_conflicts(env):
    a = await env.trigger("* * * * *")
    b = await env.trigger("* * * * *")
    assert (a.id, b.id) == ("t-1", "t-2")
    with pytest.raises(ToolError) as dup:
        await env.trigger("* * * * *", trigger_id="t-1")
    assert dup.value.code == "conflict"
    with pytest.raises(ToolError) as missing:
        await env.trigger("* * * * *", task_id="nope")
    assert missing.value.code == "not_found"
    assert [t.id for t in await env.store.page("default", None, 10)] == ["t-1", "t-2"]
    assert [t.id for t in await env.store.page("default", "t-1", 10)] == ["t-2"]
    assert a.content_digest == b.content_digest and a.spec_schema == "qinglong/cron@v1"


@pytest.fixture
def conn(home):
    c = apsw.Connection(os.path.join(home, "plan.db"))
    migrate(c)
    c.execute("ANALYZE")
    return c


TABLES = ("runs", "triggers", "trigger_revisions", "trigger_events", "tasks", "task_revisions")


@pytest.mark.parametrize("sql,params,index", [
    (CATALOG.trigger_get, ("default", "t"), "PRIMARY KEY"),
    (CATALOG.trigger_list, ("default", "", 10), "PRIMARY KEY"),
    (ADMISSION.admission.armed, {"project": "default"}, "PRIMARY KEY"),
    (CATALOG.following, ("default", "t", 1), "triggers_task_idx"),
    (ADMISSION.admission.pinned_task, ("default", "t", 1), "PRIMARY KEY"),
    (ADMISSION.admission.head_task, ("default", "t"), "PRIMARY KEY"),
    (ADMISSION.admission.active_for_task, ("default", "t"), "runs_active_idx"),
    (ADMISSION.admission.active_count, (), "runs_active_idx"),
    (ADMISSION.admission.by_key, ("default", "cron:t:1:0"), "runs_key_idx"),
    (CATALOG.newest_run, ("default",), "runs_project_created_idx"),
    (CATALOG.events_trigger, ("default", "t", 1 << 62, 10), "trigger_events_trigger_idx"),
    (CATALOG.events_project, ("default", 1 << 62, 10), "trigger_events_project_idx"),
    (CATALOG.newest_event, ("default", "t"), "trigger_events_trigger_idx"),
    (CATALOG.events_prune, ("default", "t", 64, 100), "trigger_events_trigger_idx"),
])
def test_query_plans(conn, sql, params, index):
    assert_uses_index(conn, sql, params, index, big_tables=TABLES)


async def test_stop_during_an_admission_still_hands_its_runs_over(env, home):
    """Scheduler.stop while an admission is inside its transaction in the store's thread
    (held there by another writer's lock): once it commits, its run reaches the executor."""
    await env.trigger("* * * * *")
    env.clock.ms = at("10:00:00")
    other = apsw.Connection(os.path.join(home, "q.db"))
    other.execute("BEGIN IMMEDIATE")  # the admission's BEGIN IMMEDIATE waits behind this
    try:
        await env.scheduler.start()
        await _until_task(lambda names: any(n.startswith("admit-") for n in names))  # the tick awaits its admission
        stopping = asyncio.create_task(env.scheduler.stop())
        await _until_task(lambda names: "scheduler" not in names)  # the loop has been cancelled meanwhile
    finally:
        other.execute("COMMIT")
        other.close()
    await stopping
    admitted = await env.all_runs()
    assert len(admitted) == 1
    assert [r.id for r in env.executor.submitted] == [admitted[0].id]


async def _until_task(seen, timeout_s: float = 20.0) -> None:
    """Until `seen` holds of the names of the tasks alive on the loop."""
    async with asyncio.timeout(timeout_s):
        while not seen({t.get_name() for t in asyncio.all_tasks()}):
            await asyncio.sleep(0.005)


# -- @reboot and @once --------------------------------------------------------------


class Device:
    """Daemon starts on one database file, with the kernel's boot id in a file."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.boot_file = os.path.join(home, "boot_id")
        self.envs: list[tuple[Env, Database]] = []
        self.boot("a1b2c3d4-0000-4000-8000-000000000001")

    def boot(self, boot_id: str) -> None:
        with open(self.boot_file, "w") as f:
            f.write(boot_id + "\n")

    async def start(self, now: int) -> Env:
        db = await Database.open(os.path.join(self.home, "q.db"))
        e = Env(db, self.home, FakeClock(now), boot=self.boot_file)
        await e.scheduler.load()
        self.envs.append((e, db))
        return e

    async def stop(self) -> None:
        for e, db in self.envs:
            await e.scheduler.stop()
            await db.close()
        self.envs.clear()


@pytest.fixture
async def device(home):
    d = Device(home)
    yield d
    await d.stop()


async def test_reboot_fires_once_per_boot_not_per_daemon_restart(device):
    first = await device.start(at("10:00:00"))
    await first.task()
    trig = await first.trigger("@reboot")
    assert trig.spec.expression == "@reboot" and trig.next_fire_at_ms is None  # waits for the next boot
    await first.tick(at("10:00:01"))
    assert await first.all_runs() == []
    # The daemon restarts within the same boot: nothing fires.
    await device.stop()
    again = await device.start(at("10:05:00"))
    await again.tick(at("10:05:00"))
    assert await again.all_runs() == [] and await again.cursor(trig.id) is None
    # The device reboots: one fire, through admission like any fire.
    await device.stop()
    device.boot("a1b2c3d4-0000-4000-8000-000000000002")
    booted = await device.start(at("11:00:00"))
    assert await booted.cursor(trig.id) == at("11:00:00")
    await booted.tick(at("11:00:00.300"))
    [run] = await booted.all_runs()
    assert (run.origin, run.status, run.scheduled_for_ms) == ("scheduled", "queued", at("11:00:00.300"))
    assert run.idempotency_key == f"boot:{trig.id}:a1b2c3d4-0000-4000-8000-000000000002"
    assert booted.executor.submitted == [run]
    assert await booted.cursor(trig.id) is None
    await booted.tick(at("11:30:00"))
    assert len(await booted.all_runs()) == 1
    # Restarts within that boot fire nothing more, even with the run finished.
    await booted.finish(run)
    await device.stop()
    later = await device.start(at("12:00:00"))
    await later.tick(at("12:00:00"))
    assert len(await later.all_runs()) == 1


async def test_reboot_armed_then_crash_fires_once_after_restart(device):
    setup = await device.start(at("10:00:00"))
    await setup.task()
    trig = await setup.trigger("@reboot")
    await device.stop()
    device.boot("b0000000-0000-4000-8000-000000000002")
    armed = await device.start(at("10:10:00"))  # arms, then dies before its first tick
    assert await armed.cursor(trig.id) == at("10:10:00")
    await device.stop()
    after = await device.start(at("10:10:30"))
    await after.tick(at("10:10:30"))
    await after.tick(at("10:11:30"))
    keys = [r.idempotency_key for r in await after.all_runs()]
    assert keys == [f"boot:{trig.id}:b0000000-0000-4000-8000-000000000002"]


async def test_reboot_waits_for_the_clock_sync_hold_and_is_no_misfire(device):
    setup = await device.start(at("10:00:00"))
    await setup.task()
    trig = await setup.trigger("@reboot")
    await setup.tick(at("10:00:00"))
    await device.stop()
    device.boot("c0000000-0000-4000-8000-000000000003")
    boot = await device.start(65_000)  # the router's clock says 1970 until NTP answers
    assert await boot.cursor(trig.id) == at("10:00:00")  # the newest time on record
    await boot.tick(66_000)
    assert await boot.all_runs() == [] and boot.scheduler.status()["clock"].startswith("waiting for sync")
    await boot.tick(at("13:00:00"))  # NTP set the clock, hours later: it fires now, not "missed"
    [run] = await boot.all_runs()
    assert run.scheduled_for_ms == at("13:00:00")
    assert await boot.events(trig.id) == []


async def test_reboot_fire_goes_through_overlap_and_a_disabled_trigger_stays_quiet(device):
    setup = await device.start(at("10:00:00"))
    await setup.task()
    await setup.task("u")
    busy = await setup.trigger("@reboot")
    off = await setup.trigger("@reboot", task_id="u")
    await setup.store.set_enabled("default", off.id, False, None, at("10:00:00"))
    await setup.store.create("default", "manual", "t", None, CronSpec(expression="0 0 1 1 *", timezone="UTC"),
                             at("10:00:00"))
    blocking = await setup.admission.admit_manual(await setup.tasks.get("default", "t"), "user", at("10:00:00"))
    await device.stop()
    device.boot("d0000000-0000-4000-8000-000000000004")
    boot = await device.start(at("10:30:00"))
    assert await boot.cursor(off.id) is None
    await boot.tick(at("10:30:00"))
    assert [r.id for r in await boot.all_runs()] == [blocking.run.id]
    [event] = await boot.events(busy.id)
    assert (event.type, event.reason, event.scheduled_for_ms) == ("skipped", "overlap", at("10:30:00"))
    assert await boot.cursor(busy.id) is None


async def test_once_fires_once_then_disables_itself(env, home):
    trig = await env.trigger("@once")
    assert trig.next_fire_at_ms == at("09:59:00")  # due as soon as it is armed
    await env.tick(at("09:59:00.100"))
    [run] = await env.all_runs()
    assert run.idempotency_key == f"once:{trig.id}:1" and run.scheduled_for_ms == at("09:59:00.100")
    fired = await env.store.get("default", trig.id)
    assert (fired.enabled, fired.revision, fired.next_fire_at_ms) == (False, 2, None)
    await env.finish(run)
    await env.tick(at("10:30:00"))
    assert len(await env.all_runs()) == 1
    # A restart fires nothing more.
    db2 = await Database.open(os.path.join(home, "q.db"))
    again = Env(db2, home, FakeClock(at("10:31:00")))
    await again.scheduler.load()
    await again.tick(at("10:31:00"))
    assert len(await again.all_runs()) == 1
    await db2.close()
    # Enabling it again is one more shot.
    await env.store.set_enabled("default", trig.id, True, None, at("10:40:00"))
    env.scheduler.changed()
    await env.tick(at("10:40:00"))
    assert [r.idempotency_key for r in await env.all_runs()] == [f"once:{trig.id}:1", f"once:{trig.id}:3"]
    assert (await env.store.get("default", trig.id)).enabled is False


async def test_once_for_a_disabled_task_is_recorded_and_spent(env):
    await env.tasks.set_enabled("default", "t", False, None, env.clock.ms)
    trig = await env.trigger("@once")
    await env.tick(at("09:59:01"))
    assert await env.all_runs() == []
    [event] = await env.events(trig.id)
    assert (event.type, event.reason) == ("skipped", "task_disabled")
    assert (await env.store.get("default", trig.id)).enabled is False


async def test_a_reload_the_store_refuses_is_tried_again(env, home):
    """A reload that meets a storage fault (here the triggers table gone for a moment, as a
    database that cannot be read) is not forgotten: the next tick reads the triggers again."""
    await env.trigger("0 10 * * *")  # created after the load: the heap does not hold it yet
    env.scheduler.changed()
    other = apsw.Connection(os.path.join(home, "q.db"))
    other.execute("ALTER TABLE triggers RENAME TO triggers_away")
    with pytest.raises(ToolError) as refused:
        await env.tick(at("09:59:30"))
    assert refused.value.code == "unavailable"
    other.execute("ALTER TABLE triggers_away RENAME TO triggers")
    other.close()
    await env.tick(at("10:00:00"))
    assert [r.scheduled_for_ms for r in await env.all_runs()] == [at("10:00:00")]
