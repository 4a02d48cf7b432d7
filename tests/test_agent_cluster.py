"""The AI operator in cluster mode: real daemons as nodes of a real PostgreSQL, real AI runs
in real children against a scripted provider. The evidence history is the cluster's (any
node reads what any node ran); a run's credential lives on the node that runs it; every
terminal outcome leaves its record: answered, cancelled from another node, cancelled
before any node took it, and lost with a node that died. Every test that sends a request runs
against each provider family's conformance fake: a refusal fails it, naming the family."""

from __future__ import annotations

import os
import re
import signal

import pytest

from agent_support import EVERY_FAMILY, agent_config, ai_task, served, record, until, wait
from cluster_support import node_config, rows, task
from edge.runner.process import alive
from fake_provider import FakeProvider, Step, answer, tool_call

pytestmark = pytest.mark.e2e


@pytest.fixture
def provider(request):
    yield from served(request)


def _nodes(daemon_factory, dsn: str, provider: FakeProvider, count: int, **kw):
    return [daemon_factory(config=node_config(dsn, f"n{i + 1}", extra=agent_config(provider), **kw)).start()
            for i in range(count)]


def _held_by(d, run_id: str) -> str:
    (node,) = [e["detail"] for e in d.call("qledge.run.events", {"runId": run_id})["events"]
               if e["type"] == "run.claimed"]
    return node.removeprefix("node ")


@EVERY_FAMILY
def test_ask_on_one_node_is_answered_and_its_record_read_from_any(daemon_factory, pg_dsn, provider):
    a, b = _nodes(daemon_factory, pg_dsn, provider, 2)
    provider.add(tool_call("qinglong.run.list", {}, content="Plan: list the runs."), answer("nothing failed"))
    asked = a.cli("ask", "did", "anything", "fail?", "--wait")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.strip() == "nothing failed"
    run_id = re.search(r"run (\S+) queued", asked.stderr).group(1)
    for node in (a, b):  # the evidence history is the cluster's
        found = record(node, run_id)
        assert (found["state"], found["rounds"], found["toolSequence"]) == ("succeeded", 2, ["qinglong.run.list"])
        assert found["answerSummary"] == "nothing failed" and found["positionAfter"] > found["positionBefore"]
        listed = node.call("qinglong.agent.history.list", {})["records"]
        assert [r["runId"] for r in listed] == [run_id]
    assert rows(pg_dsn, "SELECT state FROM agent_evidence WHERE run_id = %s", (run_id,)) == [("succeeded",)]
    # Its calls were audited as the run, by the node that ran it (where its credential lived).
    held = _held_by(a, run_id)
    audited = rows(pg_dsn, "SELECT DISTINCT node_id FROM security_audit WHERE principal = %s", (f"agent:{run_id}",))
    assert audited == [(held,)]


@EVERY_FAMILY
def test_cancel_from_the_other_node_stops_the_child_and_ends_the_record(daemon_factory, pg_dsn, provider):
    a, b = _nodes(daemon_factory, pg_dsn, provider, 2)
    provider.add(Step(answer("never"), delay_s=float("inf")))
    run = a.call("qledge.run.start", {"taskId": ai_task(a, "hang")["id"]})
    until(lambda: provider.requests, what="the provider call")
    held = _held_by(a, run["id"])
    other = b if held == "n1" else a
    # A run is recorded running (with its pid) once it has lasted a second.
    until(lambda: rows(pg_dsn, "SELECT pid FROM runs WHERE id = %s", (run["id"],))[0][0] is not None,
          what="the run's pid on record")
    (pid,) = rows(pg_dsn, "SELECT pid FROM runs WHERE id = %s", (run["id"],))[0]
    cancelled = other.call("qledge.run.cancel", {"runId": run["id"]})
    assert cancelled["status"] == "cancelled", cancelled
    assert not alive(pid)
    assert record(other, run["id"])["state"] == "cancelled"


# No request is sent (the run never starts): one family.
def test_an_ai_run_cancelled_before_any_node_took_it_has_its_record(daemon_factory, pg_dsn, provider):
    (a,) = _nodes(daemon_factory, pg_dsn, provider, 1, concurrency=1)
    a.call("qledge.task.create", task("busy", ["sleep", "30"]))
    busy = a.call("qledge.run.start", {"taskId": "busy"})
    until(lambda: a.call("qledge.run.get", {"runId": busy["id"]})["status"] == "running", what="the busy run")
    queued = a.call("qledge.run.start", {"taskId": ai_task(a, "later")["id"]})  # no free slot on any node
    assert a.call("qledge.run.get", {"runId": queued["id"]})["status"] == "queued"
    cancelled = a.call("qledge.run.cancel", {"runId": queued["id"]})
    assert cancelled["status"] == "cancelled"
    found = record(a, queued["id"])
    assert (found["state"], found["rounds"], found["instruction"]) == ("cancelled", 0, "Why did backup fail?")
    assert provider.requests == []
    a.call("qledge.run.cancel", {"runId": busy["id"]})


@EVERY_FAMILY
def test_a_node_killed_mid_run_leaves_it_lost_and_its_record_ended(daemon_factory, pg_dsn, provider):
    a, b = _nodes(daemon_factory, pg_dsn, provider, 2, lease_s=3)
    provider.add(tool_call("qinglong.run.list", {}), Step(answer("never"), delay_s=float("inf")))
    run = a.call("qledge.run.start", {"taskId": ai_task(a, "orphan")["id"]})
    until(lambda: len(provider.requests) == 2, what="the second request")
    held = _held_by(a, run["id"])
    holder, survivor = (a, b) if held == "n1" else (b, a)
    # A run is recorded running (with its pid) once it has lasted a second.
    until(lambda: rows(pg_dsn, "SELECT pid FROM runs WHERE id = %s", (run["id"],))[0][0] is not None,
          what="the run's pid on record")
    (pid,) = rows(pg_dsn, "SELECT pid FROM runs WHERE id = %s", (run["id"],))[0]
    os.kill(holder.pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)  # its child would be stopped by the node's next life; here it is gone
    final = wait(survivor, run["id"], timeout_s=60)
    assert (final["status"], final["errorCode"]) == ("lost", "lease_expired")
    found = record(survivor, run["id"])
    # The rounds were held in the dead node's memory (the record is written whole at the end):
    # the reaping transaction ends the record its start inserted.
    assert (found["state"], found["errorCode"], found["rounds"]) == ("lost", "lease_expired", 0)
    assert found["finishedAtMs"] is not None and found["positionAfter"] is not None


def test_attempts_above_one_are_refused_on_a_node_with_one_line(daemon_factory, pg_dsn):
    """A cluster node keeps no mission ledger: an attempt of a mission could not be bound."""
    import subprocess
    import sys

    d = daemon_factory(config=node_config(pg_dsn, "n1", extra=agent_config(None, attempts=2)))
    assert d.config_path is not None
    result = subprocess.run([sys.executable, "-m", "edge", "serve", "--config", d.config_path],
                            env={**os.environ, "QLEDGE_HOME": d.home}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("qledge: invalid_argument: [agent] attempts = 2: a cluster node keeps no mission"), line
