"""Specialists, measured: what their requests hold (constraints against history against what
was left out) in the scripted mission of the tests and in a long one, and the per-request
overhead of building a specialist's context at 50 constraints — the request builder alone,
the ledger's read on a real database, and end to end in a real daemon (from the operator's
reply asking the specialist to the specialist's request reaching the provider). Results go
to bench/results/latest.json ("specialists"); docs/ai.md's figures come from there.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

import pytest

from agent_support import agent_config, tool_messages
from daemons import BenchDaemon, install_venv, record
from edge.airun.specialists import build_request
from edge.cli.client import Client
from edge.core.agent import ProviderSettings, SpecialistSpec
from edge.core.ledger import AttemptStart, CorrectArgs, DelegateArgs, HistoryEntry, PrepareArgs
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.ledger import SqliteMissionLedger
from fake_provider import FakeProvider, Request, answer, tool_call
from specialist_support import LA, ask, constraint_lines, conversation, mission, specialist_requests, system
from support import DaemonProcess

RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    record("specialists", RESULTS)


def _sizes(request: Request, round_: dict[str, int] | None) -> dict[str, int | None]:
    """What one request held; `round_` is its evidence (historySent, historyTrimmed), None for a
    request whose round was never reported (then only its last message counts as current)."""
    text = system(request)
    lines = constraint_lines(request)
    items = text.split("\n\nOpen work items:\n", 1)[1]
    messages = conversation(request)
    sent = round_["historySent"] if round_ is not None else len(messages) - 1
    history, current = messages[:sent], messages[sent:]
    return {
        "body_bytes": len(request.raw), "system_bytes": len(text.encode()), "constraints": len(lines),
        "constraint_bytes": len("\n".join(lines).encode()), "items_bytes": len(items.encode()),
        "history_messages": len(history), "history_bytes": sum(len(h.encode()) for h in history),
        "current_messages": len(current), "current_bytes": sum(len(c.encode()) for c in current),
        "history_trimmed": round_["historyTrimmed"] if round_ is not None else None,
    }


def _rounds(d: DaemonProcess, run_id: str) -> list[dict]:
    got = d.cli("agent", "get", run_id, "--json")
    assert got.returncode == 0, got.stderr
    return [r["specialist"] for r in json.loads(got.stdout)["perRound"] if r["specialist"]]


def test_request_sizes_in_the_scripted_mission():
    provider, made = FakeProvider(), []

    def factory(**kw: Any) -> DaemonProcess:
        made.append(DaemonProcess(**kw))
        return made[-1]

    try:
        m = mission(factory, provider)
        assert _rounds(m.second, m.run_1) == []  # held by the daemon that died: its `lost` record has none
        reported = _rounds(m.second, m.run_2)
        requests = specialist_requests(provider)
        per = [_sizes(r, t) for r, t in zip(requests, [None, None, None, *reported], strict=True)]
        RESULTS["mission"] = per
        assert [p["constraints"] for p in per] == [2, 2, 2, 2, 2]
        assert [p["current_messages"] for p in per] == [1, 1, 1, 2, 1]  # the crash's message, delivered once
    finally:
        for d in made:
            d.cleanup()
        provider.close()


def test_request_sizes_in_a_long_mission():
    """24 questions with 7.9 KB log excerpts and 3 KB replies: the 12-message window and the
    64 KiB budget both bite; the constraints never move."""
    provider = FakeProvider()
    excerpt = "\n".join(f"2026-10-14 02:30:{i % 60:02d} rsync: copying /srv/share/file-{i}.tar" for i in range(160))
    steps: list[Any] = [tool_call("specialist.delegate", {"specialist": LA, "instruction": (
        "Only look at the backup task's runs of this week; keep the answer to the root cause.")}, call_id="call_d")]
    steps += [tool_call("specialist.correct", {"specialist": LA, "text": f"Correction {i}: " + "also note " * 20},
                        call_id=f"call_c{i}") for i in range(5)]
    for i in range(24):
        steps += [ask(f"Q{i}: run {i} log:\n{excerpt[:7_900]}", f"call_a{i}"), answer(f"R{i}: " + "finding " * 380)]
    steps.append(answer("done"))
    provider.add(*steps)
    d = DaemonProcess(config=agent_config(provider, context_window_tokens=400_000, budget_rounds=100)).start()
    try:
        asked = d.cli("ask", "why did the backup fail this week?", "--json")
        run_id = json.loads(asked.stdout)["id"]
        with Client(d.socket) as c:
            while not (waited := c.call("qledge.run.wait", {"runId": run_id, "timeoutMs": 30_000}))["done"]:
                pass
        assert waited["run"]["status"] == "succeeded", (waited["run"]["errorCode"], waited["run"]["errorSummary"])
        per = [_sizes(r, t) for r, t in zip(specialist_requests(provider), _rounds(d, run_id), strict=True)]
        RESULTS["long_mission"] = {"requests": len(per), "first": per[0], "sixth": per[5], "last": per[-1]}
        assert per[-1]["history_messages"] < 12 and per[-1]["history_bytes"] <= 64 * 1024
        assert per[-1]["constraints"] == 6
    finally:
        d.cleanup()
        provider.close()


SPEC = SpecialistSpec(name=LA, description="d", system="You analyse logs. " * 30, max_output_tokens=1024)
PROVIDER = ProviderSettings(base_url="http://127.0.0.1:9/v1", model="m")


def _timed(fn: Any, n: int) -> float:
    """The median of `n` timings of `fn()`, in microseconds."""
    samples = []
    for _ in range(n):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return round(statistics.median(samples), 1)


async def _ledger_with(constraints: int, text_chars: int, path: str) -> tuple[Database, SqliteMissionLedger, Any]:
    db = await Database.open(path)
    ledger = SqliteMissionLedger(db)
    at = await ledger.begin_attempt(AttemptStart(project_id="default", run_id=f"run-{constraints}-{text_chars}",
                                                 task_id="ask", task_revision=1, goal="why did backup fail?"), 1)
    await ledger.delegate(at, DelegateArgs(child=LA, instruction="d" * text_chars, round=1, call="c"), 1)
    for i in range(constraints - 1):
        await ledger.correct(at, CorrectArgs(child=LA, text=f"{i}:" + "c" * (text_chars - 4), round=1, call="c"), 1)
    return db, ledger, at


def test_context_overhead_at_50_constraints():
    history = [HistoryEntry(id=i + 1, sender="parent" if i % 2 == 0 else "child", text="h" * 2000) for i in range(12)]
    out: dict[str, Any] = {}

    async def measure() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for constraints, chars in ((0, 0), (50, 200), (50, 2000)):
                key = f"{constraints}x{chars}"
                if constraints == 0:
                    db = await Database.open(os.path.join(tmp, "zero.db"))
                    ledger = SqliteMissionLedger(db)
                    at = await ledger.begin_attempt(AttemptStart(project_id="default", run_id="run-0", task_id="ask",
                                                                 task_revision=1, goal="why did backup fail?"), 1)
                else:
                    db, ledger, at = await _ledger_with(constraints, chars, os.path.join(tmp, f"{key}.db"))
                samples, ctx = [], None
                for i in range(60):
                    started = time.perf_counter_ns()
                    ctx = await ledger.prepare(at, PrepareArgs(child=LA, message=f"m{i}", round=1, call="c"), 2)
                    samples.append((time.perf_counter_ns() - started) / 1000)
                    await db.run(lambda conn: conn.execute("UPDATE agent_messages SET status = 'consumed'"))
                assert ctx is not None
                full = msgspec_replace_history(ctx, history)
                body, layout = build_request(SPEC, full, PROVIDER)
                out[key] = {
                    "ledger_prepare_us": round(statistics.median(samples), 1),
                    "build_request_us": _timed(lambda full=full: build_request(SPEC, full, PROVIDER), 300),
                    "body_bytes": len(body), "constraint_bytes": layout.constraint_bytes,
                }
                await db.close()

    asyncio.run(measure())
    RESULTS["overhead_in_process"] = out
    assert out["50x200"]["build_request_us"] < 5000


def msgspec_replace_history(ctx: Any, history: list[HistoryEntry]) -> Any:
    import msgspec

    return msgspec.structs.replace(ctx, history=history, history_total=len(history))


def _gaps(provider: FakeProvider) -> list[float]:
    """For each specialist request: the time from the operator's reply that asked for it (sent
    by the provider) to the specialist's request arriving, in milliseconds."""
    gaps, previous = [], None
    for request in provider.requests:
        if "tools" not in request.body and previous is not None:
            gaps.append((request.received_at - previous.received_at - previous.handled_s) * 1000)
        previous = request
    return gaps


def test_end_to_end_overhead_at_50_constraints():
    """A real daemon (regular install) and child: 10 specialist requests with no constraints,
    then 10 with 50 (200 characters each)."""
    python = install_venv()
    provider = FakeProvider()
    d = BenchDaemon(python, config=agent_config(provider, context_window_tokens=400_000)).start()
    try:
        results = {}
        for constraints in (0, 50):
            provider.requests.clear()
            steps: list[Any] = []
            pending = [("specialist.correct", {"specialist": LA, "text": f"Correction {i}: " + "keep " * 38})
                       for i in range(constraints)]
            while pending:
                steps.append(tool_call("", calls=pending[:8]))
                pending = pending[8:]
            for i in range(10):
                steps += [ask(f"Q{i}: " + "log line\n" * 100, f"call_a{i}"), answer(f"R{i}")]
            provider.add(*steps, answer("done"))
            with Client(d.socket) as c:
                run = c.call("qledge.agent.ask", {"instruction": f"measure {constraints}"})
                while not c.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})["done"]:
                    pass
                assert c.call("qledge.run.get", {"runId": run["id"]})["status"] == "succeeded"
            specialist = specialist_requests(provider)
            assert len(specialist) == 10
            assert constraint_lines(specialist[-1]) == (["(none)"] if constraints == 0 else
                                                        constraint_lines(specialist[-1])[:constraints])
            assert len(constraint_lines(specialist[-1])) == max(constraints, 1)
            gaps = _gaps(provider)
            results[str(constraints)] = {"median_ms": round(statistics.median(gaps), 2),
                                         "max_ms": round(max(gaps), 2),
                                         "body_bytes": len(specialist[-1].raw)}
            assert not tool_messages(specialist[-1])
        RESULTS["overhead_end_to_end"] = results
    finally:
        d.cleanup()
        provider.close()
