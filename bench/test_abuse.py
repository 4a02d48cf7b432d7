"""Hostile peers against a real daemon: what each attack costs it, and whether everyone else
is still served. A benchmark that records figures (bench/results/latest.json, section
`abuse`), not a timed test: the assertions only check that the figures were taken.

Every attack runs against a fresh daemon from a regular install, with RLIMIT_NOFILE 1024
(the usual default) and a trigger firing every 2 s. Throughout, a well-behaved client (the
owner, over the tool socket) asks for `qledge.status` every 0.2 s. Per attack:

- VmRSS at idle, its peak while the attack runs, and after the peers have left;
- the slowest answer the well-behaved client got, and how many calls failed;
- scheduled runs that succeeded and failed while the attack ran;
- bytes the daemon wrote to stderr.

Attacks (sizes from the security review): 300,000 malformed frames never read; 300 partial
256 KiB frames held open; 100 partial 1 MiB MCP lines held open; 1,100 idle connections
(more than the daemon has descriptors); and a flood of 10,000 calls with a garbage token
(bytes written to disk per refused call, from /proc/<pid>/io write_bytes, and whether an
earlier `qledge.credential.create` row survives).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from daemons import BenchDaemon, install_venv, io_counters, memory, record
from edge.cli.client import Client
from edge.transports import tool_protocol as frames

NOFILE = 1024
HOLD_S = float(os.environ.get("QLEDGE_BENCH_HOLD_S", "8"))  # how long the peers stay after attacking
SETTLE_S = 3.0  # after the peers leave, before "after" is read
REPORT: dict[str, Any] = {}
CONFIG = "[mcp]\nenabled = true\n[runner]\nqueue_limit = 4\n"


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    record("abuse", REPORT)


def _more_descriptors() -> None:
    """This process holds a thousand sockets at once; its daemon gets the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))


class Probe(threading.Thread):
    """The well-behaved client: one `qledge.status` every 0.2 s on a fresh connection."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            started = time.perf_counter()
            try:
                with Client(self.path, timeout_s=10) as client:
                    client.call("qledge.status")
                self.latencies.append(time.perf_counter() - started)
            except Exception as exc:  # what a user would see: counted, not raised
                self.failures.append(f"{type(exc).__name__}: {exc}"[:120])
                self.latencies.append(time.perf_counter() - started)
            self._halt.wait(0.2)

    def halt(self) -> dict[str, Any]:
        self._halt.set()
        self.join(15)
        return {
            "calls": len(self.latencies),
            "max_latency_s": round(max(self.latencies, default=0), 3),
            "failures": len(self.failures),
            "first_failure": self.failures[0] if self.failures else None,
        }


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak = pid, 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, memory(self.pid)["VmRSS"])
            self._halt.wait(0.05)

    def halt(self) -> float:
        self._halt.set()
        self.join(5)
        return self.peak


def _start(python: str) -> BenchDaemon:
    daemon = BenchDaemon(python, config=CONFIG)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))  # inherited by the daemon
    try:
        daemon.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with Client(daemon.socket) as client:
        client.call("qledge.task.create", {"taskId": "tick", "spec": {
            "command": {"kind": "argv", "file": "true"}, "overlap": "allow"}})
        client.call("qledge.trigger.create", {"triggerId": "tick", "taskId": "tick",
                                              "expression": "*/2 * * * * *", "timezone": "UTC"})
    return daemon


def _runs(daemon: BenchDaemon, since_ms: int) -> dict[str, int]:
    with daemon.db() as db:
        return dict(db.execute("SELECT coalesce(error_code, status), count(*) FROM runs WHERE created_at_ms >= ?"
                               " AND status NOT IN ('queued', 'running') GROUP BY 1", (since_ms,)))


def _stderr_bytes(daemon: BenchDaemon) -> int:
    try:
        return os.path.getsize(daemon.stderr_path)
    except OSError:
        return 0


def measure(name: str, attack: Callable[[BenchDaemon], Iterator[dict[str, Any]]]) -> dict[str, Any]:
    """Run `attack` (a generator: it attacks, yields while its peers hold on, then lets them
    go) against a fresh daemon and record what it cost."""
    daemon = _start(install_venv())
    try:
        for _ in range(20):
            daemon.call("qledge.status")
        time.sleep(2)
        idle = memory(daemon.pid)["VmRSS"]
        err0, since = _stderr_bytes(daemon), int(time.time() * 1000)
        probe, sampler = Probe(daemon.socket), Sampler(daemon.pid)
        probe.start()
        sampler.start()
        steps = attack(daemon)
        facts = next(steps)  # attacked; the peers are still there
        time.sleep(HOLD_S)
        during = memory(daemon.pid)["VmRSS"]
        facts.update(next(steps, {}))  # the peers leave
        time.sleep(SETTLE_S)
        peak = sampler.halt()
        served = probe.halt()
        after = memory(daemon.pid)["VmRSS"]
        result = {
            "rss_idle_mib": idle, "rss_peak_mib": round(peak, 2), "rss_held_mib": during,
            "rss_after_mib": after, "growth_mib": round(peak - idle, 2), "after_minus_idle_mib": round(after - idle, 2),
            "well_behaved_client": served, "scheduled_runs": _runs(daemon, since),
            "stderr_bytes": _stderr_bytes(daemon) - err0, **facts,
        }
        REPORT[name] = result
        return result
    finally:
        daemon.cleanup()


def _connect(path: str, timeout: float = 2.0) -> socket.socket | None:
    """Connect, retrying while the listen backlog is full (a Unix socket says EAGAIN at once)."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        except OSError:
            sock.close()
            return None


def _send_some(sock: socket.socket, data: bytes, deadline_s: float) -> int:
    """Send until done, refused, or the peer stops reading for `deadline_s`; bytes sent."""
    sock.settimeout(deadline_s)
    view, sent = memoryview(data), 0
    try:
        while sent < len(view):
            sent += sock.send(view[sent:])
    except OSError:
        pass
    return sent


def _close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


# -- the attacks ---------------------------------------------------------------------------


def unread_bad_frames(daemon: BenchDaemon) -> Iterator[dict[str, Any]]:
    bad = frames.frame(msgspec.msgpack.encode({"id": 1, "tool": ""}))  # fails validation: answered, connection kept
    sock = _connect(daemon.socket)
    assert sock is not None
    sent = 0
    batch = bad * 1000
    for _ in range(300):
        n = _send_some(sock, batch, 3.0)
        sent += n
        if n < len(batch):
            break
    yield {"frames_sent": sent // len(bad), "frames_asked": 300_000}
    sock.close()
    yield {}


def partial_frames(daemon: BenchDaemon) -> Iterator[dict[str, Any]]:
    size = 256 * 1024
    body = size.to_bytes(4, "big") + b"\x00" * (size - 1)
    socks, accepted = [], 0
    for _ in range(300):
        sock = _connect(daemon.socket)
        if sock is None:
            continue
        socks.append(sock)
        accepted += _send_some(sock, body, 1.0) == len(body)
    yield {"connections": len(socks), "fully_sent": accepted}
    _close_all(socks)
    yield {}


def partial_mcp_lines(daemon: BenchDaemon) -> Iterator[dict[str, Any]]:
    path = os.path.join(daemon.home, "mcp.sock")
    line = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * ((1 << 20) - 64)
    socks, accepted = [], 0
    for _ in range(100):
        sock = _connect(path)
        if sock is None:
            continue
        socks.append(sock)
        accepted += _send_some(sock, line, 1.0) == len(line)
    yield {"connections": len(socks), "fully_sent": accepted}
    _close_all(socks)
    yield {}


def idle_connections(daemon: BenchDaemon) -> Iterator[dict[str, Any]]:
    socks = [s for s in (_connect(daemon.socket, 1.0) for _ in range(1100)) if s is not None]
    yield {"connections": len(socks)}
    # After the hold: the ones the daemon still serves (the others were refused or evicted).
    served = sum(1 for s in socks if _still_open(s))
    _close_all(socks)
    yield {"still_served_after_hold": served}


def _still_open(sock: socket.socket) -> bool:
    """Nothing to read yet: the daemon neither refused nor closed it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


FLOOD = 10_000


def garbage_token_flood(daemon: BenchDaemon) -> Iterator[dict[str, Any]]:
    created = daemon.call("qledge.credential.create", {"role": "viewer"})
    request = frames.frame(msgspec.msgpack.encode({"id": 1, "tool": "qledge.status", "token": "qle_garbage_x"}))
    before = io_counters(daemon.pid)["write_bytes"]
    started = time.perf_counter()
    sock = _connect(daemon.socket, 30)
    assert sock is not None
    answered = 0
    with sock:
        for _ in range(0, FLOOD, 100):  # pipelined in batches, every answer read
            sock.sendall(request * 100)
            answered += _read_answers(sock, 100)
    elapsed = time.perf_counter() - started
    time.sleep(4)  # whatever the daemon writes later (counts flushed) belongs to the flood too
    written = io_counters(daemon.pid)["write_bytes"] - before
    with daemon.db() as db:
        survived = db.execute("SELECT count(*) FROM security_audit WHERE tool = 'qledge.credential.create'"
                              ).fetchone()[0]
        rows = db.execute("SELECT count(*) FROM security_audit").fetchone()[0]
    # Gross: the probe's audited calls and the trigger's runs write meanwhile too (see audit_bytes).
    yield {"calls": FLOOD, "answered": answered, "seconds": round(elapsed, 2), "write_bytes": written,
           "bytes_per_call_gross": round(written / FLOOD, 1), "credential_create_rows_left": survived,
           "audit_rows": rows, "credential": created["credential"]["id"]}
    yield {}


def _pipelined(path: str, request: bytes, calls: int) -> int:
    sock = _connect(path, 30)
    assert sock is not None
    answered = 0
    with sock:
        for _ in range(0, calls, 100):
            sock.sendall(request * 100)
            answered += _read_answers(sock, 100)
    return answered


def test_bytes_written_per_call():
    """On a quiet daemon (no probe, no trigger): bytes written per refused call (a garbage
    token) and, for comparison, per allowed call (the owner's `qledge.status`)."""
    daemon = BenchDaemon(install_venv()).start()
    try:
        daemon.call("qledge.credential.create", {"role": "viewer"})
        time.sleep(1)
        figures: dict[str, Any] = {}
        for name, token, calls in (("refused", "qle_garbage_x", FLOOD), ("allowed", None, 1000)):
            request = frames.frame(msgspec.msgpack.encode({"id": 1, "tool": "qledge.status", "token": token}))
            before = io_counters(daemon.pid)["write_bytes"]
            assert _pipelined(daemon.socket, request, calls) == calls
            time.sleep(4)  # counts of refused calls are flushed within 2 s
            written = io_counters(daemon.pid)["write_bytes"] - before
            figures[name] = {"calls": calls, "write_bytes": written, "bytes_per_call": round(written / calls, 1)}
        with daemon.db() as db:
            figures["audit_rows"] = dict(db.execute("SELECT class, count(*) FROM security_audit GROUP BY class"))
    finally:
        daemon.cleanup()
    REPORT["audit_bytes"] = figures
    print("audit_bytes", figures)
    assert figures["refused"]["write_bytes"] >= 0


def _read_answers(sock: socket.socket, n: int) -> int:
    buf, got = b"", 0
    while got < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            buf = buf[4 + int.from_bytes(buf[:4], "big"):]
            got += 1
    return got


ATTACKS = {
    "unread_bad_frames": unread_bad_frames,
    "partial_frames": partial_frames,
    "partial_mcp_lines": partial_mcp_lines,
    "idle_connections": idle_connections,
    "garbage_token_flood": garbage_token_flood,
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack(name):
    _more_descriptors()
    result = measure(name, ATTACKS[name])
    print(name, result)
    assert result["rss_idle_mib"] > 0 and result["well_behaved_client"]["calls"] > 0
