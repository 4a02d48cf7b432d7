"""The system log under the reliability scenarios, on real daemons: a crash (kill -9 mid-run),
overlapping starts of a `forbid` task, a full run queue, a full disk and PostgreSQL going
away. Each refusal is an expected outcome: at most a line, coalesced per task, and never a
traceback (a traceback in the daemon's stderr means a bug, and fails the test)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import pytest

from cluster_support import node_config, wait_for
from edge.cli.client import CallFailed
from support import IS_ROOT, DaemonProcess, short_tmpdir

pytestmark = pytest.mark.e2e

EVERY_SECOND = {"expression": "* * * * * *", "timezone": "UTC"}


def _spec(argv: list[str], overlap: str = "forbid") -> dict:
    return {"command": {"kind": "argv", "file": argv[0], "args": argv[1:]}, "overlap": overlap}


def _refused(d: DaemonProcess, task: str, times: int) -> list[str]:
    codes = []
    for _ in range(times):
        with contextlib.suppress(CallFailed):
            d.call("qledge.run.start", {"taskId": task})
            continue
        codes.append("refused")
    return codes


def _fire_events(d: DaemonProcess, reason: str) -> list[dict]:
    return [e for e in d.call("qledge.trigger.events", {})["events"] if e["reason"] == reason]


def _no_traceback(d: DaemonProcess) -> str:
    err = d.stderr()
    assert "Traceback" not in err, err[err.index("Traceback") - 300:][:3000]
    for line in err.splitlines():  # every line of the system log is one of ours, one line each
        assert line.startswith("qledge: "), line
    return err


def test_overlapping_starts_of_a_forbid_task_are_one_coalesced_line(daemon_factory):
    d = daemon_factory().start()
    d.call("qledge.task.create", {"taskId": "long", "spec": _spec(["sleep", "30"])})
    d.call("qledge.task.create", {"taskId": "swap", "spec": _spec(["sleep", "30"], overlap="replace")})
    first = d.call("qledge.run.start", {"taskId": "long"})
    with pytest.raises(CallFailed) as refused:
        d.call("qledge.run.start", {"taskId": "long"})
    assert refused.value.code == "conflict"
    assert len(_refused(d, "long", 200)) == 200
    for _ in range(3):
        d.call("qledge.run.start", {"taskId": "swap"})  # replaces the one before
    d.call("qledge.trigger.create", {"triggerId": "tick", "taskId": "long", **EVERY_SECOND})
    wait_for(lambda: _fire_events(d, "overlap"), timeout=15)
    d.call("qledge.run.cancel", {"runId": first["id"]})
    d.stop()
    err = _no_traceback(d)
    refusals = [line for line in err.splitlines() if "start refused: task=long" in line]
    assert 1 <= len(refusals) <= 5, refusals
    assert refusals[0].endswith("conflict: task 'long' already has an active run"
                                f" ({first['id']}) and its overlap policy is forbid")
    assert re.search(r"task=long: \d+ more lines suppressed in the last \d+(\.\d)?s \(.*\d+ start refused", err), err
    assert len(err) < 8 * 1024, len(err)  # 200 refusals: a few lines, not 200 tracebacks


def test_a_full_queue_refuses_starts_and_fires_in_a_line(daemon_factory):
    d = daemon_factory(config="[runner]\nconcurrency = 1\nqueue_limit = 2\n").start()
    d.call("qledge.task.create", {"taskId": "many", "spec": _spec(["sleep", "30"], overlap="allow")})
    for _ in range(3):
        d.call("qledge.run.start", {"taskId": "many"})
    with pytest.raises(CallFailed) as refused:
        d.call("qledge.run.start", {"taskId": "many"})
    assert refused.value.code == "resource_exhausted"
    assert len(_refused(d, "many", 50)) == 50
    d.call("qledge.trigger.create", {"triggerId": "tick", "taskId": "many", **EVERY_SECOND})
    wait_for(lambda: _fire_events(d, "queue_full"), timeout=15)
    d.stop()
    err = _no_traceback(d)
    refusals = [line for line in err.splitlines() if "start refused: task=many" in line]
    assert 1 <= len(refusals) <= 5 and "resource_exhausted: the run queue is full" in refusals[0], refusals
    assert re.search(r"task=many: \d+ more lines suppressed .*start refused", err), err


def test_a_crash_mid_run_and_the_recovery_log_no_traceback(daemon_factory):
    d = daemon_factory(config="[runner]\nconcurrency = 2\nkill_grace_s = 1\n").start()
    d.call("qledge.task.create", {"taskId": "long", "spec": _spec(["sleep", "30"])})
    d.call("qledge.task.create", {"taskId": "tick", "spec": _spec(["sh", "-c", "echo tick; sleep 2"])})
    d.call("qledge.trigger.create", {"triggerId": "tick", "taskId": "tick", **EVERY_SECOND})
    long_run = d.call("qledge.run.start", {"taskId": "long"})
    wait_for(lambda: d.call("qledge.run.get", {"runId": long_run["id"]})["status"] == "running")
    _refused(d, "long", 20)
    d.stop(signal.SIGKILL)
    d.start()  # recovers: what was left running and queued is lost, its processes stopped
    wait_for(lambda: d.call("qledge.run.get", {"runId": long_run["id"]})["status"] == "lost")
    _refused(d, "tick", 5)
    time.sleep(2)
    d.call("qledge.trigger.disable", {"triggerId": "tick"})
    d.stop()
    err = _no_traceback(d)
    assert "was left running by a daemon that stopped" in err


@pytest.fixture
def small_disk():
    """A 12 MiB tmpfs (root only); the daemon's home is `<mount>/home`."""
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root")
    mount = short_tmpdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m,mode=0755", "tmpfs", mount],
                          capture_output=True, text=True)
    if done.returncode != 0:
        os.rmdir(mount)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    os.mkdir(os.path.join(mount, "home"), 0o700)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)
        os.rmdir(mount)


def _fill(path: str) -> None:
    chunk = b"\xa5" * 65536
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk[:size])


def test_a_full_disk_refuses_runs_in_a_line(small_disk):
    home = os.path.join(small_disk, "home")
    scratch = os.path.join(small_disk, "scratch")
    os.mkdir(scratch)
    os.chmod(scratch, 0o1777)  # for the task's user
    d = DaemonProcess(home=home).start()
    try:
        d.call("qledge.task.create", {"taskId": "filler", "spec": _spec(
            ["sh", "-c", f"dd if=/dev/zero of={scratch}/fill bs=64k 2>/dev/null; seq 1 100000"])})
        d.call("qledge.task.create", {"taskId": "t", "spec": _spec(["true"])})
        run = d.call("qledge.run.start", {"taskId": "filler"})
        wait_for(lambda: d.call("qledge.run.get", {"runId": run["id"]})["status"] == "succeeded")
        d.call("qledge.trigger.create", {"triggerId": "tick", "taskId": "t", **EVERY_SECOND})
        filler = os.path.join(small_disk, "more")
        _fill(filler)
        with pytest.raises(CallFailed) as refused:
            d.call("qledge.run.start", {"taskId": "t"})
        assert refused.value.code in ("resource_exhausted", "unavailable")
        _refused(d, "t", 20)
        time.sleep(3)  # fires meet the full disk
        os.unlink(filler)
        os.unlink(os.path.join(scratch, "fill"))
        wait_for(lambda: d.call("qledge.trigger.disable", {"triggerId": "tick"}))
        d.stop()
        _no_traceback(d)
    finally:
        d.cleanup()


def test_postgresql_down_logs_no_traceback(daemon_factory, pg_server):
    dsn = pg_server.create_database()
    nodes = [daemon_factory(config=node_config(dsn, f"n{i + 1}")).start() for i in range(2)]
    nodes[0].call("qledge.task.create", {"taskId": "tick", "spec": _spec(["true"], overlap="allow")})
    nodes[0].call("qledge.task.create", {"taskId": "long", "spec": _spec(["sleep", "3"])})
    nodes[0].call("qledge.trigger.create", {"triggerId": "tick", "taskId": "tick", **EVERY_SECOND})
    nodes[1].call("qledge.run.start", {"taskId": "long"})
    _refused(nodes[0], "long", 10)
    time.sleep(1)
    pg_server.stop()
    time.sleep(1)
    for node in nodes:
        _refused(node, "tick", 10)
        with contextlib.suppress(CallFailed):
            node.call("qledge.run.list", {})
    time.sleep(3)  # the scheduler, the claim loop and the heartbeat meet the outage
    pg_server._start_server()
    pg_server.wait_ready()
    for node in nodes:
        wait_for(lambda node=node: "reachable" in node.call("qledge.status")["extra"]["cluster"], timeout=30)
    nodes[0].call("qledge.trigger.disable", {"triggerId": "tick"})
    for node in nodes:
        node.stop()
        _no_traceback(node)
