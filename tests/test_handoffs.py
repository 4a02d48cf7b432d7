"""Hand-offs that must not be lost: a run committed to the store is always executed, or
cancelled with a reason when the daemon stops; never left `queued`. And the graceful
stop: listeners close, calls in flight are answered, then whatever is left is cancelled."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import time

import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import build_stores, build_workers
from edge.core.clock import SystemClock
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.storage.sqlite.db import Database
from edge.transports import tool_protocol as frames
from support import RawConnection

STORM = 400


def _start_frame(task_id: str, request_id: int) -> bytes:
    request = frames.Request(id=request_id, tool="qledge.run.start",
                             args=msgspec.Raw(frames.encoder.encode({"taskId": task_id})))
    return frames.frame(frames.encoder.encode(request))


def _hung_up(socks: list[socket.socket], timeout_s: float = 60.0) -> None:
    """Read each connection to its end, then close it: once the daemon has closed one, every
    call it read there has been answered (the daemon answers what was asked before the end
    of input), so each run those calls admitted is in the store."""
    for sock in socks:
        sock.settimeout(timeout_s)
        while sock.recv(65536):
            pass
        sock.close()


def _settled(daemon, timeout_s: float = 60.0) -> dict[str, int]:
    """Run statuses once no run is queued or running: a stranded run stays queued, and then
    this gives up after `timeout_s` and the statuses show it."""
    deadline = time.monotonic() + timeout_s
    while True:
        with daemon.db() as db:
            statuses = dict(db.execute("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status"))
        if not statuses.keys() & {"queued", "running"} or time.monotonic() > deadline:
            return statuses
        time.sleep(0.05)


@pytest.mark.e2e
def test_hanging_up_during_run_start_strands_no_run(daemon_factory):
    """400 clients send run.start and half-close 0-4 ms later: every run the store
    admitted is executed; none stays queued (which would block `forbid` tasks). The
    connection cap is above the storm: every client is served, however far behind a loaded
    machine lets the daemon fall (the cap has tests of its own, in test_limits.py)."""
    daemon = daemon_factory(config=f"[runner]\nconcurrency = 4\nqueue_limit = 1024\n"
                                   f"[retention]\nruns_per_task = 1000\n[connections]\nmax_per_socket = {STORM + 1}\n"
                            ).start()
    daemon.cli("task", "add", "quick", "--overlap", "allow", "--", "true")
    rng = random.Random(7)
    socks = []
    for i in range(STORM):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(daemon.socket)
        sock.sendall(_start_frame("quick", i))
        time.sleep(rng.uniform(0, 0.004))
        sock.shutdown(socket.SHUT_WR)
        socks.append(sock)
    _hung_up(socks)
    statuses = _settled(daemon)
    assert set(statuses) == {"succeeded"}, statuses
    assert 0 < statuses["succeeded"] <= STORM
    assert daemon.call("qledge.status")["counts"]["activeRuns"] == 0


def test_calls_in_flight_at_end_of_input_are_answered(daemon):
    daemon.cli("task", "add", "slow", "--", "sleep", "30")
    run = daemon.call("qledge.run.start", {"taskId": "slow"})
    raw = RawConnection(daemon.socket)
    raw.send({"id": "w", "tool": "qledge.run.wait", "args": {"runId": run["id"], "timeoutMs": 300}})
    raw.send({"id": "s", "tool": "qledge.status"})
    raw.sock.shutdown(socket.SHUT_WR)  # nothing more to ask: the answers must still come
    answers = {raw.recv()["id"], raw.recv()["id"]}
    assert answers == {"w", "s"}
    assert raw.closed_by_peer()
    daemon.call("qledge.run.cancel", {"runId": run["id"]})


def test_a_call_in_flight_at_sigterm_is_answered_then_the_daemon_exits(daemon):
    daemon.cli("task", "add", "slow", "--", "sleep", "30")
    run = daemon.call("qledge.run.start", {"taskId": "slow"})
    raw = RawConnection(daemon.socket)
    raw.send({"id": "w", "tool": "qledge.run.wait", "args": {"runId": run["id"], "timeoutMs": 1500}})
    _until_audited(daemon, "w")  # the wait is in flight: each call is audited before it runs
    daemon.proc.send_signal(signal.SIGTERM)
    answer = raw.recv()
    assert answer["id"] == "w" and answer["ok"] is True and answer["result"]["done"] is False
    assert daemon.stop() == 0
    with daemon.db() as db:
        status, summary = db.execute("SELECT status, error_summary FROM runs WHERE id = ?", (run["id"],)).fetchone()
    assert (status, summary) == ("cancelled", "cancelled: shutdown")


def test_a_second_sigterm_stops_at_once(daemon_factory):
    daemon = daemon_factory(config="[runner]\nkill_grace_s = 120\n").start()
    # It notes the SIGTERM the daemon sends it (a file), and stays.
    termed = os.path.join(daemon.scratch, "termed")
    daemon.cli("task", "add", "stubborn", "--shell", "--",
               f"trap 'touch {termed}' TERM; while :; do sleep 1 & wait $!; done")
    run = daemon.call("qledge.run.start", {"taskId": "stubborn"})
    _until_running(daemon, run["id"])
    daemon.proc.send_signal(signal.SIGTERM)
    _until(lambda: os.path.exists(termed), "the run to be sent SIGTERM")
    assert daemon.proc.poll() is None  # waiting out the run's grace period
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(10) == 0
    assert time.monotonic() - started < 5
    with daemon.db() as db:
        status, summary = db.execute("SELECT status, error_summary FROM runs WHERE id = ?", (run["id"],)).fetchone()
    assert (status, summary) == ("cancelled", "cancelled: shutdown")


def _until(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _until_audited(daemon, request_id: str) -> None:
    def audited() -> bool:
        with daemon.db() as db:
            return db.execute("SELECT 1 FROM security_audit WHERE request_id = ?", (request_id,)).fetchone() is not None

    _until(audited, f"call {request_id} to be audited")


def _until_running(daemon, run_id: str) -> None:
    deadline = time.monotonic() + 10
    while daemon.call("qledge.run.get", {"runId": run_id})["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)


# -- in-process: cancellation at every point of the hand-off ---------------------------


@pytest.mark.parametrize("yields", range(6))
async def test_a_start_cancelled_anywhere_leaves_no_run_stranded(home, yields):
    """Cancel `qledge.run.start`'s await after 0..5 loop turns (before, during and after the
    admission transaction in the store's thread): every run the store admitted runs."""
    db = await Database.open(os.path.join(home, "q.db"))
    config, clock = Config(), SystemClock()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    try:
        spec = TaskSpec(command=ArgvCommand(file="true"), overlap="allow")
        await stores.tasks.create("default", "t", "t", spec, clock.now_ms(), privileged=True)
        task = await stores.tasks.get("default", "t")
        assert task is not None
        calls = [asyncio.create_task(workers.runner.start(task, "user")) for _ in range(8)]
        for _ in range(yields):
            await asyncio.sleep(0)
        for call in calls:
            call.cancel()
        async with asyncio.timeout(20):
            await workers.runner.settle()
            while await stores.runs.active():
                await asyncio.sleep(0.01)
        runs = await stores.runs.page("default", "t", None, 64)
        # A call cancelled before it began admits nothing; once begun, its admission completes.
        assert len(runs) == (0 if yields == 0 else len(calls))
        assert {r.status for r in runs} <= {"succeeded"}, [r.status for r in runs]
    finally:
        await workers.runner.shutdown()
        await db.close()
