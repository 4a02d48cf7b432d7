"""sd_notify against real AF_UNIX datagram sockets: path and abstract, in-process and from a daemon."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from edge.app.sdnotify import Notifier, Watchdog, start_watchdog
from support import short_tmpdir


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


async def test_watchdog_pets_at_its_interval_and_stops_when_the_loop_is_stuck(listener):
    dog = Watchdog(Notifier(listener.address), 0.05)
    dog.start()
    await asyncio.sleep(0.5)
    pets = await asyncio.to_thread(listener.messages, 0.02)
    # 0.5 s at 0.05 s: about 11 pets (one at start); a loaded machine may delay a few.
    assert 6 <= len(pets) <= 12 and set(pets) == {"WATCHDOG=1"}, pets
    time.sleep(0.5)  # the loop is blocked: no timer runs, so nothing may be sent
    assert listener.messages(0.02) == []
    dog.stop()
    await asyncio.sleep(0.2)
    assert await asyncio.to_thread(listener.messages, 0.02) == []


async def test_pets_from_scheduler_wake_ups_push_the_fallback_timer_back(listener):
    dog = Watchdog(Notifier(listener.address), 1.0)
    dog.start()
    for _ in range(5):  # the scheduler's wake-ups, more often than the fallback timer
        await asyncio.sleep(0.3)
        dog.pet()
    # 1.5 s have passed, but every pet pushed the 1 s timer back: one message per call and
    # none from the timer, so an idle daemon wakes once per minute, not twice.
    assert await asyncio.to_thread(listener.messages, 0.02) == ["WATCHDOG=1"] * 6
    dog.stop()


def _daemon(listener: Listener, home: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "QLEDGE_HOME": home, "NOTIFY_SOCKET": listener.address, **env}
    full.pop("QLEDGE_SOCKET", None)
    return subprocess.Popen(
        [sys.executable, "-m", "edge", "serve"], env=full,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


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
