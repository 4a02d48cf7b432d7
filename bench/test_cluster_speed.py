"""Cluster mode on a real PostgreSQL (on demand: `pytest bench/test_cluster_speed.py`; not
part of the budgets): admissions and completed runs per second with 1 and 3 nodes, and
qinglong.task.runs.compare latency with 1,000 / 100,000 / 1,000,000 runs in the database.
Figures go to bench/results/cluster.json."""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time

import pytest

from cluster_support import node_config, rows, task, wait_for
from conftest import RESULTS_DIR
from edge.cli.client import Client
from support import DaemonProcess

psycopg = pytest.importorskip("psycopg")

SIZES = (1_000, 100_000, 1_000_000)
MEASURED_TASK = "task-07"
ROUNDS = 300
MAX_RATIO = 3.0
STARTS = 240
CLIENTS_PER_NODE = 2
REPORT: dict = {"python": platform.python_version(), "cpus": os.cpu_count()}

FILL = """
INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq, created_at_ms,
                  queued_at_ms, started_at_ms, finished_at_ms, exit_code)
SELECT lpad(to_hex(c), 13, '0') || '-' || lpad(i::text, 10, '0'),
       CASE WHEN i % 10 = 9 THEN 'other' ELSE 'default' END, 'task-' || lpad((i % 24)::text, 2, '0'), 1,
       CASE WHEN i % 3 = 0 THEN 'manual' ELSE 'scheduled' END, s, 3, 3, c, c, c + 5, c + 900 + i % 50,
       CASE WHEN s = 'succeeded' THEN 0 ELSE 1 END
FROM (SELECT i, 1790000000000 + i * 1000 AS c,
             (ARRAY['succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded', 'failed', 'cancelled',
                    'timed_out'])[((i / 24) % 8) + 1] AS s
      FROM generate_series(0, {size} - 1) AS i) AS g;
"""


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "cluster.json"), "w") as f:
        json.dump(REPORT, f, indent=2)
        f.write("\n")


def _nodes(dsn: str, count: int) -> list[DaemonProcess]:
    keep = "[retention]\nruns_per_task = 100000\n"  # every run stays, to be counted
    return [DaemonProcess(config=node_config(dsn, f"b{i}", concurrency=4, lease_s=10, heartbeat_s=2,
                                             extra=keep)).start() for i in range(count)]


@pytest.mark.parametrize("count", [1, 3])
def test_throughput(pg_server, count):
    dsn = pg_server.create_database()
    nodes = _nodes(dsn, count)
    try:
        nodes[0].call("qledge.task.create", task("t", ["true"]))
        per_thread = STARTS // (count * CLIENTS_PER_NODE)
        errors: list[str] = []

        def client(node: DaemonProcess) -> None:
            with Client(node.socket) as c:
                for _ in range(per_thread):
                    try:
                        c.call("qledge.run.start", {"taskId": "t"})
                    except Exception as exc:  # a refused start is a figure, not a crash
                        errors.append(str(exc))

        threads = [threading.Thread(target=client, args=(n,)) for n in nodes for _ in range(CLIENTS_PER_NODE)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        admitted_s = time.perf_counter() - began
        total = per_thread * len(threads)
        wait_for(lambda: rows(dsn, "SELECT count(*) FROM runs WHERE status = 'succeeded'")[0][0] == total - len(errors),
                 timeout=120, every=0.05)
        done_s = time.perf_counter() - began
        per_node = dict(rows(dsn, "SELECT node_id, count(*) FROM runs GROUP BY node_id"))
    finally:
        for n in nodes:
            n.cleanup()
    REPORT.setdefault("throughput", {})[f"{count}_nodes"] = {
        "runs": total, "refused": len(errors), "admissions_per_s": round(total / admitted_s, 1),
        "completed_runs_per_s": round((total - len(errors)) / done_s, 1), "runs_per_node": per_node,
        "concurrency_per_node": 4,
    }
    assert not errors, errors[:3]


@pytest.fixture(scope="module")
def compare_clients(pg_server):
    made, nodes = {}, []
    try:
        for size in SIZES:
            dsn = pg_server.create_database()
            boot = DaemonProcess(config=node_config(dsn, f"boot{size}"))
            boot.start()
            boot.stop()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(FILL.replace("{size}", str(size)))
                conn.execute("VACUUM ANALYZE runs")
            node = DaemonProcess(config=node_config(dsn, f"r{size}", lease_s=30, heartbeat_s=5, poll_s=5)).start()
            nodes.append(node)
            made[size] = node.client()
        yield made
    finally:
        for c in made.values():
            c.close()
        for n in nodes:
            n.cleanup()


def test_compare_latency_stays_flat(compare_clients):
    args = {"taskId": MEASURED_TASK}
    for c in compare_clients.values():
        for _ in range(30):
            c.call("qinglong.task.runs.compare", args)
    samples: dict[int, list[float]] = {s: [] for s in SIZES}
    for _ in range(ROUNDS):
        for size, c in compare_clients.items():
            began = time.perf_counter()
            out = c.call("qinglong.task.runs.compare", args)
            samples[size].append(time.perf_counter() - began)
            assert out["baseline"] and out["candidate"] and out["selection"]["complete"] is True
    medians = {s: statistics.median(v) * 1000 for s, v in samples.items()}
    REPORT["task_runs_compare_ms"] = {
        "latency_ms": {str(s): round(m, 3) for s, m in medians.items()},
        "ratio_100k_to_1k": round(medians[SIZES[1]] / medians[SIZES[0]], 3),
        "ratio_1m_to_1k": round(medians[SIZES[-1]] / medians[SIZES[0]], 3),
        "what": "median ms of one call through the real socket (auth, audit row in PostgreSQL, 65-row window,"
                " two point reads, reply)",
    }
    assert medians[SIZES[-1]] / medians[SIZES[0]] < MAX_RATIO, medians
