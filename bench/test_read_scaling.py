"""Latency of qinglong.task.runs.compare and qinglong.run.list through the real socket with
1,000, 100,000 and 1,000,000 runs in the store.

One store grows in place: rows are bulk-inserted with plain SQL (one transaction per
step), then a real daemon is started on the file and called over its Unix socket. The
reads seek an index (runs_task_created_idx, runs_project_created_idx) and touch a fixed
number of rows, so the 1M/1k latency ratio must stay bounded: the plan, not luck, keeps
it flat. Figures go to bench/results/read_scaling.json.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import time

import apsw
import pytest

from conftest import RESULTS_DIR
from edge.storage.sqlite.schema import migrate
from support import DaemonProcess, short_tmpdir

SIZES = (1_000, 100_000, 1_000_000)
TASKS = 24  # runs are spread over several tasks (and a second project)
MEASURED_TASK = "task-07"
MAX_RATIO = 3.0
ROUNDS = 400
BASE_MS = 1_790_000_000_000
STATUSES = ("succeeded",) * 5 + ("failed", "cancelled", "timed_out")

_ROW_SQL = (
    "INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,"
    " queued_at_ms, started_at_ms, finished_at_ms, exit_code) VALUES (?, ?, ?, 1, ?, ?, 3, 3, ?, ?, ?, ?, ?)"
)


def _rows(first: int, last: int):
    """Runs number first..last-1, in creation order; every 10th belongs to another project."""
    for i in range(first, last):
        created = BASE_MS + i * 1000
        status = STATUSES[(i // TASKS) % len(STATUSES)]
        yield (
            f"{created:013x}-{i:010d}", "other" if i % 10 == 9 else "default", f"task-{i % TASKS:02d}",
            "scheduled" if i % 3 else "manual", status, created, created, created + 5, created + 900 + i % 50,
            0 if status == "succeeded" else 1,
        )


def _build(home: str, previous: str | None, first: int, size: int) -> str:
    """A store of `size` runs: a copy of the previous one plus rows first..size-1, one transaction."""
    os.makedirs(home, exist_ok=True)
    path = os.path.join(home, "qledge.db")
    if previous:
        shutil.copyfile(previous, path)
    conn = apsw.Connection(path)
    migrate(conn)
    conn.pragma("journal_mode", "wal")
    conn.pragma("synchronous", "OFF")
    conn.pragma("cache_size", -128 * 1024)
    with conn:
        conn.executemany(_ROW_SQL, _rows(first, size))
    conn.execute("ANALYZE")
    conn.pragma("wal_checkpoint", "TRUNCATE")
    conn.close()
    return path


@pytest.fixture(scope="module")
def clients():
    """One running daemon per store size, each with a connected client."""
    root = short_tmpdir()
    daemons, made, previous, first = {}, {}, None, 0
    try:
        for size in SIZES:
            previous = _build(os.path.join(root, str(size)), previous, first, size)
            first = size
        for size in SIZES:
            daemons[size] = DaemonProcess(home=os.path.join(root, str(size))).start()
            made[size] = daemons[size].client()
        yield made
    finally:
        for client in made.values():
            client.close()
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


CASES = {
    "task.runs.compare": ("qinglong.task.runs.compare", {"taskId": MEASURED_TASK}),
    "run.list": ("qinglong.run.list", {"limit": 32}),
}
BENCHMARKED: dict[str, dict[int, float]] = {}


def _check(case: str, size: int, out: dict) -> None:
    if case == "task.runs.compare":
        assert out["baseline"] and out["candidate"] and out["selection"]["complete"] is True
        mine = sum(1 for i in range(size) if i % TASKS == 7 and i % 10 != 9)
        assert out["selection"]["searchedRunCount"] == min(64, mine)
    else:
        assert len(out["runs"]) == 32 and out["hasMore"] is True


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", list(CASES))
def test_latency(benchmark, clients, size, case):
    tool, args = CASES[case]
    benchmark.group = case
    benchmark.extra_info["runs_in_store"] = size
    out = benchmark.pedantic(clients[size].call, args=(tool, args), rounds=ROUNDS, warmup_rounds=40, iterations=1)
    _check(case, size, out)
    BENCHMARKED.setdefault(case, {})[size] = benchmark.stats.stats.median * 1000


def _interleaved(clients: dict, tool: str, args: dict) -> dict[int, float]:
    """Median per size, sampling the sizes in turn so load on a shared machine hits all alike."""
    samples: dict[int, list[float]] = {size: [] for size in SIZES}
    for _ in range(ROUNDS):
        for size in SIZES:
            began = time.perf_counter()
            clients[size].call(tool, args)
            samples[size].append(time.perf_counter() - began)
    return {size: statistics.median(times) * 1000 for size, times in samples.items()}


def test_the_ratio_stays_bounded(clients):
    """1M/1k median latency per tool, measured interleaved; written to bench/results/read_scaling.json."""
    report = {
        "what": "median latency in ms of one call through the real Unix socket (auth, audit row, read, reply)",
        "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "rounds": ROUNDS, "tasks": TASKS, "tools": {},
    }
    for case, (tool, args) in CASES.items():
        medians = _interleaved(clients, tool, args)
        small = medians[SIZES[0]]
        report["tools"][case] = {
            "latency_ms": {str(size): round(ms, 4) for size, ms in medians.items()},
            "ratio_100k_to_1k": round(medians[SIZES[1]] / small, 3),
            "ratio_1m_to_1k": round(medians[SIZES[-1]] / small, 3),
            "pytest_benchmark_median_ms": {str(s): round(ms, 4) for s, ms in sorted(BENCHMARKED.get(case, {}).items())},
        }
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "read_scaling.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    for case, figures in report["tools"].items():
        assert figures["ratio_1m_to_1k"] < MAX_RATIO, (case, figures)
