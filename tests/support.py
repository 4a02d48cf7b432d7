"""Real daemons, real sockets, real SQLite files: helpers shared by the tests."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

import apsw
import msgspec

from edge.cli.client import Client
from edge.transports import tool_protocol as frames

READY_TIMEOUT_S = 20.0
# The user the test daemons run as: a task naming it runs as the daemon does (as root in
# CI, where a task naming no user runs as nobody).
OWN_USER = pwd.getpwuid(os.geteuid()).pw_name
IS_ROOT = os.geteuid() == 0


def until(predicate: Callable[[], Any], what: str, timeout_s: float = 20.0, every_s: float = 0.02) -> Any:
    """Poll `predicate` until it returns something true (returned) or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)
    return value


def unread(sock: socket.socket) -> int:
    """Bytes sent on this Unix stream socket that its peer has not read yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def read_by(daemon: DaemonProcess, *socks: socket.socket) -> None:
    """Once this returns, the daemon has read everything sent on `socks` and acted on it: the
    kernel holds none of it any more, and a call after that (a full turn of the daemon's
    event loop, and then some) has been answered."""
    until(lambda: all(unread(s) == 0 for s in socks), "the daemon to read what was sent")
    daemon.call("qledge.status")


def short_tmpdir() -> str:
    """Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer."""
    return tempfile.mkdtemp(prefix="qle", dir="/tmp")


def scratch_dir() -> str:
    """A directory outside every home that any task user may write (mode 1777, like /tmp):
    where a test's tasks leave files for the test to read."""
    path = tempfile.mkdtemp(prefix="qlew", dir="/tmp")
    os.chmod(path, 0o1777)
    return path


class DaemonProcess:
    """`python -m edge serve` in a private home, ready when it says READY=1 via sd_notify."""

    def __init__(
        self, home: str | None = None, config: str | None = None, env: dict[str, str] | None = None,
        argv: list[str] | None = None, user: str | None = None,
    ) -> None:
        self.argv = argv or [sys.executable, "-m", "edge"]  # what runs `serve`: e.g. a .pyz or another venv
        self.ready_s: float | None = None
        self.home = home or short_tmpdir()
        self._own_home = home is None
        self.socket = os.path.join(self.home, "qledge.sock")
        self.config_path: str | None = None
        if config is not None:
            self.config_path = os.path.join(self.home, "qledge.toml")
            with open(self.config_path, "w") as f:
                f.write(config)
        self.env = {**os.environ, "QLEDGE_HOME": self.home, **(env or {})}
        self.env.pop("QLEDGE_TOKEN", None)
        self.env.pop("QLEDGE_SOCKET", None)
        self.proc: subprocess.Popen | None = None
        self.notifications: Notifications | None = None  # what the daemon said via sd_notify
        self.stderr_path = os.path.join(self.home, "daemon.stderr")
        self._scratch: str | None = None
        self.user = user  # run the daemon as this user (the test must be root); its home becomes its own
        if user is not None:
            pw = pwd.getpwnam(user)
            os.chown(self.home, pw.pw_uid, pw.pw_gid)

    @property
    def scratch(self) -> str:
        """A 1777 directory outside the home (scratch_dir), removed with the daemon's home."""
        if self._scratch is None:
            self._scratch = scratch_dir()
        return self._scratch

    def start(self, extra_args: list[str] | None = None) -> DaemonProcess:
        notify_path = os.path.join(self.home, "notify.sock")
        if self.notifications is not None:
            self.notifications.close()
        self.notifications = Notifications(notify_path, world_writable=self.user is not None)
        args = [*self.argv, "serve"]
        if self.config_path:
            args += ["--config", self.config_path]
        args += extra_args or []
        started = time.perf_counter()
        with open(self.stderr_path, "ab") as err:
            as_user = {} if self.user is None else {"user": self.user, "group": pwd.getpwnam(self.user).pw_gid,
                                                     "extra_groups": []}
            self.proc = subprocess.Popen(
                args, env={**self.env, "NOTIFY_SOCKET": notify_path},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, **as_user,
            )
        proc = self.proc
        if not self.notifications.wait("READY=1", READY_TIMEOUT_S, while_=lambda: proc.poll() is None):
            code = proc.poll()
            self.stop()
            why = "timed out" if code is None else f"it exited with status {code}"
            raise RuntimeError(f"daemon did not become ready ({why}): {self.stderr()}")
        self.ready_s = time.perf_counter() - started
        return self

    def stderr(self) -> str:
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the daemon (a graceful stop by default) and wait for it to exit; killed
        after `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self._reap(timeout)

    def _reap(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        if self.notifications is not None:
            self.notifications.close()
        return code

    def halt(self, timeout: float = 20.0) -> int | None:
        """Stop for good, as fast as the daemon can: SIGTERM, then, once it says it is
        stopping (STOPPING=1), a second SIGTERM, which stops it at once (no grace for calls
        in flight or for runs). What a test that is over needs: nothing waits out a grace."""
        if self.proc is None:
            return None
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert self.notifications is not None
            if self.notifications.wait("STOPPING=1", timeout, while_=lambda: proc.poll() is None):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        return self._reap(timeout)

    def cleanup(self) -> None:
        self.halt()
        if self._own_home:
            shutil.rmtree(os.path.realpath(self.home) + "-tasks", ignore_errors=True)  # the tasks' data directories
            shutil.rmtree(self.home, ignore_errors=True)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, token: str | None = None) -> Client:
        return Client(self.socket, token=token)

    def call(self, tool: str, args: Any = None, token: str | None = None) -> Any:
        with self.client(token) as c:
            return c.call(tool, args)

    def cli(self, *args: str, token: str | None = None, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        env = dict(self.env)
        if token:
            env["QLEDGE_TOKEN"] = token
        return subprocess.run(
            [sys.executable, "-m", "edge", *args], env=env, capture_output=True, text=True, timeout=timeout,
            input=input, stdin=subprocess.DEVNULL if input is None else None,
        )

    def db(self) -> apsw.Connection:
        """A second, real connection to the daemon's database file (for assertions)."""
        conn = apsw.Connection(os.path.join(self.home, "qledge.db"))
        conn.set_busy_timeout(5000)
        return conn

    def token(self, role: str, permissions: list[str] | None = None) -> tuple[str, str]:
        args: dict[str, Any] = {"role": role}
        if permissions is not None:
            args["permissions"] = permissions
        created = self.call("qledge.credential.create", args)
        return created["credential"]["id"], created["token"]


class Notifications:
    """The sd_notify datagrams a daemon sends (READY=1, RELOADING=1, STOPPING=1, …), read by
    a thread as they come (the daemon's send would block on a full queue), for a test to
    wait on."""

    def __init__(self, path: str, world_writable: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        if world_writable:
            os.chmod(path, 0o777)
        self._sock.settimeout(0.2)
        self.messages: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, daemon=True, name=f"notify {path}").start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while not self._closed:
                try:
                    data = self._sock.recv(4096)
                except TimeoutError:
                    continue
                with self._changed:
                    if data:
                        self.messages.append(data.decode(errors="replace"))
                    self._changed.notify_all()

    def wait(self, line: str, timeout: float, while_: Callable[[], bool] = lambda: True) -> bool:
        """Whether a message holding `line` (e.g. "READY=1") came within `timeout`; gives up
        at once when `while_()` turns false (the daemon exited)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(line in m.splitlines() for m in self.messages):
                left = deadline - time.monotonic()
                if left <= 0 or not while_():
                    return False
                self._changed.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop reading; the descriptor is given back now, not when the thread next wakes."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class RawConnection:
    """A socket speaking the frame protocol by hand, for malformed-input tests."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: dict) -> None:
        self.send_raw(frames.frame(msgspec.msgpack.encode(request)))

    def recv(self) -> dict | None:
        header = self._exactly(4)
        if header is None:
            return None
        body = self._exactly(int.from_bytes(header, "big"))
        return None if body is None else msgspec.msgpack.decode(body)

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def interrupt_once_written(argv: list[str], env: dict[str, str], written: Callable[[], bool],
                           sig: int = signal.SIGTERM) -> subprocess.CompletedProcess | None:
    """Start `argv`, send it `sig` as soon as `written()` holds (the command has written its
    first batch), and return what it exited with and printed; None when it finished before
    the signal could reach it (a fast machine: the caller gives it more work and tries again)."""
    proc = subprocess.Popen(argv, env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not written():
            assert time.monotonic() < deadline, f"{argv[3:]} wrote nothing in a minute"
            time.sleep(0.005)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == 0:
        return None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class ManualTimer:
    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due, self.callback, self.cancelled = due, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Timers (edge.core.ports.runtime) that fire only when the test advances time, so
    nothing waits on the real clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[ManualTimer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> ManualTimer:
        timer = ManualTimer(self.now + delay_s, callback)
        self._timers.append(timer)
        return timer

    @property
    def pending(self) -> list[float]:
        """Delays from now of the timers still armed."""
        return sorted(t.due - self.now for t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time on, firing what falls due in order (callbacks may arm new timers);
        returns how many fired."""
        end, fired = self.now + seconds, 0
        while due := sorted((t for t in self._timers if not t.cancelled and t.due <= end), key=lambda t: t.due):
            timer = due[0]
            self._timers.remove(timer)
            self.now = timer.due
            timer.callback()
            fired += 1
        self.now = end
        self._timers = [t for t in self._timers if not t.cancelled]
        return fired


def query_plan(conn: apsw.Connection, sql: str, params: tuple = ()) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


# What SQLite says when it walks an index in time order and sorts only the entries of one
# time by the last key (a run's id): as bounded as the runs that share a millisecond.
TIE_SORT = "USE TEMP B-TREE FOR LAST TERM OF ORDER BY"
# The indexes it may follow: those of runs by time, which hold no id (schema 20).
RUN_TIME_INDEXES = ("runs_project_created_idx", "runs_task_created_idx", "runs_unsuccessful_idx",
                    "runs_task_unsuccessful_idx", "runs_unscheduled_idx", "runs_log_idx")


def assert_uses_index(conn: apsw.Connection, sql: str, params: tuple, index: str, big_tables=("runs",)) -> list[str]:
    """The real planner must use `index`, never fully scan a big table nor sort in a temp B-tree,
    except the runs of one millisecond by id (the time indexes of runs hold no id: schema 20)."""
    plan = query_plan(conn, sql, params)
    # WITHOUT ROWID tables report their key as "PRIMARY KEY" rather than by index name.
    marks = (f"INDEX {index} ", f"USING {index} ")
    assert any(m in d + " " for d in plan for m in marks), plan
    for detail in plan:
        assert "USE TEMP B-TREE" not in detail or (detail == TIE_SORT and index in RUN_TIME_INDEXES), plan
        for table in big_tables:
            if detail.startswith(f"SCAN {table}") and "INDEX" not in detail:
                raise AssertionError(f"full scan of {table}: {plan}")
    return plan
