"""What the daemon says in the system log (its stderr: procd sends it to logread, systemd
to the journal): one line per finished run and per skipped or refused fire, bounded per
task, never a task's output or a secret. The rate limit on injected timers; the lines
from real daemons."""

from __future__ import annotations

import logging
import re
import time

import pytest

from cluster_support import rows, start_nodes
from cluster_support import task as task_spec
from edge.core.notices import RUN_ID_PREFIX, Notices
from support import ManualTimers


class TimersClock:
    """The monotonic clock of ManualTimers, so windows and timers agree."""

    def __init__(self, timers: ManualTimers) -> None:
        self.timers = timers

    def now_ms(self) -> int:
        return int(self.timers.now * 1000)

    def monotonic(self) -> float:
        return self.timers.now


def _lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "qledge.test"]


def test_a_chatty_task_gets_five_lines_a_minute_then_one_line_saying_what_was_suppressed(caplog):
    timers = ManualTimers()
    notices = Notices(TimersClock(timers), timers)
    logger = logging.getLogger("qledge.test")
    caplog.set_level(logging.INFO, "qledge")
    for second in range(60):  # a `*/1 * * * * *` trigger: a run a second, every tenth fails
        failed = second % 10 == 9
        notices.say(logger, "chatty", logging.WARNING if failed else logging.INFO, f"run {second}",
                    "failed" if failed else "succeeded")
        if second == 30:  # another task has its own budget
            notices.say(logger, "calm", logging.INFO, f"calm {second}", "succeeded")
        timers.advance(0.999)
    assert _lines(caplog) == [("INFO", f"run {n}") for n in range(5)] + [("INFO", "calm 30")]
    timers.advance(0.1)  # the window closes: one line, a warning because failures were among them
    assert _lines(caplog)[-1] == ("WARNING", "task=chatty: 55 more lines suppressed in the last 1m00s"
                                             " (6 failed, 49 succeeded)")
    notices.say(logger, "chatty", logging.INFO, "run 60", "succeeded")  # a new window
    assert _lines(caplog)[-1] == ("INFO", "run 60") and timers.pending == []


def test_what_is_suppressed_when_the_daemon_stops_is_said_then(caplog):
    timers = ManualTimers()
    notices = Notices(TimersClock(timers), timers, burst=1)
    logger = logging.getLogger("qledge.test")
    caplog.set_level(logging.INFO, "qledge")
    for _ in range(3):
        notices.say(logger, "t", logging.INFO, "line", "succeeded")
    notices.close()
    assert _lines(caplog) == [("INFO", "line"),
                              ("INFO", "task=t: 2 more lines suppressed in the last 0.0s (2 succeeded)")]
    assert timers.pending == []


def _stderr_lines(d, pattern: str) -> list[str]:
    return [line for line in d.stderr().splitlines() if re.search(pattern, line)]


def test_every_finished_run_has_one_line_with_task_run_status_exit_and_duration(daemon):
    daemon.cli("secret", "set", "api", input="hunter2-very-secret")
    daemon.cli("task", "add", "ok", "--", "echo", "hello-from-the-task")
    daemon.cli("task", "add", "bad", "--shell", "--secret-env", "API=api", "--",
               'echo "$API"; echo boom-output; exit 3')
    daemon.cli("task", "add", "slow", "--timeout", "1", "--", "sleep", "30")
    daemon.cli("task", "add", "nap", "--", "sleep", "30")
    ids = {}
    for task in ("ok", "bad", "slow"):
        ids[task] = daemon.call("qledge.run.start", {"taskId": task})["id"]
        daemon.call("qledge.run.wait", {"runId": ids[task], "timeoutMs": 20_000})
    ids["nap"] = daemon.call("qledge.run.start", {"taskId": "nap"})["id"]
    daemon.call("qledge.run.cancel", {"runId": ids["nap"]})
    took = r"took=\d+\.\ds"
    expected = {
        "ok": rf"^qledge: INFO qledge\.runner: run finished: task=ok run={ids['ok'][:RUN_ID_PREFIX]}"
              rf" status=succeeded exit=0 {took}$",
        "bad": rf"^qledge: WARNING qledge\.runner: run finished: task=bad run={ids['bad'][:RUN_ID_PREFIX]}"
               rf" status=failed exit=3 {took}$",
        "slow": rf"^qledge: WARNING qledge\.runner: run finished: task=slow run={ids['slow'][:RUN_ID_PREFIX]}"
                rf" status=timed_out signal=SIGTERM {took}$",
        "nap": rf"^qledge: WARNING qledge\.runner: run finished: task=nap run={ids['nap'][:RUN_ID_PREFIX]}"
               rf" status=cancelled (signal=SIGTERM {took}|exit=- took=-) reason=user$",
    }
    for task, pattern in expected.items():
        assert len(_stderr_lines(daemon, pattern)) == 1, (task, daemon.stderr())
    assert len(_stderr_lines(daemon, "run finished:")) == 4
    for never in ("hello-from-the-task", "boom-output", "hunter2"):  # output and secrets stay out
        assert never not in daemon.stderr()


@pytest.mark.e2e
def test_a_chatty_trigger_cannot_flood_the_log(daemon):
    daemon.cli("task", "add", "chatty", "--overlap", "allow", "--", "false")
    daemon.cli("trigger", "add", "chatty", "--cron", "* * * * * *")
    time.sleep(9)
    daemon.cli("trigger", "disable", "chatty-1")
    runs = len(daemon.call("qledge.run.list", {"taskId": "chatty", "limit": 64})["runs"])
    assert runs >= 7
    assert daemon.stop() == 0  # what is still suppressed is said at the stop
    lines = _stderr_lines(daemon, "task=chatty")
    assert len(_stderr_lines(daemon, r"WARNING qledge\.runner: run finished: task=chatty .* status=failed"
                                      r" exit=1 .* origin=scheduled$")) == 5
    [summary] = _stderr_lines(daemon, "more lines suppressed")
    assert re.search(rf"WARNING qledge\.runner: task=chatty: {runs - 5} more lines suppressed in the last"
                     rf" \S+ \({runs - 5} failed\)$", summary)
    assert len(lines) == 6


@pytest.mark.e2e
def test_skipped_fires_are_one_line_then_one_line_for_the_rest_of_the_streak(daemon):
    daemon.cli("task", "add", "nap", "--", "sleep", "2.5")  # overlap forbid: fires meanwhile are skipped
    daemon.cli("trigger", "add", "nap", "--cron", "* * * * * *")
    deadline = time.monotonic() + 20
    while not _stderr_lines(daemon, "more in a row"):
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.2)
    daemon.cli("trigger", "disable", "nap-1")
    first = _stderr_lines(daemon, r"WARNING qledge\.scheduler: fire skipped: task=nap trigger=nap-1 reason=overlap"
                                  r' scheduled="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+"$')
    rest = _stderr_lines(daemon, r"WARNING qledge\.scheduler: fire skipped: task=nap trigger=nap-1 reason=overlap"
                                 r' \d+ more in a row last="[^"]+"$')
    assert first and rest
    events = daemon.call("qledge.trigger.events", {"triggerId": "nap-1"})["events"]
    skipped = sum(e["fires"] for e in events if e["reason"] == "overlap")
    more = sum(int(re.search(r" (\d+) more", line).group(1)) for line in rest)
    assert len(first) + more <= skipped  # every line stands for fires that are on record
    assert len(first) == len(rest) or len(first) == len(rest) + 1  # one streak may still be open


# -- cluster nodes: each line once, by the node that recorded what it says ------------------


def _both(nodes, pattern: str) -> list[str]:
    return [line for d in nodes for line in _stderr_lines(d, pattern)]


def test_cluster_nodes_log_each_finished_run_once_on_the_node_that_ran_it(daemon_factory, pg_dsn):
    nodes = start_nodes(daemon_factory, pg_dsn, 2)
    a, b = nodes
    a.call("qledge.task.create", task_spec("ok", ["true"]))
    a.call("qledge.task.create", task_spec("bad", ["sh", "-c", "echo boom-output; exit 3"]))
    ids = {}
    for name in ("ok", "bad"):
        ids[name] = b.call("qledge.run.start", {"taskId": name})["id"]
        assert a.call("qledge.run.wait", {"runId": ids[name], "timeoutMs": 20_000})["done"]
    took = r"took=\d+\.\ds"
    assert len(_both(nodes, rf"^qledge: INFO qledge\.runner: run finished: task=ok run={ids['ok'][:RUN_ID_PREFIX]}"
                            rf" status=succeeded exit=0 {took}$")) == 1
    assert len(_both(nodes, rf"^qledge: WARNING qledge\.runner: run finished: task=bad"
                            rf" run={ids['bad'][:RUN_ID_PREFIX]} status=failed exit=3 {took}$")) == 1
    assert len(_both(nodes, "run finished:")) == 2
    assert "boom-output" not in a.stderr() + b.stderr()


@pytest.mark.e2e
def test_cluster_nodes_log_skipped_fires_once_across_the_cluster(daemon_factory, pg_dsn):
    """Every node evaluates every trigger, but a fire is recorded by one node: the lines of
    both nodes together account for every skipped fire on record, each exactly once."""
    nodes = start_nodes(daemon_factory, pg_dsn, 2)
    a, _ = nodes
    a.call("qledge.task.create", task_spec("off", ["true"]))
    a.call("qledge.trigger.create", {"taskId": "off", "triggerId": "off-1", "expression": "* * * * * *",
                                     "timezone": "UTC"})
    assert a.cli("task", "disable", "off").returncode == 0
    deadline = time.monotonic() + 20
    while rows(pg_dsn, "SELECT coalesce(sum(fires), 0) FROM trigger_events WHERE reason = 'task_disabled'")[0][0] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    for d in nodes:
        assert d.stop() == 0  # a streak still open is said at the stop
    (recorded,) = rows(pg_dsn, "SELECT coalesce(sum(fires), 0) FROM trigger_events WHERE reason = 'task_disabled'")[0]
    first = _both(nodes, r"^qledge: INFO qledge\.scheduler: fire skipped: task=off trigger=off-1 reason=task_disabled"
                         r' scheduled="[^"]+"$')
    rest = _both(nodes, r"^qledge: INFO qledge\.scheduler: fire skipped: task=off trigger=off-1 reason=task_disabled"
                        r' \d+ more in a row last="[^"]+"$')
    assert first and len(first) <= 2  # one streak per node at most
    assert len(first) + sum(int(re.search(r" (\d+) more", line).group(1)) for line in rest) == recorded


async def test_a_hand_off_hands_its_refusal_to_its_caller_and_logs_a_bug_once_alone(caplog):
    """shielded: the caller that waits gets the exception and nothing is logged; once the
    caller has gone, a refusal (ToolError) is one line and anything else a traceback."""
    import asyncio

    from edge.core.errors import ToolError, conflict
    from edge.core.handoff import Background, shielded

    background = Background(logging.getLogger("qledge.test"))

    async def refuse(after_s: float = 0.0) -> None:
        await asyncio.sleep(after_s)
        raise conflict("task 'long' already has an active run")

    async def crash(after_s: float) -> None:
        await asyncio.sleep(after_s)
        raise RuntimeError("a bug")

    caplog.set_level(logging.INFO)
    with pytest.raises(ToolError):
        await shielded(background, refuse(), "admit-long")
    await background.wait()
    assert _lines(caplog) == []
    for work in (refuse(0.05), crash(0.05)):
        caller = asyncio.create_task(shielded(background, work, "admit-gone"))
        await asyncio.sleep(0)
        caller.cancel()  # the client hung up: the work goes on, and its failure is logged here
        with pytest.raises(asyncio.CancelledError):
            await caller
    await background.wait()
    records = [r for r in caplog.records if r.name == "qledge.test"]
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in records] == [
        ("WARNING", "admit-gone: conflict: task 'long' already has an active run", False),
        ("ERROR", "background task admit-gone failed", True),
    ]
