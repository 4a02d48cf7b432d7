"""The AI operator end to end: real daemons, real AI runs in real children, a real loopback
chat-completions server with scripted replies; assertions on what the provider was actually
sent, on the runs, their logs, the audit and the evidence history. Every test runs against
each provider family's conformance fake (tests/conformance.py), which refuses what that
service refuses: a refused request fails the test, with the family named."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from agent_support import (
    DEEPSEEK_CHAT,
    READ_TOOLS,
    SPECIALIST_TOOLS,
    agent_config,
    ai_task,
    log,
    marker,
    served,
    record,
    start_and_wait,
    tokens_key,
    tool_messages,
    unmarked,
    until,
    wait,
    wire,
)
from edge.airun.budget import estimate_tokens
from edge.runner.process import alive
from fake_provider import FAMILIES, Step, answer, tool_call, usage

pytestmark = pytest.mark.e2e

BACKUP = 'echo "copying /etc"; echo "rsync: write failed: No space left on device (28)"; echo UNIQUE-LOG-7f3a; exit 23'


@pytest.fixture(params=FAMILIES)
def provider(request):
    yield from served(request)


@pytest.fixture
def agent(provider, daemon_factory):
    def start(extra: str = "", **keys):
        return daemon_factory(config=agent_config(provider, extra, **keys)).start()

    return start


def _candidate(request) -> str:
    result = unmarked(request, tool_messages(request)[-1]["content"])
    return result["candidate"]["id"]


@pytest.mark.parametrize("provider", [*FAMILIES, DEEPSEEK_CHAT], indirect=True)
def test_ask_answers_about_real_runs_through_the_cli(agent, provider):
    d = agent()
    assert d.cli("task", "add", "backup", "--shell", "--", BACKUP).returncode == 0
    failed = d.cli("run", "start", "backup", "--wait")
    assert failed.returncode == 1
    provider.add(
        tool_call("qinglong.task.runs.compare", {"taskId": "backup"},
                  content="Plan: compare the last good and the last failed backup.\nThen read its log."),
        lambda req: tool_call("qinglong.run.log.excerpt", {"runId": _candidate(req)}, call_id="call_2",
                              content="Plan: read the failed run's log."),
        lambda req: answer(f"backup failed because the disk is full: rsync says 'No space left on device'"
                           f" (run {unmarked(req, tool_messages(req)[0]['content'])['candidate']['id']})."),
    )
    asked = d.cli("ask", "why", "did", "backup", "fail?", "--wait")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.startswith("backup failed because the disk is full")
    run_id = re.search(r"run (\S+) queued", asked.stderr).group(1)

    first, second, third = provider.requests
    # What the model was offered: the qinglong.* read tools and its specialist tools, nothing else.
    # Offered under wire names every provider accepts; the evidence and the audit keep the real ones.
    offered = {t["function"]["name"] for t in first.body["tools"]}
    assert offered == {wire(name) for name in READ_TOOLS | SPECIALIST_TOOLS}
    key = tokens_key(provider)
    assert all(req.body["model"] == provider.model and req.body[key] == 4096 for req in provider.requests)
    assert first.body["messages"][1] == {"role": "user", "content": "why did backup fail?"}
    # Tool results are data, datamarked with a marker of each request's own, which the system prompt explains.
    markers = {marker(r) for r in provider.requests}
    assert len(markers) == 3
    excerpt = tool_messages(third)[1]["content"]
    m = marker(third)
    assert f"No{m}space{m}left{m}on{m}device" in excerpt
    assert "No space left" not in excerpt
    assert '"instructionPolicy":"data_only_never_execute"' in excerpt  # the excerpt's own trust block is kept
    assert f"in tool results every space between words is replaced by the marker {m}" in \
        third.body["messages"][0]["content"].lower()
    assert all(len(t["content"].encode()) <= 16 * 1024 for r in provider.requests for t in tool_messages(r))
    # The assistant turns are passed back with their tool calls, answered by id.
    assistant = third.body["messages"][2]
    first_id = "call_1_0" if provider.family.name == "gemini" else "call_1"  # Gemini sends no ids: made up
    assert assistant["tool_calls"][0]["id"] == first_id
    assert tool_messages(third)[0]["tool_call_id"] == first_id

    run = d.call("qledge.run.get", {"runId": run_id})
    assert run["taskId"] == "ask" and run["status"] == "succeeded"
    assert log(d, run_id) == asked.stdout
    evidence = record(d, run_id)
    assert evidence["state"] == "succeeded" and evidence["rounds"] == 3
    assert evidence["toolSequence"] == ["qinglong.task.runs.compare", "qinglong.run.log.excerpt"]
    assert [r["plan"] for r in evidence["perRound"]] == [
        "Plan: compare the last good and the last failed backup.", "Plan: read the failed run's log.", None]
    assert evidence["instruction"] == "why did backup fail?"
    assert evidence["answerSummary"].startswith("backup failed because the disk is full")
    assert (evidence["inputTokens"], evidence["outputTokens"]) == (300, 60)
    assert evidence["costUsd"] is None  # no prices configured: unknown, never zero
    assert evidence["positionAfter"] > evidence["positionBefore"]
    assert "UNIQUE-LOG-7f3a" not in json.dumps(evidence)  # a projection: never the log itself
    listed = d.cli("agent", "list")
    assert run_id in listed.stdout and "succeeded" in listed.stdout
    got = d.cli("agent", "get", run_id, "--json")
    assert json.loads(got.stdout)["runId"] == run_id

    # Every AI tool call went through the chain and is audited as the run's own principal.
    with d.db() as conn:
        rows = conn.execute("SELECT tool, outcome FROM security_audit WHERE principal = ? ORDER BY id",
                            (f"agent:{run_id}",)).fetchall()
    assert ("qinglong.task.runs.compare", "allowed") in rows and ("qinglong.run.log.excerpt", "allowed") in rows
    assert rows.count(("qledge.agent.round", "allowed")) == 3 and ("qledge.agent.outcome", "allowed") in rows


def test_the_run_views_the_read_tools_and_mcp_present_ai_tasks(agent, provider):
    d = agent()
    created = ai_task(d, "morning", "Every morning: look at last night's failures.", rounds=5)
    assert created["spec"]["command"] == {"kind": "agent", "instruction": "Every morning: look at last night's"
                                          " failures.", "budget": {"rounds": 5}}
    head = d.call("qinglong.task.get", {"taskId": "morning"})["task"]
    assert head["kind"] == "agent" and head["specSchema"] == "qinglong/agent@v1"
    assert head["contentDigest"] == created["contentDigest"]
    shown = d.cli("task", "get", "morning")
    assert "instruction: Every morning" in shown.stdout and "rounds 5" in shown.stdout
    added = d.cli("agent", "add", "nightly", "Summarize the failures of the night", "--wall-clock", "60")
    assert added.returncode == 0, added.stderr
    assert d.cli("trigger", "add", "nightly", "--cron", "0 8 * * *", "--tz", "UTC").returncode == 0
    assert d.call("qinglong.task.get", {"taskId": "nightly"})["task"]["kind"] == "agent"
    tools = {t["name"] for t in d.call("qledge.tools.list")["tools"]}
    assert {"qinglong.agent.history.list", "qinglong.agent.history.get", "qledge.agent.ask"} <= tools


def test_rounds_budget_at_its_edge(agent, provider):
    d = agent(budget_rounds=2)
    provider.add(tool_call("qinglong.run.list", {}), answer("done in two"))
    assert start_and_wait(d, ai_task(d, "fits")["id"])["status"] == "succeeded"
    provider.add(tool_call("qinglong.run.list", {}), tool_call("qinglong.run.list", {}), answer("never asked"))
    provider.requests.clear()
    run = start_and_wait(d, ai_task(d, "over")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "budget_exhausted")
    assert "rounds budget exhausted" in run["errorSummary"]
    assert len(provider.requests) == 2  # the third request was never sent
    evidence = record(d, run["id"])
    assert (evidence["state"], evidence["budget"], evidence["rounds"]) == ("budget_exhausted", "rounds", 2)
    assert log(d, run["id"]).startswith("qledge agent: budget_exhausted: rounds budget exhausted")


def test_input_token_budget_at_its_edge(agent, provider):
    d = agent()
    provider.add(answer("measured"))
    start_and_wait(d, ai_task(d, "probe")["id"])
    need = estimate_tokens(len(provider.requests[0].raw))  # the first request is the same for every task here
    provider.add(answer("fits exactly"))
    assert start_and_wait(d, ai_task(d, "exact", input_tokens=need)["id"])["status"] == "succeeded"
    sent = len(provider.requests)
    run = start_and_wait(d, ai_task(d, "short", input_tokens=need - 1)["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "budget_exhausted")
    assert len(provider.requests) == sent  # refused before sending
    assert record(d, run["id"])["budget"] == "input_tokens"


def test_output_token_budget_at_its_edge(agent, provider):
    d = agent(max_output_tokens=100)
    # Round 1 reports 20 output tokens; round 2 may be sent only if 20 + 100 fit.
    provider.add(tool_call("qinglong.run.list", {}, usage_=usage(50, 20)), answer("ok"))
    assert start_and_wait(d, ai_task(d, "exact", output_tokens=120)["id"])["status"] == "succeeded"
    assert len(provider.requests) == 2
    provider.add(tool_call("qinglong.run.list", {}, usage_=usage(50, 20)), answer("never sent"))
    run = start_and_wait(d, ai_task(d, "short", output_tokens=119)["id"])
    assert run["errorCode"] == "budget_exhausted" and len(provider.requests) == 3
    evidence = record(d, run["id"])
    assert (evidence["budget"], evidence["rounds"], evidence["outputTokens"]) == ("output_tokens", 1, 20)
    provider.script.clear()


def test_cost_budget_at_its_edge(agent, provider):
    # Input free, output $1,000 per million: 100 tokens of reply allowed cost $0.10, 20 used cost $0.02.
    d = agent(max_output_tokens=100, input_usd_per_mtok=0.0, output_usd_per_mtok=1000.0)
    provider.add(tool_call("qinglong.run.list", {}, usage_=usage(50, 20)), answer("ok", usage_=usage(60, 10)))
    run = start_and_wait(d, ai_task(d, "exact", cost_usd=0.12)["id"])
    assert run["status"] == "succeeded"
    assert record(d, run["id"])["costUsd"] == pytest.approx(0.03)
    provider.add(tool_call("qinglong.run.list", {}, usage_=usage(50, 20)), answer("never sent"))
    run = start_and_wait(d, ai_task(d, "short", cost_usd=0.1199)["id"])
    assert run["errorCode"] == "budget_exhausted" and len(provider.requests) == 3
    evidence = record(d, run["id"])
    assert evidence["budget"] == "cost_usd" and evidence["costUsd"] == pytest.approx(0.02)
    provider.script.clear()


@pytest.mark.emulated("a tight timing (the child stopped within 0.5 s of its budget)")
def test_wall_clock_budget_stops_the_child_before_the_runner_must(agent, provider):
    d = agent()
    provider.add(Step(answer("too late"), delay_s=30))
    started = time.monotonic()
    run = start_and_wait(d, ai_task(d, "slow", wall_clock_s=4)["id"])
    assert time.monotonic() - started < 4.5
    assert (run["status"], run["errorCode"]) == ("failed", "budget_exhausted")
    assert record(d, run["id"])["budget"] == "wall_clock"


def test_a_child_that_does_not_cooperate_is_killed_at_the_wall_clock(agent, provider):
    d = agent(extra="[runner]\nkill_grace_s = 1\n")
    provider.add(Step(answer("never"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "stuck", wall_clock_s=3)["id"]})
    until(lambda: provider.requests, what="the request")
    pid = _pid(d, run["id"])
    os.kill(pid, signal.SIGSTOP)  # it can no longer notice anything: only the runner's kill ends it
    final = wait(d, run["id"])
    assert (final["status"], final["errorCode"]) == ("timed_out", "timeout")
    assert not alive(pid)
    assert record(d, run["id"])["state"] == "timed_out"


def _pid(d, run_id: str) -> int:
    conn = d.db()  # no `with`: that would be one read transaction, one snapshot
    try:
        return until(lambda: conn.execute("SELECT pid FROM runs WHERE id = ?", (run_id,)).fetchone()[0],
                     what="the child's pid")
    finally:
        conn.close()


def test_provider_500_is_retried_then_fails(agent, provider):
    d = agent(retries=1)
    provider.add(Step({"error": {"message": "upstream overloaded"}}, status=500),
                 Step({"error": {"message": "upstream overloaded"}}, status=503))
    run = start_and_wait(d, ai_task(d, "flaky")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "provider_http")
    port = provider.server.server_address[1]
    assert run["errorSummary"] == f"HTTP 503 from 127.0.0.1:{port}: upstream overloaded (after 2 attempts)"
    assert len(provider.requests) == 2
    evidence = record(d, run["id"])
    assert (evidence["state"], evidence["errorCode"], evidence["rounds"]) == ("failed", "provider_http", 0)


def test_provider_4xx_is_not_retried(agent, provider):
    d = agent(retries=2)
    provider.add(Step({"error": {"message": "Incorrect API key provided"}}, status=401))
    run = start_and_wait(d, ai_task(d, "denied")["id"])
    assert run["errorCode"] == "provider_http" and "HTTP 401" in run["errorSummary"]
    assert len(provider.requests) == 1


def test_provider_timeout(agent, provider):
    d = agent(request_timeout_s=1, retries=0)
    provider.add(Step(answer("late"), delay_s=5))
    run = start_and_wait(d, ai_task(d, "slow")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "provider_timeout")


def test_malformed_json_is_retried_then_fails(agent, provider):
    d = agent(retries=1)
    provider.add(Step(b"<html>bad gateway</html>"), Step(b'{"choices": "nope"}'))
    run = start_and_wait(d, ai_task(d, "garbled")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "provider_malformed")
    assert len(provider.requests) == 2


def test_missing_usage_is_estimated_and_the_cost_unknown(agent, provider):
    d = agent(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    provider.add(answer("fine", usage_=False))
    run = start_and_wait(d, ai_task(d, "nousage")["id"])
    assert run["status"] == "succeeded"
    evidence = record(d, run["id"])
    assert evidence["usageEstimated"] is True and evidence["perRound"][0]["usageEstimated"] is True
    assert evidence["inputTokens"] == estimate_tokens(len(provider.requests[0].raw))
    assert evidence["costUsd"] is None


def test_missing_ids_object_arguments_and_reasoning_content(agent, provider):
    d = agent()
    provider.add(
        tool_call("qinglong.run.list", {"limit": 2}, call_id=None, as_object=True,
                  extra={"reasoning_content": "The owner wants failures; list runs first."}),
        answer("nothing failed"),
    )
    run = start_and_wait(d, ai_task(d, "quirks")["id"])
    assert run["status"] == "succeeded"
    second = provider.requests[1]
    assistant = second.body["messages"][2]
    # Passed back to DeepSeek (its thinking mode refuses a tool-call turn without it), never to
    # the others (OpenAI refuses the field).
    if provider.family.name == "deepseek":
        assert assistant["reasoning_content"] == "The owner wants failures; list runs first."
    else:
        assert "reasoning_content" not in assistant
    (call,) = assistant["tool_calls"]
    assert call["id"] == "call_1_0" and call["function"]["arguments"] == '{"limit":2}'
    (result,) = tool_messages(second)
    assert result["tool_call_id"] == "call_1_0"
    assert "runs" in unmarked(second, result["content"])  # the daemon really answered the call


def test_more_tool_calls_than_a_round_allows_are_refused(agent, provider):
    d = agent(tool_calls_per_round=2)
    provider.add(tool_call("", calls=[("qinglong.run.list", {}), ("qinglong.task.list", {}),
                                      ("qinglong.trigger.list", {}), ("qledge.task.delete", {"taskId": "x"})]),
                 answer("ok"))
    run = start_and_wait(d, ai_task(d, "greedy")["id"])
    assert run["status"] == "succeeded"
    results = [unmarked(provider.requests[1], m["content"]) for m in tool_messages(provider.requests[1])]
    assert "runs" in results[0] and "tasks" in results[1]
    assert results[2]["error"]["code"] == results[3]["error"]["code"] == "refused"
    assert record(d, run["id"])["toolSequence"] == [  # a name that was not offered is not kept as sent
        "qinglong.run.list", "qinglong.task.list", "qinglong.trigger.list", "unknown_tool"]


def test_a_write_tool_asked_for_by_the_model_is_never_called(agent, provider):
    d = agent()
    provider.add(tool_call("qledge.task.delete", {"taskId": "victim"}), answer("I could not"))
    d.cli("task", "add", "victim", "--", "true")
    run = start_and_wait(d, ai_task(d, "rogue")["id"])
    assert run["status"] == "succeeded"
    (result,) = tool_messages(provider.requests[1])
    assert unmarked(provider.requests[1], result["content"])["error"]["code"] == "unknown_tool"
    assert d.call("qledge.task.get", {"taskId": "victim"})["id"] == "victim"


def test_a_redirect_to_another_host_is_refused(agent, provider):
    d = agent(retries=2)
    provider.add(Step({"moved": True}, status=307, headers={"Location": "http://collector.example:8080/v1/x"}))
    run = start_and_wait(d, ai_task(d, "moved")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "provider_redirect")
    assert "collector.example:8080" in run["errorSummary"] and "not followed" in run["errorSummary"]
    assert len(provider.requests) == 1


def test_cancel_during_a_provider_call_stops_the_child(agent, provider):
    d = agent()
    provider.add(Step(answer("never"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "waiting")["id"]})
    until(lambda: provider.requests, what="the request")
    pid = _pid(d, run["id"])
    cancelled = d.cli("run", "cancel", run["id"])
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    assert not alive(pid)
    evidence = record(d, run["id"])
    assert evidence["state"] == "cancelled" and evidence["finishedAtMs"] is not None


def test_kill_9_of_the_child_is_recorded(agent, provider):
    d = agent()
    provider.add(tool_call("qinglong.run.list", {}), Step(answer("never"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "victim")["id"]})
    until(lambda: len(provider.requests) == 2, what="the second request")
    os.kill(_pid(d, run["id"]), signal.SIGKILL)
    final = wait(d, run["id"])
    assert (final["status"], final["errorCode"]) == ("failed", "killed_by_signal")
    evidence = record(d, run["id"])
    assert (evidence["state"], evidence["rounds"], evidence["errorCode"]) == ("failed", 1, "killed_by_signal")
    assert evidence["error"] == "killed by SIGKILL"


def test_kill_9_of_the_daemon_mid_task_leaves_it_lost_and_finalized(agent, provider, daemon_factory):
    d = agent()
    provider.add(tool_call("qinglong.run.list", {}), Step(answer("never"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "orphan")["id"]})
    until(lambda: len(provider.requests) == 2, what="the second request")
    child = _pid(d, run["id"])
    d.stop(signal.SIGKILL)
    assert alive(child)  # the child outlived its daemon
    again = daemon_factory(home=d.home, config=agent_config(provider)).start()
    final = again.call("qledge.run.get", {"runId": run["id"]})
    assert (final["status"], final["errorCode"]) == ("lost", "daemon_lost")
    until(lambda: not alive(child), what="the orphaned child to be stopped")
    # Seed 001: the record is written once, at the end; the rounds the dead daemon held in
    # memory died with it, and recovery writes the `lost` record from what it knows.
    evidence = record(again, run["id"])
    assert evidence["state"] == "lost" and evidence["rounds"] == 0 and evidence["finishedAtMs"] is not None
    assert evidence["toolSequence"] == [] and evidence["instruction"] == "Why did backup fail?"


def test_an_evidence_write_failure_is_swallowed_and_logged_once(agent, provider):
    d = agent()
    with d.db() as conn:
        for event in ("INSERT", "UPDATE"):
            conn.execute(f"CREATE TRIGGER break_evidence_{event.lower()} BEFORE {event} ON agent_evidence"
                         " BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
    provider.add(tool_call("qinglong.run.list", {}), answer("fine anyway"))
    run = start_and_wait(d, ai_task(d, "unrecorded")["id"])
    assert run["status"] == "succeeded" and log(d, run["id"]) == "fine anyway\n"
    assert not d.call("qinglong.agent.history.get", {"runId": run["id"]})["found"]
    assert d.stderr().count(f"AI run {run['id']}: its evidence record could not be written") == 1


def test_disabled_agent_ask_says_how_to_enable_it(daemon):
    asked = daemon.cli("ask", "why did backup fail?")
    assert asked.returncode == 2
    (line,) = asked.stderr.strip().splitlines()
    assert line.startswith("qledge: invalid_argument: the AI operator is off") and "[agent] enabled = true" in line
    assert daemon.cli("agent", "list").stderr.startswith("qledge: invalid_argument: the AI operator is off")
    # An AI task created anyway fails clearly when run.
    ai_task(daemon, "later")
    run = start_and_wait(daemon, "later")
    assert (run["status"], run["errorCode"]) == ("failed", "agent_disabled")


def test_an_unknown_profile_fails_the_run_with_evidence(agent, provider):
    d = agent(extra='[agent.profiles.local]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "llama3.2"\n')
    d.call("qledge.task.create", {"taskId": "typo", "spec": {"command": {
        "kind": "agent", "instruction": "hi", "profile": "lcoal"}}})
    run = start_and_wait(d, "typo")
    assert (run["status"], run["errorCode"]) == ("failed", "agent_config")
    assert "profile 'lcoal' is not configured" in run["errorSummary"]
    assert record(d, run["id"])["state"] == "failed"


def test_the_key_file_is_read_by_the_child_and_sent_only_to_the_provider(provider, daemon_factory, home):
    key = os.path.join(home, "provider.key")
    with open(key, "w") as f:
        f.write("sk-proj-0123456789abcdef\n")
    os.chmod(key, 0o600)
    d = daemon_factory(config=agent_config(provider, api_key_file=key)).start()
    provider.add(answer("ok"))
    run = start_and_wait(d, ai_task(d, "keyed")["id"])
    assert run["status"] == "succeeded"
    assert provider.requests[0].headers["authorization"] == "Bearer sk-proj-0123456789abcdef"
    assert "sk-proj" not in log(d, run["id"]) + json.dumps(record(d, run["id"])) + d.stderr()
    os.chmod(key, 0o644)  # loosened after start: the child refuses it
    run = start_and_wait(d, ai_task(d, "loose")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "agent_config")
    assert run["errorSummary"] == f"api_key_file {key} has mode 0644; it must be 0600"
    assert len(provider.requests) == 1


def test_long_results_are_cut_and_the_oldest_trimmed_to_fit_the_context(agent, provider):
    d = agent(context_window_tokens=18_000, max_output_tokens=1000)
    for i in range(64):
        d.call("qledge.task.create", {"taskId": f"t{i:02d}", "name": "a task name with many words " * 4,
                                      "spec": {"command": {"kind": "argv", "file": "true"}}})
    provider.add(tool_call("qinglong.task.list", {"limit": 64}), tool_call("qinglong.task.list", {"limit": 64}),
                 answer("64 tasks"))
    run = start_and_wait(d, ai_task(d, "wide")["id"])
    assert run["status"] == "succeeded", run
    second, third = provider.requests[1:]
    (cut,) = tool_messages(second)
    assert len(cut["content"].encode()) <= 16 * 1024
    assert "[qledge: this tool result was cut to" in cut["content"]
    # The third request would not fit 18,000 tokens with both results: the oldest is replaced by a stub.
    first_result, second_result = tool_messages(third)
    assert "removed to fit the context window" in first_result["content"]
    assert second_result["content"] == cut["content"].replace(marker(second), marker(third))
    assert estimate_tokens(len(third.raw)) + 1000 <= 18_000


def test_mcp_offers_the_history_tools(provider, daemon_factory):
    from mcp_support import LineClient, request

    d = daemon_factory(config=agent_config(provider, "[mcp]\nenabled = true\n")).start()
    c = LineClient(os.path.join(d.home, "mcp.sock"))
    c.send({"qledge": {"token": None}})
    assert c.recv() == {"qledge": {"ok": True}}
    from mcp_support import INITIALIZE

    c.ask(INITIALIZE)
    names = {t["name"] for t in c.ask(request(2, "tools/list"))["result"]["tools"]}
    assert names == READ_TOOLS
    c.close()


def test_a_build_without_the_agent_refuses_to_start_with_one_line(home, provider):
    import subprocess
    import sys

    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write(agent_config(provider))
    code = "import sys; sys.modules['edge.airun'] = None; from edge.cli.main import main; raise SystemExit(main())"
    result = subprocess.run([sys.executable, "-c", code, "serve", "--config", config],
                            env={**os.environ, "QLEDGE_HOME": home}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "qledge: invalid_argument: the AI operator is not included in this build\n"


def test_the_daemon_loads_nothing_of_the_child_even_after_ai_runs(agent, provider):
    d = agent(read_logs=False)
    provider.add(tool_call("qinglong.run.list", {}), answer("备份失败：磁盘已满。"))
    run = start_and_wait(d, ai_task(d, "cjk")["id"])
    assert run["status"] == "succeeded" and log(d, run["id"]) == "备份失败：磁盘已满。\n"
    offered = {t["function"]["name"] for t in provider.requests[0].body["tools"]}
    assert offered == {wire(n) for n in READ_TOOLS - {"qinglong.run.log.excerpt"} | SPECIALIST_TOOLS}  # read_logs off
    modules = d.call("qledge.status", {"includeModules": True})["modules"]
    assert "edge.operator.runs" in modules and "edge.storage.sqlite.evidence" in modules
    for absent in ("edge.airun", "ssl", "_ssl", "http"):  # (urllib: the editable install loads it)
        assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent
    assert re.search(rf"^agent: +{re.escape(provider.model)} at http", d.cli("status").stdout, re.M)


def test_the_default_daemon_loads_nothing_of_the_operator(daemon):
    modules = daemon.call("qledge.status", {"includeModules": True})["modules"]
    for absent in ("edge.airun", "edge.operator", "edge.core.agent", "edge.tools.agent",
                   "edge.storage.sqlite.evidence", "edge.app.operator", "ssl", "http"):
        assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent


def test_each_question_is_a_revision_of_the_ask_task_and_keeps_its_run(agent, provider):
    d = agent()
    provider.add(answer("first answer"), answer("second answer"))
    runs = []
    for question in ("first question?", "second question?"):
        asked = d.cli("ask", question, "--json")
        assert asked.returncode == 0, asked.stderr
        runs.append(json.loads(asked.stdout))
    finished = [wait(d, r["id"]) for r in runs]
    assert [r["taskRevision"] for r in finished] == [1, 2] and all(r["status"] == "succeeded" for r in finished)
    assert [record(d, r["id"])["instruction"] for r in finished] == ["first question?", "second question?"]
    assert d.call("qledge.task.get", {"taskId": "ask"})["spec"]["overlap"] == "allow"


def test_ask_will_not_take_over_a_command_task_named_ask(agent):
    d = agent()
    d.cli("task", "add", "ask", "--", "true")
    asked = d.cli("ask", "hello?")
    assert asked.returncode == 1
    assert asked.stderr.strip() == ("qledge: conflict: task 'ask' exists and is not an AI task;"
                                    " `qledge ask` needs that name")


def test_the_evidence_keeps_the_limits_each_run_had(agent, provider):
    d = agent(budget_rounds=4)
    provider.add(tool_call("qinglong.run.list", {}), answer("done"))
    run = start_and_wait(d, ai_task(d, "lowered", rounds=2)["id"])
    assert run["status"] == "succeeded"
    limits = record(d, run["id"])["limits"]
    assert set(limits) == {"rounds", "inputTokens", "outputTokens", "costUsd", "wallClockS", "toolCallsPerRound"}
    assert limits["rounds"] == 2  # the configured 4, lowered by the task's own budget
    assert all(isinstance(v, (int, float)) and v > 0 for v in limits.values())
    with d.db() as conn:  # written once, with the record; a record kept before limits were reads as not known
        conn.execute("UPDATE agent_evidence SET limits = NULL WHERE run_id = ?", (run["id"],))
    assert record(d, run["id"])["limits"] is None
