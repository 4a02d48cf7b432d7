"""Retries: a failed or timed-out run is run again through admission, linked to the run it
retries, after its delay; the due time is in the database, so a restarted scheduler admits
it too. In-process with an injected clock and a real SQLite file; then on a real daemon."""

from __future__ import annotations

import os
import re
import time

import msgspec
import pytest

from edge.core.runs import Run, RunUpdate, retry_delay_ms
from edge.core.tasks import ArgvCommand, NotifyRule, RetryPolicy, TaskSpec, content_digest
from edge.scheduler.loop import Scheduler
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.notify import SqliteNotifyStore
from test_scheduler import Env, FakeClock, at


@pytest.fixture
async def renv(home):
    db = await Database.open(os.path.join(home, "q.db"))
    e = Env(db, home, FakeClock(at("10:00:00")))
    e.made_followers()
    await e.scheduler.load()
    yield e
    await e.scheduler.stop()
    await db.close()


def _followers(self: Env) -> None:
    """What composition does: a retry scheduled by a finishing run lands on the heap."""
    self.runs._followers.retry = self.scheduler.retry_due  # type: ignore[attr-defined]


Env.made_followers = _followers  # type: ignore[attr-defined]


async def retry_task(e: Env, task_id: str = "r", **policy) -> None:
    spec = TaskSpec(command=ArgvCommand(file="false"), retry=RetryPolicy(**policy))
    await e.tasks.create("default", task_id, task_id, spec, e.clock.ms, privileged=True)


async def start(e: Env, task_id: str = "r") -> Run:
    task = await e.tasks.get("default", task_id)
    return (await e.admission.admit_manual(task, "user", e.clock.ms)).run


async def end(e: Env, run: Run, status: str = "failed") -> Run:
    run = await e.runs.get("default", run.id)
    running = await e.runs.transition(run.id, run.version, "running", e.clock.ms, "runner", RunUpdate())
    return await e.runs.transition(running.id, running.version, status, e.clock.ms, "runner",
                                   RunUpdate(finished_at_ms=e.clock.ms, exit_code=1))


def test_delay_grows_by_the_backoff_up_to_the_cap():
    assert [retry_delay_ms(10, 2, 50, n) for n in (1, 2, 3, 4)] == [10_000, 20_000, 40_000, 50_000]
    assert retry_delay_ms(30, 1, None, 5) == 30_000


def test_specs_without_retries_keep_their_stored_json_and_digest():
    spec = TaskSpec(command=ArgvCommand(file="true"))
    assert msgspec.json.encode(spec) == b'{"command":{"kind":"argv","file":"true","args":[]}}'
    assert content_digest(spec) == "sha256:" + __import__("hashlib").sha256(
        b'{"command":{"args":[],"file":"true","kind":"argv"}}').hexdigest()


async def test_a_failed_run_is_retried_after_its_delay_until_the_retries_are_spent(renv):
    e = renv
    await retry_task(e, count=2, delay_s=30, backoff=2)
    first = await end(e, await start(e))
    assert first.retry_due_at_ms == e.clock.ms + 30_000
    events = [ev.type for ev in await e.runs.events("default", first.id, 0, 10)]
    assert events[-1] == "run.retry_scheduled"
    assert await e.tick(e.clock.ms + 29_000) > 0 and e.executor.submitted == []
    await e.tick(first.retry_due_at_ms)
    (second,) = e.executor.submitted
    assert (second.origin, second.retry_of, second.attempt, second.status) == ("retry", first.id, 2, "queued")
    assert (await e.runs.get("default", first.id)).retry_due_at_ms is None
    second = await end(e, second, "timed_out")
    assert second.retry_due_at_ms == e.clock.ms + 60_000  # the backoff doubled it
    await e.tick(second.retry_due_at_ms)
    third = e.executor.submitted[-1]
    assert (third.retry_of, third.attempt) == (second.id, 3)
    third = await end(e, third)
    assert third.retry_due_at_ms is None  # two retries, both spent
    assert "1 retries waiting" not in e.scheduler.status()["scheduler"]


async def test_cancelled_lost_and_succeeded_runs_are_not_retried(renv):
    e = renv
    await retry_task(e, count=3, delay_s=1)
    for status in ("cancelled", "lost", "succeeded"):
        run = await end(e, await start(e), status)
        assert run.retry_due_at_ms is None, status


async def test_a_retry_goes_through_admission_and_a_refusal_is_on_record(renv):
    e = renv
    await retry_task(e, count=1, delay_s=10)
    await e.trigger("0 * * * *", task_id="r", trigger_id="hourly")
    first = await end(e, await start(e))
    blocker = await start(e)  # forbid: an active run of the task blocks the retry
    await e.tick(first.retry_due_at_ms)
    assert e.executor.submitted == []
    events = [(ev.type, ev.detail) for ev in await e.runs.events("default", first.id, 0, 10)]
    assert events[-1] == ("run.retry_skipped", "overlap")
    assert (await e.runs.get("default", first.id)).retry_due_at_ms is None
    assert await e.events("hourly") == []  # a manual run's retry: no trigger to record it on
    await end(e, blocker, "succeeded")


async def test_a_skipped_retry_queues_a_skipped_notification(renv):
    e = renv
    store = SqliteNotifyStore(e.db)
    await store.set_channel("default", "a", "webhook", '{"kind": "webhook", "url": "http://127.0.0.1:9/"}', e.clock.ms)
    spec = TaskSpec(command=ArgvCommand(file="false"), retry=RetryPolicy(count=1, delay_s=10),
                    notify=[NotifyRule(channels=["a"], on=["skipped"])])
    await e.tasks.create("default", "s", "s", spec, e.clock.ms, privileged=True)
    first = await end(e, await start(e, "s"))
    await start(e, "s")
    await e.tick(first.retry_due_at_ms)
    (pending,) = await store.due("default", e.clock.ms, 10, 60_000)
    assert (pending.event, pending.task_id, pending.detail) == ("skipped", "s", "overlap")


async def test_a_pending_retry_survives_a_restart(renv):
    e = renv
    await retry_task(e, count=1, delay_s=120)
    first = await end(e, await start(e))
    await e.scheduler.stop()
    # A new scheduler (a restarted daemon) finds the due time in the database.
    e.scheduler = Scheduler(e.admission, e.runs, e.executor, e.clock, "default", rng=lambda: 0.25, timers=e.timers)
    await e.scheduler.load()
    assert await e.tick(e.clock.ms + 1000) <= 60
    assert "1 retries waiting" in e.scheduler.status()["scheduler"]
    await e.tick(first.retry_due_at_ms + 5000)  # the daemon was down when it fell due: admitted now
    (retry,) = e.executor.submitted
    assert (retry.origin, retry.retry_of) == ("retry", first.id)
    await e.tick(first.retry_due_at_ms + 10_000)
    assert len(e.executor.submitted) == 1  # once


def test_retries_on_a_real_daemon(daemon):
    added = daemon.cli("task", "add", "flaky", "--retries", "2", "--retry-delay", "0", "--", "false")
    assert added.returncode == 0, added.stderr
    assert "retries:     2 after 0s" in daemon.cli("task", "get", "flaky").stdout
    daemon.cli("run", "start", "flaky", "--wait")
    deadline = time.monotonic() + 20
    runs: list = []
    while time.monotonic() < deadline:
        runs = daemon.call("qledge.run.list", {"taskId": "flaky"})["runs"]
        if len(runs) == 3 and all(r["status"] == "failed" for r in runs):
            break
        time.sleep(0.1)
    runs.reverse()
    assert [(r["origin"], r["attempt"]) for r in runs] == [("manual", 1), ("retry", 2), ("retry", 3)]
    assert [r["retryOf"] for r in runs] == [None, runs[0]["id"], runs[1]["id"]]
    shown = daemon.cli("run", "get", runs[2]["id"]).stdout
    assert re.search(rf"^retry of: +{runs[1]['id']} \(attempt 3\)$", shown, re.M), shown
    # The AI read tools show the link; a run that is no retry keeps its projection as it was.
    ai = daemon.call("qinglong.run.get", {"runId": runs[1]["id"]})
    assert (ai["run"]["origin"], ai["run"]["retryOf"]) == ("retry", runs[0]["id"])
    assert "retryOf" not in daemon.call("qinglong.run.get", {"runId": runs[0]["id"]})["run"]
    listed = {r["id"]: r.get("retryOf") for r in daemon.call("qinglong.run.list", {})["runs"]}
    assert listed == {runs[0]["id"]: None, runs[1]["id"]: runs[0]["id"], runs[2]["id"]: runs[1]["id"]}
    compared = daemon.call("qinglong.task.runs.compare", {"taskId": "flaky"})
    assert compared["candidate"]["id"] == runs[2]["id"] and compared["candidate"]["retryOf"] == runs[1]["id"]
    bad = daemon.cli("task", "add", "x", "--retry-delay", "5", "--", "true")
    assert bad.returncode == 2 and "need --retries" in bad.stderr


@pytest.mark.e2e
def test_a_retry_due_while_the_daemon_was_stopped_runs_once_after_its_restart(daemon_factory):
    d = daemon_factory().start()
    d.call("qledge.task.create", {"taskId": "flaky", "spec": {"command": {"kind": "argv", "file": "false"},
                                                             "retry": {"count": 1, "delayS": 2}}})
    first = d.call("qledge.run.start", {"taskId": "flaky"})
    done = d.call("qledge.run.wait", {"runId": first["id"], "timeoutMs": 20_000})["run"]
    assert done["status"] == "failed" and done["retryDueAtMs"] == done["finishedAtMs"] + 2000
    d.stop()
    time.sleep(max(0.0, (done["retryDueAtMs"] - time.time() * 1000) / 1000) + 0.5)  # due while it was down
    d.start()
    deadline = time.monotonic() + 20
    runs: list = []
    while time.monotonic() < deadline:
        runs = d.call("qledge.run.list", {"taskId": "flaky"})["runs"]
        if len(runs) == 2 and runs[0]["status"] == "failed":
            break
        time.sleep(0.1)
    assert [(r["origin"], r["retryOf"]) for r in runs] == [("retry", first["id"]), ("manual", None)]
    time.sleep(1.0)
    d.stop()
    d.start()  # a second restart admits nothing again
    time.sleep(1.0)
    assert len(d.call("qledge.run.list", {"taskId": "flaky"})["runs"]) == 2


def test_task_update_changes_retries_and_notification_rules(daemon):
    assert daemon.cli("task", "add", "t", "--", "true").returncode == 0

    def spec() -> dict:
        return daemon.call("qledge.task.get", {"taskId": "t"})["spec"]

    up = daemon.cli("task", "update", "t", "--retries", "3", "--retry-delay", "5m")
    assert up.returncode == 0, up.stderr
    assert spec()["retry"] == {"count": 3, "delayS": 300.0}
    assert daemon.cli("task", "update", "t", "--retry-backoff", "2").returncode == 0  # the rest is kept
    assert spec()["retry"] == {"count": 3, "delayS": 300.0, "backoff": 2.0}
    assert daemon.cli("task", "update", "t", "--notify", "phone,mail", "--notify-on", "failure").returncode == 0
    assert spec()["notify"] == [{"channels": ["phone", "mail"], "on": ["failure"]}]
    assert daemon.cli("task", "update", "t", "--no-notify").returncode == 0 and spec()["notify"] == []
    shown = daemon.cli("task", "get", "t").stdout
    assert re.search(r"^retries: +3 after 300s, ×2 each time$", shown, re.M) and re.search(r"^notify: +none$", shown,
                                                                                        re.M), shown
    assert daemon.cli("task", "update", "t", "--reset", "retries", "--reset", "notify").returncode == 0
    assert "retry" not in spec() and "notify" not in spec()
    E = "qledge: invalid_argument: "  # noqa: N806 (the prefix of every refused flag)
    for args, line in (
        (["--retries", "11"], E + "--retries must be from 1 to 10\n"),
        (["--retries", "1", "--retry-delay", "2d"], E + "--retry-delay must be at most 1 day (86400 seconds)\n"),
        (["--retry-backoff", "0.5", "--retries", "1"], E + "--retry-backoff must be from 1 to 10\n"),
        (["--retry-delay", "5"], E + "--retry-delay, --retry-backoff and --retry-max-delay need --retries N\n"),
        (["--notify-on", "failure"], E + "--notify-on needs --notify CHANNEL\n"),
        (["--no-notify", "--notify", "a"], E + "--no-notify cannot be combined with --notify or --notify-on\n"),
    ):
        bad = daemon.cli("task", "add", "x", *args, "--", "true")
        assert (bad.returncode, bad.stderr) == (2, line), args
    wrong = daemon.cli("task", "add", "x", "--notify", "a", "--notify-on", "sometimes", "--", "true")
    assert wrong.returncode == 2 and wrong.stderr.startswith(E + "--notify-on takes events among failure,")
    assert daemon.call("qledge.task.list")["tasks"][-1]["id"] == "t"  # nothing was added


def test_run_start_wait_says_when_the_retry_is_due(daemon):
    from edge.cli.shared import span

    assert daemon.cli("task", "add", "flaky", "--retries", "2", "--retry-delay", "300", "--", "false").returncode == 0
    waited = daemon.cli("run", "start", "flaky", "--wait")
    assert waited.returncode == 1, waited.stderr
    lines = waited.stdout.splitlines()
    assert lines[-2].split()[2] == "failed", lines
    # Due 300 s after the run ended: a slow machine may have taken a few of them since.
    due = [f"retry 1 of 2 due in {span(s, units=2)} (" for s in range(280, 301)]
    assert any(lines[-1].startswith(d) for d in due), lines
    assert lines[-1].endswith("; qledge run list --task flaky)"), lines
    no_retries = daemon.cli("task", "add", "once", "--", "false")
    assert no_retries.returncode == 0
    plain = daemon.cli("run", "start", "once", "--wait")
    assert plain.returncode == 1 and "retry" not in plain.stdout, plain.stdout
