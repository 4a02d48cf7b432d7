"""The budgets in the README's Performance table, measured; CI runs these after the tests and
fails when one is exceeded.

Each daemon variant runs from a regular install, is loaded with 100 tasks (and 100 cron
triggers where the scheduler exists), then left alone for a minute; memory is read from
/proc at the end of that minute and wake-ups are counted over it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from daemons import ROOT, BenchDaemon, context_switches, install_venv, memory, record, uvloop_path
from edge.cli.client import Client

MiB = 1 << 20
IDLE_S = float(os.environ.get("QLEDGE_BENCH_IDLE_S", "60"))
TASKS = 100

BUDGET = {
    "default_hwm_mib": 24.0,
    "default_rss_anon_mib": 14.0,
    "mcp_hwm_mib": 26.0,
    "bridge_rss_mib": 12.0,
    "edge_pyz_bytes": 256 * 1024,
    "edge_pyz_files": 64,
    "idle_wakeups_per_min": 1.0,
}
REPORT: dict[str, Any] = {"budget": BUDGET}


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    record("budgets", REPORT)


def _spec(i: int) -> dict:
    return {"command": {"kind": "argv", "file": "true", "args": [str(i)]}, "overlap": "allow"}


def populate(daemon: BenchDaemon) -> dict[str, int]:
    """100 tasks, and a cron trigger on each."""
    with Client(daemon.socket) as client:
        for i in range(TASKS):
            client.call("qledge.task.create", {"taskId": f"task-{i:03d}", "spec": _spec(i)})
        for i in range(TASKS):
            client.call("qledge.trigger.create", {
                "triggerId": f"trigger-{i:03d}", "taskId": f"task-{i:03d}",
                "expression": f"{i % 60} 3 1 1 *", "timezone": "UTC",  # yearly: nothing due while idle
            })
    return {"tasks": TASKS, "triggers": TASKS}


@pytest.fixture(scope="module")
def idle():
    """Every variant started, loaded, then idle together for IDLE_S; readings per variant."""
    python = install_venv()
    variants = {
        "default": BenchDaemon(python),
        "uvloop": BenchDaemon(python, env={"PYTHONPATH": uvloop_path()}),
        "mcp": BenchDaemon(python, config="[mcp]\nenabled = true\n"),
    }
    readings: dict[str, dict[str, Any]] = {}
    try:
        for name, d in variants.items():
            d.start()
            readings[name] = {"startup_to_ready_s": round(d.ready_s or 0, 3), "loaded": populate(d),
                              "home": d.home}
        time.sleep(2)  # let start-up work (checkpoints, optimize) settle before the window opens
        before = {name: context_switches(d.pid) for name, d in variants.items()}
        time.sleep(IDLE_S)
        for name, d in variants.items():
            after = context_switches(d.pid)
            minutes = IDLE_S / 60
            readings[name]["memory_mib"] = memory(d.pid)
            readings[name]["threads"] = after["threads"]
            readings[name]["idle_wakeups_per_min"] = round(
                (after["voluntary"] - before[name]["voluntary"]) / minutes, 2)
            readings[name]["idle_involuntary_per_min"] = round(
                (after["nonvoluntary"] - before[name]["nonvoluntary"]) / minutes, 2)
        for name, d in variants.items():  # after the window: a call is itself a wake-up
            with Client(d.socket) as client:
                status = client.call("qledge.status", {"includeModules": True})
            readings[name]["loop"] = status["loop"]
            readings[name]["modules"] = status["modules"]
            readings[name]["module_count"] = len(status["modules"])
        yield readings
    finally:
        for d in variants.values():
            d.cleanup()


def _summary(reading: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reading.items() if k not in ("modules", "home")}


def test_default_daemon_idle_memory(idle):
    r = idle["default"]
    REPORT["default"] = _summary(r)
    mem = r["memory_mib"]
    assert r["loop"] == "asyncio"
    assert mem["VmHWM"] <= BUDGET["default_hwm_mib"], mem
    assert mem["RssAnon"] <= BUDGET["default_rss_anon_mib"], mem


def test_uvloop_variant_is_reported(idle):
    r = idle["uvloop"]
    REPORT["uvloop"] = _summary(r)
    assert r["loop"] == "uvloop"
    assert "ssl" in r["modules"]  # uvloop needs it: the reason it is opt-in


def test_mcp_daemon_idle_memory(idle):
    r = idle["mcp"]
    REPORT["mcp"] = _summary(r)
    assert "edge.mcp" in " ".join(r["modules"])
    assert r["memory_mib"]["VmHWM"] <= BUDGET["mcp_hwm_mib"], r["memory_mib"]


def test_default_daemon_modules(idle):
    modules = idle["default"]["modules"]
    REPORT["default_modules"] = modules
    # edge.core.imports: the import planner runs in the CLI; the daemon needs only its shapes (core.tasks).
    # edge.core.redaction and edge.core.excerpt: loaded with the first run's log or excerpt, not while idle;
    # random with the first jittered fire, secrets with the first credential, hmac with the first token.
    for absent in ("edge.mcp", "edge.storage.postgres", "edge.core.ports.cluster", "psycopg", "ssl", "_ssl",
                   "_hashlib", "argparse", "edge.core.imports", "edge.core.redaction", "edge.core.excerpt",
                   "random", "secrets", "hmac"):
        assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent


def test_idle_wakeups(idle):
    r = idle["default"]
    assert r["idle_wakeups_per_min"] <= BUDGET["idle_wakeups_per_min"], r


def test_edge_artifact_size():
    out = tempfile.mkdtemp(prefix="qlb")
    try:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "build.py"), "--profile", "edge",
                                 "--out", out], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        with open(os.path.join(out, "qledge-edge.json")) as f:
            manifest = json.load(f)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    REPORT["edge_pyz"] = {k: manifest[k] for k in ("bytes", "files", "source_bytes", "sha256")}
    assert manifest["bytes"] <= BUDGET["edge_pyz_bytes"], manifest["bytes"]
    assert manifest["files"] <= BUDGET["edge_pyz_files"], manifest["files"]


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}


def test_bridge_rss(idle):
    """`qledge mcp` connected to the MCP daemon, after a handshake, idle for a moment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QLEDGE_", "PYTHON"))}
    env["QLEDGE_HOME"] = idle["mcp"]["home"]
    bridge = subprocess.Popen([install_venv(), "-P", "-m", "edge", "mcp"], env=env, cwd=idle["mcp"]["home"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        bridge.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        bridge.stdin.flush()
        answer = json.loads(bridge.stdout.readline())
        assert answer.get("id") == 1 and "result" in answer, answer
        time.sleep(1)
        mem = memory(bridge.pid)
    finally:
        bridge.stdin.close()
        try:
            bridge.wait(10)
        except subprocess.TimeoutExpired:
            bridge.kill()
            bridge.wait()
    REPORT["bridge"] = {"memory_mib": mem}
    assert mem["VmHWM"] <= BUDGET["bridge_rss_mib"], mem
