"""Chaos on a real cluster: three real daemons on one real PostgreSQL, in real time.
kill -9, SIGSTOP/SIGCONT and a PostgreSQL restart; each test as short as its leases
allow. The figures (fires, runs, duplicates, lost) are printed (`pytest -s`)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import time

import pytest

from cluster_support import rows, start_nodes, task, wait_for
from edge.cli.client import CallFailed

pytestmark = pytest.mark.e2e

EVERY_SECOND = {"expression": "*/1 * * * * *", "timezone": "UTC"}
DURATION_S = float(os.environ.get("QLEDGE_CHAOS_S", "60"))


def _report(name: str, **figures) -> None:
    print(f"\n[chaos] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def _holder(dsn: str, run_id: str) -> str | None:
    found = rows(dsn, "SELECT node_id FROM runs WHERE id = %s AND status = 'running'", (run_id,))
    return found[0][0] if found else None


def _kill_leftovers(dsn: str) -> None:
    """The process groups of runs whose daemon was killed (the kernel does not end them)."""
    for (pid,) in rows(dsn, "SELECT pid FROM runs WHERE pid IS NOT NULL"):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _settled(dsn: str) -> bool:
    return not rows(dsn, "SELECT 1 FROM runs WHERE status IN ('queued', 'running')")


def test_three_nodes_admit_every_fire_exactly_once(daemon_factory, pg_dsn):
    # Retention would trim the manual task's oldest runs; every run must stay to be counted.
    nodes = start_nodes(daemon_factory, pg_dsn, 3, extra="[retention]\nruns_per_task = 1000\n")
    nodes[0].call("qledge.task.create", task("tick", ["true"]))
    nodes[0].call("qledge.task.create", task("manual", ["true"]))
    nodes[1].call("qledge.trigger.create", {"triggerId": "every-second", "taskId": "tick", **EVERY_SECOND})
    began = time.monotonic()
    manual: list[str] = []
    i = 0
    while time.monotonic() - began < DURATION_S:
        manual.append(nodes[i % 3].call("qledge.run.start", {"taskId": "manual"})["id"])
        i += 1
        time.sleep(0.5)
    nodes[2].call("qledge.trigger.disable", {"triggerId": "every-second"})
    wait_for(lambda: _settled(pg_dsn), timeout=30)
    fired = rows(pg_dsn, "SELECT scheduled_for_ms, status FROM runs WHERE trigger_id = 'every-second'"
                         " ORDER BY scheduled_for_ms")
    times = [t for t, _ in fired]
    per_fire = collections.Counter(times)
    duplicates = sum(n - 1 for n in per_fire.values())
    gaps = [(a, b) for a, b in zip(times, times[1:], strict=False) if b - a != 1000]
    skipped = rows(pg_dsn, "SELECT type, reason, fires FROM trigger_events")
    statuses = collections.Counter(s for (s,) in rows(pg_dsn, "SELECT status FROM runs"))
    by_node = collections.Counter(n for (n,) in rows(pg_dsn, "SELECT node_id FROM runs"))
    _report("exactly-once", seconds=round(time.monotonic() - began), fires=len(per_fire), scheduled_runs=len(times),
            manual_runs=len(manual), duplicates=duplicates, missed=len(gaps), lost=statuses.get("lost", 0),
            statuses=dict(statuses), runs_per_node=dict(by_node))
    assert len(times) >= DURATION_S - 3
    assert duplicates == 0 and gaps == [] and skipped == []
    assert statuses == {"succeeded": len(times) + len(manual)}
    assert len(by_node) == 3  # every node claimed some


def test_kill_9_a_node_mid_run_loses_its_runs_and_nothing_else(daemon_factory, pg_dsn):
    nodes = start_nodes(daemon_factory, pg_dsn, 3, concurrency=1)
    nodes[0].call("qledge.task.create", task("work", ["sleep", "6"]))
    try:
        runs = [nodes[0].call("qledge.run.start", {"taskId": "work"})["id"] for _ in range(3)]
        holders = wait_for(lambda: (h := {r: _holder(pg_dsn, r) for r in runs}) and all(h.values()) and h)
        victim_index = 0
        victim_run = next(r for r, n in holders.items() if n == "n1")
        killed_at = time.monotonic()
        os.kill(nodes[victim_index].pid, signal.SIGKILL)
        nodes[victim_index].proc.wait()
        lost = wait_for(lambda: rows(pg_dsn, "SELECT error_code, finished_at_ms FROM runs WHERE id = %s"
                                             " AND status = 'lost'", (victim_run,)), timeout=20)
        seconds_to_lost = time.monotonic() - killed_at
        wait_for(lambda: _settled(pg_dsn), timeout=30)
    finally:
        _kill_leftovers(pg_dsn)
    statuses = dict(rows(pg_dsn, "SELECT id, status FROM runs"))
    _report("kill -9", runs=len(statuses), lost=sum(s == "lost" for s in statuses.values()),
            succeeded=sum(s == "succeeded" for s in statuses.values()), duplicates=len(statuses) - 3,
            seconds_to_lost=round(seconds_to_lost, 1))
    assert lost[0][0] == "lease_expired"
    assert statuses == {r: ("lost" if r == victim_run else "succeeded") for r in runs}
    # One line says so, by the node that recorded it lost (notices.RUN_ID_PREFIX: 18).
    said = [line for d in nodes[1:] for line in d.stderr().splitlines()
            if re.search(rf"WARNING qledge\.cluster: run finished: task=work run={victim_run[:18]} status=lost"
                         r" exit=- took=\S+ error=lease_expired$", line)]
    assert len(said) == 1, [d.stderr() for d in nodes[1:]]
    assert nodes[1].call("qledge.status")["extra"]["cluster"].endswith("of 1 slots busy here")


def test_a_node_stopped_past_its_lease_has_its_completion_fenced(daemon_factory, pg_dsn):
    nodes = start_nodes(daemon_factory, pg_dsn, 2, concurrency=1)
    # Long enough to be recorded running (after its first second) before its node is stopped.
    nodes[0].call("qledge.task.create", task("short", ["sleep", "2"]))
    run = nodes[0].call("qledge.run.start", {"taskId": "short"})["id"]
    holder = wait_for(lambda: _holder(pg_dsn, run))
    stopped = nodes[0] if holder == "n1" else nodes[1]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: rows(pg_dsn, "SELECT 1 FROM runs WHERE id = %s AND status = 'lost'", (run,)), timeout=20)
        time.sleep(1.5)  # the command has finished meanwhile; its node does not know yet
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    refused = wait_for(lambda: rows(pg_dsn, "SELECT detail FROM run_events WHERE run_id = %s"
                                            " AND type = 'run.fence_refused'", (run,)), timeout=20)
    final = rows(pg_dsn, "SELECT status, error_code, exit_code FROM runs WHERE id = %s", (run,))
    _report("SIGSTOP", runs=1, lost=1, fenced_completions=len(refused), refused=refused[0][0])
    assert final == [("lost", "lease_expired", None)]
    assert "tried to record succeeded" in refused[0][0]


def test_forbid_holds_across_nodes(daemon_factory, pg_dsn):
    nodes = start_nodes(daemon_factory, pg_dsn, 3)
    nodes[0].call("qledge.task.create", task("solo", ["sleep", "1.5"], overlap="forbid"))
    nodes[0].call("qledge.trigger.create", {"triggerId": "solo-tick", "taskId": "solo", **EVERY_SECOND})
    conflicts = 0
    began = time.monotonic()
    while time.monotonic() - began < 8:
        for node in nodes:
            try:
                node.call("qledge.run.start", {"taskId": "solo"})
            except CallFailed as exc:
                assert exc.code == "conflict", exc
                conflicts += 1
        time.sleep(0.3)
    nodes[1].call("qledge.trigger.disable", {"triggerId": "solo-tick"})
    wait_for(lambda: _settled(pg_dsn), timeout=30)
    spans = rows(pg_dsn, "SELECT started_at_ms, finished_at_ms FROM runs WHERE status = 'succeeded'"
                         " ORDER BY started_at_ms")
    overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    skipped = rows(pg_dsn, "SELECT coalesce(sum(fires), 0) FROM trigger_events WHERE reason = 'overlap'")[0][0]
    _report("forbid", runs=len(spans), overlapping=len(overlaps), manual_conflicts=conflicts,
            fires_skipped_for_overlap=skipped)
    assert spans and overlaps == [] and conflicts > 0 and skipped > 0


def test_postgresql_restarted_under_load_nothing_is_lost(daemon_factory, pg_server):
    dsn = pg_server.create_database()
    nodes = start_nodes(daemon_factory, dsn, 3)
    nodes[0].call("qledge.task.create", task("tick", ["true"]))
    nodes[0].call("qledge.task.create", task("long", ["sleep", "4"]))
    nodes[0].call("qledge.trigger.create", {"triggerId": "tick", "taskId": "tick", **EVERY_SECOND})
    long_run = nodes[1].call("qledge.run.start", {"taskId": "long"})["id"]
    wait_for(lambda: _holder(dsn, long_run))
    time.sleep(1)
    pg_server.restart()  # every session is cut; the long run finishes while nodes reconnect
    pg_server.stop()
    time.sleep(1)
    down = nodes[2].call("qledge.status")["extra"]["cluster"]
    with pytest.raises(CallFailed) as refused:
        nodes[2].call("qledge.run.start", {"taskId": "tick"})
    time.sleep(2)
    pg_server._start_server()
    pg_server.wait_ready()
    resumed_at = int(time.time() * 1000)
    wait_for(lambda: rows(dsn, "SELECT 1 FROM runs WHERE trigger_id = 'tick' AND created_at_ms > %s",
                          (resumed_at + 2000,)), timeout=30)
    wait_for(lambda: (s := nodes[2].call("qledge.status")["extra"]["cluster"]) and "reachable" in s and s)
    nodes[0].call("qledge.trigger.disable", {"triggerId": "tick"})
    wait_for(lambda: _settled(dsn), timeout=40)
    statuses = collections.Counter(s for (s,) in rows(dsn, "SELECT status FROM runs"))
    per_fire = collections.Counter(t for (t,) in rows(dsn, "SELECT scheduled_for_ms FROM runs"
                                                           " WHERE trigger_id = 'tick'"))
    long_status = rows(dsn, "SELECT status FROM runs WHERE id = %s", (long_run,))[0][0]
    _report("postgres restart", runs=sum(statuses.values()), fires=len(per_fire),
            duplicates=sum(n - 1 for n in per_fire.values()), lost=statuses.get("lost", 0),
            statuses=dict(statuses), long_run=long_status)
    assert "unreachable" in down and "new runs are refused" in down
    assert refused.value.code == "unavailable"
    assert long_status == "succeeded"
    assert statuses.get("lost", 0) == 0 and set(statuses) == {"succeeded"}
    assert max(per_fire.values()) == 1
