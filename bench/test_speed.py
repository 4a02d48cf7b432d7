"""Speed, on demand (`pytest bench/`): compare figures as ratios within one run, not across machines.

Tool-call round trips through the socket, the audited read against its floor (section
`call_floor` of bench/results/latest.json), run admission + completion throughput, and
start-up to socket ready. (What a run and an audited call write to flash is a budget:
bench/test_budgets.py.)
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pytest

from callfloor import CLIENTS_CPU_RATIO_BUDGET, CPU_RATIO_BUDGET, against_floor
from daemons import BenchDaemon, install_venv, record
from edge.cli.client import CallFailed, Client

RESULTS: dict[str, Any] = {}
SPEC = {"command": {"kind": "argv", "file": "true"}, "overlap": "allow"}


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    record("speed", RESULTS)


@pytest.fixture(scope="module")
def python():
    return install_venv()


@pytest.fixture
def daemon(python):
    d = BenchDaemon(python).start()
    with Client(d.socket) as client:
        client.call("qledge.task.create", {"taskId": "bench", "spec": SPEC})
    yield d
    d.cleanup()


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _calls(path: str, n: int, latencies: list[float]) -> None:
    with Client(path) as client:
        for _ in range(n):
            t = time.perf_counter()
            client.call("qledge.task.get", {"taskId": "bench"})
            latencies.append(time.perf_counter() - t)


@pytest.mark.parametrize("clients", [1, 16])
def test_tool_call_round_trip(daemon, clients):
    per_client = 1500 if clients == 1 else 120
    _calls(daemon.socket, 50, [])  # warm up
    latencies: list[float] = []
    threads = [threading.Thread(target=_calls, args=(daemon.socket, per_client, latencies)) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    assert len(latencies) == clients * per_client
    RESULTS[f"tool_call_{clients}_client{'s' if clients > 1 else ''}"] = {
        "tool": "qledge.task.get (audited read)",
        "calls": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 99) * 1000, 3),
        "calls_per_s": round(len(latencies) / elapsed, 1),
    }


def _start_all(client: Client, n: int, tasks: tuple[str, ...] = ("bench",)) -> list[str]:
    """Start n runs round-robin over `tasks`, backing off while the bounded queue is full."""
    ids: list[str] = []
    while len(ids) < n:
        try:
            ids.append(client.call("qledge.run.start", {"taskId": tasks[len(ids) % len(tasks)]})["id"])
        except CallFailed as exc:
            if exc.code != "resource_exhausted":
                raise
            time.sleep(0.01)
    return ids


def _wait_all(client: Client, ids: list[str]) -> list[str]:
    return [client.call("qledge.run.wait", {"runId": i, "timeoutMs": 60_000})["run"]["status"] for i in ids]


def test_run_admission_and_completion_throughput(daemon):
    n = 200
    # Retention keeps 100 finished runs per task: spread the runs so none is pruned before it is waited for.
    tasks = ("bench", "bench-2", "bench-3", "bench-4")
    with Client(daemon.socket) as client:
        for task in tasks[1:]:
            client.call("qledge.task.create", {"taskId": task, "spec": SPEC})
        started = time.perf_counter()
        ids = _start_all(client, n, tasks)
        statuses = _wait_all(client, ids)
        elapsed = time.perf_counter() - started
    assert statuses == ["succeeded"] * n
    RESULTS["runs"] = {"runs": n, "concurrency": 2, "runs_per_s": round(n / elapsed, 1),
                       "ms_per_run": round(elapsed / n * 1000, 2)}


def test_startup_to_socket_ready(python):
    times = []
    for _ in range(5):
        d = BenchDaemon(python).start()
        times.append(d.ready_s or 0)
        d.cleanup()
    RESULTS["startup_to_ready_s"] = {"median": round(statistics.median(times), 3), "max": round(max(times), 3)}


def test_audited_read_against_its_floor(daemon, python):
    """`qledge.task.get` through the whole chain against bench/floor_server.py: server CPU
    per call, sequential and 16-client calls/s, interleaved, ratios pair by pair."""
    assert daemon.proc is not None
    result = against_floor(python, daemon.socket, daemon.proc.pid, rounds=7)
    record("call_floor", {**result, "cpu_ratio_budget": CPU_RATIO_BUDGET,
                          "clients_cpu_ratio_budget": CLIENTS_CPU_RATIO_BUDGET})
    assert result["cpu_us_per_call"]["ratio"]["median"] > 0
