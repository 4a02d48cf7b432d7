"""The real EXPLAIN QUERY PLAN of every query behind the AI read tools, on a migrated
database, empty and populated (with ANALYZE statistics): each rides an existing index,
none scans a big table or sorts in a temp B-tree."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.storage.sqlite.sql import READS as reads
from edge.storage.sqlite.schema import migrate
from rows import RUN_SQL, add_run, add_task, add_trigger, run_row
from support import TIE_SORT, assert_uses_index

TASK_TABLES = ("tasks", "task_revisions", "t", "r")
TRIGGER_TABLES = ("triggers", "trigger_revisions", "g", "r")
RUN_TABLES = ("runs", "run_events", "e", "r")


def _populate(conn: apsw.Connection) -> None:
    conn.execute("BEGIN")
    for project in ("default", "other"):
        for t in range(50):
            add_task(conn, project, f"task-{t:03d}", revision=2)
            add_trigger(conn, project, f"trig-{t:03d}", f"task-{t:03d}", task_revision=2)
        conn.executemany(RUN_SQL, (
            run_row(project, f"task-{i % 50:03d}", f"{project}-run-{i:06d}", ("succeeded", "failed")[i % 2], 10_000 + i)
            for i in range(5_000)
        ))
    add_run(conn, "default", "task-000", "with-events", "failed", 99_999, events=True)
    conn.execute("COMMIT")


@pytest.fixture(params=["empty", "populated"])
def conn(home, request):
    c = apsw.Connection(os.path.join(home, "plan.db"))
    migrate(c)
    if request.param == "populated":
        _populate(c)
    c.execute("ANALYZE")
    yield c
    c.close()


def test_task_list_seeks_the_primary_keys(conn):
    plan = assert_uses_index(conn, reads.task_list, ("default", "task-010", 33), "PRIMARY KEY",
                             big_tables=TASK_TABLES)
    assert any(d.startswith("SEARCH t USING PRIMARY KEY (project_id=? AND id>?)") for d in plan), plan
    assert any(d.startswith("SEARCH r USING PRIMARY KEY (project_id=? AND task_id=? AND revision=?)")
               for d in plan), plan


def test_task_get_is_a_point_read(conn):
    plan = assert_uses_index(conn, reads.task_get, ("default", "task-010"), "PRIMARY KEY",
                             big_tables=TASK_TABLES)
    assert any(d.startswith("SEARCH t USING PRIMARY KEY (project_id=? AND id=?)") for d in plan), plan


def test_trigger_list_seeks_the_primary_keys(conn):
    plan = assert_uses_index(conn, reads.trigger_list, ("default", "trig-010", 33), "PRIMARY KEY",
                             big_tables=TRIGGER_TABLES)
    assert any(d.startswith("SEARCH g USING PRIMARY KEY (project_id=? AND id>?)") for d in plan), plan
    assert any(d.startswith("SEARCH r USING PRIMARY KEY (project_id=? AND trigger_id=? AND revision=?)")
               for d in plan), plan


def test_run_get_is_a_point_read(conn):
    assert_uses_index(conn, reads.run_get, ("default-run-000001", "default"), "sqlite_autoindex_runs_1",
                      big_tables=RUN_TABLES)


def test_run_list_uses_the_project_wide_runs_index(conn):
    plan = assert_uses_index(conn, reads.run_page, ("default", 12_000, "default-run-002000", 33),
                             "runs_project_created_idx", big_tables=RUN_TABLES)
    assert plan[1:] in ([], [TIE_SORT]), plan  # one index seek; at most the sort of one millisecond's runs


def test_run_events_use_the_event_key_and_the_run_key(conn):
    plan = assert_uses_index(conn, reads.run_events, ("with-events", "default", 0, 33), "sqlite_autoindex_runs_1",
                             big_tables=RUN_TABLES)
    assert any("VIRTUAL TABLE" in d for d in plan), plan  # the events in the run's row


def test_task_outcome_window_uses_the_task_runs_index(conn):
    plan = assert_uses_index(conn, reads.window, ("default", "task-007", 65), "runs_task_created_idx",
                             big_tables=RUN_TABLES)
    assert plan[1:] in ([], [TIE_SORT]), plan
