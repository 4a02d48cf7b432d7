"""Cluster mode on a real PostgreSQL (on demand: `pytest bench/test_cluster_speed.py`; not
part of the budgets): admissions and completed runs per second with 1 and 3 nodes,
qinglong.task.runs.compare latency with 1,000 / 100,000 / 1,000,000 runs in the database,
and one node against procrastinate (its peer, when installed: `pip install procrastinate`
into the venv, for the benchmark only) on the same server at the same concurrency:
completions per second and PostgreSQL transactions per run, sides interleaved.
Figures go to bench/results/cluster.json."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
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
PEER_RUNS = 240
PEER_REPS = 3
PEER_CONCURRENCY = 4
PEER_CLIENTS = 2
# Counted by pg_stat_database: the call's audit row with the admission that reads the task (its claim in
# it), the completion (the start carried into it when the run ended first, the next claim in it), and about
# 0.05 a run: claims of runs admitted while every slot was busy and no completion was under way, a share of
# the heartbeats, the node's stop. (3.08-3.15 while the call read its task in a transaction of its own.)
MAX_TX_PER_RUN = 2.5
PEER_SCRIPT = os.path.join(os.path.dirname(__file__), "procrastinate_peer.py")
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


CONNECT_XACTS = 2  # what a short session of the figure's costs: the backend's start counts one, the read one


def _xacts(dsn: str) -> int:
    """Transactions of the database so far (PostgreSQL flushes a backend's counts when it
    exits, and at most once a second while it works). This read's own session counts
    CONNECT_XACTS in the next."""
    return int(rows(dsn, "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                         " WHERE datname = current_database()")[0][0])


def _qledge_side(pg_server) -> tuple[float, float]:
    """One node, PEER_CLIENTS callers of qledge.run.start, `true` runs: (completions/s,
    transactions per run)."""
    dsn = pg_server.create_database()
    keep = "[retention]\nruns_per_task = 100000\n"
    config = node_config(dsn, "p0", concurrency=PEER_CONCURRENCY, lease_s=10, heartbeat_s=2, extra=keep)
    # Every start admitted, as every defer is: the queue holds them all.
    node = DaemonProcess(config=config.replace("queue_limit = 64", f"queue_limit = {PEER_RUNS}")).start()
    polls = 0

    def done() -> bool:
        nonlocal polls
        polls += 1
        return rows(dsn, "SELECT count(*) FROM runs WHERE status = 'succeeded'")[0][0] == PEER_RUNS

    try:
        node.call("qledge.task.create", task("t", ["true"]))
        time.sleep(1.5)  # the set-up's counts are flushed
        before = _xacts(dsn)

        def client() -> None:
            with Client(node.socket) as c:
                for _ in range(PEER_RUNS // PEER_CLIENTS):
                    c.call("qledge.run.start", {"taskId": "t"})

        threads = [threading.Thread(target=client) for _ in range(PEER_CLIENTS)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(done, timeout=120, every=0.05)
        seconds = time.perf_counter() - began
    finally:
        node.cleanup()  # its sessions end: their counts are flushed
    time.sleep(0.5)
    used = _xacts(dsn) - before - CONNECT_XACTS * (1 + polls)  # neither the figure's reads nor its polls
    return PEER_RUNS / seconds, used / PEER_RUNS


def _peer_side(pg_server) -> tuple[float, float]:
    dsn = pg_server.create_database()
    schema = subprocess.run([sys.executable, "-c", (
        "import sys, procrastinate; app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector("
        "conninfo=sys.argv[1]))\nwith app.open(): app.schema_manager.apply_schema()"), dsn],
        capture_output=True, text=True, timeout=120)
    assert schema.returncode == 0, schema.stderr[-800:]
    time.sleep(0.5)
    before = _xacts(dsn)
    out = subprocess.run([sys.executable, PEER_SCRIPT, dsn, str(PEER_RUNS), str(PEER_CLIENTS),
                          str(PEER_CONCURRENCY)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-800:]
    time.sleep(0.5)
    used = _xacts(dsn) - before - CONNECT_XACTS
    return PEER_RUNS / json.loads(out.stdout)["seconds"], used / PEER_RUNS


def _spread(values: list[float]) -> list[float]:
    return [round(min(values), 2), round(statistics.median(values), 2), round(max(values), 2)]


def test_against_procrastinate(pg_server):
    """Interleaved, pair by pair: qledge, then procrastinate, PEER_REPS times (qledge alone,
    once, without procrastinate installed). The transactions per run are held to a budget:
    a count, steady from run to run; the speed ratio is a figure."""
    peer = importlib.util.find_spec("procrastinate") is not None
    ours, theirs, ratios = [], [], []
    for _ in range(PEER_REPS if peer else 1):
        ours.append(_qledge_side(pg_server))
        if peer:
            theirs.append(_peer_side(pg_server))
            ratios.append(ours[-1][0] / theirs[-1][0])
    figures: dict = {
        "runs": PEER_RUNS, "concurrency": PEER_CONCURRENCY, "callers": PEER_CLIENTS,
        "qledge_completions_per_s": _spread([q[0] for q in ours]),
        "qledge_transactions_per_run": _spread([q[1] for q in ours]),
        "what": "min/median/max; one node (qledge.run.start of `true`, audited, from the socket) against"
                " procrastinate 3 (defer_async of a no-op job, one worker) on the same server; transactions"
                " from pg_stat_database, the figure's own reads left out",
    }
    if peer:
        figures["procrastinate_completions_per_s"] = _spread([p[0] for p in theirs])
        figures["procrastinate_transactions_per_run"] = _spread([p[1] for p in theirs])
        figures["ratio"] = _spread(ratios)
    REPORT["against_procrastinate"] = figures
    assert max(q[1] for q in ours) <= MAX_TX_PER_RUN, ours
