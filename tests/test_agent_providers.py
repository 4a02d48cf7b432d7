"""What differs between providers, on the child's parts and real loopback servers: tool names
on the wire (reversible, unique, a clash refused), the profile table and what base_url's host
names, each profile's request shape against its family's conformance fake, provider errors in
their own words with what to change, the total deadline of a request against a server that
drips its reply, and token estimates that never trust themselves over the provider."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from edge.airun.budget import Budget, estimate_tokens
from edge.airun.operator import Operator
from edge.airun.prompt import Conversation, ToolResult
from edge.airun.provider import ChatClient, ProviderError, error_text, hint, parse
from edge.core.agent import (
    PARENT_TOOLS,
    PROFILES,
    AgentJob,
    Limits,
    OfferedTool,
    OutcomeReport,
    ProviderSettings,
    RoundMeta,
    detect_provider,
    wire_name,
    wire_names,
)
from fake_provider import FAMILIES, MODELS, FakeProvider, Step, answer, tool_call, usage

LIMITS = Limits(rounds=8, input_tokens=10_000, output_tokens=5_000, cost_usd=1.0, wall_clock_s=60,
                tool_calls_per_round=8)
READS = ["qinglong.task.list", "qinglong.run.list", "qinglong.task.runs.compare", "qinglong.agent.history.get",
         *PARENT_TOOLS]


# -- names on the wire -----------------------------------------------------------------


def test_every_name_maps_to_one_every_provider_accepts_and_back():
    wire = wire_names(READS)
    assert wire["qinglong.task.runs.compare"] == "qinglong_task_runs_compare"
    assert wire["specialist.delegate"] == "specialist_delegate"
    assert all(msgspec.json.decode(b'"x"') and len(w) <= 64 and w[0].isalpha() for w in wire.values())
    assert {w: n for n, w in wire.items()}.keys() == set(wire.values())  # reversible: one name each
    assert wire_name("9lives.x") == "t9lives_x" and len(wire_name("a." * 80)) == 64
    assert wire_name("qinglong.run.log.excerpt") == "qinglong_run_log_excerpt"


def test_two_tools_that_would_share_a_wire_name_are_refused():
    with pytest.raises(ValueError, match="'qinglong.run.list' and 'qinglong_run.list' would both be offered"):
        wire_names(["qinglong.run.list", "qinglong_run.list"])
    with pytest.raises(ValueError, match="would both be offered"):
        wire_names(["a" * 70 + ".x", "a" * 70 + ".y"])  # cut to 64, they are one


def test_a_clash_among_the_daemons_tools_is_a_start_up_error():
    from edge.operator.offer import Offer
    from edge.tools.definition import tool

    class Args(msgspec.Struct):
        pass

    async def handler(ctx, args):  # never called
        raise AssertionError

    tools = [tool(name, handler, Args, Args, effect="read", risk="low", permission="run.read", title=name, ai=True)
             for name in ("qinglong.run.list", "qinglong_run.list")]
    with pytest.raises(ValueError, match="would both be offered to the model as 'qinglong_run_list'"):
        Offer([t.info() for t in tools], read_logs=True, specialists=[], tools=lambda: tools)


def test_a_returned_name_maps_back_or_stays_unknown():
    job = _job()
    op = Operator(job, None, _Tools(), _Reporter(), Budget(job.limits, job.provider))  # type: ignore[arg-type]
    reply = op._resolved(parse(json.dumps(tool_call("", calls=[
        ("qinglong.run.list", {}), ("multi_tool_use.parallel", {}), ("qinglong.task.list", {})])).encode(), 1))
    reply.tool_calls[2].name = "qinglong.task.list"  # a model that names the tool itself is understood too
    op._resolved(reply)
    assert [(c.tool, c.wire) for c in reply.tool_calls] == [
        ("qinglong.run.list", "qinglong_run_list"), (None, "multi_tool_use_parallel"),
        ("qinglong.task.list", "qinglong_task_list")]


# -- the profile table ---------------------------------------------------------------------


@pytest.mark.parametrize(("url", "name"), [
    ("https://api.openai.com/v1", "openai"), ("https://api.deepseek.com/v1", "deepseek"),
    ("https://api.deepseek.com", "deepseek"), ("https://dashscope.aliyuncs.com/compatible-mode/v1", "qwen"),
    ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "qwen"),
    ("https://generativelanguage.googleapis.com/v1beta/openai", "gemini"), ("http://192.168.1.10:11434/v1", "ollama"),
    ("http://127.0.0.1:8080/v1", "generic"), ("http://gpu-box:8000/v1", "generic"),
    ("https://evil-api.openai.com.example/v1", "generic"),
])
def test_base_urls_host_names_the_profile_where_it_is_unambiguous(url, name):
    assert detect_provider(url) == name


def test_the_configuration_resolves_the_profile_and_the_reply_parameter(tmp_path):
    from edge.app.operator import _overlay, _resolved
    from edge.app.config import AgentProfile

    base = ProviderSettings(base_url="https://api.openai.com/v1", model="gpt-5-mini")
    openai = _resolved(base, None, None)
    assert (openai.provider, openai.max_tokens_param) == ("openai", "max_completion_tokens")
    assert _resolved(base, None, "max_tokens").max_tokens_param == "max_tokens"  # the owner's word wins
    local = _overlay(openai, AgentProfile(base_url="http://10.0.0.2:11434/v1", model="qwen2.5:7b"), None)
    assert (local.provider, local.max_tokens_param) == ("ollama", "max_tokens")  # another host: detected anew
    same = _overlay(openai, AgentProfile(model="gpt-4o-mini"), None)
    assert same.provider == "openai"


def _job(provider: str = "generic", url: str = "http://127.0.0.1:9/v1", model: str = "m", **kw) -> AgentJob:
    settings = ProviderSettings(base_url=url, model=model, provider=provider,
                                max_tokens_param=PROFILES[provider].max_tokens_param, max_output_tokens=100, **kw)
    tools = [OfferedTool(name=n, description=n, parameters=msgspec.Raw(b'{"type":"object","properties":{}}'))
             for n in READS if n not in PARENT_TOOLS]
    return AgentJob(run_id="r", task_id="t", token="x", instruction="why?", provider=settings, limits=LIMITS,
                    tools=tools)


class _Tools:
    def offered(self):
        return _job().tools

    def call(self, name, arguments):
        return {"tool": name, "rows": ["a b"]}


class _Reporter:
    def __init__(self) -> None:
        self.rounds: list[RoundMeta] = []
        self.outcomes: list[OutcomeReport] = []

    def round(self, meta):
        self.rounds.append(meta)

    def outcome(self, report):
        self.outcomes.append(report)


@pytest.mark.parametrize(("family", "model"), [*((f, MODELS[f]) for f in FAMILIES), ("deepseek", "deepseek-chat")])
def test_each_profile_sends_what_its_family_accepts_through_a_whole_run(family, model):
    """The operator's loop, in process, against the family's fake: tool calls, results, the
    reasoning a thinking model sends (deepseek-reasoner's; deepseek-chat sends none), the
    answer; every request accepted."""
    server = FakeProvider(family=family, model=model)
    try:
        server.add(tool_call("", calls=[("qinglong.run.list", {}), ("qinglong.task.list", {})],
                             extra={"reasoning_content": "I list the runs."}),
                   tool_call("qinglong.task.runs.compare", {"taskId": "backup"}, call_id="call_2", content=None),
                   answer("backup failed: disk full"))
        job = _job(family, server.url, model)
        reporter = _Reporter()
        client = ChatClient(job.provider, None)
        op = Operator(job, client, _Tools(), reporter, Budget(job.limits, job.provider))
        assert op.answer() == "backup failed: disk full"
        client.close()
        assert not server.refused, server.refused
        assert [r.tools for r in reporter.rounds] if reporter.rounds else True
        sent = [r.body for r in server.requests]
        assert all(b[PROFILES[family].max_tokens_param] == 100 for b in sent)
        assert ("enable_thinking" in sent[0]) == (family == "qwen")
        second = sent[1]["messages"][2]
        assert ("reasoning_content" in second) == (model == "deepseek-reasoner")
        assert sent[2]["messages"][5]["content"] is None  # content null beside tool calls only
    finally:
        server.close()


@pytest.mark.parametrize("family", ["openai", "deepseek", "gemini", "qwen"])
def test_a_request_a_family_refuses_is_refused_by_its_fake(family):
    """The fakes are strict: the shapes another profile (or an older qledge) sent are refused
    with the family's own status and words."""
    server = FakeProvider(family=family)
    model = MODELS[family]
    bad = {
        "openai": {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
        "deepseek": {"model": model, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{}"}]},
        "gemini": {"model": model, "messages": [{"role": "user", "content": "hi"}], "enable_thinking": False},
        "qwen": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }[family]
    try:
        with pytest.raises(ProviderError) as err:
            ChatClient(ProviderSettings(base_url=server.url, model=model), None).send(json.dumps(bad).encode(), 5)
        assert err.value.status == 400 and server.refused
        expected = {"openai": "max_completion_tokens", "deepseek": "reasoning_content", "gemini": "enable_thinking",
                    "qwen": "enable_thinking"}[family]
        assert expected in err.value.message
    finally:
        server.close()


def _turns(*, earlier_reasoning: bool, plain_reasoning: bool) -> list[dict]:
    """Two user turns: the first called a tool (its reasoning passed back or not) and answered
    (its reasoning kept or not); the second is the current one."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}
    if earlier_reasoning:
        call["reasoning_content"] = "I look first."
    plain = {"role": "assistant", "content": "done"}
    if plain_reasoning:
        plain["reasoning_content"] = "That answers it."
    return [{"role": "user", "content": "hi"}, call, {"role": "tool", "tool_call_id": "c1", "content": "{}"}, plain,
            {"role": "user", "content": "and now?"}]


@pytest.mark.parametrize(("model", "extra", "earlier_reasoning", "plain_reasoning", "refused"), [
    # thinking mode: a tool-calling turn's reasoning is passed back in every later turn, too
    ("deepseek-reasoner", {}, False, False, True),
    ("deepseek-reasoner", {}, True, False, False),
    ("deepseek-reasoner", {}, True, True, False),  # a turn without tool calls: its reasoning is ignored
    # deepseek-chat does not think: nothing to pass back, unless the request turns thinking on
    ("deepseek-chat", {}, False, False, False),
    ("deepseek-chat", {"thinking": {"type": "enabled"}}, False, False, True),
    ("deepseek-reasoner", {"thinking": {"type": "disabled"}}, False, False, False),
])
def test_the_deepseek_fake_applies_the_thinking_mode_guide(model, extra, earlier_reasoning, plain_reasoning,
                                                            refused):
    server = FakeProvider(family="deepseek", model=model)
    body = {"model": model, "messages": _turns(earlier_reasoning=earlier_reasoning, plain_reasoning=plain_reasoning),
            **extra}
    try:
        client = ChatClient(ProviderSettings(base_url=server.url, model=model), None)
        if refused:
            with pytest.raises(ProviderError) as err:
                client.send(json.dumps(body).encode(), 5)
            assert err.value.status == 400 and server.refused
            assert "Missing `reasoning_content` field in the assistant message at message index 1." in \
                err.value.message
        else:
            server.add(answer("fine"))
            reply = parse(client.send(json.dumps(body).encode(), 5), 1)
            assert (reply.reasoning is not None) == (model == "deepseek-reasoner" and not extra) and not server.refused
    finally:
        server.close()


def test_dotted_names_are_refused_by_the_openai_fake():
    server = FakeProvider(family="openai")
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "qinglong.run.list", "parameters": {"type": "object"}}}]}
    try:
        with pytest.raises(ProviderError) as err:
            ChatClient(ProviderSettings(base_url=server.url, model="m"), None).send(json.dumps(body).encode(), 5)
        assert "Invalid 'tools[0].function.name': string does not match pattern" in err.value.message
    finally:
        server.close()


# -- errors in the provider's words ------------------------------------------------------------


def test_error_bodies_of_every_shape_are_read_in_their_own_words():
    assert error_text({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}) == \
        "Incorrect API key provided"
    assert error_text([{"error": {"code": 400, "message": "Name cannot be empty.", "status": "INVALID_ARGUMENT"}}]) \
        == "Name cannot be empty."
    assert error_text({"object": "error", "message": "\"auto\" tool choice requires --enable-auto-tool-choice",
                       "type": "BadRequestError"}).startswith('"auto" tool choice')
    assert error_text({"error": "model not found"}) == "model not found"
    assert error_text("x") == "x" and error_text(3) == ""


@pytest.mark.parametrize(("status", "message", "fix"), [
    (400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'"
          " instead.", 'set max_tokens_param to "max_completion_tokens"'),
    (400, "parameter.enable_thinking must be set to false for non-streaming calls", 'provider = "qwen"'),
    (400, "Missing `reasoning_content` field in the assistant message at message index 2.", 'provider = "deepseek"'),
    (400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
     "--enable-auto-tool-choice"),
    (500, "tools param requires --jinja flag", "--jinja"),
    (400, "registry.ollama.ai/library/gemma:2b does not support tools", "choose one that can"),
    (400, "This model's maximum context length is 8192 tokens.", "context_window_tokens"),
    (400, "Unrecognized request argument supplied: enable_thinking", "set [agent] provider"),
    (401, "Incorrect API key provided", "api_key_file"),
    (404, "The model `gpt-9` does not exist", "check model"),
    (429, "Rate limit reached", "rate limit"),
])
def test_each_error_says_what_to_change(status, message, fix):
    found = hint(status, message)
    assert found is not None and fix in found
    assert hint(400, "something else entirely") is None


def test_every_line_of_what_to_change_survives_the_logs_masking():
    from edge.airun import provider
    from edge.airun.check import _FIX
    from edge.core.excerpt import redact

    lines = [line for _, line in provider._HINTS] + list(_FIX.values())
    lines += [hint(status, "") for status in (401, 404, 429)]
    for line in lines:
        assert redact(f"qledge agent: to fix: {line}", []).text == f"qledge agent: to fix: {line}", line


def test_the_providers_message_and_what_to_change_reach_the_run(tmp_path):
    server = FakeProvider(family="openai")
    try:
        job = _job("generic", server.url, "gpt-5-mini")  # generic sends max_tokens: a reasoning model refuses it
        reporter = _Reporter()
        import io

        out = io.StringIO()
        op = Operator(job, ChatClient(job.provider, None), _Tools(), reporter, Budget(job.limits, job.provider))
        assert op.main(out) == 1
        first, second = out.getvalue().splitlines()
        assert first.startswith("qledge agent: provider_http: HTTP 400 from 127.0.0.1:") and \
            "Use 'max_completion_tokens' instead." in first
        assert second == ('qledge agent: to fix: this model wants max_completion_tokens instead of max_tokens;'
                          ' in [agent], set max_tokens_param to "max_completion_tokens" (or provider = "openai")')
        assert "(to fix: this model wants max_completion_tokens" in reporter.outcomes[0].message
        server.refused.clear()
    finally:
        server.close()


# -- deadlines and budgets -----------------------------------------------------------------------


def test_a_provider_dripping_bytes_is_cut_at_the_total_deadline():
    # One family: the deadline of the HTTP exchange, which no family's rules touch.
    server = FakeProvider()
    server.add(Step(answer("far too slow " * 20), drip_s=0.2))  # a byte every 0.2 s: each read is quick
    try:
        client = ChatClient(ProviderSettings(base_url=server.url, model="m"), None)
        started = time.monotonic()
        with pytest.raises(ProviderError) as err:
            client.send(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(), 1.5)
        elapsed = time.monotonic() - started
        assert err.value.code == "provider_timeout" and "connect, send, headers and body" in err.value.message
        assert 1.4 <= elapsed < 4.0  # at the deadline, never at the end of the drip (~100 s)
    finally:
        server.close()


def test_the_next_estimate_is_never_below_what_the_provider_counted():
    budget = Budget(LIMITS, ProviderSettings(base_url="http://127.0.0.1:9/v1", model="m"))
    assert budget.estimate("operator", 4000) == 2000  # nothing counted yet: one token per two bytes
    budget.counted("operator", 4000, 5000)  # the provider counted more than that
    assert budget.estimate("operator", 4600) == 5000 + estimate_tokens(600)  # counted, plus what was added
    assert budget.estimate("operator", 3000) == 5000  # trimmed: still never below what was counted
    assert budget.estimate("specialist:log-analyst", 4000) == 2000  # each conversation its own
    budget.counted("operator", 5000, None)  # no usage: the last count stands
    assert budget.estimate("operator", 4600) == 5000 + estimate_tokens(600)


def test_an_over_counting_provider_passes_a_budget_by_at_most_its_first_request():
    """A provider that counts three tokens for every one estimated: after its first count the
    next request is estimated from it (never from bytes alone), so the run stops before the
    request that would have passed the budget (estimated from bytes, it would have been sent).
    One family: the estimate is the child's own arithmetic on what any provider counts."""
    server = FakeProvider()
    counted = []

    def over(reply):
        def step(request):
            counted.append(3 * estimate_tokens(len(request.raw)))
            reply["usage"] = usage(counted[-1], 10)
            return reply
        return step

    server.add(*(over(tool_call("qinglong.run.list", {}, call_id=f"call_{i}")) for i in range(6)))
    try:
        job = _job("generic", server.url)
        first_estimate = estimate_tokens(len(_first_body(job)))
        limit = 3 * first_estimate * 2  # room for two requests as the provider counts them, not three
        job = msgspec.structs.replace(job, limits=msgspec.structs.replace(LIMITS, input_tokens=limit))
        op = Operator(job, ChatClient(job.provider, None), _Tools(), _Reporter(), Budget(job.limits, job.provider))
        import io

        out = io.StringIO()
        assert op.main(out) == 2 and "input_tokens budget exhausted" in out.getvalue()
        assert len(counted) == 1 and sum(counted) <= limit
        # Estimated from its bytes, the second request would have fit what was left:
        assert counted[0] + estimate_tokens(len(server.requests[0].raw) + 400) <= limit
    finally:
        server.close()


def _first_body(job: AgentJob) -> bytes:
    conv = Conversation(job.instruction, _job().tools, 8, PROFILES["generic"],
                        wire_names([t.name for t in _job().tools]))
    return conv.body(job.provider.model, "max_tokens", 100, "^000000^")


def test_tool_results_keep_their_ids_under_every_profile():
    result = ToolResult("call_1", {"a": 1})
    assert result.content("^0^") == '{"a":1}'
