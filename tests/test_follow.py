"""A run's output as it happens: followers on real terminals see each line as it is
printed (with and without secrets to mask), a partial line shows after a short wait, and
`kill -9` of the daemon keeps in the lost run's log what the run had printed. Held-back
output is written on the runner's timer, checked with injected timers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from edge.runner.supervisor import RELEASE_AFTER_S, _Pump
from edge.storage.run_logs import LogSink
from support import DaemonProcess, ManualTimers

SECRET = "Kq7-vT2pLm9xR4wZ8sN1bC6yH3jF5dA0gE2uQ"  # 38 characters: its hex form holds 75 back
TICK = ('for i in 1 2 3 4; do echo "tick $i $(date +%s%N)"; sleep 1; done;'
        ' printf "partial $(date +%s%N) "; sleep 2; echo end')
BOUND_NS = 1_000_000_000  # the test's bound; the rule is 250 ms (the figures are printed)


class PtyReader:
    """A qledge command on a real terminal, what it prints recorded with when it came."""

    def __init__(self, d: DaemonProcess, *args: str) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "edge", *args], env=d.env, stdin=slave, stdout=slave,
                                     stderr=slave, close_fds=True)
        os.close(slave)
        self.reads: list[tuple[int, bytes]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not data:
                break
            self.reads.append((time.time_ns(), data))

    def text(self) -> bytes:
        return b"".join(data for _, data in list(self.reads))

    def seen_at(self, piece: bytes) -> int | None:
        """When the end of `piece` arrived on the terminal (time_ns), if it has."""
        text = self.text()
        at = text.find(piece)
        if at < 0:
            return None
        end, pos = at + len(piece), 0
        for when, data in list(self.reads):
            pos += len(data)
            if pos >= end:
                return when
        return None

    def wait_for(self, piece: bytes, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while self.seen_at(piece) is None:
            assert time.monotonic() < deadline, (piece, self.text())
            time.sleep(0.02)

    def finish(self, timeout_s: float = 30) -> int:
        code = self.proc.wait(timeout_s)
        self._thread.join(timeout_s)
        os.close(self.master)
        return code


def _printed(text: bytes, pattern: bytes) -> list[tuple[bytes, int]]:
    """(the piece as printed, when the task printed it: its last number) for each match."""
    return [(m.group(), int(m.group(m.lastindex or 0))) for m in re.finditer(pattern, text)]


@pytest.mark.e2e
@pytest.mark.parametrize("secret", [None, SECRET], ids=["plain", "with-a-secret"])
def test_followers_on_a_terminal_see_each_line_as_it_is_printed(daemon, secret):
    if secret is not None:  # redaction then holds back the last characters a secret could start with
        assert daemon.cli("secret", "set", "token", input=secret + "\n").returncode == 0
    assert daemon.cli("task", "add", "tk", "--shell", "--", TICK).returncode == 0
    started = PtyReader(daemon, "run", "start", "tk", "--follow")
    started.wait_for(b"queued")
    logged = PtyReader(daemon, "run", "log", "tk:latest", "--follow")
    assert started.finish() == 0 and logged.finish() == 0
    delays = {}
    for name, follower in (("run start --follow", started), ("run log --follow", logged)):
        text = follower.text()
        ticks = _printed(text, rb"tick (\d) (\d+)")
        partial = _printed(text, rb"partial (\d+) ")
        assert [t.split()[1] for t, _ in ticks] == [b"1", b"2", b"3", b"4"] and len(partial) == 1, text
        late = []
        began = follower.reads[0][0]  # a follower that started late is timed from then on
        for piece, printed_ns in [p for p in ticks + partial if p[1] >= began]:
            arrived = follower.seen_at(piece)
            assert arrived is not None
            late.append((arrived - printed_ns) / 1e9)
        assert len(late) >= (4 if follower is started else 2), (name, text)  # the lines printed once it was there
        delays[name] = late
        assert max(late) < BOUND_NS / 1e9, (name, late, text)
        if secret is not None:
            assert secret.encode() not in text
    print(f"\n[follow] {'with a secret' if secret else 'plain'}: line delays (s) "
          + "; ".join(f"{k}: {', '.join(f'{v:.3f}' for v in vs)}" for k, vs in delays.items()))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


@pytest.mark.e2e
def test_kill_9_of_the_daemon_keeps_what_the_run_printed(daemon):
    # Short lines and a long secret: what redaction holds back is many lines long.
    assert daemon.cli("secret", "set", "token", input=SECRET + "\n").returncode == 0
    printed = os.path.join(daemon.scratch, "printed")
    script = (f'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "${{i}}0%"; echo "${{i}}0% $(date +%s%N)" >> {printed};'
              f' sleep 0.25; done; printf "half a line"; echo "half $(date +%s%N)" >> {printed}; sleep 60')
    assert daemon.cli("task", "add", "pct", "--shell", "--", script).returncode == 0
    run_id = daemon.call("qledge.run.start", {"taskId": "pct"})["id"]
    deadline = time.monotonic() + 30
    while b"half" not in _read(printed):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.5)
    killed_ns = time.time_ns()
    daemon.stop(signal.SIGKILL)
    truth = [(line.split()[0], int(line.split()[1])) for line in _read(printed).splitlines()]
    daemon.start()
    deadline = time.monotonic() + 30
    while (run := daemon.call("qledge.run.get", {"runId": run_id}))["status"] != "lost":
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
    shown = daemon.cli("run", "log", run_id)
    assert shown.returncode == 0, shown.stderr
    expected = "".join(f"{word.decode()}\n" for word, at in truth if word != b"half" and at <= killed_ns - BOUND_NS)
    assert len(expected.splitlines()) == 12
    assert shown.stdout.startswith(expected), shown.stdout
    assert shown.stdout == expected + "half a line", shown.stdout  # the partial line too


async def test_held_back_output_is_written_when_its_time_is_up(tmp_path):
    """Redaction holds back the end of the output; the pump writes it RELEASE_AFTER_S after
    it arrived, by its timer (injected here), and wakes followers when it does."""
    timers = ManualTimers()

    class Clock:
        def now_ms(self) -> int:
            return 0

        def monotonic(self) -> float:
            return timers.now

    path = str(tmp_path / "run.log")
    sink = LogSink(path, 1 << 20, [SECRET.encode()])
    marks: list[int] = []
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", 'printf "first line\\nprogress 10%%"; sleep 30', stdout=asyncio.subprocess.PIPE)
    pump = asyncio.create_task(_Pump(sink, lambda: marks.append(1), Clock(), timers).run(proc))
    shown = b"first line\nprogress 10%"
    try:
        async with asyncio.timeout(10):
            while sink.held < len(shown):
                await asyncio.sleep(0.01)
        assert sink.held == len(shown)  # the secret's forms are longer than all of it
        # Nothing on disk yet (the file is made with the first byte written).
        assert not os.path.lexists(path) and timers.pending == [pytest.approx(RELEASE_AFTER_S)]
        woken = len(marks)
        timers.advance(RELEASE_AFTER_S * 0.9)
        assert not os.path.lexists(path)
        timers.advance(RELEASE_AFTER_S * 0.2)
        with open(path, "rb") as f:
            assert f.read() == shown
        assert sink.held == 0 and len(marks) == woken + 1 and timers.pending == []
    finally:
        proc.kill()
        await proc.wait()
        await pump
        sink.close()
