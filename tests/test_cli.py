"""The CLI end to end against a real daemon process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _json(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_add_start_wait_and_read_log(daemon):
    assert daemon.cli("task", "add", "hello", "--", "echo", "hi").returncode == 0
    started = daemon.cli("run", "start", "hello", "--wait")
    assert started.returncode == 0, started.stderr
    assert "succeeded" in started.stdout
    run_id = started.stdout.split()[1]
    log = daemon.cli("run", "log", run_id)
    assert log.returncode == 0
    assert log.stdout == "hi\n"
    run = _json(daemon.cli("run", "get", run_id, "--json"))
    assert run["status"] == "succeeded" and run["exitCode"] == 0 and run["logBytes"] == 3
    events = daemon.call("qledge.run.events", {"runId": run_id})["events"]
    assert [e["type"] for e in events] == ["run.queued", "run.running", "run.succeeded"]
    assert [e["sequence"] for e in events] == [1, 2, 3]


def test_failing_command_is_failed_with_exit_code(daemon):
    daemon.cli("task", "add", "bad", "--shell", "--", "echo oops >&2; exit 3")
    result = daemon.cli("run", "start", "bad", "--wait", "--json")
    assert result.returncode == 1
    run = json.loads(result.stdout)
    assert run["status"] == "failed" and run["exitCode"] == 3 and run["errorCode"] == "exit_nonzero"
    assert daemon.cli("run", "log", run["id"]).stdout == "oops\n"


def test_timeout_kills_the_process_group(daemon):
    # The child shell spawns a grandchild; both must die when the run times out.
    daemon.cli("task", "add", "slow", "--timeout", "1", "--shell", "--", "sleep 60 & echo $! > pidfile; wait")
    result = daemon.cli("run", "start", "slow", "--wait", "--json")
    run = json.loads(result.stdout)
    assert run["status"] == "timed_out" and run["errorCode"] == "timeout"
    with open(os.path.join(daemon.home, "work", "pidfile")) as f:
        grandchild = int(f.read())
    assert not _alive(grandchild)


def test_cancel_a_running_run(daemon):
    daemon.cli("task", "add", "long", "--", "sleep", "60")
    run = _json(daemon.cli("run", "start", "long", "--json"))
    waited = daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 0})
    cancelled = _json(daemon.cli("run", "cancel", run["id"], "--json"))
    assert cancelled["status"] == "cancelled"
    assert waited["done"] is False
    events = daemon.call("qledge.run.events", {"runId": run["id"]})["events"]
    assert events[-1]["type"] == "run.cancelled"


def test_cancel_a_queued_run(daemon_factory):
    d = daemon_factory(config="[runner]\nconcurrency = 1\n").start()
    d.cli("task", "add", "long", "--overlap", "allow", "--", "sleep", "60")
    first = _json(d.cli("run", "start", "long", "--json"))
    second = _json(d.cli("run", "start", "long", "--json"))
    cancelled = _json(d.cli("run", "cancel", second["id"], "--json"))
    assert cancelled["status"] == "cancelled" and cancelled["startedAtMs"] is None
    assert _json(d.cli("run", "get", first["id"], "--json"))["status"] == "running"


def test_task_lifecycle_and_listing(daemon):
    for i in range(70):  # more than one page of the list tool
        daemon.call("qledge.task.create", {"taskId": f"t{i:03d}", "spec": {"command": {"kind": "argv", "file": "true"}}})
    listed = _json(daemon.cli("task", "list", "--json"))
    assert [t["id"] for t in listed] == [f"t{i:03d}" for i in range(70)]
    assert "disabled" in daemon.cli("task", "disable", "t001").stdout
    refused = daemon.cli("run", "start", "t001")
    assert refused.returncode == 1 and "disabled" in refused.stderr
    got = _json(daemon.cli("task", "get", "t001", "--json"))
    assert got["enabled"] is False and got["revision"] == 2
    assert daemon.cli("task", "rm", "t001").returncode == 0
    missing = daemon.cli("task", "get", "t001")
    assert missing.returncode == 1 and missing.stderr.strip() == "qledge: not_found: task 't001' not found"


def test_update_is_compare_and_set(daemon):
    spec = {"command": {"kind": "argv", "file": "true"}}
    daemon.call("qledge.task.create", {"taskId": "t", "spec": spec})
    updated = daemon.call("qledge.task.update", {"taskId": "t", "expectedRevision": 1, "spec": spec})
    assert updated["revision"] == 2
    stale = daemon.cli("call", "qledge.task.update", "--args", json.dumps({"taskId": "t", "expectedRevision": 1, "spec": spec}))
    assert stale.returncode == 1 and stale.stderr.startswith("qledge: conflict:")


def test_daemon_not_running_is_one_clear_line(home):
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "status"], env=env, capture_output=True, text=True)
    assert result.returncode == 3
    assert result.stderr == f"qledge: daemon not running at {home}/qledge.sock\n"


def test_usage_errors_exit_2(home):
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "task", "frobnicate"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_call_prints_json_and_fails_nonzero(daemon):
    ok = daemon.cli("call", "qledge.status")
    assert ok.returncode == 0 and json.loads(ok.stdout)["pid"] == daemon.pid
    bad = daemon.cli("call", "qledge.nope")
    assert bad.returncode == 1 and bad.stderr == "qledge: invalid_argument: unknown tool 'qledge.nope'\n"
    garbled = daemon.cli("call", "qledge.status", "--args", "{nope")
    assert garbled.returncode == 2 and garbled.stderr.startswith("qledge: --args is not valid JSON")


def test_status_reports_lean_default(daemon):
    status = daemon.call("qledge.status", {"includeModules": True})
    assert status["loop"] in ("asyncio", "uvloop")
    if status["loop"] == "asyncio":
        assert status["sslLoaded"] is False and "ssl" not in status["modules"]
    assert "edge.mcp" not in status["modules"] and "_hashlib" not in status["modules"]
    assert status["hwmBytes"] > 0 and status["dbPath"].endswith("qledge.db")


def test_sigterm_cancels_runs_and_exits_zero(daemon):
    daemon.cli("task", "add", "long", "--", "sleep", "60")
    run = _json(daemon.cli("run", "start", "long", "--json"))
    daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 200})
    db = daemon.db()
    assert daemon.stop() == 0
    status, summary = db.execute("SELECT status, error_summary FROM runs WHERE id = ?", (run["id"],)).fetchone()
    assert status == "cancelled" and summary == "cancelled: shutdown"
    assert not os.path.exists(daemon.socket)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"
