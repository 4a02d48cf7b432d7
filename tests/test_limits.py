"""Hostile neighbours on the sockets: connection caps, timeouts, the shared budget of
partially received frames, backpressure, hostile nesting, descriptors kept for runs, and
an accept loop that pauses quietly when the process is out of descriptors.

Real daemons on real sockets, except where the test must exhaust this very process's
descriptors or look at its garbage collector (in-process, still on real sockets)."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import resource
import socket
import time

import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import (
    DaemonFacts,
    build_chain,
    build_listeners,
    build_services,
    build_stores,
    build_workers,
    mcp_side,
)
from edge.core.clock import SystemClock
from edge.storage.sqlite.db import Database
from edge.app.graph import ai_tools, builtin_tools
from edge.tools.definition import Registry
from edge.transports import tool_protocol as frames
from edge.transports.unix import Connection, UnixListener
from mcp_support import LineClient
from support import RawConnection, read_by, until

LIMITS = "[connections]\nmax_per_socket = 4\n"


def _status(conn: RawConnection, rid: int = 1) -> dict:
    conn.send({"id": rid, "tool": "qledge.status"})
    answer = conn.recv()
    assert answer is not None
    return answer


def _refused_and_closed(conn: RawConnection, code: str, fragment: str) -> None:
    answer = conn.recv()
    assert answer is not None and answer["ok"] is False, answer
    assert answer["error"]["code"] == code and fragment in answer["error"]["message"], answer
    assert conn.closed_by_peer()


def _no_tracebacks(daemon) -> None:
    text = daemon.stderr()
    assert "Traceback" not in text and "RecursionError" not in text, text[-2000:]


# -- the cap -------------------------------------------------------------------------------


def test_at_the_cap_the_longest_silent_unauthenticated_connection_makes_room(daemon_factory):
    daemon = daemon_factory(config=LIMITS).start()
    silent = [RawConnection(daemon.socket) for _ in range(4)]  # accepted in this order (the backlog is FIFO)
    newcomer = RawConnection(daemon.socket)
    assert _status(newcomer)["ok"] is True
    _refused_and_closed(silent[0], "resource_exhausted", "too many connections")
    for conn in silent[1:]:  # the others were not needed
        conn.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            conn.sock.recv(1)
    for conn in [*silent, newcomer]:
        conn.close()


def test_over_the_cap_of_authenticated_connections_the_newcomer_is_refused(daemon_factory):
    daemon = daemon_factory(config=LIMITS).start()
    held = [RawConnection(daemon.socket) for _ in range(4)]
    for i, conn in enumerate(held):  # each has authenticated (as the owner uid): none is evicted
        assert _status(conn, i)["ok"] is True
    newcomer = RawConnection(daemon.socket)
    _refused_and_closed(newcomer, "resource_exhausted", "too many connections")
    assert _status(held[0], 9)["ok"] is True
    held[3].close()
    deadline = time.monotonic() + 5
    while True:  # its slot is free once the daemon has seen it go
        retry = RawConnection(daemon.socket)
        answer = _status(retry)
        retry.close()
        if answer["ok"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer["ok"] is True, answer
    for conn in held:
        conn.close()


def test_mcp_over_the_cap_gets_a_json_rpc_error(daemon_factory):
    daemon = daemon_factory(config=LIMITS + "[mcp]\nenabled = true\n").start()
    path = os.path.join(daemon.home, "mcp.sock")
    held = [LineClient(path) for _ in range(4)]
    for c in held:  # the bridge's hello with no token: the owner uid, authenticated
        assert c.ask({"qledge": {"token": None}}) == {"qledge": {"ok": True}}
    newcomer = LineClient(path)
    answer = newcomer.recv()
    assert answer is not None and answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert "resource_exhausted: too many connections" in answer["error"]["message"]
    assert newcomer.recv() is None
    for c in [*held, newcomer]:
        c.close()


# -- timeouts ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_started_frame_must_arrive_whole_in_time(daemon_factory):
    daemon = daemon_factory(config="[connections]\nframe_timeout_s = 0.3\n").start()
    slow = RawConnection(daemon.socket)
    slow.send_raw(b"\x00\x00")  # half a header, then nothing
    started = time.monotonic()
    _refused_and_closed(slow, "deadline_exceeded", "arrive whole within 0.3s")
    assert 0.25 < time.monotonic() - started < 5
    # A body that trickles in is cut the same way.
    trickle = RawConnection(daemon.socket)
    trickle.send_raw((100).to_bytes(4, "big") + b"\x80")
    _refused_and_closed(trickle, "deadline_exceeded", "arrive whole")
    assert daemon.call("qledge.status")["counts"] is not None


@pytest.mark.e2e
def test_a_silent_connection_is_closed_after_the_idle_timeout_unless_it_authenticated(daemon_factory):
    daemon = daemon_factory(config="[connections]\nidle_timeout_s = 0.3\n").start()
    silent = RawConnection(daemon.socket)
    session = RawConnection(daemon.socket)
    assert _status(session)["ok"] is True  # authenticated: session_idle_timeout_s (0, never) applies
    started = time.monotonic()
    _refused_and_closed(silent, "deadline_exceeded", "idle for 0.3s")
    assert time.monotonic() - started < 5
    time.sleep(0.5)
    assert _status(session, 2)["ok"] is True


@pytest.mark.e2e
def test_an_mcp_line_must_arrive_whole_in_time(daemon_factory):
    daemon = daemon_factory(config="[connections]\nframe_timeout_s = 0.3\n[mcp]\nenabled = true\n").start()
    c = LineClient(os.path.join(daemon.home, "mcp.sock"))
    c.send(b'{"jsonrpc": "2.0", "id": 1, "met')
    answer = c.recv()
    assert answer is not None and answer["error"]["code"] == -32000, answer
    assert "deadline_exceeded" in answer["error"]["message"]
    assert c.recv() is None


# -- the shared budget of partial frames -----------------------------------------------------


def test_partial_frames_draw_on_one_budget_and_the_one_that_does_not_fit_is_refused(daemon_factory):
    daemon = daemon_factory(config="max_frame_bytes = 65536\n[connections]\npartial_bytes = 65536\n").start()
    first = RawConnection(daemon.socket)
    first.send_raw((60_000).to_bytes(4, "big") + b"\x00" * 30_000)  # holds 60,000 - 16 KiB of the budget
    read_by(daemon, first.sock)
    second = RawConnection(daemon.socket)
    second.send_raw((60_000).to_bytes(4, "big"))
    _refused_and_closed(second, "resource_exhausted", "partly received")
    # Small requests need nothing from the budget: served while it is spent.
    assert daemon.call("qledge.status")["counts"] is not None
    first.close()
    request = frames.frame(msgspec.msgpack.encode({"id": 7, "tool": "qledge.status", "args": {"pad": "x" * 50_000}}))

    def served() -> dict | None:  # the first connection's share is given back once the daemon has seen it go
        third = RawConnection(daemon.socket)
        third.send_raw(request)
        answer = third.recv()
        third.close()
        return None if answer is not None and answer["error"]["code"] == "resource_exhausted" else answer

    answer = until(served, "the first connection's share to be given back")
    assert answer is not None and answer["id"] == 7 and answer["error"]["code"] == "invalid_argument", answer


def test_an_mcp_line_larger_than_the_budget_allows_is_refused(daemon_factory):
    daemon = daemon_factory(config="max_frame_bytes = 65536\n[connections]\npartial_bytes = 65536\n"
                                   "[mcp]\nenabled = true\nmax_line_bytes = 65536\n").start()
    path = os.path.join(daemon.home, "mcp.sock")
    first = LineClient(path)
    first.send(b"x" * 60_000)
    read_by(daemon, first.sock)
    second = LineClient(path)
    second.send(b"y" * 40_000)
    answer = second.recv()
    assert answer is not None and "partly received" in answer["error"]["message"], answer
    assert second.recv() is None
    third = LineClient(path)
    assert third.ask({"jsonrpc": "2.0", "id": 1, "method": "ping"})["result"] == {}  # still answering
    for c in (first, second, third):
        c.close()


# -- backpressure ------------------------------------------------------------------------------


def test_answers_to_malformed_requests_wait_for_the_peer_to_read(daemon):
    """A peer that sends bad requests and never reads stalls itself, not the daemon."""
    bad = frames.frame(msgspec.msgpack.encode({"id": 1, "tool": ""}))  # fails validation: answered, kept open
    raw = RawConnection(daemon.socket, timeout=2.0)
    sent = 0
    with pytest.raises(TimeoutError):
        for _ in range(200):
            raw.send_raw(bad * 1000)
            sent += 1000
    assert sent < 200_000  # the daemon stopped reading: its answers were not being taken
    raw.sock.settimeout(10)
    first = raw.recv()
    assert first is not None and first["error"]["code"] == "invalid_argument"
    raw.close()
    assert daemon.call("qledge.status")["counts"] is not None


# -- hostile nesting --------------------------------------------------------------------------


def _nested_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # [[[ ... nil ... ]]]


def test_deeply_nested_requests_are_answered_and_nothing_is_logged(daemon):
    raw = RawConnection(daemon.socket)
    deep = _nested_msgpack(20_000)
    for tool, rid in (("qledge.status", 1), ("qledge.task.list", 2)):
        body = b"\x83\xa2id" + msgspec.msgpack.encode(rid) + b"\xa4tool" + msgspec.msgpack.encode(tool)
        raw.send_raw(frames.frame(body + b"\xa4args" + deep))
        answer = raw.recv()
        assert answer is not None and answer["ok"] is False and answer["error"]["code"] == "invalid_argument", answer
    # In a field that only the id salvage reads (which gives up on it), and as the whole body.
    raw.send_raw(frames.frame(b"\x82\xa2id\x05\xa5extra" + deep))
    answer = raw.recv()
    assert answer is not None and answer["error"]["code"] == "invalid_argument" and answer["id"] is None, answer
    raw.send_raw(frames.frame(deep))
    answer = raw.recv()
    assert answer is not None and answer["error"]["code"] == "invalid_argument"
    raw.close()
    assert daemon.call("qledge.status")["counts"] is not None
    _no_tracebacks(daemon)


def test_deeply_nested_mcp_messages_are_answered_and_nothing_is_logged(daemon_factory):
    daemon = daemon_factory(config="[mcp]\nenabled = true\n").start()
    c = LineClient(os.path.join(daemon.home, "mcp.sock"))
    deep = "[" * 20_000 + "]" * 20_000
    hello = c.ask(('{"qledge": {"token": null}, "x": ' + deep + "}\n").encode())  # the first line: hello probe
    assert hello is not None and hello["error"]["code"] == -32700, hello
    for params in (deep, '{"_meta": ' + deep + "}"):
        answer = c.ask(('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + params + "}\n").encode())
        assert answer is not None and answer["error"]["code"] in (-32700, -32600), answer
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "qinglong.task.list"}}
    line = msgspec.json.encode(call)[:-2] + b', "arguments": {"x": ' + deep.encode() + b"}}}\n"
    answer = c.ask(line)
    assert answer is not None and answer["error"]["code"] == -32700 and "nests too deeply" in answer["error"]["message"]
    assert c.ask({"jsonrpc": "2.0", "id": 3, "method": "ping"})["id"] == 3  # the session goes on
    c.close()
    _no_tracebacks(daemon)


# -- descriptors ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_runs_keep_their_descriptors_while_connections_pile_up(daemon_factory):
    """With the usual 1024 descriptors, 1,100 connections: runs still get theirs, the owner is
    still served, and nothing floods the log."""
    daemon = daemon_factory()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip("needs 2048 descriptors for this process")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # inherited by the daemon
    try:
        daemon.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    try:
        daemon.cli("task", "add", "quick", "--overlap", "allow", "--", "true")
        held = []
        for _ in range(1100):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(daemon.socket)
            except BlockingIOError:  # the backlog is full: the daemon is refusing as fast as it can
                sock.close()
                time.sleep(0.002)
                continue
            held.append(sock)
        for _ in range(3):
            run = daemon.call("qledge.run.start", {"taskId": "quick"})
            done = daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 10_000})
            assert done["done"] is True and done["run"]["status"] == "succeeded", done
        for sock in held:
            sock.close()
        assert len(daemon.stderr()) < 4096, daemon.stderr()[-2000:]
        _no_tracebacks(daemon)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _Echo(UnixListener):
    """The smallest listener: answers each 4-byte frame with itself."""

    def _refusal(self, code: str, message: str) -> bytes:
        return f"{code}\n".encode()

    async def _serve_connection(self, conn: Connection) -> None:
        while (data := await conn.read_exactly(4)) is not None:
            await conn.send(data)


async def test_out_of_descriptors_the_accept_loop_pauses_with_one_line(home, caplog, monkeypatch):
    monkeypatch.setattr("edge.transports.unix.ACCEPT_PAUSE_S", 0.05)
    loop = asyncio.get_running_loop()
    attempts = 0
    accept = loop.sock_accept

    async def counted(sock: socket.socket):  # the listener's accepts, counted
        nonlocal attempts
        attempts += 1
        return await accept(sock)

    monkeypatch.setattr(loop, "sock_accept", counted)
    listener = _Echo(os.path.join(home, "echo.sock"))
    await listener.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients, filler = [], []
    try:
        for _ in range(3):  # connected, waiting in the backlog: nothing has accepted them yet
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(listener.path)
            c.setblocking(False)
            clients.append(c)
        # Sockets an earlier test left to the cycle collector would give back descriptors
        # mid-way (an accept that succeeds, a second episode): collected now, and not meanwhile.
        gc.collect()
        gc.disable()
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with caplog.at_level(logging.WARNING, logger="qledge.server"):
            try:
                while True:
                    filler.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
            tried = attempts
            async with asyncio.timeout(20):
                while attempts < tried + 10:  # 10 more attempts to accept, all out of descriptors
                    await asyncio.sleep(0.01)
            paused = [r for r in caplog.records if "cannot accept" in r.getMessage()]
            assert len(paused) == 1 and paused[0].exc_info is None
            for fd in filler:
                os.close(fd)
            filler.clear()
            # The limit back as well: descriptors another thread of this process takes meanwhile
            # (a worker's, a collector's) cannot make a second episode of the test's own.
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for c in clients:
                c.sendall(b"ping")
            for c in clients:
                assert await asyncio.wait_for(asyncio.get_running_loop().sock_recv(c, 4), 5) == b"ping"
        assert not [r for r in caplog.records if r.exc_info]
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        gc.enable()
        for c in clients:
            c.close()
        await listener.stop()


# -- no reference cycles hold buffers --------------------------------------------------------


@pytest.fixture
async def served(request, home):
    """Both real listeners in this process, on real stores and the real chain (with the
    `[connections]` keys of an indirect parameter, if any)."""
    db = await Database.open(os.path.join(home, "qledge.db"))
    keys = {"mcp": {"enabled": True}, "connections": getattr(request, "param", {})}
    config, clock = msgspec.convert(keys, Config), SystemClock()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    registry = Registry([*builtin_tools(), *ai_tools()])
    facts = DaemonFacts(db.path, "asyncio", clock, stores.counts, workers.settings, "/")
    services = build_services(config, stores, workers, facts, registry, b"p" * 32, clock)
    chain = build_chain(config, services, registry)
    listeners = build_listeners(config, os.path.join(home, "qledge.sock"), chain, mcp_side(config, home).listeners)
    for listener in listeners:
        await listener.start()
    try:
        yield listeners
    finally:
        for listener in listeners:
            await listener.stop()
        await workers.runner.shutdown()
        await db.close()


async def test_a_dropped_connection_leaves_no_cycle_holding_its_buffer(served):
    """Peers that leave mid-frame, or right after a request that fails to decode (so the
    answer meets a closed socket): once each connection ends, it and its buffers are freed
    by reference counting, not left for the cycle collector (which may run much later)."""
    tool, mcp = served
    big = 200_000
    cases = [
        (tool, big.to_bytes(4, "big") + b"\x00" * (big // 2)),  # mid-frame
        (tool, frames.frame(b"\xc1" * big)),  # undecodable
        (tool, frames.frame(msgspec.msgpack.encode({"id": 1, "tool": "", "token": "x" * big}))),  # invalid
        (mcp, b"{" + b"x" * big + b"\n"),  # not JSON
        (mcp, b"[" + b"1," * (big // 2) + b"1]\n"),  # a batch
        (mcp, b"x" * big),  # mid-line
    ]
    gc.collect()
    gc.disable()
    try:
        for listener, payload in cases:
            _reader, writer = await asyncio.open_unix_connection(listener.path)
            writer.write(payload)
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            for _ in range(200):
                await asyncio.sleep(0.01)
                if not listener._connections:
                    break
            assert not listener._connections
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        # (asyncio's transports keep a bound method of their own: that small cycle is theirs.)
        held = [type(o).__name__ for o in gc.garbage if isinstance(o, Connection | asyncio.StreamReader)
                or (isinstance(o, bytes | bytearray) and len(o) > big // 4)]
        assert held == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


# -- followers of a log --------------------------------------------------------------------


@pytest.mark.emulated("a tight timing (a status answer within 1 s)")
def test_follows_beyond_the_runners_bound_are_answered_at_once_and_the_rest_wake(daemon, tmp_path):
    """`run log --follow` waits in the daemon (qledge.run.log.read with waitMs): at most
    MAX_FOLLOWERS such waits at once, however many connections and calls ask; the others
    are answered at once (nothing new yet) and read again. Those waiting wake with the
    output; the daemon answers everyone else meanwhile."""
    from edge.runner.supervisor import MAX_FOLLOWERS
    from support import OWN_USER

    gate = tmp_path / "go"
    daemon.call("qledge.task.create", {"taskId": "quiet", "spec": {
        "command": {"kind": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo late"},
        "user": OWN_USER}})
    run = daemon.call("qledge.run.start", {"taskId": "quiet"})
    conns = [RawConnection(daemon.socket, timeout=0.3) for _ in range(5)]
    asked = 0
    for c, conn in enumerate(conns):
        for i in range(16):  # the most one connection may have in flight
            conn.send({"id": c * 16 + i, "tool": "qledge.run.log.read",
                       "args": {"runId": run["id"], "waitMs": 20_000}})
            asked += 1
    at_once: list[dict] = []
    started = time.monotonic()
    for conn in conns:
        while True:
            try:
                answer = conn.recv()
            except TimeoutError:
                break
            assert answer is not None and answer["ok"], answer
            at_once.append(answer["result"])
    waited = time.monotonic() - started
    assert len(at_once) == asked - MAX_FOLLOWERS, (len(at_once), waited)
    assert all(r["data"] == b"" and r["eof"] and not r["final"] for r in at_once)
    probe = RawConnection(daemon.socket)
    begun = time.monotonic()
    assert _status(probe)["ok"] and time.monotonic() - begun < 1.0
    gate.touch()
    woken = []
    for conn in conns:
        conn.sock.settimeout(20)
        while len(woken) < MAX_FOLLOWERS:
            try:
                answer = conn.recv()
            except TimeoutError:
                break
            if answer is None:
                break
            woken.append(answer["result"])
            conn.sock.settimeout(0.5)  # the rest of this connection's answers come together
    assert len(woken) == MAX_FOLLOWERS and {r["data"] for r in woken} == {b"late\n"}
    for conn in [*conns, probe]:
        conn.close()


@pytest.mark.parametrize("served", [{"max_per_socket": 2, "idle_timeout_s": 0.3}], indirect=True)
async def test_a_childs_attached_connection_is_outside_the_cap_and_never_idles_out(served):
    """A connection the daemon made for a child it started (an AI run's, ToolServer.attach)
    is not counted against the socket's cap, not closed to make room, and not closed for
    being silent (its run's limits end it); the others are, as ever."""
    tool, _mcp = served
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tool.attach(ours)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if tool._connections:
            break
    child = await asyncio.open_unix_connection(sock=theirs)
    silent = [await asyncio.open_unix_connection(tool.path) for _ in range(2)]  # the cap: both admitted
    async with asyncio.timeout(20):
        while len(tool._connections) < 3:
            await asyncio.sleep(0.01)
    assert len(tool._connections) == 3
    third = await asyncio.open_unix_connection(tool.path)  # at the cap: the longest silent one goes
    answer = await asyncio.wait_for(silent[0][0].read(4096), 5)
    assert b"too many connections: closing the one idle the longest" in answer
    # Past the idle timeout the socket's silent connections are closed (the child's, older, stays).
    assert await asyncio.wait_for(third[0].read(4096), 20) != b""  # told why, then closed
    reader, writer = child
    writer.write(frames.frame(msgspec.msgpack.encode({"id": 1, "tool": "qledge.status"})))
    await writer.drain()
    body = await asyncio.wait_for(reader.readexactly(int.from_bytes(await reader.readexactly(4), "big")), 5)
    reply = msgspec.msgpack.decode(body)
    # Still served, and its peer is never trusted by uid: without a token, unauthenticated.
    assert reply["id"] == 1 and reply["error"]["code"] == "unauthenticated", reply
    for _, w in [*silent, third, child]:
        w.close()
