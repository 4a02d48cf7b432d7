"""The chain's hot path on real stores in this process: an audited read answers nothing
before its audit row is durable (the row rides in the read's worker hop), and the tools'
deadlines, kept on one timer, cut a slow call without touching the others."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import DaemonFacts, build_chain, build_services, build_stores, build_workers, builtin_tools
from edge.core.clock import SystemClock
from edge.core.errors import ToolError
from edge.storage.sqlite.db import Database
from edge.tools.context import Caller, ToolContext
from edge.tools.definition import Registry, tool

OWNER = Caller(transport="socket", peer_uid=os.getuid(), request_id="1")
SPEC = {"command": {"kind": "argv", "file": "true"}}


class Nap(msgspec.Struct):
    seconds: float


class Slept(msgspec.Struct):
    slept: float


async def _nap(ctx: ToolContext, args: Nap) -> Slept:
    await asyncio.sleep(args.seconds)
    return Slept(args.seconds)


SLOW = tool("test.nap", _nap, Nap, Slept, effect="read", risk="low", permission="task.read", title="Nap",
            deadline_s=0.2)


@pytest.fixture
async def chain(home):
    db = await Database.open(os.path.join(home, "qledge.db"))
    config, clock = Config(), SystemClock()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    registry = Registry([*builtin_tools(), SLOW])
    facts = DaemonFacts(db.path, "asyncio", clock, stores.counts, workers.settings, "/")
    services = build_services(config, stores, workers, facts, registry, b"p" * 32, clock)
    try:
        yield build_chain(config, services, registry), db
    finally:
        await workers.runner.shutdown()
        await db.close()


def _args(value: dict) -> bytes:
    return msgspec.msgpack.encode(value)


def _audited(db: Database) -> asyncio.Future:
    return db.run(lambda c: c.execute("SELECT tool, outcome FROM security_audit ORDER BY id").fetchall())


async def test_a_read_whose_audit_row_cannot_be_written_answers_unavailable_not_what_it_read(chain):
    chain, db = chain
    await chain.call("qledge.task.create", _args({"taskId": "t", "spec": SPEC}), "msgpack", OWNER)
    await db.run(lambda c: c.execute(
        "CREATE TRIGGER no_audit BEFORE INSERT ON security_audit BEGIN SELECT RAISE(ABORT, 'refused'); END"))
    for name in ("qledge.task.get", "qledge.task.get"):  # the second: the refused row is not left queued
        with pytest.raises(ToolError) as refused:
            await chain.call(name, _args({"taskId": "t"}), "msgpack", OWNER)
        assert refused.value.code == "unavailable" and "audit" in refused.value.message
    # An error the read found is something it read too: not answered without its row.
    with pytest.raises(ToolError) as missing:
        await chain.call("qledge.task.get", _args({"taskId": "nope"}), "msgpack", OWNER)
    assert missing.value.code == "unavailable"
    await db.run(lambda c: c.execute("DROP TRIGGER no_audit"))
    task = await chain.call("qledge.task.get", _args({"taskId": "t"}), "msgpack", OWNER)
    assert task.id == "t"
    assert await _audited(db) == [("qledge.task.create", "allowed"), ("qledge.task.get", "allowed")]


async def test_every_audited_read_is_on_record_when_it_is_answered(chain):
    chain, db = chain
    await chain.call("qledge.task.create", _args({"taskId": "t", "spec": SPEC}), "msgpack", OWNER)
    calls = [chain.call("qledge.task.get", _args({"taskId": "t"}), "msgpack", OWNER) for _ in range(20)]
    calls.append(chain.call("qledge.tools.list", _args({}), "msgpack", OWNER))  # reads no storage at all
    await asyncio.gather(*calls)
    rows = await _audited(db)
    assert rows.count(("qledge.task.get", "allowed")) == 20 and rows.count(("qledge.tools.list", "allowed")) == 1


async def test_a_call_past_its_deadline_is_cut_and_the_others_are_not(chain):
    chain, _db = chain
    loop = asyncio.get_running_loop()
    started = loop.time()
    slow = asyncio.ensure_future(chain.call("test.nap", _args({"seconds": 30}), "msgpack", OWNER))
    quick = [chain.call("test.nap", _args({"seconds": 0.01}), "msgpack", OWNER) for _ in range(5)]
    assert [r.slept for r in await asyncio.gather(*quick)] == [0.01] * 5
    with pytest.raises(ToolError) as cut:
        await slow
    assert cut.value.code == "deadline_exceeded" and "0.2s" in cut.value.message
    assert loop.time() - started < 10  # cut at its deadline, well before its 30 s
    # A call cancelled from outside (its peer left) is cancelled, not cut by a deadline.
    gone = asyncio.ensure_future(chain.call("test.nap", _args({"seconds": 30}), "msgpack", OWNER))
    await asyncio.sleep(0.05)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    # The timer still serves later calls.
    with pytest.raises(ToolError) as again:
        await chain.call("test.nap", _args({"seconds": 30}), "msgpack", OWNER)
    assert again.value.code == "deadline_exceeded"
