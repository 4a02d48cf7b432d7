"""The AI read tools in-process: the real chain over a real SQLite file, so that the
task.runs.compare window can be checked row by row and storage anomalies can be
injected. A test double of a NARROW READER is the only double used here: it passes the
real reader's rows through, altered on the way out."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import apsw
import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import (
    DaemonFacts,
    ai_tools,
    build_chain,
    build_services,
    build_stores,
    build_workers,
)
from edge.core.clock import SystemClock
from edge.core.errors import ToolError
from edge.core.reads import RunSummary
from edge.storage.sqlite.db import Database
from edge.tools.context import Caller
from edge.tools.definition import Registry
from rows import add_run, add_task, add_trigger

replace = msgspec.structs.replace


class Harness:
    """A daemon's tool graph without its socket: real stores, real chain, real audit."""

    def __init__(self, home: str) -> None:
        self.home = home

    async def open(self) -> Harness:
        path = os.path.join(self.home, "qledge.db")
        self.db = await Database.open(path)
        self.sql = apsw.Connection(path)  # a second real connection, for rows and mischief
        self.sql.set_busy_timeout(5000)
        config, clock = Config(), SystemClock()
        stores = build_stores(self.db, config, self.home)
        workers = build_workers(config, self.home, stores, clock)
        registry = Registry(ai_tools())
        facts = DaemonFacts(path, "asyncio", clock, stores.counts, workers.settings, "/")
        self.services = build_services(config, stores, workers, facts, registry, b"p" * 32, clock)
        self.chain = build_chain(config, self.services, registry)
        return self

    async def close(self) -> None:
        self.sql.close()
        await self.db.close()

    async def call(self, tool: str, args: dict | None = None) -> Any:
        caller = Caller("socket", peer_uid=os.getuid())
        result = await self.chain.call(tool, json.dumps(args or {}).encode(), "json", caller)
        return json.loads(msgspec.json.encode(result))

    async def code(self, tool: str, args: dict | None = None) -> str:
        with pytest.raises(ToolError) as err:
            await self.call(tool, args)
        return err.value.code

    def audit(self) -> list[tuple[str, str, list[str]]]:
        rows = self.sql.execute("SELECT tool, outcome, reasons FROM security_audit ORDER BY id").fetchall()
        return [(t, o, json.loads(r)) for t, o, r in rows]


@pytest.fixture
async def h(home):
    harness = await Harness(home).open()
    yield harness
    await harness.close()


class Tampered:
    """A narrow reader double: delegates to the real reader and alters what it returns.

    `alter(method, rows)` rewrites the result; `widen` asks the real reader for more rows
    than the tool did (an over-limit page); `between` runs after the real read; `only`
    names the one method to tamper with (default: all of them).
    """

    def __init__(self, real: Any, alter: Callable[[str, Any], Any] = lambda _m, r: r, widen: int = 0,
                 between: Callable[[Any], None] | None = None, only: str | None = None) -> None:
        self._real, self._alter, self._widen, self._between = real, alter, widen, between
        self._only = only

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if self._only not in (None, name):
            return method

        async def call(*args: Any) -> Any:
            if self._widen and isinstance(args[-1], int):
                args = (*args[:-1], args[-1] + self._widen)
            rows = await method(*args)
            if self._between is not None:
                self._between(rows)
            return self._alter(name, rows)

        return call


def _seed(h: Harness, runs: list[tuple[str, str, int]], task: str = "job", project: str = "default") -> None:
    h.sql.execute("BEGIN")
    for run_id, status, created in runs:
        add_run(h.sql, project, task, run_id, status, created, events=status not in ("queued", "running"))
    h.sql.execute("COMMIT")


# -- task.runs.compare: the window ---------------------------------------------------


async def test_newest_success_is_the_baseline_and_newest_failure_the_candidate(h):
    _seed(h, [("r1", "succeeded", 1000), ("r2", "failed", 2000), ("r3", "succeeded", 3000),
              ("r4", "failed", 4000), ("r5", "running", 5000)])
    _seed(h, [("x9", "failed", 9000)], task="job", project="other")  # same task id, other project
    # The failed run was slower to start and to run: deltas are failed − succeeded.
    h.sql.execute("UPDATE runs SET started_at_ms = 4050, finished_at_ms = 4550, exit_code = 2 WHERE id = 'r4'")
    out = await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert out["baseline"]["id"] == "r3" and out["candidate"]["id"] == "r4"
    assert (out["baselineOutcome"], out["candidateOutcome"]) == ("succeeded", "failed")
    assert out["selection"] == {"windowLimit": 64, "searchedRunCount": 5, "hasOlderRuns": False, "complete": True,
                                "order": "createdAtMs desc, id desc"}
    assert out["changedFields"] == ["status", "exitCode"]
    assert (out["sameTask"], out["sameTaskRevision"], out["comparable"]) == (True, True, True)
    assert out["queueDelayDeltaMs"] == 50 - 10
    assert out["executionDurationDeltaMs"] == 500 - 100
    assert out["totalDurationDeltaMs"] == 550 - 110
    assert out["consistency"] == "bounded_task_window_then_ordered_point_reads"
    assert set(out["baseline"]) == {"id", "taskId", "taskRevision", "status", "origin", "createdAtMs", "queuedAtMs",
                                    "startedAtMs", "finishedAtMs", "exitCode"}
    assert h.audit()[-1] == ("qinglong.task.runs.compare", "allowed",
                             ["tool_invocation_allowed", "tool_qinglong_task_runs_compare"])


async def test_ties_on_creation_time_are_broken_by_id(h):
    _seed(h, [("a", "failed", 1000), ("b", "failed", 1000), ("c", "succeeded", 1000), ("d", "succeeded", 1000)])
    out = await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert (out["baseline"]["id"], out["candidate"]["id"]) == ("d", "b")


async def test_a_full_window_without_a_failure_is_incomplete(h):
    _seed(h, [(f"old-{i}", "failed", 100 + i) for i in range(3)]  # older than the window: never searched
          + [(f"ok-{i:02d}", "succeeded", 1000 + i) for i in range(64)])
    out = await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert out["selection"] == {"windowLimit": 64, "searchedRunCount": 64, "hasOlderRuns": True, "complete": False,
                                "order": "createdAtMs desc, id desc"}
    assert out["baseline"]["id"] == "ok-63" and out["candidate"] is None
    assert "changedFields" not in out and "comparable" not in out


async def test_64_rows_or_fewer_are_complete_even_with_one_outcome_missing(h):
    _seed(h, [(f"ok-{i:02d}", "succeeded", 1000 + i) for i in range(64)])
    out = await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert out["selection"]["complete"] is True and out["selection"]["hasOlderRuns"] is False
    assert out["selection"]["searchedRunCount"] == 64 and out["candidate"] is None


async def test_65_rows_with_both_outcomes_in_the_window_are_complete(h):
    cancelled = [(f"q{i:02d}", "cancelled", 100 + i) for i in range(62)]
    _seed(h, [("oldest", "succeeded", 10), ("f", "failed", 20), *cancelled, ("s", "succeeded", 500)])
    out = await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert out["selection"]["hasOlderRuns"] is True and out["selection"]["complete"] is True
    assert (out["baseline"]["id"], out["candidate"]["id"]) == ("s", "f")


async def test_an_unknown_task_and_another_projects_task_look_the_same(h):
    _seed(h, [("x1", "succeeded", 1000), ("x2", "failed", 2000)], task="theirs", project="other")
    mine = await h.call("qinglong.task.runs.compare", {"taskId": "theirs"})
    none = await h.call("qinglong.task.runs.compare", {"taskId": "nobody"})
    for out in (mine, none):
        assert out["baseline"] is None and out["candidate"] is None
        assert out["selection"]["searchedRunCount"] == 0 and out["selection"]["complete"] is True
    assert {k: v for k, v in mine.items() if k != "taskId"} == {k: v for k, v in none.items() if k != "taskId"}


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])  # the first point read, or the second
@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM runs WHERE id = ?",  # vanished
        "UPDATE runs SET project_id = 'other' WHERE id = ?",  # moved project
        "UPDATE runs SET status = CASE status WHEN 'failed' THEN 'succeeded' ELSE 'failed' END WHERE id = ?",
        "UPDATE runs SET task_id = 'elsewhere' WHERE id = ?",  # changed task
        "UPDATE runs SET status = 'exploded' WHERE id = ?",  # corrupt
    ],
)
async def test_a_selected_run_changing_before_its_point_read_fails_the_call(h, sql, outcome):
    _seed(h, [("s", "succeeded", 1000), ("f", "failed", 2000)])
    windows: list[int] = []

    def between(rows: Any) -> None:  # runs after the window read, before any point read
        windows.append(len(rows))
        h.sql.execute(sql, (next(r.id for r in rows if r.status == outcome),))

    h.services.readers.outcome_window = Tampered(h.services.readers.outcome_window, between=between)
    assert await h.code("qinglong.task.runs.compare", {"taskId": "job"}) == "unavailable"
    assert windows == [2]  # one window read: no retry, no further search
    assert h.audit()[-1][1] == "allowed"


async def test_the_window_is_read_once_with_65_rows(h):
    _seed(h, [(f"r{i:03d}", "succeeded", 1000 + i) for i in range(200)])
    seen: list[tuple] = []
    real = h.services.readers.outcome_window

    class Spy:
        async def window(self, project: str, task_id: str, limit: int):
            seen.append((project, task_id, limit))
            return await real.window(project, task_id, limit)

    h.services.readers.outcome_window = Spy()
    await h.call("qinglong.task.runs.compare", {"taskId": "job"})
    assert seen == [("default", "job", 65)]


# -- storage anomalies → unavailable --------------------------------------------------


def _each(fn: Callable[[Any], Any]) -> Callable[[str, Any], Any]:
    return lambda _method, rows: [fn(r) for r in rows] if isinstance(rows, list) else fn(rows)


def _at(index: int, **changes: Any) -> Callable[[str, Any], Any]:
    def alter(_method: str, rows: Any) -> Any:
        if not isinstance(rows, list):
            return replace(rows, **changes)
        rows = list(rows)
        rows[index] = replace(rows[index], **changes)
        return rows

    return alter


def _reverse(_method: str, rows: Any) -> Any:
    return list(reversed(rows))


def _duplicate_first(_method: str, rows: Any) -> Any:
    return [rows[0], *rows[:-1]]


PAGE_ANOMALIES = {
    "out_of_order": {"alter": _reverse},
    "duplicate": {"alter": _duplicate_first},
    "other_project": {"alter": _at(1, project_id="other")},
    "over_limit": {"widen": 1},
    "malformed": {"alter": _at(-1, project_id="default\x00")},
}


@pytest.fixture
def seeded(h):
    h.sql.execute("BEGIN")
    for i in range(8):
        add_task(h.sql, "default", f"t{i}")
        add_trigger(h.sql, "default", f"g{i}", f"t{i}")
    for i in range(70):  # more than a task.runs.compare window
        add_run(h.sql, "default", "t0", f"r{i}", "succeeded" if i % 2 else "failed", 1000 + i, events=True)
    h.sql.execute("COMMIT")
    return h


@pytest.mark.parametrize("anomaly", sorted(PAGE_ANOMALIES))
@pytest.mark.parametrize(
    "reader, tool, args",
    [
        ("tasks", "qinglong.task.list", {"limit": 4}),
        ("triggers", "qinglong.trigger.list", {"limit": 4}),
        ("runs", "qinglong.run.list", {"limit": 4}),
        ("outcome_window", "qinglong.task.runs.compare", {"taskId": "t0"}),
    ],
)
async def test_page_anomalies_fail_closed(seeded, reader, tool, args, anomaly):
    h = seeded
    assert (await h.call(tool, args))  # the real reader serves this call
    setattr(h.services.readers, reader, Tampered(getattr(h.services.readers, reader), **PAGE_ANOMALIES[anomaly]))
    assert await h.code(tool, args) == "unavailable"
    assert h.audit()[-1] == (tool, "allowed", ["tool_invocation_allowed", "tool_" + tool.replace(".", "_")])


@pytest.mark.parametrize("anomaly", sorted(PAGE_ANOMALIES))
async def test_event_page_anomalies_fail_closed(seeded, anomaly):
    h = seeded
    args = {"runId": "r3", "limit": 1}  # three events exist: a widened read returns too many
    assert (await h.call("qinglong.run.events.list", args))["found"] is True
    # The point read stays real; only the event page is tampered with.
    h.services.readers.runs = Tampered(h.services.readers.runs, only="events", **PAGE_ANOMALIES[anomaly])
    assert await h.code("qinglong.run.events.list", args) == "unavailable"


@pytest.mark.parametrize(
    "reader, tool, args, alter",
    [
        ("tasks", "qinglong.task.list", {"after": {"taskId": "t3"}}, _at(0, task_id="t2")),  # before the cursor
        ("tasks", "qinglong.task.list", {}, _at(0, kind="python")),
        ("tasks", "qinglong.task.list", {}, _at(0, revision=0)),
        ("tasks", "qinglong.task.list", {}, _at(0, enabled=1)),
        ("tasks", "qinglong.task.list", {}, _at(0, name="n" * 256)),
        ("tasks", "qinglong.task.list", {}, _at(0, name="")),
        ("tasks", "qinglong.task.get", {"taskId": "t1"}, _at(0, project_id="other")),
        ("tasks", "qinglong.task.get", {"taskId": "t1"}, _at(0, task_id="t2")),
        ("tasks", "qinglong.task.get", {"taskId": "t1"}, _at(0, content_digest="not a digest")),
        ("tasks", "qinglong.task.get", {"taskId": "t1"}, lambda _m, row: msgspec.structs.asdict(row)),
        ("triggers", "qinglong.trigger.list", {"after": {"triggerId": "g3"}}, _at(0, trigger_id="g3")),
        ("triggers", "qinglong.trigger.list", {}, _at(0, spec_schema=None)),
        ("triggers", "qinglong.trigger.list", {}, lambda _m, rows: tuple(rows)),
        ("runs", "qinglong.run.list", {"after": {"createdAtMs": 1005, "runId": "r5"}}, _at(0, id="r5",
                                                                                         created_at_ms=1005)),
        ("runs", "qinglong.run.list", {}, _at(0, status="exploded")),
        ("runs", "qinglong.run.list", {}, _at(0, created_at_ms=-1)),
        ("runs", "qinglong.run.get", {"runId": "r1"}, _at(0, project_id="other")),
        ("runs", "qinglong.run.get", {"runId": "r1"}, _at(0, id="r2")),
        ("runs", "qinglong.run.get", {"runId": "r1"}, _at(0, origin="telepathy")),
        ("runs", "qinglong.run.compare", {"baselineRunId": "r1", "candidateRunId": "r2"}, _at(0, task_revision=0)),
        ("runs", "qinglong.run.log.excerpt", {"runId": "r1"}, _at(0, project_id="other")),
        ("runs", "qinglong.run.log.excerpt", {"runId": "r1"}, _at(0, log_bytes=-5)),
        ("runs:events", "qinglong.run.events.list", {"runId": "r1"}, _at(0, run_id="r2")),
        ("runs:events", "qinglong.run.events.list", {"runId": "r1", "afterSequence": 1}, _at(0, sequence=1)),
        ("runs:events", "qinglong.run.events.list", {"runId": "r1"}, _at(0, actor_type="martian")),
        ("runs:events", "qinglong.run.events.list", {"runId": "r1"}, _at(0, type="Run Started!")),
        ("outcome_window", "qinglong.task.runs.compare", {"taskId": "t0"}, _at(0, task_id="t1")),
        ("outcome_window", "qinglong.task.runs.compare", {"taskId": "t0"}, _at(0, status="exploded")),
    ],
)
async def test_malformed_rows_fail_closed(seeded, reader, tool, args, alter):
    h = seeded
    await h.call(tool, args)  # fine with the real reader
    reader, _, only = reader.partition(":")
    setattr(h.services.readers, reader, Tampered(getattr(h.services.readers, reader), alter=alter, only=only or None))
    assert await h.code(tool, args) == "unavailable"


async def test_task_names_are_free_text_with_controls_neutralized(seeded):
    h = seeded
    h.sql.execute("UPDATE tasks SET name = ? WHERE id = 't1'", ("bell\x07 rtl\u202e line\nbreak",))
    listed = (await h.call("qinglong.task.list", {}))["tasks"][1]
    got = (await h.call("qinglong.task.get", {"taskId": "t1"}))["task"]
    assert listed["name"] == got["name"] == "bell\ufffd rtl\ufffd line\ufffdbreak"


async def test_a_storage_fault_surfaces_as_unavailable_not_a_traceback(seeded):
    h = seeded

    class Broken:
        def __getattr__(self, name: str) -> Any:
            async def fail(*_args: Any) -> Any:
                raise ToolError("unavailable", "storage is unavailable")

            return fail

    for reader in ("tasks", "triggers", "runs", "outcome_window"):
        setattr(h.services.readers, reader, Broken())
    for tool, args in [("qinglong.task.list", {}), ("qinglong.task.get", {"taskId": "t1"}),
                       ("qinglong.trigger.list", {}), ("qinglong.run.list", {}), ("qinglong.run.get", {"runId": "r"}),
                       ("qinglong.run.events.list", {"runId": "r"}),
                       ("qinglong.run.compare", {"baselineRunId": "a", "candidateRunId": "b"}),
                       ("qinglong.task.runs.compare", {"taskId": "t"}), ("qinglong.run.log.excerpt", {"runId": "r"})]:
        assert await h.code(tool, args) == "unavailable", tool


async def test_a_dropped_table_is_unavailable(seeded):
    h = seeded
    h.sql.execute("DROP TABLE runs")
    assert await h.code("qinglong.run.events.list", {"runId": "r1"}) == "unavailable"


async def test_log_excerpt_refuses_a_run_id_that_would_leave_the_log_directory(h):
    _seed(h, [("../../etc/passwd", "failed", 1000)])
    assert await h.code("qinglong.run.log.excerpt", {"runId": "../../etc/passwd"}) == "unavailable"


async def test_log_excerpt_refuses_a_symlinked_log(h):
    _seed(h, [("r1", "failed", 1000)])
    secret = os.path.join(h.home, "elsewhere.txt")
    with open(secret, "w") as f:
        f.write("not a log")
    os.symlink(secret, os.path.join(h.home, "logs", "r1.log"))
    assert await h.code("qinglong.run.log.excerpt", {"runId": "r1"}) == "unavailable"


async def test_log_excerpt_without_the_secret_values_shows_nothing(h):
    _seed(h, [("r1", "failed", 1000)])
    with open(os.path.join(h.home, "logs", "r1.log"), "w") as f:
        f.write("a log that could hold a secret\n")
    h.sql.execute("ALTER TABLE secrets RENAME TO secrets_gone")  # the values cannot be read: a storage fault
    assert await h.code("qinglong.run.log.excerpt", {"runId": "r1"}) == "unavailable"


def test_row_guards_accept_only_the_declared_row_type():
    from edge.core.reads import valid_row

    row = RunSummary("r", "default", "t", 1, "failed", "manual", 1, None, None, None, None, 0)
    assert valid_row(row, RunSummary, "default") == row
    with pytest.raises(ToolError):
        valid_row(msgspec.structs.asdict(row), RunSummary, "default")
    with pytest.raises(ToolError):
        valid_row(row, RunSummary, "other")
