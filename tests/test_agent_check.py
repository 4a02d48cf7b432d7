"""`qledge agent check` against each failure class (real daemons, real children, the families'
conformance fakes: one test each, llama.cpp without --jinja among them), the context a server
serves (llama.cpp's n_ctx and vLLM's max_model_len refused in their words, Ollama's num_ctx cut
silently), and, end to end, what the rest of the operator owes a new user: a provider that
drips its reply is cut at the request's deadline with the run's one log line, a secret typed
into a question is stored nowhere, one evidence write per run, and runs named as every run
command names them (these last three against each provider family's fake). A refusal a test
did not ask for fails it, naming the family."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from agent_support import (
    agent_config,
    ai_task,
    log,
    no_refusals,
    record,
    start_and_wait,
    tool_messages,
    until,
    wait,
)
from conformance import tokens
from edge.storage.sqlite.evidence import MAX_RECORDS
from fake_provider import FAMILIES, FakeProvider, Step, answer, self_signed, tool_call

pytestmark = pytest.mark.e2e


@pytest.fixture
def servers():
    made: list[FakeProvider] = []

    def make(**kw) -> FakeProvider:
        made.append(FakeProvider(**kw))
        return made[-1]

    yield make
    for server in made:
        server.close()
    for server in made:  # a test that expects a refusal clears it
        no_refusals(server)


def check(d, *args: str):
    result = d.cli("agent", "check", "--json", *args)
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else None), result


def failed(d, server: FakeProvider | None, failure: str, fix: str):
    code, out, result = check(d)
    assert code == 1, result.stderr
    assert out["passed"] is False and out["failure"] == failure, out
    assert out["hint"] is not None and fix in out["hint"], out
    assert out["recorded"] is True and record(d, out["runId"])["state"] == "failed"
    if server is not None:
        assert len(server.requests) == 1  # one request, never retried
    return out


def test_a_check_that_passes_spends_one_request_and_is_recorded(servers, daemon_factory):
    server = servers(family="openai")
    server.add(tool_call("qledge_check", {}, raw_names=True, content=None))
    d = daemon_factory(config=agent_config(server)).start()
    shown = d.cli("agent", "check")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    port = server.server.server_address[1]
    assert lines[0] == (f'ok  configuration: OpenAI (provider = "openai") at 127.0.0.1:{port},'
                        " model gpt-5-mini, replies bounded by max_completion_tokens")
    assert any(line.startswith("ok  tool calling: the model called qledge_check") for line in lines)
    assert "passed" in lines and lines[-1].startswith("recorded: qledge agent get ")
    assert len(server.requests) == 1 and not server.refused
    sent = server.requests[0].body
    assert [t["function"]["name"] for t in sent["tools"]] == ["qledge_check"] and sent["tool_choice"] == "auto"
    run_id = lines[-1].split()[-1]
    evidence = record(d, run_id)
    assert (evidence["state"], evidence["rounds"], evidence["taskId"]) == ("succeeded", 1, "ask")
    assert evidence["instruction"].startswith("qledge agent check")


def test_check_unreachable(daemon_factory):
    d = daemon_factory(config=agent_config(None, provider="generic")).start()  # 127.0.0.1:9: nothing listens
    out = failed(d, None, "unreachable", "check base_url's host and port")
    assert out["errorCode"] == "provider_unreachable"


def test_check_tls(servers, daemon_factory, home):
    cert, key = self_signed(home)
    server = servers(tls=(cert, key))
    d = daemon_factory(config=agent_config(server)).start()  # no ca_file: the system's store does not know it
    failed(d, None, "tls", "ca_file")  # refused at the handshake: no request reached the server


def test_check_key(servers, daemon_factory):
    server = servers(family="openai")
    server.add(Step({"error": {"message": "Incorrect API key provided: sk-proj-****abcd.", "type":
                               "invalid_request_error", "code": "invalid_api_key"}}, status=401))
    d = daemon_factory(config=agent_config(server)).start()
    out = failed(d, server, "key", "api_key_file")
    assert "Incorrect API key provided" in out["steps"][-1]["text"]


def test_check_model_or_path(servers, daemon_factory):
    server = servers(family="openai")
    server.add(Step({"error": {"message": "The model `gpt-9` does not exist or you do not have access to it.",
                               "type": "invalid_request_error", "code": "model_not_found"}}, status=404))
    d = daemon_factory(config=agent_config(server)).start()
    out = failed(d, server, "not_found", "check model")
    assert "The model `gpt-9` does not exist" in out["steps"][-1]["text"]


def test_check_bad_request_in_the_providers_words(servers, daemon_factory):
    server = servers(family="vllm", auto_tool_choice=False)  # vLLM started without its tool-calling flags
    d = daemon_factory(config=agent_config(server)).start()
    out = failed(d, server, "bad_request", "--enable-auto-tool-choice")
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set' in \
        out["steps"][-1]["text"]
    server.refused.clear()


def test_check_no_tool_call_support(servers, daemon_factory):
    server = servers(family="ollama")
    server.add(answer("I cannot call tools, but hello!"))
    d = daemon_factory(config=agent_config(server)).start()
    out = failed(d, server, "no_tool_calls", "choose a model that can call tools")
    assert out["errorCode"] == "no_tool_calls"


def test_check_a_model_without_tools_refused_by_the_server(servers, daemon_factory):
    server = servers(family="ollama", tools=False)
    d = daemon_factory(config=agent_config(server, model="gemma:2b")).start()
    out = failed(d, server, "bad_request", "choose one that can")
    assert "does not support tools" in out["steps"][-1]["text"]
    server.refused.clear()


def test_check_reasoning_model_parameters(servers, daemon_factory):
    server = servers(family="openai")
    d = daemon_factory(config=agent_config(server, provider="generic")).start()  # generic sends max_tokens
    out = failed(d, server, "reasoning_params", 'set max_tokens_param to "max_completion_tokens"')
    assert "Use 'max_completion_tokens' instead." in out["steps"][-1]["text"]
    server.refused.clear()


def test_check_llamacpp_started_without_jinja(servers, daemon_factory):
    server = servers(family="llamacpp", jinja=False)  # llama-server without --jinja: no tool calling
    d = daemon_factory(config=agent_config(server)).start()
    out = failed(d, server, "server_error", "start llama-server with --jinja")
    assert out["errorCode"] == "provider_http"
    assert out["steps"][-1]["text"].endswith("tools param requires --jinja flag")
    assert server.refused == ["llamacpp: tools without --jinja"]
    server.refused.clear()


def test_check_says_why_nothing_was_checked(daemon, daemon_factory, home):
    off = daemon.cli("agent", "check")
    assert off.returncode == 2 and off.stderr.startswith("qledge: invalid_argument: the AI operator is off")
    gone = daemon_factory(config=agent_config(None, provider="generic"))  # configured, never started
    unreachable = gone.cli("agent", "check")
    assert unreachable.returncode == 3 and unreachable.stderr.startswith("qledge: unavailable: ")


# -- the context the server serves ------------------------------------------------------------

CONTEXT_FIX = ("qledge agent: to fix: lower [agent] context_window_tokens (and max_output_tokens) to what the server"
               " serves, or serve the model with a larger context")


def _asked_and_failed(d) -> tuple[str, list[str]]:
    asked = d.cli("ask", "why", "did", "backup", "fail?", "--wait")
    assert asked.returncode == 1, asked.stderr
    run_id = re.search(r"run (\S+) queued", asked.stderr).group(1)
    run = d.call("qledge.run.get", {"runId": run_id})
    assert (run["status"], run["errorCode"]) == ("failed", "provider_http"), run
    return run_id, log(d, run_id).splitlines()


def test_a_prompt_beyond_llamacpps_context_fails_the_run_in_its_words(servers, daemon_factory):
    server = servers(family="llamacpp", n_ctx=1000)  # the slot's context, far below the first request
    d = daemon_factory(config=agent_config(server)).start()
    run_id, (said, fix) = _asked_and_failed(d)
    assert len(server.requests) == 1  # a 400: never retried
    prompt = tokens(server.requests[0].raw)
    assert re.fullmatch(rf"qledge agent: provider_http: HTTP 400 from 127\.0\.0\.1:\d+: request \({prompt} tokens\)"
                        r" exceeds the available context size \(1000 tokens\), try increasing it", said), said
    assert fix == CONTEXT_FIX
    assert "(to fix: lower [agent] context_window_tokens" in record(d, run_id)["error"]
    assert server.refused and server.refused[0].startswith("llamacpp: request (")
    server.refused.clear()


def test_a_prompt_beyond_vllms_max_model_len_fails_the_run_in_its_words(servers, daemon_factory):
    server = servers(family="vllm", max_model_len=2048)
    d = daemon_factory(config=agent_config(server)).start()
    run_id, (said, fix) = _asked_and_failed(d)
    assert len(server.requests) == 1
    prompt = tokens(server.requests[0].raw)
    assert re.fullmatch(rf"qledge agent: provider_http: HTTP 400 from 127\.0\.0\.1:\d+: This model's maximum context"
                        rf" length is 2048 tokens\. However, you requested {prompt + 4096} tokens \({prompt} in the"
                        r" messages, 4096 in the completion\)\. Please reduce the length of the messages or"
                        r" completion\.", said), said
    assert fix == CONTEXT_FIX
    assert "(to fix: lower [agent] context_window_tokens" in record(d, run_id)["error"]
    server.refused.clear()


def _noisy_run(d) -> str:
    """A finished run whose log is far longer than a tool result may be (16 KiB)."""
    added = d.cli("task", "add", "noisy", "--shell", "--",
                  "yes 'rsync: write failed: No space left on device (28)' | head -n 2000")
    assert added.returncode == 0, added.stderr
    run = d.call("qledge.run.start", {"taskId": "noisy"})
    assert wait(d, run["id"])["status"] == "succeeded"
    return run["id"]


def test_ollama_cuts_a_prompt_beyond_num_ctx_silently_and_context_window_tokens_keeps_within_it(
        servers, daemon_factory):
    """Ollama's /v1 has no field for the context and cuts a longer prompt to num_ctx without a
    word: the run goes on as if nothing happened (the fake records the cut). With
    context_window_tokens set to what the model is served with, qledge never sends more: it
    drops the oldest results, and says so to the model."""
    num_ctx = 12288

    def script(server: FakeProvider, run_id: str) -> None:
        server.add(tool_call("", calls=[("qinglong.run.log.excerpt", {"runId": run_id})] * 6),
                   answer("backup failed: the disk is full"))

    cut = servers(family="ollama", num_ctx=num_ctx)
    d = daemon_factory(config=agent_config(cut)).start()  # context_window_tokens left at 65536
    script(cut, _noisy_run(d))
    asked = d.cli("ask", "why", "did", "backup", "fail?", "--wait")
    assert asked.returncode == 0 and asked.stdout == "backup failed: the disk is full\n", asked.stderr
    first, second = (tokens(r.raw) for r in cut.requests)  # as the fake's tokenizer counts
    assert first <= num_ctx < second  # the second request, with the six results, is beyond what Ollama serves
    assert cut.truncated == [second] and not cut.refused  # cut without an error: the owner is told nothing

    kept = servers(family="ollama", num_ctx=num_ctx)
    d = daemon_factory(config=agent_config(kept, context_window_tokens=num_ctx, max_output_tokens=1024)).start()
    script(kept, _noisy_run(d))
    asked = d.cli("ask", "why", "did", "backup", "fail?", "--wait")
    assert asked.returncode == 0 and asked.stdout == "backup failed: the disk is full\n", asked.stderr
    assert len(kept.requests) == 2 and kept.truncated == [] and not kept.refused
    trimmed = [m["content"] for m in tool_messages(kept.requests[1])]
    assert any("removed to fit the context window" in content for content in trimmed), trimmed
    assert all(len(r.raw) // 2 + 1024 <= num_ctx for r in kept.requests)  # qledge's own estimate fits, too


# -- deadlines, masking, writes, names --------------------------------------------------------


def test_a_provider_dripping_its_reply_is_cut_at_the_deadline_with_one_log_line(servers, daemon_factory):
    # One family: the subject is the deadline of the HTTP exchange, which no family's rules
    # touch (the reply never arrives whole).
    server = servers(family="openai")
    server.add(Step(answer("late " * 40), drip_s=0.25))
    d = daemon_factory(config=agent_config(server, request_timeout_s=2, retries=0)).start()
    started = time.monotonic()
    run = start_and_wait(d, ai_task(d, "drip", wall_clock_s=60)["id"])
    assert time.monotonic() - started < 20
    assert (run["status"], run["errorCode"]) == ("failed", "provider_timeout")
    (line,) = log(d, run["id"]).splitlines()
    assert re.fullmatch(r"qledge agent: provider_timeout: 127\.0\.0\.1:\d+ did not answer within 2s \(the whole"
                        r" request: connect, send, headers and body\)", line), line
    assert record(d, run["id"])["errorCode"] == "provider_timeout"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_secret_typed_into_a_question_is_stored_nowhere(servers, daemon_factory, family):
    server = servers(family=family)
    server.add(answer("I would not repeat it."))
    d = daemon_factory(config=agent_config(server)).start()
    assert d.cli("secret", "set", "router_pw", input="Tr0ub4dor-and-3\n").returncode == 0
    asked = d.cli("ask", "my router password is Tr0ub4dor-and-3, why did backup fail?", "--wait")
    assert asked.returncode == 0, asked.stderr
    run_id = re.search(r"run (\S+) queued", asked.stderr).group(1)
    task = d.call("qledge.task.get", {"taskId": "ask"})
    stored = json.dumps(task) + json.dumps(record(d, run_id)) + log(d, run_id)
    assert "Tr0ub4dor-and-3" not in stored and "Tr0ub4dor-and-3" not in json.dumps(server.requests[0].body)
    assert "[REDACTED]" in task["spec"]["command"]["instruction"]
    with d.db() as conn:
        assert conn.execute("SELECT count(*) FROM task_revisions WHERE spec LIKE '%Tr0ub4dor%'").fetchone()[0] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_an_ai_run_writes_its_record_once(servers, daemon_factory, family):
    """Seed 001: nothing at the start, nothing per round; one insert at the terminal state."""
    server = servers(family=family)
    d = daemon_factory(config=agent_config(server)).start()
    with d.db() as conn:
        conn.execute("CREATE TABLE evidence_writes (op TEXT, state TEXT)")
        conn.execute("CREATE TRIGGER count_ins AFTER INSERT ON agent_evidence BEGIN"
                     " INSERT INTO evidence_writes VALUES ('insert', new.state); END")
        conn.execute("CREATE TRIGGER count_upd AFTER UPDATE ON agent_evidence BEGIN"
                     " INSERT INTO evidence_writes VALUES ('update', new.state); END")
    server.add(tool_call("qinglong.run.list", {}), tool_call("qinglong.task.list", {}, call_id="call_2"),
               Step(answer("nothing failed"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "once")["id"]})
    until(lambda: len(server.requests) == 3, what="the third round")
    with d.db() as conn:  # two rounds reported, the third on its way: nothing written
        assert conn.execute("SELECT count(*) FROM evidence_writes").fetchone()[0] == 0
    server.release.set()
    final = wait(d, run["id"])
    assert final["status"] == "succeeded"
    with d.db() as conn:
        assert conn.execute("SELECT op, state FROM evidence_writes").fetchall() == [("insert", "succeeded")]
    assert record(d, run["id"])["rounds"] == 3 and MAX_RECORDS == 500


@pytest.mark.parametrize("family", FAMILIES)
def test_agent_get_mission_and_retry_take_every_name_of_a_run(servers, daemon_factory, family):
    server = servers(family=family)
    server.add(Step({"error": {"message": "upstream overloaded"}}, status=500), answer("second time lucky"))
    d = daemon_factory(config=agent_config(server, retries=0)).start()
    asked = d.cli("ask", "did anything fail?", "--wait")
    assert asked.returncode == 1
    run_id = re.search(r"run (\S+) queued", asked.stderr).group(1)
    for name in ("ask:latest", "ask:latest-failed", run_id[:13]):
        got = d.cli("agent", "get", name, "--json")
        assert got.returncode == 0, (name, got.stderr)
        assert json.loads(got.stdout)["runId"] == run_id
        mission = d.cli("agent", "mission", name, "--json")
        assert mission.returncode == 0, (name, mission.stderr)
        assert json.loads(mission.stdout)["missionId"] == run_id
    retried = d.cli("agent", "retry", "ask:latest-failed", "--wait")
    assert retried.returncode == 0 and retried.stdout == "second time lucky\n", retried.stderr
    wrong = d.cli("agent", "get", "nosuchtask:latest")
    assert wrong.returncode == 1 and "task 'nosuchtask' not found" in wrong.stderr
    short = d.cli("agent", "mission", run_id[:4])
    assert short.returncode == 2 and "too short" in short.stderr


def test_a_tool_name_clash_stops_the_daemon_at_start(home, daemon_factory):
    """Two offered tools that would share one wire name: the start fails with one line."""
    import subprocess
    import sys

    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write(agent_config(None, provider="generic") + "[agent.specialists.log-analyst]\nenabled = true\n")
    code = (
        "import sys\n"
        "import edge.operator.offer as a\n"
        "real = a.Offer.__init__\n"
        "def offer(self, infos, *rest):\n"
        "    import msgspec\n"
        "    infos = list(infos)\n"
        "    twin = [i for i in infos if i.name == 'qinglong.run.list'][0]\n"
        "    real(self, [*infos, msgspec.structs.replace(twin, name='qinglong_run.list')], *rest)\n"
        "a.Offer.__init__ = offer\n"
        "from edge.cli.main import main\n"
        "raise SystemExit(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", code, "serve", "--config", config],
                            env={**os.environ, "QLEDGE_HOME": home}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("qledge: invalid_argument: [agent] the tools 'qinglong.run.list' and"
                                     " 'qinglong_run.list' would both be offered to the model as"
                                     " 'qinglong_run_list': rename one")
