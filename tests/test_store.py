"""Migrations on real files and the real query plan of every query on runs."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.app.config import Config
from edge.app.graph import build_stores
from edge.core.runs import Run, RunCursor, RunUpdate
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.storage.sqlite import runs as run_sql
from edge.storage.sqlite import tasks as task_sql
from edge.storage.sqlite.db import Database
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


def test_refuses_a_newer_schema(home):
    path = os.path.join(home, "new.db")
    c = apsw.Connection(path)
    c.pragma("user_version", len(MIGRATIONS) + 1)
    c.close()
    with pytest.raises(apsw.SQLError, match="newer than this qledge"):
        migrate(apsw.Connection(path))


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
    assert_uses_index(conn, run_sql.SQL_GET, ("r", "default"), "sqlite_autoindex_runs_1")


def test_plan_run_list_project(conn):
    assert_uses_index(conn, run_sql.SQL_LIST_PROJECT, ("default", 1, "z", 10), "runs_project_created_idx")


def test_plan_run_list_task(conn):
    assert_uses_index(conn, run_sql.SQL_LIST_TASK, ("default", "t", 1, "z", 10), "runs_task_created_idx")


def test_plan_active_runs(conn):
    assert_uses_index(conn, run_sql.SQL_ACTIVE, (), "runs_active_idx")


def test_plan_run_events(conn):
    plan = assert_uses_index(conn, run_sql.SQL_EVENTS, ("r", "default", 0, 10), "PRIMARY KEY")
    assert any("sqlite_autoindex_runs_1" in d for d in plan), plan


def test_plan_task_get_and_list(conn):
    assert_uses_index(conn, task_sql.SQL_GET, ("default", "t", None), "PRIMARY KEY",
                      big_tables=("tasks", "task_revisions"))
    assert_uses_index(conn, task_sql.SQL_LIST, ("default", "", 10), "PRIMARY KEY",
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
