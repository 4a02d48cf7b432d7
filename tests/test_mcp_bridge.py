"""`qledge mcp` under load, against real daemons: thousands of pipelined requests all get
their answers, whole, and a connection the daemon cuts ends the bridge with one line on
stderr, a non-zero exit and no partial line on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from mcp_support import bridge_env, request, run_bridge
from support import DaemonProcess

MCP_ON = "[mcp]\nenabled = true\n"
REQUESTS = 10_000


def _answers(out: bytes) -> list[dict]:
    """Every line of the bridge's stdout as JSON: each must be whole."""
    assert out.endswith(b"\n"), out[-200:]
    return [json.loads(line) for line in out.split(b"\n")[:-1]]


@pytest.fixture
def mcp_daemon(daemon_factory) -> DaemonProcess:
    return daemon_factory(config=MCP_ON).start()


def test_ten_thousand_pipelined_requests_get_ten_thousand_whole_answers(mcp_daemon):
    # Stateless-era requests (each carries its envelope) and some tools/list: megabytes each
    # way, far more than the socket holds, written before the first answer is read.
    lines = [json.dumps(request(i, "tools/list" if i % 10 == 0 else "server/discover", modern=True)).encode() + b"\n"
             for i in range(REQUESTS)]
    began = time.monotonic()
    result = run_bridge(mcp_daemon.home, stdin=b"".join(lines), timeout=300)
    took = time.monotonic() - began
    answers = _answers(result.stdout)
    print(f"\n[bridge] {REQUESTS} pipelined requests: {len(answers)} answers, {len(result.stdout) / 1e6:.1f} MB,"
          f" {took:.2f}s ({REQUESTS / took:.0f} answers/s)")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    assert sorted(a["id"] for a in answers) == list(range(REQUESTS))
    assert all("result" in a for a in answers)
    assert all(len(a["result"]["tools"]) > 5 for a in answers if a["id"] % 10 == 0)


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _until(predicate, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_a_cut_connection_ends_the_bridge_with_one_line_and_no_partial_answer(daemon_factory):
    # The client stops reading: the bridge holds what it may, the daemon's answers back up,
    # and the daemon cuts the connection after its frame timeout.
    d = daemon_factory(config=MCP_ON + "[connections]\nframe_timeout_s = 1\n").start()
    before = _socket_inodes(d.pid)
    proc = subprocess.Popen([sys.executable, "-m", "edge", "mcp"], env=bridge_env(d.home),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        requests = b"".join(json.dumps(request(i, "tools/list", modern=True)).encode() + b"\n" for i in range(400))
        writer = threading.Thread(target=lambda: (proc.stdin.write(requests), proc.stdin.flush()), daemon=True)
        writer.start()
        session = _until(lambda: _socket_inodes(d.pid) - before)
        _until(lambda: not session & _socket_inodes(d.pid))  # the daemon closed its end
        out = proc.stdout.read()
        code = proc.wait(30)
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    answers = _answers(out)
    assert code == 1
    assert err in ("qledge: unavailable: the daemon cut the connection in the middle of an answer\n",
                   "qledge: unavailable: the daemon closed the connection\n"), err
    assert 0 < len(answers) < 400 and [a["id"] for a in answers] == list(range(len(answers)))
