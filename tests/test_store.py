"""Migrations on real files and the real query plan of every query on runs."""

from __future__ import annotations

import os
import re
import time

import apsw
import pytest

from edge.app.config import Config
from edge.app.graph import build_stores
from edge.core.runs import Run, RunCursor, RunUpdate
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.storage.sqlite.sql import CATALOG, RUNS
from edge.storage.sqlite.db import PAGE_SIZE, WAL_CHECKPOINT_BYTES, Database
from edge.storage.sqlite.schema import MIGRATIONS, migrate
from support import assert_uses_index


@pytest.fixture
def conn(home):
    c = apsw.Connection(os.path.join(home, "plan.db"))
    migrate(c)
    c.execute("ANALYZE")  # plans must hold with statistics too
    return c


def test_migrates_an_empty_file_and_reopens(home):
    async def go():
        path = os.path.join(home, "q.db")
        db = await Database.open(path)
        await db.close()
        db = await Database.open(path)  # second open: nothing to do, nothing lost
        version = await db.run(lambda c: c.pragma("user_version"))
        mode = await db.run(lambda c: c.pragma("journal_mode"))
        fk = await db.run(lambda c: c.pragma("foreign_keys"))
        await db.close()
        return version, mode, fk, oct(os.stat(path).st_mode & 0o777)

    import asyncio

    assert asyncio.run(go()) == (len(MIGRATIONS), "wal", 1, "0o600")


async def test_a_new_database_gets_small_pages_and_a_small_old_one_is_rewritten_once(home, caplog):
    db = await Database.open(os.path.join(home, "new.db"))
    assert await db.run(lambda c: (c.pragma("page_size"), c.pragma("wal_autocheckpoint"))) == (
        PAGE_SIZE, WAL_CHECKPOINT_BYTES // PAGE_SIZE)
    await db.close()
    # A database made with SQLite's default pages (as before this version), with a row.
    path = os.path.join(home, "old.db")
    old = apsw.Connection(path)
    old.pragma("journal_mode", "wal")
    for number, sql in enumerate(MIGRATIONS[:4], 1):
        old.execute(sql)
        old.pragma("user_version", number)
    old.execute("INSERT INTO tasks VALUES ('default', 't', 't', 1, 1, 0, 0)")
    assert old.pragma("page_size") == 4096
    old.close()
    caplog.set_level("INFO", "qledge.store")
    db = await Database.open(path)
    assert await db.run(lambda c: (c.pragma("page_size"), c.pragma("journal_mode"), c.pragma("user_version"),
                                   c.execute("SELECT id FROM tasks").fetchall(),
                                   c.execute("PRAGMA integrity_check").fetchone()[0])) == (
        PAGE_SIZE, "wal", len(MIGRATIONS), [("t",)], "ok")
    await db.close()
    assert "database rewritten with 512-byte pages (was 4096" in caplog.text
    caplog.clear()
    db = await Database.open(path)  # once: nothing to rewrite now
    await db.close()
    assert "rewritten" not in caplog.text


async def test_an_old_database_held_open_elsewhere_keeps_its_pages(home, caplog):
    path = os.path.join(home, "old.db")
    old = apsw.Connection(path)
    old.pragma("journal_mode", "wal")
    for number, sql in enumerate(MIGRATIONS[:4], 1):  # a qledge database of an older version
        old.execute(sql)
        old.pragma("user_version", number)
    reader = apsw.Connection(path)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM tasks").fetchall()  # a reader holds it open
    caplog.set_level("INFO", "qledge.store")
    db = await Database.open(path)
    assert await db.run(lambda c: (c.pragma("page_size"), c.pragma("journal_mode"))) == (4096, "wal")
    await db.close()
    reader.execute("COMMIT")
    assert "keeps its 4096-byte pages" in caplog.text


def test_a_new_databases_migrations_are_not_kept_prepared(home):
    """A migration's statements run once: apsw's statement cache would otherwise hold up to a
    hundred of them prepared (about 0.3 MiB of SQLite memory) for as long as the daemon runs."""
    c = apsw.Connection(os.path.join(home, "m.db"))
    migrate(c)
    cached = [e["query"] for e in c.cache_stats(True)["entries"]]
    assert not [q for q in cached if re.search(r"\b(CREATE|ALTER|DROP)\b", q)], cached
    assert c.status(apsw.SQLITE_DBSTATUS_STMT_USED)[0] < 64 * 1024  # a few reads' statements (about 10 KB)


def test_time_indexes_are_ascending(conn):
    """New rows go to the right edge of an ascending index (one page written per insert,
    not three); queries read them backwards, without a sort (test_plan_* below)."""
    columns = {name: [(r[2], r[3]) for r in conn.execute(f"PRAGMA index_xinfo({name})") if r[5]]
               for name in ("runs_task_created_idx", "runs_project_created_idx", "trigger_events_trigger_idx",
                            "trigger_events_project_idx", "runs_unsuccessful_idx", "runs_task_unsuccessful_idx",
                            "runs_unscheduled_idx")}
    assert all(desc == 0 for cols in columns.values() for _, desc in cols), columns


def test_refuses_a_newer_schema(home):
    path = os.path.join(home, "new.db")
    c = apsw.Connection(path)
    c.pragma("user_version", len(MIGRATIONS) + 1)
    c.close()
    with pytest.raises(apsw.SQLError, match="newer than this qledge"):
        migrate(apsw.Connection(path))


async def test_a_database_of_schema_14_keeps_every_run_event_in_the_runs_rows(home):
    """Migration 15 moves the events of run_events into their runs' rows, in sequence
    order, with their details; a run without events gets none; the table is gone."""
    path = os.path.join(home, "v14.db")
    c = apsw.Connection(path)
    for number, script in enumerate(MIGRATIONS[:14], start=1):
        c.execute(script)
        c.pragma("user_version", number)
    c.execute("INSERT INTO tasks VALUES ('default', 't', 't', 1, 1, 1000, 1000)")
    for rid in ("r1", "r2"):
        c.execute("INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq,"
                  " created_at_ms) VALUES (?, 'default', 't', 1, 'manual', 'succeeded', 3, 3, 1000)", (rid,))
    c.execute("INSERT INTO run_events VALUES ('r1', 3, 'run.succeeded', 'runner', 1003, NULL),"
              " ('r1', 1, 'run.queued', 'user', 1000, NULL), ('r1', 2, 'run.running', 'runner', 1001, 'pid 7')")
    c.close()
    db = await Database.open(path)
    runs = build_stores(db, Config(), home).runs
    events = await runs.events("default", "r1", 0, 10)
    assert [(e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail) for e in events] == [
        (1, "run.queued", "user", 1000, None), (2, "run.running", "runner", 1001, "pid 7"),
        (3, "run.succeeded", "runner", 1003, None)]
    assert [(e.sequence, e.type) for e in await runs.events("default", "r1", 1, 1)] == [(2, "run.running")]
    assert await runs.events("default", "r2", 0, 10) == []
    named = "SELECT name FROM sqlite_schema WHERE name = 'run_events'"
    assert await db.run(lambda c: c.execute(named).fetchall()) == []
    await db.close()


async def test_run_transitions_are_compare_and_set_with_events(home):
    db = await Database.open(os.path.join(home, "cas.db"))
    made = build_stores(db, Config(), home)
    tasks, runs = made.tasks, made.runs
    await tasks.create("default", "t", "t", TaskSpec(command=ArgvCommand(file="true")), 1000, privileged=True)
    run = await runs.create(Run(id="r1", project_id="default", task_id="t", task_revision=1, origin="manual",
                                status="queued", version=1, event_seq=1, created_at_ms=1000), "user")
    assert (run.status, run.version, run.event_seq) == ("queued", 1, 1)
    running = await runs.transition("r1", 1, "running", 1001, "runner", RunUpdate(started_at_ms=1001))
    assert (running.version, running.event_seq, running.started_at_ms) == (2, 2, 1001)
    from edge.core.errors import ToolError

    with pytest.raises(ToolError) as stale:
        await runs.transition("r1", 1, "succeeded", 1002, "runner", RunUpdate())
    assert stale.value.code == "conflict"
    with pytest.raises(ToolError) as illegal:
        await runs.transition("r1", 2, "queued", 1002, "runner", RunUpdate())
    assert illegal.value.code == "conflict"
    done = await runs.transition("r1", 2, "succeeded", 1003, "runner", RunUpdate(exit_code=0, finished_at_ms=1003))
    assert done.status == "succeeded" and done.version == 3
    events = await runs.events("default", "r1", 0, 10)
    assert [(e.sequence, e.type) for e in events] == [(1, "run.queued"), (2, "run.running"), (3, "run.succeeded")]
    assert await runs.get("other", "r1") is None  # another project sees nothing
    await db.close()


def test_plan_run_get(conn):
    assert_uses_index(conn, RUNS.get, ("r", "default"), "sqlite_autoindex_runs_1")


def test_plan_run_list_project(conn):
    assert_uses_index(conn, RUNS.page_project, ("default", 1, "z", 10), "runs_project_created_idx")


def test_plan_run_list_task(conn):
    assert_uses_index(conn, RUNS.page_task, ("default", "t", 1, "z", 10), "runs_task_created_idx")


def test_plan_active_runs(conn):
    assert_uses_index(conn, RUNS.active, (), "runs_active_idx")


def test_plan_run_events(conn):
    plan = assert_uses_index(conn, RUNS.events, ("r", "default", 0, 10), "sqlite_autoindex_runs_1")
    assert any("VIRTUAL TABLE" in d for d in plan), plan  # the events in the run's row


def test_plan_task_get_and_list(conn):
    assert_uses_index(conn, CATALOG.task_get, ("default", "t", None), "PRIMARY KEY",
                      big_tables=("tasks", "task_revisions"))
    assert_uses_index(conn, CATALOG.task_list, ("default", "", 10), "PRIMARY KEY",
                      big_tables=("tasks", "task_revisions"))


async def test_keyset_pages_have_no_gaps_or_duplicates(home):
    db = await Database.open(os.path.join(home, "page.db"))
    made = build_stores(db, Config(), home)
    tasks, runs = made.tasks, made.runs
    await tasks.create("default", "t", "t", TaskSpec(command=ArgvCommand(file="true")), 1, privileged=True)
    made = []
    for i in range(50):  # several runs share a millisecond: the id breaks ties
        run = Run(id=f"r{i:03d}", project_id="default", task_id="t", task_revision=1, origin="manual",
                  status="queued", version=1, event_seq=1, created_at_ms=1000 + i // 3)
        made.append(await runs.create(run, "user"))
    seen, after = [], None
    while True:
        page = await runs.page("default", "t", after, 7)
        if not page:
            break
        seen += [r.id for r in page]
        after = RunCursor(page[-1].created_at_ms, page[-1].id)
    expected = [r.id for r in sorted(made, key=lambda r: (r.created_at_ms, r.id), reverse=True)]
    assert seen == expected
    await db.close()


def test_status_shows_the_bytes_written_since_start_and_a_rate_per_day(daemon):
    daemon.cli("task", "add", "t", "--", "true")
    first = daemon.call("qledge.status")
    for _ in range(20):
        run = daemon.call("qledge.run.start", {"taskId": "t"})
        daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})
    deadline = time.monotonic() + 20
    while (then := daemon.call("qledge.status"))["uptimeS"] < 1:  # a rate needs at least a second of uptime
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with open(f"/proc/{daemon.pid}/io") as f:
        kernel = int(next(line for line in f if line.startswith("write_bytes")).split()[1])
    assert 0 < first["writtenBytes"] < then["writtenBytes"] <= kernel  # what the kernel counts for it
    per_day = then["writtenBytes"] * 86_400 / then["uptimeS"]
    assert abs(then["writtenBytesPerDay"] - per_day) <= per_day * 0.05
    line = next(x for x in daemon.cli("status").stdout.splitlines() if x.startswith("written"))
    size = r"\d+(\.\d)? (B|KiB|MiB|GiB)"
    # Minutes of uptime make no daily rate (the start's own writes would be most of it).
    assert re.search(rf"^written: +{size} since start \(a daily rate after 1h up\)$", line), line


def test_status_shows_a_daily_rate_with_the_window_it_is_computed_over():
    from edge.cli import admin
    from edge.tools.builtin.status import Counts, Status

    def written(uptime_s: float) -> str:
        s = Status(version="0", pid=1, uptime_s=uptime_s, loop="asyncio", ssl_loaded=False, rss_bytes=0,
                   hwm_bytes=0, rss_anon_bytes=0, module_count=0, db_path="x", db_bytes=0, project="p",
                   counts=Counts(tasks=0, triggers=0, runs=0, active_runs=0, credentials=0),
                   written_bytes=3 << 20, written_bytes_per_day=(3 << 20) * 86_400 // max(1, int(uptime_s)))
        return dict(admin._status_lines(s))["written"]

    assert written(59) == "3 MiB since start (a daily rate after 1h up)"
    assert written(3599) == "3 MiB since start (a daily rate after 1h up)"
    assert written(7200) == "3 MiB since start, about 36 MiB a day at the rate of the last 2h"


def test_an_exclusive_lock_keeps_the_wal_index_in_memory_and_others_out(daemon_factory):
    d = daemon_factory(config="[store]\nexclusive_lock = true\n").start()
    d.cli("task", "add", "t", "--", "true")
    run = d.call("qledge.run.start", {"taskId": "t"})
    assert d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})["run"]["status"] == "succeeded"
    assert os.path.exists(os.path.join(d.home, "qledge.db-wal"))
    assert not os.path.exists(os.path.join(d.home, "qledge.db-shm"))  # nothing mapped, nothing written back
    other = apsw.Connection(os.path.join(d.home, "qledge.db"))
    with pytest.raises(apsw.BusyError):
        other.execute("SELECT count(*) FROM runs").fetchone()
    other.close()
    d.stop()
    # Started again on its WAL database: still no -shm (the lock is taken before the first read).
    d.start()
    run = d.call("qledge.run.start", {"taskId": "t"})
    assert d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})["run"]["status"] == "succeeded"
    assert not os.path.exists(os.path.join(d.home, "qledge.db-shm"))
    d.stop()
    with d.db() as db:  # once the daemon is gone, the file is anyone's again
        assert db.execute("SELECT status FROM runs").fetchall() == [("succeeded",)] * 2



APART = r"""
import logging, os, signal, sys, threading
import apsw
from edge.storage.sqlite.apart import run_apart
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
parent = os.getpid()
def work():
    logging.getLogger("qledge.store").info("made in %s", "a child" if os.getpid() != parent else "the parent")
    raise apsw.CantOpenError("unable to open database file")
print(run_apart(work, lambda exc: f"cannot open x: {exc}"))
print(run_apart(lambda: None, str))
print(run_apart(lambda: os.kill(os.getpid(), signal.SIGKILL), str))
stop = threading.Event()
other = threading.Thread(target=stop.wait)
other.start()
print(run_apart(lambda: None, str))
stop.set()
other.join()
"""


def test_the_database_is_made_apart_and_what_the_child_says_comes_back():
    """edge.storage.sqlite.apart, in a fresh interpreter (one thread): the work runs in a child
    (its pid is not the parent's), what it logs is logged by the parent (once), its failure
    comes back as its one line, a child killed as how it ended; with another thread running
    no child is made (False: the caller does the work)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", APART], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == [
        "qledge.store INFO made in a child",
        "cannot open x: unable to open database file",
        "None",
        "the process preparing the database ended by signal 9",
        "False",
    ], (out.stdout, out.stderr)
