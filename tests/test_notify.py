"""Notifications from a run's end to a request: queued in the transaction that finishes the
run (real SQLite), delivered by the notifier through the real sender child to a real
loopback server, with an injected clock and timers for backoff and rate limits; and a
real daemon for the whole path and for a restart with messages still queued."""

from __future__ import annotations

import json
import os
import time

import pytest

from edge.app.config import Config
from edge.app.graph import build_stores
from edge.core.runs import Run, RunUpdate
from edge.core.tasks import NotifyRule, ShellCommand, TaskSpec
from edge.notify.dispatch import Notifier, NotifySettings
from edge.storage.sqlite.db import Database
from notify_support import Loopback
from support import ManualTimers

T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ms = T0

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000


class Env:
    """Real stores on a real file; the notifier with injected time."""

    def __init__(self, db: Database, home: str, server: Loopback, **settings) -> None:
        self.db, self.server, self.clock, self.timers = db, server, Clock(), ManualTimers()
        self.stores = build_stores(db, Config(), home)
        assert self.stores.notify is not None
        self.store = self.stores.notify()
        self.notifier = Notifier(store=self.store, secrets=self.stores.secrets, logs=self.stores.logs,
                                 clock=self.clock, timers=self.timers, project="default",
                                 settings=NotifySettings(device="router", **settings))
        self.stores.followers.notify = self.notifier.wake
        self.woken = 0

    async def channel(self, name: str, path: str = "/hook") -> None:
        spec = {"kind": "webhook", "url": self.server.url + path, "body": {"task": "{task}", "event": "{event}",
                                                                          "count": "{count}", "text": "{text}"}}
        await self.store.set_channel("default", name, "webhook", json.dumps(spec), self.clock.ms)

    async def task(self, task_id: str, rules: list[NotifyRule] | None = None, command: str = "false") -> None:
        spec = TaskSpec(command=ShellCommand(command=command), notify=rules)
        await self.stores.tasks.create("default", task_id, task_id, spec, self.clock.ms, privileged=True)

    async def finish(self, task_id: str, status: str = "failed", log: bytes = b"", exit_code: int = 1) -> Run:
        """A run of the task that ends with `status` (and a log), through the real store."""
        task = await self.stores.tasks.get("default", task_id)
        admitted = await self.stores.admission.admit_manual(task, "user", self.clock.ms)
        run = admitted.run
        sink = self.stores.logs.create(run.id, 1 << 20, [])
        sink.write(log)
        size = sink.close()
        run = await self.stores.runs.transition(run.id, run.version, "running", self.clock.ms, "runner",
                                                RunUpdate(started_at_ms=self.clock.ms - 1500))
        return await self.stores.runs.transition(run.id, run.version, status, self.clock.ms, "runner",
                                                 RunUpdate(finished_at_ms=self.clock.ms, exit_code=exit_code,
                                                           log_bytes=size, error_summary="exited with code 1"
                                                           if status == "failed" else None))

    async def deliver(self) -> None:
        await self.notifier.settle()

    async def later(self, seconds: float) -> None:
        self.clock.ms += int(seconds * 1000)
        self.timers.advance(seconds + 0.002)  # timers are armed a millisecond past the due time
        await self.notifier.settle()

    async def log(self) -> list:
        return await self.store.log("default", None, 64)


@pytest.fixture
def server():
    s = Loopback()
    yield s
    s.close()


@pytest.fixture
async def env(home, server):
    db = await Database.open(os.path.join(home, "q.db"))
    made = Env(db, home, server)
    await made.notifier.start()
    yield made
    await made.notifier.stop()
    await db.close()


async def test_a_failure_sends_one_message_per_rule_and_redacts_the_log(env):
    await env.channel("a", "/a")
    await env.channel("b", "/b")
    await env.stores.secrets.set("default", "DB_PASS", "hunter2-very-secret", env.clock.ms)
    # Two rules name b for a failure: b still gets one message; a gets its own.
    await env.task("backup", [NotifyRule(channels=["a"], on=["failure"]),
                              NotifyRule(channels=["b"], on=["failure", "recovery"]),
                              NotifyRule(channels=["b"], on=["every"])])
    await env.finish("backup", log=b"starting\nconnecting with hunter2-very-secret\npassword=letmein\nboom\n")
    await env.deliver()
    assert sorted(r.path for r in env.server.requests) == ["/a", "/b"]
    body = env.server.requests[0].json()
    assert body["task"] == "backup" and body["event"] == "failure"
    assert "boom" in body["text"] and "hunter2-very-secret" not in body["text"] and "letmein" not in body["text"]
    assert "Status: failed (exit 1)" in body["text"] and "Device: router" in body["text"]
    assert {(r.channel, r.state, r.attempts) for r in await env.log()} == {("a", "sent", 1), ("b", "sent", 1)}


async def test_recovery_is_the_first_success_after_a_final_failure(env):
    await env.channel("a")
    await env.task("t", [NotifyRule(channels=["a"])])  # on failure and recovery: the default
    await env.finish("t", "succeeded", exit_code=0)
    await env.finish("t", "failed")
    await env.finish("t", "succeeded", exit_code=0)
    await env.finish("t", "succeeded", exit_code=0)
    await env.deliver()
    assert [r.json()["event"] for r in env.server.requests] == ["failure", "recovery"]


async def test_the_project_default_rule_applies_to_tasks_without_their_own(env):
    await env.channel("a")
    await env.store.set_rules("default", [NotifyRule(channels=["a"], on=["failure", "lost"])], env.clock.ms)
    await env.task("plain")
    await env.task("quiet", [])  # its own rules: none
    await env.finish("plain", "lost")
    await env.finish("quiet", "failed")
    await env.deliver()
    assert [(r.json()["task"], r.json()["event"]) for r in env.server.requests] == [("plain", "lost")]


async def test_a_rule_naming_no_channel_is_on_record(env):
    await env.channel("a")
    await env.task("t", [NotifyRule(channels=["gone"])])
    await env.finish("t")
    await env.deliver()
    (record,) = await env.log()
    assert (record.channel, record.state, record.last_error) == ("gone", "dropped", "no channel named 'gone'")
    assert env.server.requests == []


async def test_failed_deliveries_back_off_then_go_once(env):
    env.server.replies = [(500, {}, {}), (502, {}, {})]
    await env.channel("a")
    await env.task("t", [NotifyRule(channels=["a"])])
    await env.finish("t")
    await env.deliver()
    assert env.timers.pending == [pytest.approx(30.001)]  # backoff_s, then doubling
    await env.later(30)
    assert env.timers.pending == [pytest.approx(60.001)]
    await env.later(60)
    assert len(env.server.requests) == 3
    (record,) = await env.log()
    assert (record.state, record.attempts) == ("sent", 3)
    assert [t.ok for t in reversed(record.tries)] == [False, False, True]
    assert "HTTP 500" in record.tries[-1].detail
    assert env.timers.pending == []  # nothing left: no wake-ups


async def test_a_permanent_refusal_gives_up_and_the_channel_shows_as_failing(env):
    env.server.default = {"message": "bad token"}
    env.server.replies = [(401, {"message": "bad token"}, {})] * 3
    await env.channel("a")
    for name in ("t1", "t2", "t3"):  # three tasks (one task's repeats would be damped)
        await env.task(name, [NotifyRule(channels=["a"])])
        await env.finish(name)
        await env.deliver()
        await env.later(61)  # past the rate window
    records = await env.log()
    assert {(r.state, r.attempts) for r in records} == {("failed", 1)}
    line = env.notifier.status()["notify"]
    assert line.startswith("1 channel failing: a (3 failed attempts in a row since") and "HTTP 401" in line


async def test_rate_limit_then_one_summary_and_coalescing(home, server):
    db = await Database.open(os.path.join(home, "r.db"))
    env = Env(db, home, server, per_minute=2, repeat_s=0)  # every failure a message: only the rate limit holds them
    try:
        await env.channel("a")
        for name in ("t1", "t2", "t3", "t4", "t5"):
            await env.task(name, [NotifyRule(channels=["a"])])
            await env.finish(name)
        await env.notifier.start()
        await env.deliver()
        # Two requests in the minute: one message, then one summary of the other four.
        assert [r.json()["event"] for r in server.requests] == ["failure", "summary"]
        summary = server.requests[1].json()
        assert summary["count"] == 4 and "t2: failure" in summary["text"] and "t5: failure" in summary["text"]
        # A */1 task failing every second while the channel is full: one message, counted.
        for _ in range(5):
            env.clock.ms += 1000
            await env.finish("t1")
            await env.deliver()
        assert len(server.requests) == 2
        assert env.timers.pending and env.timers.pending[0] <= 60.1
        await env.later(60)
        assert len(server.requests) == 3
        last = server.requests[2].json()
        assert (last["task"], last["count"]) == ("t1", 5) and "5 times since" in last["text"]
        states = sorted(r.state for r in await env.log())
        assert states == ["merged"] * 4 + ["sent"] * 3
    finally:
        await env.notifier.stop()
        await db.close()


async def test_an_event_during_a_delivery_is_a_message_of_its_own(home, server):
    """A message in flight is claimed: a failure that ends meanwhile does not join it (it
    would be marked sent with the rest unsent) but is a message of its own, sent next
    (every failure is a message here: no damping)."""
    db = await Database.open(os.path.join(home, "e.db"))
    env = Env(db, home, server, repeat_s=0)
    await env.notifier.start()
    try:
        await _during_a_delivery(env)
    finally:
        await env.notifier.stop()
        await db.close()


async def _during_a_delivery(env: Env) -> None:
    import asyncio

    env.server.delay = 0.5
    await env.channel("a")
    await env.task("t", [NotifyRule(channels=["a"])])
    first = await env.finish("t")
    assert await asyncio.to_thread(env.server.received.wait, 20)
    second = await env.finish("t")  # while the first request waits for its answer
    await env.deliver()
    sent = [r.json() for r in env.server.requests]
    assert [b["count"] for b in sent] == [1, 1]
    assert f"Run: {first.id[:13]}" in sent[0]["text"] and f"Run: {second.id[:13]}" in sent[1]["text"]
    assert [(r.state, r.count) for r in await env.log()] == [("sent", 1), ("sent", 1)]


async def test_a_test_message_bypasses_the_queue_wait(env):
    await env.channel("a", "/t")
    outcome = await env.notifier.test("a", 20)
    assert outcome.ok and env.server.requests[0].json()["event"] == "test"


async def test_retried_failures_notify_once_when_final(env):
    from edge.core.tasks import RetryPolicy

    await env.channel("a")
    spec = TaskSpec(command=ShellCommand(command="false"), retry=RetryPolicy(count=1, delay_s=5),
                    notify=[NotifyRule(channels=["a"])])
    await env.stores.tasks.create("default", "r", "r", spec, env.clock.ms, privileged=True)
    first = await env.finish("r")
    assert first.retry_due_at_ms == first.finished_at_ms + 5000 if first.finished_at_ms else False
    await env.deliver()
    assert env.server.requests == []  # a retry follows: not a failure yet
    env.clock.ms = first.retry_due_at_ms
    admitted = await env.stores.admission.admit_retry("default", first.id, env.clock.ms)
    (retry,) = admitted.runs
    assert (retry.origin, retry.retry_of, retry.attempt) == ("retry", first.id, 2)
    running = await env.stores.runs.transition(retry.id, retry.version, "running", env.clock.ms, "runner",
                                               RunUpdate(started_at_ms=env.clock.ms))
    final = await env.stores.runs.transition(running.id, running.version, "failed", env.clock.ms, "runner",
                                             RunUpdate(finished_at_ms=env.clock.ms, exit_code=1))
    assert final.retry_due_at_ms is None  # its one retry is spent
    await env.deliver()
    assert [r.json()["event"] for r in env.server.requests] == ["failure"]


# -- a real daemon -------------------------------------------------------------------


def _wait(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_a_failing_task_on_a_real_daemon(daemon, server):
    daemon.call("qledge.secret.set", {"name": "HOOK_TOKEN", "value": "Bearer tok-123456"})
    for name in ("first", "second"):
        added = daemon.cli("notify", "add", name, "webhook", "--set", f"url={server.url}/{name}",
                           "--set", 'headers={"Authorization": {"secret": "HOOK_TOKEN"}}')
        assert added.returncode == 0, added.stderr
    assert daemon.cli("notify", "rules", "--channel", "first", "--on", "failure").returncode == 0
    added = daemon.cli("task", "add", "flaky", "--shell", "--notify", "second", "--notify-on", "failure,recovery",
                       "--", "echo oops; exit 4")
    assert added.returncode == 0, added.stderr
    daemon.cli("task", "add", "plain", "--shell", "--", "exit 2")
    assert daemon.cli("run", "start", "flaky", "--wait").returncode == 1
    assert daemon.cli("run", "start", "plain", "--wait").returncode == 1
    got = _wait(lambda: len(server.requests) >= 2 and server.requests)
    # Nothing more comes: the runs' transactions queued two messages, and both are done.
    records = _wait(lambda: (r := daemon.call("qledge.notify.log")["records"]) and all(
        x["state"] != "pending" for x in r) and r)
    assert [(x["state"], x["attempts"]) for x in records] == [("sent", 1), ("sent", 1)]
    assert len(server.requests) == 2
    assert sorted(r.path for r in got) == ["/first", "/second"]  # each task: its one rule's message
    assert all(r.headers["Authorization"] == "Bearer tok-123456" for r in got)
    flaky = next(r.json() for r in got if r.path == "/second")
    assert flaky["task"] == "flaky" and flaky["exitCode"] == 4 and flaky["log"] == "oops"
    tested = daemon.cli("notify", "test", "first")
    assert tested.returncode == 0 and "sent through first" in tested.stdout
    log = daemon.cli("notify", "log")
    assert log.returncode == 0 and "test" in log.stdout and "failure" in log.stdout
    listed = json.loads(daemon.cli("notify", "channels", "--json").stdout)
    assert "tok-123456" not in json.dumps(listed) and listed[0]["health"]["failures"] == 0


def test_who_may_configure_channels(daemon, server):
    daemon.call("qledge.secret.set", {"name": "S", "value": "value-1"})
    _, operator = daemon.token("operator")
    spec = {"kind": "webhook", "url": server.url, "headers": {"X": {"secret": "S"}}}
    with daemon.client(operator) as c:
        from edge.cli.client import CallFailed

        with pytest.raises(CallFailed) as denied:
            c.call("qledge.notify.channel.set", {"name": "x", "spec": spec})
        assert denied.value.code == "permission_denied" and "secret.export" in denied.value.message
    assert daemon.call("qledge.notify.channel.set", {"name": "x", "spec": spec})["status"] == "created"
    with daemon.client(operator) as c:
        assert c.call("qledge.notify.test", {"channel": "x"})["ok"]
        assert [ch["name"] for ch in c.call("qledge.notify.channel.list")["channels"]] == ["x"]
    with pytest.raises(Exception, match="secret 'NOPE' is not set"):
        daemon.call("qledge.notify.channel.set",
                    {"name": "y", "spec": {"kind": "pushplus", "token": {"secret": "NOPE"}}})


@pytest.mark.e2e
def test_undelivered_messages_go_after_a_restart_once(daemon_factory):
    import socket

    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = daemon_factory(config="[notify]\nbackoff_s = 1\n").start()
    d.call("qledge.notify.channel.set", {"name": "w", "spec": {"kind": "webhook", "url": f"http://127.0.0.1:{port}/x"}})
    d.call("qledge.notify.rules.set", {"rules": [{"channels": ["w"]}]})
    d.call("qledge.task.create", {"taskId": "t", "spec": {"command": {"kind": "shell", "command": "exit 1"}}})
    d.cli("run", "start", "t", "--wait")
    assert _wait(lambda: d.call("qledge.notify.log")["records"][0]["attempts"] >= 1)
    d.stop()
    server = Loopback()
    server.httpd.server_close()  # rebind the same port
    import http.server

    server.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), server.httpd.RequestHandlerClass)
    import threading

    threading.Thread(target=server.httpd.serve_forever, daemon=True).start()
    try:
        d.start()
        assert _wait(lambda: server.requests)
        time.sleep(1.5)
        d.stop()
        d.start()
        time.sleep(1.5)
        assert len(server.requests) == 1
        (record,) = d.call("qledge.notify.log")["records"]
        assert record["state"] == "sent" and record["attempts"] == 2
    finally:
        server.close()


def test_a_failing_channel_is_in_status_also_after_a_restart(daemon_factory):
    """The notifier is dormant until there is work: a daemon whose channel's last attempt
    failed starts it at once, so `qledge status` keeps reporting the channel."""
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = daemon_factory(config="[notify]\nmax_attempts = 1\n").start()
    modules = d.call("qledge.status", {"includeModules": True})["modules"]
    assert "edge.notify.dispatch" not in modules  # nothing to deliver yet: not even loaded
    d.call("qledge.notify.channel.set", {"name": "w", "spec": {"kind": "webhook", "url": f"http://127.0.0.1:{port}/"}})
    d.call("qledge.task.create", {"taskId": "t", "spec": {"command": {"kind": "argv", "file": "false"},
                                                         "notify": [{"channels": ["w"]}]}})
    d.cli("run", "start", "t", "--wait")
    assert _wait(lambda: d.call("qledge.notify.log")["records"][0]["state"] == "failed")
    line = _wait(lambda: d.call("qledge.status")["extra"].get("notify"))
    assert line.startswith("1 channel failing: w (1 failed attempts in a row since") and "127.0.0.1" in line
    d.stop()
    d.start()
    assert d.call("qledge.status")["extra"]["notify"].startswith("1 channel failing: w")
    shown = d.cli("status")
    assert shown.returncode == 0 and "1 channel failing: w" in shown.stdout


def test_a_run_that_timed_out_says_so_in_words(daemon, server):
    daemon.call("qledge.notify.channel.set", {"name": "w", "spec": {"kind": "webhook", "url": server.url + "/w"}})
    daemon.call("qledge.task.create", {"taskId": "slow", "spec": {
        "command": {"kind": "shell", "command": "sleep 30"}, "timeoutMs": 1000, "notify": [{"channels": ["w"]}]}})
    daemon.call("qledge.task.create", {"taskId": "crash", "spec": {
        "command": {"kind": "shell", "command": "kill -SEGV $$"}, "notify": [{"channels": ["w"]}]}})
    assert daemon.cli("run", "start", "slow", "--wait").returncode == 1
    assert daemon.cli("run", "start", "crash", "--wait").returncode == 1
    got = _wait(lambda: len(server.requests) >= 2 and server.requests)
    bodies = {r.json()["task"]: r.json() for r in got}
    assert bodies["slow"]["outcome"] == "timed out after 1 s, stopped with SIGTERM", bodies["slow"]
    assert "Status: timed out after 1 s, stopped with SIGTERM" in bodies["slow"]["text"]
    assert "exit -15" not in bodies["slow"]["text"]
    assert bodies["crash"]["outcome"] == "failed: killed by SIGSEGV", bodies["crash"]


def test_set_takes_a_text_fields_value_as_text(daemon):
    """A Telegram chat id reads as a JSON number, but the field is text: it is taken as typed,
    while a number field (ntfy's priority) still gets a number."""
    daemon.call("qledge.secret.set", {"name": "TG_TOKEN", "value": "123456:ABC-token"})
    added = daemon.cli("notify", "add", "tg", "telegram", "--secret", "token=TG_TOKEN",
                       "--set", "chatId=-1001234567890")
    assert added.returncode == 0, added.stderr
    added = daemon.cli("notify", "add", "alerts", "ntfy", "--set", "topic=12345", "--set", "priority=4")
    assert added.returncode == 0, added.stderr
    refused = daemon.cli("notify", "add", "bad", "ntfy", "--set", "topic=x", "--set", "priority=high")
    assert refused.returncode == 2 and "priority" in refused.stderr, refused.stderr
    specs = {c["name"]: c["spec"] for c in daemon.call("qledge.notify.channel.list", {})["channels"]}
    assert specs["tg"]["chatId"] == "-1001234567890"
    assert specs["alerts"]["topic"] == "12345" and specs["alerts"]["priority"] == 4
