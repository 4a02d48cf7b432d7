"""The audit log under flooding: refused calls are aggregated (one row per principal, cause,
outcome, transport and minute, with a count and its first and last time), and each class
of rows (allowed calls, credential and secret changes, refused calls) has bounds of its
own, so no volume of refused calls can push out the others."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket

import msgspec

from edge.core.auth import AuditRecord
from edge.core.auth import FLUSH_S, MINUTE_MS
from edge.core.auth import AuditBounds as Bounds
from edge.storage.security import SqlAuditLog
from edge.storage.sqlite.sql import SECURITY
from edge.storage.sqlite.db import Database
from edge.transports import tool_protocol as frames
from support import ManualTimers

T0 = 1_700_000_000_000 // MINUTE_MS * MINUTE_MS
FLOOD = 20_000


def _garbage(i: int) -> bytes:
    # Tokens of every shape: malformed, and well-formed with ids nobody issued.
    token = "qle_garbage" if i % 3 == 0 else f"qle_{secrets.token_hex(6)}_{secrets.token_hex(8)}"
    return frames.frame(msgspec.msgpack.encode({"id": i, "tool": f"qledge.tool{i % 7}", "token": token}))


def _flood(path: str, calls: int, connections: int = 4) -> int:
    """Pipelined over a few connections, every answer read; how many said unauthenticated."""
    refused = 0
    per = calls // connections
    for c in range(connections):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(path)
            for start in range(c * per, (c + 1) * per, 500):
                sock.sendall(b"".join(_garbage(i) for i in range(start, start + 500)))
                for _ in range(500):
                    answer = msgspec.msgpack.decode(_read_frame(sock))
                    refused += answer["error"]["code"] == "unauthenticated"
    return refused


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the daemon closed the connection"
            buf += chunk
        return buf

    return exactly(int.from_bytes(exactly(4), "big"))


def test_a_flood_of_garbage_calls_leaves_the_credential_create_row_and_a_few_aggregates(daemon_factory):
    daemon = daemon_factory(config="[retention]\naudit_max_rows = 100\naudit_refused_max_rows = 100\n").start()
    created = daemon.call("qledge.credential.create", {"role": "viewer"})
    for _ in range(150):  # allowed calls beyond their own bound: trimmed within their class
        daemon.call("qledge.status")
    assert _flood(daemon.socket, FLOOD) == FLOOD
    assert daemon.stop(signal.SIGTERM) == 0  # what is counted in memory is written at stop
    with daemon.db() as db:
        change = db.execute("SELECT principal, outcome, class FROM security_audit"
                            " WHERE tool = 'qledge.credential.create'").fetchall()
        refused = db.execute("SELECT principal, outcome, reasons, tool, count, at_ms, last_at_ms, request_id"
                             " FROM security_audit WHERE class = 'refused'").fetchall()
        calls = db.execute("SELECT count(*) FROM security_audit WHERE class = 'call'").fetchone()[0]
    assert change == [(f"uid:{os.getuid()}", "allowed", "change")], created
    assert sum(r[4] for r in refused) == FLOOD
    # One row per cause and minute: malformed and unknown tokens, the flood's minute or two.
    assert 2 <= len(refused) <= 6, refused
    for principal, outcome, reasons, tool, _count, first, last, request_id in refused:
        assert principal == f"uid:{os.getuid()}" and outcome == "unauthenticated"  # the peer, not invented ids
        assert json.loads(reasons)[0] in ("credential_malformed", "credential_unknown")
        assert tool == "*" and request_id is None and first <= last  # many tools and requests on one row
    assert calls <= 100


def test_refused_calls_of_one_minute_share_a_row_written_at_once_then_counted(home):
    async def go() -> None:
        db = await Database.open(os.path.join(home, "a.db"))
        timers = ManualTimers()
        log = SqlAuditLog(db, SECURITY, Bounds(), timers)

        def refused(at: int, tool: str = "qledge.status", request: str = "r") -> AuditRecord:
            return AuditRecord(at_ms=at, project_id="default", principal="uid:7", tool=tool, outcome="denied",
                               reasons=["tool_policy_denied", "tool_x"], transport="socket", request_id=request)

        rows = lambda: db.run(lambda c: c.execute(  # noqa: E731
            "SELECT tool, reasons, count, at_ms, last_at_ms, request_id FROM security_audit ORDER BY id").fetchall())
        await log.append(refused(T0 + 1))
        assert await rows() == [("qledge.status", '["tool_policy_denied","tool_x"]', 1, T0 + 1, T0 + 1, "r")]
        for i in range(2, 50):
            await log.append(refused(T0 + i))
        assert (await rows())[0][2] == 1 and timers.pending == [FLUSH_S]  # counted, not yet written
        timers.advance(FLUSH_S)
        async with asyncio.timeout(20):  # the flush it armed writes in the store's thread
            while (await rows())[0][2] == 1:
                await asyncio.sleep(0.01)
        assert await rows() == [("qledge.status", '["tool_policy_denied","tool_x"]', 49, T0 + 1, T0 + 49, None)]
        # Another tool in the same minute: the same row, which then names no tool.
        await log.append(refused(T0 + 100, tool="qledge.run.start"))
        # The next minute: a row of its own.
        await log.append(refused(T0 + MINUTE_MS + 5))
        await log.close()
        assert await rows() == [
            ("*", '["tool_policy_denied"]', 50, T0 + 1, T0 + 100, None),
            ("qledge.status", '["tool_policy_denied","tool_x"]', 1, T0 + MINUTE_MS + 5, T0 + MINUTE_MS + 5, "r"),
        ]
        await db.close()

    asyncio.run(go())


def test_each_class_is_trimmed_to_its_own_bound(home):
    async def go() -> None:
        db = await Database.open(os.path.join(home, "a.db"))
        log = SqlAuditLog(db, SECURITY, Bounds(calls=100, changes=100, refused=100, max_age_days=30))

        def record(at: int, outcome: str = "allowed", change: bool = False, who: str = "uid:0") -> AuditRecord:
            return AuditRecord(at_ms=at, project_id="default", principal=who, tool="t", outcome=outcome,  # type: ignore[arg-type]
                               reasons=["x"], transport="socket", change=change)

        for i in range(5):
            await log.append(record(T0 + i, change=True))
        for i in range(50):
            await log.append(record(T0 + 10 + i))
        for i in range(400):  # refused calls of 400 minutes: 400 aggregates, only the newest stay
            await log.append(record(T0 + i * MINUTE_MS, outcome="unauthenticated", who=f"uid:{i % 3}"))
            refused = await db.run(lambda c: c.execute(
                "SELECT count(*) FROM security_audit WHERE class = 'refused'").fetchone()[0])
            assert refused <= 100  # over the bound: down to 75 at once (AUDIT_TRIM), never above
        await log.close()
        counts = await db.run(lambda c: dict(c.execute(
            "SELECT class, count(*) FROM security_audit GROUP BY class").fetchall()))
        assert counts["change"] == 5 and counts["call"] == 50 and 75 <= counts["refused"] <= 100, counts
        newest = await db.run(lambda c: c.execute(
            "SELECT max(at_ms) FROM security_audit WHERE class = 'refused'").fetchone()[0])
        assert newest == T0 + 399 * MINUTE_MS  # the oldest went, not the newest
        for i in range(150):  # and allowed calls past their bound never touch the changes
            await log.append(record(T0 + 1000 + i))
        after = await db.run(lambda c: dict(c.execute(
            "SELECT class, count(*) FROM security_audit GROUP BY class").fetchall()))
        assert after["change"] == 5 and 75 <= after["call"] <= 100 and after["refused"] == counts["refused"], after
        await db.close()

    asyncio.run(go())


def test_credential_and_secret_changes_are_their_own_class(daemon):
    daemon.call("qledge.credential.create", {"role": "viewer"})
    daemon.cli("secret", "set", "api", input="value-1\n")
    daemon.call("qledge.secret.list")
    daemon.call("qledge.status")
    with daemon.db() as db:
        rows = dict(db.execute("SELECT tool, class FROM security_audit WHERE outcome = 'allowed'").fetchall())
    assert rows == {"qledge.credential.create": "change", "qledge.secret.set": "change",
                    "qledge.secret.list": "call", "qledge.status": "call"}


def test_qledge_audit_shows_an_aggregate_with_its_count_and_last_time(daemon):
    """`qledge audit` writes what is still counted before it reads (no waiting for the
    flush): one row for the flood, its count, and in the table the time of its last call."""
    assert _flood(daemon.socket, 1000, connections=1) == 1000
    shown = json.loads(daemon.cli("audit", "--json").stdout)
    refused = [r for r in shown if r["outcome"] == "unauthenticated"]
    assert sum(r["count"] for r in refused) == 1000 and 1 <= len(refused) <= 4, refused
    assert all(r["lastAtMs"] >= r["atMs"] and r["principal"] == f"uid:{os.getuid()}" for r in refused)
    table = daemon.cli("audit").stdout.splitlines()
    assert table[0].split() == ["TIME", "WHO", "TOOL", "OUTCOME", "WHY", "VIA", "CALLS"]
    counts = [line for line in table if "unauthenticated" in line]
    assert counts and all(" until " in line for line in counts if not line.rstrip().endswith(" 1")), table
