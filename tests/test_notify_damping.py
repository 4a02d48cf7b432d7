"""A task that keeps failing: its first failure at once, then "still failing" reminders at
growing intervals, then "recovered". On real stores (SQLite here, both backends in
tests/test_port_contracts.py) through the real notifier, sender child and a loopback
server, with an injected clock; and on a real daemon."""

from __future__ import annotations

import json
import os
import time

import pytest

from edge.core.tasks import NotifyRule
from edge.storage.sqlite.db import Database
from notify_support import Loopback
from test_notify import Env

DAY_S = 24 * 3600


async def _channel(env: Env, name: str, path: str = "/hook") -> None:
    """A webhook that is sent every field of the message."""
    spec = {"kind": "webhook", "url": env.server.url + path}
    await env.store.set_channel("default", name, "webhook", json.dumps(spec), env.clock.ms)


@pytest.fixture
def server():
    s = Loopback()
    yield s
    s.close()


async def _failing_every_minute(home: str, server: Loopback, minutes: int, **settings) -> Env:
    db = await Database.open(os.path.join(home, "d.db"))
    env = Env(db, home, server, **settings)
    await env.notifier.start()
    await _channel(env, "phone")
    await env.task("backup", [NotifyRule(channels=["phone"])])
    for _ in range(minutes):
        await env.finish("backup")
        await env.deliver()
        await env.later(60)
    return env


async def _close(env: Env) -> None:
    await env.notifier.stop()
    await env.db.close()


async def test_a_day_of_failing_every_minute_is_nine_messages_then_one_recovery(home, server):
    env = await _failing_every_minute(home, server, DAY_S // 60)
    try:
        sent = [r.json() for r in server.requests]
        # At once, then after 10, 30, 70, 150, 310, 630, 990 and 1350 minutes, each counting
        # every failure so far.
        assert len(sent) == 9, [b["title"] for b in sent]
        assert sent[0]["title"] == "[qledge] backup failed" and "Still failing" not in sent[0]["text"]
        reminders = sent[1:]
        assert all(b["title"] == "[qledge] backup still failing" for b in reminders)
        assert [b["failures"] for b in reminders] == [10, 30, 70, 150, 310, 630, 990, 1350]
        assert "Still failing: 10 times since 2027-01-15 08:00:00 UTC" in reminders[0]["text"]
        assert "Next reminder in 20 min if it still fails" in reminders[0]["text"]
        assert "Next reminder in 6 h if it still fails" in reminders[-1]["text"]
        # The first success: a recovery that counts every failure, the waiting ones too.
        await env.finish("backup", "succeeded", exit_code=0)
        await env.deliver()
        recovered = server.requests[-1].json()
        assert recovered["title"] == "[qledge] backup recovered" and recovered["failures"] == 1440
        assert "Recovered after 1440 failures since 2027-01-15 08:00:00 UTC" in recovered["text"]
        states = [r.state for r in await env.store.log("default", None, 64)]
        assert states.count("sent") == 10 and states.count("merged") == 1 and "pending" not in states
        # A new spell of failures starts a new streak: its first failure goes at once.
        await env.later(60)
        await env.finish("backup")
        await env.deliver()
        assert server.requests[-1].json()["title"] == "[qledge] backup failed"
    finally:
        await _close(env)


async def test_without_damping_every_failure_is_a_message(home, server):
    env = await _failing_every_minute(home, server, 60, repeat_s=0)
    try:
        assert len(server.requests) == 60
    finally:
        await _close(env)


async def test_damping_is_per_task_and_channel(home, server):
    db = await Database.open(os.path.join(home, "p.db"))
    env = Env(db, home, server)
    await env.notifier.start()
    try:
        await _channel(env, "a", "/a")
        await _channel(env, "b", "/b")
        await env.task("one", [NotifyRule(channels=["a", "b"])])
        await env.task("two", [NotifyRule(channels=["a"])])
        for task in ("one", "two", "one", "two"):
            await env.finish(task)
            await env.deliver()
            await env.later(61)
        # Each task's first failure on each channel; the repeats wait for their reminder.
        assert sorted((r.path, r.json()["task"]) for r in server.requests) == [
            ("/a", "one"), ("/a", "two"), ("/b", "one")]
        await env.later(600)
        reminders = sorted((r.path, r.json()["task"], r.json()["failures"]) for r in server.requests[3:])
        assert reminders == [("/a", "one", 2), ("/a", "two", 2), ("/b", "one", 2)]
    finally:
        await env.notifier.stop()
        await db.close()


async def test_a_recovery_folds_in_the_failures_still_waiting(home, server):
    db = await Database.open(os.path.join(home, "r.db"))
    env = Env(db, home, server)
    await env.notifier.start()
    try:
        await _channel(env, "a")
        await env.task("t", [NotifyRule(channels=["a"])])
        await env.finish("t")
        await env.deliver()
        for _ in range(3):
            await env.later(30)
            await env.finish("t")  # wait for the reminder, joined
        await env.later(30)
        await env.finish("t", "succeeded", exit_code=0)
        await env.deliver()
        titles = [r.json()["title"] for r in server.requests]
        assert titles == ["[qledge] t failed", "[qledge] t recovered"]
        assert server.requests[1].json()["failures"] == 4
        assert env.timers.pending == []  # no reminder left armed
    finally:
        await env.notifier.stop()
        await db.close()


def _wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.e2e
def test_a_failing_task_on_a_real_daemon_is_reminded_then_recovers(daemon_factory, server, scratch):
    d = daemon_factory(config="[notify]\nrepeat_s = 3\n").start()
    try:
        d.call("qledge.notify.channel.set", {"name": "phone", "spec": {"kind": "webhook", "url": server.url + "/x"}})
        d.call("qledge.task.create", {"taskId": "flaky", "spec": {
            "command": {"kind": "shell", "command": "test -f ok || { echo 'not yet'; exit 2; }"},
            "workingDir": scratch, "notify": [{"channels": ["phone"]}]}})
        for _ in range(3):
            assert d.cli("run", "start", "flaky", "--wait").returncode == 1
        assert _wait(lambda: server.requests)
        first = server.requests[0].json()
        assert first["event"] == "failure" and first["failures"] is None
        reminder = _wait(lambda: len(server.requests) >= 2 and server.requests[1].json())
        assert reminder["title"] == "[qledge] flaky still failing" and reminder["failures"] == 3, reminder
        with open(os.path.join(scratch, "ok"), "w"):
            pass
        assert d.cli("run", "start", "flaky", "--wait").returncode == 0
        recovered = _wait(lambda: len(server.requests) >= 3 and server.requests[2].json())
        assert recovered["event"] == "recovery" and recovered["failures"] == 3, recovered
        assert "Recovered after 3 failures since" in recovered["text"]
        time.sleep(1)
        assert len(server.requests) == 3
        records = d.call("qledge.notify.log")["records"]
        assert [r["state"] for r in records] == ["sent"] * 3
    finally:
        d.stop()
