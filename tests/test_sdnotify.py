"""sd_notify against real AF_UNIX datagram sockets: path and abstract, in-process and from a daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from edge.app.daemon import Notifier, Watchdog, start_watchdog
from support import ManualTimers, short_tmpdir


class Listener:
    """A datagram socket standing in for the service manager's notify socket."""

    def __init__(self, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"qledge-test-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
            self.dir = None
        else:
            self.dir = short_tmpdir()
            self.address = os.path.join(self.dir, "notify.sock")
            self.sock.bind(self.address)

    def messages(self, timeout: float = 0.2) -> list[str]:
        """Everything received until the socket has been quiet for `timeout` seconds."""
        got: list[str] = []
        self.sock.settimeout(timeout)
        while True:
            try:
                got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return got

    def wait_for(self, needle: str, timeout: float = 20.0) -> list[str]:
        """Messages up to and including the first that contains `needle`."""
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                break
            if needle in got[-1]:
                return got
        raise AssertionError(f"no {needle!r} within {timeout}s; got {got}")

    def close(self) -> None:
        self.sock.close()
        if self.dir:
            os.unlink(self.address)
            os.rmdir(self.dir)


@pytest.fixture(params=["path", "abstract"])
def listener(request):
    lst = Listener(abstract=request.param == "abstract")
    yield lst
    lst.close()


def test_notify_reaches_path_and_abstract_sockets(listener):
    n = Notifier(listener.address)
    assert n.enabled
    assert n.notify("READY=1\nSTATUS=ok")
    assert listener.messages() == ["READY=1\nSTATUS=ok"]


def test_without_notify_socket_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled and n.notify("READY=1") is False
    assert start_watchdog(n) is None


def test_unreachable_socket_is_not_an_error(tmp_path):
    assert Notifier(str(tmp_path / "nobody-listens")).notify("READY=1") is False


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    ("2000000", None, 1.0),
    ("2000000", "self", 1.0),
    ("2000000", "1", None),  # the watchdog is meant for another process
    ("junk", None, None),
    ("0", None, None),
    (None, None, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch, usec, pid, expected):
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert Notifier("/unused").watchdog_interval_s() == expected


def test_watchdog_pets_at_its_interval_until_stopped(listener):
    timers = ManualTimers()
    dog = Watchdog(Notifier(listener.address), 30.0, timers)
    dog.start()
    assert timers.pending == [30.0]
    assert timers.advance(95.0) == 3  # at 30, 60 and 90 s
    assert listener.messages(0.02) == ["WATCHDOG=1"] * 4  # and one at start
    dog.stop()
    assert timers.pending == [] and timers.advance(600.0) == 0
    assert listener.messages(0.02) == []


def test_pets_from_scheduler_wake_ups_push_the_fallback_timer_back(listener):
    timers = ManualTimers()
    dog = Watchdog(Notifier(listener.address), 30.0, timers)
    dog.start()
    for _ in range(5):  # the scheduler's wake-ups, more often than the fallback timer
        assert timers.advance(20.0) == 0
        dog.pet()
        assert timers.pending == [30.0]  # one timer, pushed back
    # 100 s have passed: one message per pet and none from the timer, so an idle daemon
    # wakes once per minute, not twice.
    assert listener.messages(0.02) == ["WATCHDOG=1"] * 6
    dog.stop()


async def test_the_watchdog_timer_runs_on_the_event_loop(listener):
    """A timer on the loop, not a thread: while the loop is stuck nothing is sent, so the
    service manager restarts the daemon."""
    dog = Watchdog(Notifier(listener.address), 0.01)
    dog.start()
    time.sleep(0.1)  # the loop is blocked: its timers cannot run
    assert listener.messages(0.01) == ["WATCHDOG=1"]  # only the pet at start
    dog.stop()


def _daemon(listener: Listener, home: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "QLEDGE_HOME": home, "NOTIFY_SOCKET": listener.address, **env}
    full.pop("QLEDGE_SOCKET", None)
    return subprocess.Popen(
        [sys.executable, "-m", "edge", "serve"], env=full,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


@pytest.mark.e2e
def test_daemon_ready_watchdog_reload_and_stopping(listener, home):
    proc = _daemon(listener, home, WATCHDOG_USEC="400000")  # pet every 0.2 s
    try:
        ready = listener.wait_for("READY=1")[-1]
        assert f"MAINPID={proc.pid}" in ready and "STATUS=serving on" in ready
        assert os.path.exists(os.path.join(home, "qledge.sock"))  # READY=1 only once the socket accepts
        time.sleep(1.0)
        pets = [m for m in listener.messages(0.05) if m == "WATCHDOG=1"]
        assert 3 <= len(pets) <= 7, pets
        proc.send_signal(signal.SIGHUP)
        reload = listener.wait_for("READY=1")
        assert any(m.startswith("RELOADING=1\nMONOTONIC_USEC=") for m in reload), reload
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in listener.wait_for("STOPPING=1")
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
