"""Specialists end to end (seed 003's acceptance list), on the ACTUAL model input: real
daemons, real AI runs in real children, a real loopback chat-completions server that records
every request body. Assertions are on those bodies, on the persisted ledger rows and on
failure states, never on a model repeating its task. Every test runs against each provider
family's conformance fake (tests/conformance.py): a refused request fails it, naming the family."""

from __future__ import annotations

import json
import os
import re

import pytest

from agent_support import (
    DEEPSEEK_CHAT,
    agent_config,
    ai_task,
    log,
    served,
    record,
    start_and_wait,
    tokens_key,
    tool_messages,
    unmarked,
    until,
    wait,
)
from fake_provider import FAMILIES, FakeProvider, Step, answer, tool_call, usage
from specialist_support import (
    CORR_1,
    CORR_2,
    CORR_3,
    DELEGATION,
    ITEM,
    LA,
    ask,
    constraint_lines,
    conversation,
    is_specialist,
    last_result,
    mission,
    reply,
    rows,
    specialist_requests,
    system,
)

pytestmark = pytest.mark.e2e

SA = "schedule-advisor"


@pytest.fixture(params=FAMILIES)
def provider(request):
    yield from served(request)


@pytest.fixture
def agent(provider, daemon_factory):
    def start(extra: str = "", **keys):
        return daemon_factory(config=agent_config(provider, extra, **keys)).start()

    return start


def cid(provider: FakeProvider, scripted: str, round_: int) -> str:
    """The id a call is named by (in the ledger's sources, in its answer): the model's own, or,
    as Gemini's endpoint sends every call with an empty id, the one qledge makes up for it."""
    return f"call_{round_}_0" if provider.family.name == "gemini" else scripted


def sourced(provider: FakeProvider, text: str) -> str:
    """`text` with each "round N call ID" naming the call as `cid` does."""
    return re.sub(r"round (\d+) call ([A-Za-z0-9_]+)",
                  lambda m: f"round {m.group(1)} call {cid(provider, m.group(2), int(m.group(1)))}", text)


def _asked(d, question: str = "why did backup fail?") -> str:
    asked = d.cli("ask", question, "--wait")
    assert asked.returncode == 0, asked.stderr
    return re.search(r"run (\S+) queued", asked.stderr).group(1)


def _specialist_rounds(d, run_id: str) -> list[dict]:
    got = d.cli("agent", "get", run_id, "--json")  # every page of rounds
    assert got.returncode == 0, got.stderr
    return [r for r in json.loads(got.stdout)["perRound"] if r["specialist"] is not None]


# -- 1, 2: the delegation leaves the windows; the requests still carry it -------------------------


def test_the_delegation_leaves_the_twelve_message_window_and_is_still_delivered(agent, provider):
    d = agent()
    steps = [
        tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION,
                                          "workItems": [{"text": ITEM, "acceptance": "names the exit code"}]},
                  call_id="call_d"),
        tool_call("specialist.correct", {"specialist": LA, "text": CORR_1}, call_id="call_c"),
    ]
    for i in range(1, 9):
        steps += [ask(f"ASK-{i}: look at run {i}", f"call_a{i}"), reply(f"REPLY-{i}")]
    provider.add(*steps, answer("done"))
    run_id = _asked(d)
    asks = specialist_requests(provider)
    assert len(asks) == 8
    first, last = asks[0], asks[-1]
    assert conversation(first) == ["ASK-1: look at run 1"]  # the delegation's first delivery
    # The eighth request: its history is the newest 12 messages; ASK-1 and REPLY-1 have left it.
    assert conversation(last) == [text for i in range(2, 8) for text in (f"ASK-{i}: look at run {i}",
                                                                         f"REPLY-{i}")] + ["ASK-8: look at run 8"]
    assert "ASK-1" not in json.dumps(last.body) and "REPLY-1" not in json.dumps(last.body)
    # ... and still holds the current scope, the correction and the open item, with ids, versions and sources.
    assert constraint_lines(last) == [sourced(provider, line) for line in (
        f"[c1] delegation v1, from attempt 1 round 1 call call_d: {DELEGATION}",
        f"[c3] correction v1, from attempt 1 round 2 call call_c: {CORR_1}",
    )]
    assert sourced(provider, f"[w2] {ITEM} (acceptance: names the exit code; from attempt 1 round 1 call call_d)") \
        in system(last)
    assert all(constraint_lines(r) == constraint_lines(last) for r in asks)
    assert all(is_specialist(r) and r.body[tokens_key(provider)] == 1024 for r in asks)
    rounds = _specialist_rounds(d, run_id)
    assert [(r["specialist"]["historySent"], r["specialist"]["historyTrimmed"]) for r in rounds] == [
        (0, 0), (2, 0), (4, 0), (6, 0), (8, 0), (10, 0), (12, 0), (12, 2)]
    assert {(r["specialist"]["child"], r["specialist"]["constraints"]) for r in rounds} == {(LA, 2)}


def test_the_delegation_leaves_the_64_kib_window_and_is_still_delivered(agent, provider):
    d = agent(context_window_tokens=200_000)
    big = ["备份" * 4000 for _ in range(4)]  # 8,000 characters, 24,000 bytes each
    provider.add(
        tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION}, call_id="call_d"),
        *(step for i in range(4)
          for step in (ask(f"ASK-{i + 1}:" + big[i][:7990], f"call_a{i}"), reply(f"REPLY-{i + 1}"))),
        answer("done"),
    )
    _asked(d)
    asks = specialist_requests(provider)
    fourth = conversation(asks[3])
    # Newest first: REPLY-3, ASK-3, REPLY-2, ASK-2 (48 KB), REPLY-1; ASK-1 (24 KB more) does not fit and is
    # skipped, within 12 messages: the byte budget alone pushed the delegation's first exchange out.
    assert [c.split(":")[0] if c.startswith("ASK") else c for c in fourth] == [
        "REPLY-1", "ASK-2", "REPLY-2", "ASK-3", "REPLY-3", "ASK-4"]
    assert sum(len(c.encode()) for c in fourth[:-1]) <= 64 * 1024
    assert constraint_lines(asks[3]) == [sourced(provider, f"[c1] delegation v1, from attempt 1 round 1 call call_d:"
                                                           f" {DELEGATION}")]


def test_the_context_window_trim_drops_history_first(agent, provider):
    # The specialist reserves 6,000 of the 12,000 tokens for its reply: about 12 KB are left for its request.
    d = agent(context_window_tokens=12_000, max_output_tokens=1000,
              extra=f"[agent.specialists.{LA}]\nmax_output_tokens = 6000\n")
    long_reply = "the disk was full " * 170  # about 3 KB
    steps = [tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION}, call_id="call_d")]
    for i in range(1, 7):
        steps += [ask(f"ASK-{i}", f"call_a{i}"), reply(f"REPLY-{i} {long_reply}")]
    provider.add(*steps, answer("done"))
    run_id = _asked(d)
    asks = specialist_requests(provider)
    last = asks[-1]
    sent = conversation(last)[:-1]
    history = [text for i in range(1, 6) for text in (f"ASK-{i}", f"REPLY-{i} {long_reply}".strip())]
    assert 0 < len(sent) < 10  # ten history messages were candidates; the oldest were dropped to fit
    assert sent == history[-len(sent):]  # the newest survive, in order
    assert conversation(last)[-1] == "ASK-6" and DELEGATION in system(last)
    assert -(-len(last.raw) // 2) + 6000 <= 12_000 and last.body[tokens_key(provider)] == 6000
    trimmed = _specialist_rounds(d, run_id)[-1]["specialist"]
    assert trimmed["historySent"] == len(sent) and trimmed["historyTrimmed"] == 10 - len(sent)


def test_required_content_that_cannot_fit_is_not_sent_and_the_operator_sees_why(agent, provider):
    # The reply's reserve leaves 500 tokens (1,000 bytes): less than the system text alone.
    d = agent(context_window_tokens=12_000, max_output_tokens=1000,
              extra=f"[agent.specialists.{LA}]\nmax_output_tokens = 11500\n")
    provider.add(ask("ASK-1: look at run 7", "call_a1"), answer("the specialist could not take it"))
    run_id = _asked(d)
    assert not specialist_requests(provider)  # never sent
    result = last_result(provider.requests[1])
    assert result["error"]["code"] == "context_overflow"
    assert "11,500 reserved for the reply; the context window is 12,000: nothing was sent; the message was" \
        " withdrawn, never to be delivered" in result["error"]["message"]
    assert _specialist_rounds(d, run_id) == []
    assert rows(d, "SELECT text, status FROM agent_messages") == []  # withdrawn: no later request carries it


def test_a_message_too_long_for_the_window_is_withdrawn_and_the_specialist_goes_on(agent, provider):
    # The specialist reserves 13,000 of 16,000 tokens: about 6 KB for its request, a 6,500-character
    # message cannot fit; left pending it would overflow every later request to it.
    d = agent(context_window_tokens=16_000, max_output_tokens=1000,
              extra=f"[agent.specialists.{LA}]\nmax_output_tokens = 13000\n")
    provider.add(
        tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION}, call_id="call_d"),
        ask("TOO-LONG " + "x" * 6500, "call_a1"),
        ask("ASK-2: shorter", "call_a2"), reply("REPLY-2"),
        answer("done"),
    )
    run_id = _asked(d)
    overflow = last_result(provider.requests[2])["error"]
    assert overflow["code"] == "context_overflow" and "the message was withdrawn" in overflow["message"]
    (sent,) = specialist_requests(provider)
    assert conversation(sent) == ["ASK-2: shorter"] and "TOO-LONG" not in json.dumps(sent.body)
    assert constraint_lines(sent) == [sourced(provider, f"[c1] delegation v1, from attempt 1 round 1 call call_d:"
                                                        f" {DELEGATION}")]
    assert rows(d, "SELECT text, status FROM agent_messages") == [("ASK-2: shorter", "consumed")]
    assert [r["specialist"]["historySent"] for r in _specialist_rounds(d, run_id)] == [0]


# -- 3, 4, 6 and "Done means": the scripted mission through qledge ask --------------------------


@pytest.mark.parametrize("provider", [*FAMILIES, DEEPSEEK_CHAT], indirect=True)
def test_the_scripted_mission_delegates_corrects_revokes_survives_a_restart_and_a_retry(provider, daemon_factory):
    m = mission(daemon_factory, provider)
    d = m.second
    assert m.retry_out.startswith("The backup failed because /mnt/usb filled up")
    s1, s2, s3, s4, s5 = specialist_requests(provider)
    c = {name: m.ids[name] for name in ("delegation", "corr_1", "corr_2", "corr_3")}
    deleg = sourced(provider, f"[{c['delegation']}] delegation v1, from attempt 1 round 1 call call_d1: {DELEGATION}")
    corr_1 = sourced(provider, f"[{c['corr_1']}] correction v1, from attempt 1 round 2 call call_c1: {CORR_1}")
    corr_2 = sourced(provider, f"[{c['corr_2']}] correction v2, replaces {c['corr_1']}, from attempt 1 round 5 call"
                               f" call_c2: {CORR_2}")
    # Every request carries every constraint in force then, and nothing else.
    assert constraint_lines(s1) == [deleg, corr_1]
    assert constraint_lines(s2) == constraint_lines(s3) == constraint_lines(s4) == constraint_lines(s5) == [
        deleg, corr_2]
    # Superseded and revoked constraints are never delivered again: not after the restart, not in attempt 2.
    for later in (s2, s3, s4, s5):
        assert CORR_1 not in json.dumps(later.body, ensure_ascii=False)
    assert all(CORR_3 not in json.dumps(r.body, ensure_ascii=False) for r in specialist_requests(provider))
    assert all(ITEM in system(r) for r in (s1, s2, s3, s4, s5))
    # Attempt 1 consumed ASK-1 and ASK-2; ASK-3 left pending by the crash is delivered once, in attempt 2.
    assert conversation(s3)[-1].startswith("ASK-3-PENDING")
    assert [x.split(":")[0] for x in conversation(s4)] == ["ASK-1", "REPLY-1", "ASK-2", "REPLY-2", "ASK-3-PENDING",
                                                           "ASK-4"]
    assert [x.split(":")[0] for x in conversation(s5)] == ["ASK-1", "REPLY-1", "ASK-2", "REPLY-2", "ASK-3-PENDING",
                                                           "ASK-4", "REPLY-4", "ASK-5"]
    receipts = rows(d, "SELECT substr(m.text, 1, 13), r.attempt, r.run_id FROM agent_receipts r JOIN agent_messages m"
                       " ON m.mission = r.mission AND m.id = r.message ORDER BY m.id")
    assert receipts == [("ASK-1: backup", 1, m.run_1), ("ASK-2: the la", 1, m.run_1), ("ASK-3-PENDING", 2, m.run_2),
                        ("ASK-4: after ", 2, m.run_2), ("ASK-5: and ho", 2, m.run_2)]
    assert rows(d, "SELECT count(*) FROM agent_messages WHERE status = 'pending'") == [(0,)]
    replies = rows(d, "SELECT substr(text, 1, 7), attempt, run_id FROM agent_replies ORDER BY id")
    assert replies == [("REPLY-1", 1, m.run_1), ("REPLY-2", 1, m.run_1), ("REPLY-4", 2, m.run_2),
                       ("REPLY-5", 2, m.run_2)]
    # The ledger rows keep their source bindings across the restart.
    assert rows(d, "SELECT 'c' || id, kind, version, status, source_attempt, source_round, source_call"
                   " FROM agent_constraints ORDER BY id") == [
        (c["delegation"], "delegation", 1, "active", 1, 1, cid(provider, "call_d1", 1)),
        (c["corr_1"], "correction", 1, "superseded", 1, 2, cid(provider, "call_c1", 2)),
        (c["corr_2"], "correction", 2, "active", 1, 5, cid(provider, "call_c2", 5)),
        (c["corr_3"], "correction", 1, "revoked", 1, 6, cid(provider, "call_c3", 6)),
    ]
    assert rows(d, "SELECT run_id, attempt FROM agent_attempts ORDER BY attempt") == [(m.run_1, 1), (m.run_2, 2)]
    # Each attempt is a run of its own, with its own principal, its own evidence.
    first, second = record(d, m.run_1), record(d, m.run_2)
    assert (first["state"], second["state"]) == ("lost", "succeeded")
    # The crashed attempt's rounds were held in its daemon's memory (the record is written once,
    # at the end): its `lost` record has none; the ledger above is what carries over.
    assert first["perRound"] == [] and first["rounds"] == 0
    assert [(r["specialist"]["constraints"], r["specialist"]["historySent"]) for r in second["perRound"]
            if r["specialist"]] == [(2, 4), (2, 7)]
    audit = rows(d, "SELECT DISTINCT principal FROM security_audit WHERE tool LIKE 'qledge.agent.specialist.%'")
    assert sorted(a[0] for a in audit) == sorted([f"agent:{m.run_1}", f"agent:{m.run_2}"])
    shown = d.cli("agent", "mission", m.run_2)
    assert shown.returncode == 0 and f"attempts: 1: {m.run_1}, 2: {m.run_2}" in shown.stdout


def test_a_replaced_delegation_closed_items_and_a_revoked_delegation_are_never_sent_again(agent, provider):
    """Across a retry (no restart): attempt 2 replaces attempt 1's delegation and correction,
    closes one work item, adds another, then revokes its own delegation; every request carries
    exactly what is in force, with its source, and the operator sees each change's result."""
    d = agent()
    provider.add(
        tool_call("specialist.delegate", {"specialist": LA, "instruction": "SCOPE-ONE", "workItems": [
            {"text": "ITEM-A"}, {"text": "ITEM-B", "acceptance": "quotes the line"}]}, call_id="call_d1"),
        tool_call("specialist.correct", {"specialist": LA, "text": "CORR-ONE"}, call_id="call_c1"),
        ask("ASK-1", "call_a1"), reply("REPLY-1"),
        answer("attempt 1 done"),
    )
    run_1 = _asked(d)
    provider.add(
        tool_call("specialist.delegate", {"specialist": LA, "instruction": "SCOPE-TWO"}, call_id="call_d2"),
        tool_call("specialist.correct", {"specialist": LA, "text": "CORR-TWO", "replaces": "c4"}, call_id="call_c2"),
        tool_call("specialist.items", {"specialist": LA, "close": ["w2"], "add": [{"text": "ITEM-C"}]},
                  call_id="call_i1"),
        tool_call("specialist.items", {"specialist": LA, "close": ["w2"]}, call_id="call_i2"),  # done already
        ask("ASK-2", "call_a2"), reply("REPLY-2"),
        tool_call("specialist.revoke", {"constraintId": "c8"}, call_id="call_r1"),
        tool_call("specialist.correct", {"specialist": LA, "text": "CORR-X", "replaces": "c4"}, call_id="call_c3"),
        ask("ASK-3", "call_a3"), reply("REPLY-3"),
        answer("attempt 2 done"),
    )
    retried = d.cli("agent", "retry", run_1, "--wait")
    assert retried.returncode == 0 and retried.stdout == "attempt 2 done\n", retried.stderr
    run_2 = re.search(r"run (\S+) queued: attempt 2", retried.stderr).group(1)
    s1, s2, s3 = specialist_requests(provider)
    assert constraint_lines(s1) == [sourced(provider, line) for line in (
        "[c1] delegation v1, from attempt 1 round 1 call call_d1: SCOPE-ONE",
        "[c4] correction v1, from attempt 1 round 2 call call_c1: CORR-ONE")]
    assert "[w2] ITEM-A" in system(s1) and "[w3] ITEM-B (acceptance: quotes the line;" in system(s1)
    assert constraint_lines(s2) == [sourced(provider, line) for line in (
        "[c8] delegation v2, replaces c1, from attempt 2 round 1 call call_d2: SCOPE-TWO",
        "[c9] correction v2, replaces c4, from attempt 2 round 2 call call_c2: CORR-TWO")]
    items = system(s2).split("Open work items:\n", 1)[1].splitlines()
    assert items == [sourced(provider, line) for line in (
        "[w3] ITEM-B (acceptance: quotes the line; from attempt 1 round 1 call call_d1)",
        "[w10] ITEM-C (from attempt 2 round 3 call call_i1)")]
    assert constraint_lines(s3) == constraint_lines(s2)[1:]  # the delegation revoked: only the correction
    for later in (s2, s3):
        text = json.dumps(later.body)
        assert "SCOPE-ONE" not in text and "CORR-ONE" not in text and "ITEM-A" not in text and "CORR-X" not in text
    assert "SCOPE-TWO" not in json.dumps(s3.body)
    assert conversation(s2) == ["ASK-1", "REPLY-1", "ASK-2"] and conversation(s3)[-1] == "ASK-3"
    # What the operator was told: the changes, and why the two that could not be made were refused.
    by_call = {}
    for r in provider.requests:
        if not is_specialist(r) and tool_messages(r):
            by_call[tool_messages(r)[-1]["tool_call_id"]] = last_result(r)
    assert by_call[cid(provider, "call_d2", 1)]["superseded"] == "c1"
    assert by_call[cid(provider, "call_i1", 3)]["workItems"] == [
        {"id": "w2", "specialist": LA, "text": "ITEM-A", "status": "done"},
        {"id": "w10", "specialist": LA, "text": "ITEM-C", "status": "open"}]
    assert by_call[cid(provider, "call_i2", 4)]["error"] == {"code": "conflict",
                                                             "message": "work item w2 is already done"}
    assert by_call[cid(provider, "call_r1", 7)]["constraint"]["status"] == "revoked"
    assert by_call[cid(provider, "call_c3", 8)]["error"] == {"code": "conflict",
                                           "message": "c4 was superseded by c9: it is no longer in force"}
    assert rows(d, "SELECT 'c' || id, kind, version, status, superseded_by, source_attempt FROM agent_constraints"
                   " ORDER BY id") == [
        ("c1", "delegation", 1, "superseded", 8, 1), ("c4", "correction", 1, "superseded", 9, 1),
        ("c8", "delegation", 2, "revoked", None, 2), ("c9", "correction", 2, "active", None, 2)]
    assert rows(d, "SELECT 'w' || id, status, source_attempt FROM agent_work_items ORDER BY id") == [
        ("w2", "done", 1), ("w3", "open", 1), ("w10", "open", 2)]
    shown = json.loads(d.cli("agent", "mission", run_2, "--json").stdout)
    assert shown["attempts"] == [run_1, run_2] and len(shown["constraints"]) == 4


# -- 5: isolation ----------------------------------------------------------------------------


def test_specialists_of_a_mission_and_two_missions_never_mix(agent, provider):
    d = agent()
    provider.add(
        tool_call("", calls=[
            ("specialist.delegate", {"specialist": LA, "instruction": "LA-SCOPE", "workItems": [{"text": "LA-ITEM"}]}),
            ("specialist.delegate", {"specialist": SA, "instruction": "SA-SCOPE", "workItems": [{"text": "SA-ITEM"}]}),
        ]),
        ask("LA-MSG-1", "call_a1"), reply("LA-REPLY-1"),
        ask("SA-MSG-1", "call_a2", specialist=SA), reply("SA-REPLY-1"),
        ask("LA-MSG-2", "call_a3"), reply("LA-REPLY-2"),
        answer("first mission done"),
        tool_call("specialist.delegate", {"specialist": LA, "instruction": "OTHER-SCOPE"}, call_id="call_x"),
        ask("OTHER-MSG", "call_a4"), reply("OTHER-REPLY"),
        answer("second mission done"),
    )
    _asked(d, "first question")
    _asked(d, "second question")
    la_1, sa_1, la_2, other = specialist_requests(provider)
    sa_texts = ("SA-SCOPE", "SA-ITEM", "SA-MSG-1", "SA-REPLY-1")
    la_texts = ("LA-SCOPE", "LA-ITEM", "LA-MSG", "LA-REPLY")
    for request in (la_1, la_2):
        assert not [t for t in sa_texts if t in json.dumps(request.body)]
    assert not [t for t in la_texts if t in json.dumps(sa_1.body)]
    assert conversation(la_2) == ["LA-MSG-1", "LA-REPLY-1", "LA-MSG-2"]
    assert "SA-SCOPE" in system(sa_1) and "SA-ITEM" in system(sa_1) and "first question" in system(sa_1)
    assert system(sa_1).startswith("You are the schedule advisor")
    assert not [t for t in (*la_texts, *sa_texts, "first question") if t in json.dumps(other.body)]
    assert "OTHER-SCOPE" in system(other) and "second question" in system(other)
    assert conversation(other) == ["OTHER-MSG"]


# -- 7: budgets ------------------------------------------------------------------------------


def test_specialist_rounds_count_against_the_rounds_budget(agent, provider):
    d = agent(budget_rounds=2)
    provider.add(ask("ASK-1", "call_a1"), reply("REPLY-1"), answer("never sent"))
    run = start_and_wait(d, ai_task(d, "tight")["id"])
    assert (run["status"], run["errorCode"]) == ("failed", "budget_exhausted")
    assert len(provider.requests) == 2  # the operator's round 1 and the specialist's round 2; round 3 not sent
    evidence = record(d, run["id"])
    assert (evidence["budget"], evidence["rounds"], evidence["inputTokens"]) == ("rounds", 2, 200)
    assert evidence["perRound"][1]["specialist"]["child"] == LA


def test_a_specialist_call_that_would_exceed_a_budget_is_not_sent(agent, provider):
    # The specialist reserves 3,000 output tokens; after round 1 (20 used) 2,500 cannot hold them, the
    # operator's own 1,000 still fit.
    d = agent(max_output_tokens=1000, extra=f"[agent.specialists.{LA}]\nmax_output_tokens = 3000\n")
    provider.add(ask("ASK-1", "call_a1", ), answer("answered without the specialist"))
    run = start_and_wait(d, ai_task(d, "reserve", output_tokens=2500)["id"])
    assert run["status"] == "succeeded", run
    assert not specialist_requests(provider) and len(provider.requests) == 2
    error = last_result(provider.requests[1])["error"]
    assert (error["code"], error["budget"]) == ("budget_exhausted", "output_tokens")
    assert "the request was not sent" in error["message"]
    assert rows(d, "SELECT text, status FROM agent_messages") == [("ASK-1", "pending")]  # delivered with the next
    assert _specialist_rounds(d, run["id"]) == [] and record(d, run["id"])["rounds"] == 2


def test_specialist_usage_is_charged_to_the_attempt(agent, provider):
    d = agent(input_usd_per_mtok=1.0, output_usd_per_mtok=1.0)
    provider.add(ask("ASK-1", "call_a1"), Step(answer("REPLY-1", usage_=usage(5000, 700))), answer("done"))
    run = start_and_wait(d, ai_task(d, "charged")["id"])
    evidence = record(d, run["id"])
    assert (evidence["inputTokens"], evidence["outputTokens"]) == (5200, 740)
    assert evidence["costUsd"] == pytest.approx(5940 / 1e6)
    specialist = evidence["perRound"][1]
    assert (specialist["inputTokens"], specialist["outputTokens"], specialist["tools"]) == (5000, 700, [])


# -- 8: permissions ----------------------------------------------------------------------------


def test_a_specialist_cannot_call_a_tool_whatever_it_answers(agent, provider):
    d = agent()
    d.cli("task", "add", "victim", "--", "true")
    provider.add(ask("ASK-1", "call_a1"),
                 tool_call("qledge.task.delete", {"taskId": "victim"}, content="REPLY-1 (and a tool call)"),
                 answer("done"))
    run = start_and_wait(d, ai_task(d, "rogue")["id"])
    assert run["status"] == "succeeded"
    (request,) = specialist_requests(provider)
    assert "tools" not in request.body and "tool_choice" not in request.body
    assert last_result(provider.requests[2])["reply"] == "REPLY-1 (and a tool call)"
    assert d.call("qledge.task.get", {"taskId": "victim"})["id"] == "victim"
    calls = rows(d, "SELECT tool FROM security_audit WHERE principal = ?", (f"agent:{run['id']}",))
    assert "qledge.task.delete" not in {c[0] for c in calls}
    assert record(d, run["id"])["perRound"][1]["tools"] == []


def test_the_ledger_tools_are_the_run_credentials_alone(provider, daemon_factory):
    from mcp_support import INITIALIZE, LineClient, request

    d = daemon_factory(config=agent_config(provider, "[mcp]\nenabled = true\n")).start()
    args = {"child": LA, "constraint": 1, "round": 1, "call": "x"}
    for op in ("delegate", "correct", "revoke", "items", "prepare", "commit", "withdraw"):
        owner = d.cli("call", f"qledge.agent.specialist.{op}", "--args", json.dumps(args))
        assert owner.returncode != 0 and "permission_denied" in owner.stderr, owner.stderr
    for role in ("owner", "operator"):  # a stored credential, even an owner's `*`, is not an AI run's own
        _, token = d.token(role)
        refused = d.cli("call", "qledge.agent.specialist.revoke", "--args", json.dumps(args), token=token)
        assert refused.returncode != 0 and "permission_denied" in refused.stderr, refused.stderr
    c = LineClient(os.path.join(d.home, "mcp.sock"))
    c.send({"qledge": {"token": None}})
    assert c.recv() == {"qledge": {"ok": True}}
    c.ask(INITIALIZE)
    names = {t["name"] for t in c.ask(request(2, "tools/list"))["result"]["tools"]}
    assert not [n for n in names if "specialist" in n or n == "qledge.agent.retry"]
    refused = c.ask(request(3, "tools/call", {"name": "qledge.agent.specialist.revoke", "arguments": args}))
    assert "Unknown tool" in json.dumps(refused)
    c.close()


def test_retry_is_refused_while_an_attempt_is_active_and_for_what_is_not_a_mission(agent, provider):
    d = agent()
    provider.add(Step(answer("slow"), delay_s=float("inf")))
    run = d.call("qledge.run.start", {"taskId": ai_task(d, "busy")["id"]})
    until(lambda: provider.requests, what="the request")
    busy = d.cli("agent", "retry", run["id"])
    # Still `queued` on record within its first second (its start is written with its end, or after 1 s).
    assert busy.returncode == 1 and re.search(r"is still (queued|running): wait for it", busy.stderr), busy.stderr
    d.call("qledge.run.cancel", {"runId": run["id"]})
    d.cli("task", "add", "plain", "--", "true")
    plain = d.call("qledge.run.start", {"taskId": "plain"})
    until(lambda: d.call("qledge.run.get", {"runId": plain["id"]})["status"] == "succeeded", what="the plain run")
    refused = d.cli("agent", "retry", plain["id"])
    assert refused.returncode == 1 and "is not an attempt of a mission" in refused.stderr
    for tool, args in (("qledge.agent.retry", {}), ("qledge.agent.mission", {"runId": 7, "x": 1})):
        bad = d.cli("call", tool, "--args", json.dumps(args))
        assert bad.returncode != 0 and "invalid_argument" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    provider.add(answer("second attempt"))
    again = d.cli("agent", "retry", run["id"], "--wait")
    assert again.returncode == 0 and again.stdout == "second attempt\n"
    assert "attempt 2 of mission " + run["id"] in again.stderr
    assert log(d, run["id"]) == ""  # the cancelled attempt keeps its own (empty) log


def test_specialists_can_be_configured_and_turned_off(agent, provider):
    d = agent(extra=(f"[agent.specialists.{SA}]\nenabled = false\n"
                     "[agent.specialists.wifi-expert]\ndescription = \"knows OpenWrt wireless\"\n"
                     "system = \"You know OpenWrt's wireless stack.\"\nmax_output_tokens = 512\n"
                     f"[agent.specialists.{LA}]\nsystem = \"LA-OWN-SYSTEM: read logs tersely.\"\n"))
    provider.add(ask("ASK-1", "call_a1", specialist="wifi-expert"), reply("REPLY"),
                 ask("ASK-2", "call_a2"), reply("REPLY-2"), answer("done"))
    _asked(d)
    parent = provider.requests[0]
    tools = {t["function"]["name"]: t["function"] for t in parent.body["tools"]}
    schema = tools["specialist_ask"]
    assert schema["parameters"]["properties"]["specialist"]["enum"] == [LA, "wifi-expert"]
    # The built-in description stays when only the system text is configured.
    assert (f"{LA}: reads the log lines, exit codes and errors you quote" in tools["specialist_delegate"]["description"]
            and "wifi-expert: knows OpenWrt wireless" in tools["specialist_delegate"]["description"])
    request, own = specialist_requests(provider)
    assert system(request).startswith("You know OpenWrt's wireless stack.")
    assert request.body[tokens_key(provider)] == 512
    assert system(own).startswith("LA-OWN-SYSTEM: read logs tersely.\n\nHow this works") and "log analyst" not in \
        system(own)
    assert unmarked(provider.requests[2], tool_messages(provider.requests[2])[-1]["content"])["reply"] == "REPLY"


def test_a_provider_failure_starts_the_next_attempt_up_to_attempts(agent, provider):
    d = agent(attempts=2, retries=0)
    overloaded = Step({"error": {"message": "overloaded"}}, status=503)
    provider.add(overloaded, tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION},
                                       call_id="call_d"), answer("answered by attempt 2"))
    first = start_and_wait(d, ai_task(d, "flaky")["id"])
    assert (first["status"], first["errorCode"]) == ("failed", "provider_http")
    # The next attempt is admitted before the failed one is finished (and waited for).
    (second_id,) = [r[0] for r in rows(d, "SELECT id FROM runs WHERE task_id = 'flaky' AND id != ?", (first["id"],))]
    second = wait(d, second_id)
    assert rows(d, "SELECT run_id, attempt FROM agent_attempts ORDER BY attempt") == [(first["id"], 1), (second_id, 2)]
    assert second["status"] == "succeeded" and second["taskId"] == "flaky"
    assert log(d, second["id"]) == "answered by attempt 2\n"
    assert rows(d, "SELECT kind, source_attempt FROM agent_constraints") == [("delegation", 2)]
    # Two failures: two attempts, no third.
    provider.add(overloaded, overloaded)
    failed = start_and_wait(d, ai_task(d, "down")["id"])
    runs = rows(d, "SELECT id, status, error_code FROM runs WHERE task_id = 'down' ORDER BY id")
    assert len(runs) == 2 and runs[0][0] == failed["id"]
    assert wait(d, runs[1][0])["errorCode"] == "provider_http"
    assert rows(d, "SELECT count(*) FROM runs WHERE task_id = 'down'") == [(2,)]
