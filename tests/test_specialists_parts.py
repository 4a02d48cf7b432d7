"""The specialists' parts on their own: the request builder's rules (the 12-message window, the
64 KiB byte budget with skipping, the context-window trim, context_overflow) on the body it
builds, and the mission ledger on a real SQLite file (versions, supersession, revocation,
receipts per attempt, idempotent consumption, isolation of children and missions, bounds,
a reopened database, retention)."""

from __future__ import annotations

import json
import os

import msgspec
import pytest

from edge.airun.budget import estimate_tokens
from edge.airun.specialists import Overflow, build_request
from edge.core.agent import ProviderSettings, SpecialistSpec
from edge.core.errors import ToolError
from edge.core.ledger import (
    ACTIVE_CONSTRAINTS_MAX,
    HISTORY_BYTES_MAX,
    PENDING_MAX,
    AttemptStart,
    CommitArgs,
    ConstraintView,
    CorrectArgs,
    DelegateArgs,
    HistoryEntry,
    ItemDraft,
    ItemsArgs,
    PendingMessage,
    PrepareArgs,
    RevokeArgs,
    Source,
    SpecialistContext,
    WithdrawArgs,
)
from edge.storage.sqlite import ledger as ledger_module
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.ledger import SqliteMissionLedger

SPEC = SpecialistSpec(name="log-analyst", description="d", system="You analyse logs.", max_output_tokens=500)
SRC = Source(attempt=1, round=1, call="call_1")


def provider(window: int = 65536) -> ProviderSettings:
    return ProviderSettings(base_url="http://127.0.0.1:9/v1", model="m", context_window_tokens=window)


def constraint(cid: int, text: str, kind: str = "correction", version: int = 1) -> ConstraintView:
    return ConstraintView(id=cid, child="log-analyst", kind=kind, text=text, version=version, status="active",
                          replaces=None, superseded_by=None, source=SRC, created_at_ms=0, updated_at_ms=0)


def context(history: list[HistoryEntry], constraints: list[ConstraintView] | None = None,
            current: str = "CURRENT-MESSAGE", total: int | None = None) -> SpecialistContext:
    return SpecialistContext(
        mission_id="m1", attempt=1, goal="why did backup fail?",
        constraints=constraints if constraints is not None else [constraint(1, "ONLY-AUTH", "delegation")],
        items=[], history=history, history_total=len(history) if total is None else total,
        pending=[PendingMessage(id=999, text=current, source=SRC)])


def entries(texts: list[str]) -> list[HistoryEntry]:
    return [HistoryEntry(id=i + 1, sender="parent" if i % 2 == 0 else "child", text=t) for i, t in enumerate(texts)]


def body(raw: bytes) -> dict:
    return json.loads(raw)


def test_the_request_is_in_order_and_all_constraints_are_in_it():
    many = [constraint(i, f"RULE-{i}") for i in range(1, 51)]
    raw, layout = build_request(SPEC, context(entries(["hello", "hi"]), many), provider())
    messages = body(raw)["messages"]
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and system.startswith("You analyse logs.")
    assert system.index("You analyse logs.") < system.index("why did backup fail?") < system.index("[c1]") \
        < system.index("Open work items")
    assert all(f"[c{i}] correction v1, from attempt 1 round 1 call call_1: RULE-{i}\n" in system + "\n"
               for i in range(1, 51))
    assert [m["content"] for m in messages[1:]] == ["hello", "hi", "CURRENT-MESSAGE"]
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    assert "tools" not in body(raw) and "tool_choice" not in body(raw)  # a specialist never gets tools
    assert (layout.constraints, layout.history_sent, layout.history_trimmed) == (50, 2, 0)


def test_at_most_twelve_history_messages():
    texts = [f"H{i:02d}" for i in range(20)]
    raw, layout = build_request(SPEC, context(entries(texts), total=20), provider())
    contents = [m["content"] for m in body(raw)["messages"][1:-1]]
    assert contents == texts[-12:]
    assert (layout.history_candidates, layout.history_sent, layout.history_trimmed) == (12, 12, 8)


def test_the_byte_budget_skips_what_does_not_fit_and_keeps_older_that_does():
    big = "x" * 30_000
    texts = ["FIRST-small", "reply-1", big + "A", "reply-2", big + "B", "reply-3", big + "C", "reply-4"]
    raw, layout = build_request(SPEC, context(entries(texts)), provider(window=200_000))
    contents = [m["content"] for m in body(raw)["messages"][1:-1]]
    # Newest first: reply-4, C, reply-3, B (60 KB so far), reply-2, A does not fit (skipped), reply-1, FIRST fit.
    assert contents == ["FIRST-small", "reply-1", "reply-2", big + "B", "reply-3", big + "C", "reply-4"]
    assert sum(len(c.encode()) for c in contents) <= HISTORY_BYTES_MAX
    assert (layout.skipped_bytes, layout.history_sent, layout.dropped_context) == (1, 7, 0)
    assert "ONLY-AUTH" in body(raw)["messages"][0]["content"]


def test_the_context_window_trim_drops_history_oldest_first_and_nothing_required():
    texts = [f"{i}:" + "y" * 3000 for i in range(8)]
    window = 4000  # tokens: 8,000 bytes less the reserve of 500 tokens
    raw, layout = build_request(SPEC, context(entries(texts)), provider(window=window))
    messages = body(raw)["messages"]
    sent = [m["content"][:2] for m in messages[1:-1]]
    assert 0 < len(sent) < 8 and sent == [f"{i}:" for i in range(8 - len(sent), 8)]  # the newest survive
    assert estimate_tokens(len(raw)) + SPEC.max_output_tokens <= window
    assert layout.dropped_context == 8 - len(sent) and layout.body_bytes == len(raw)
    assert "ONLY-AUTH" in messages[0]["content"] and messages[-1]["content"] == "CURRENT-MESSAGE"
    # One more history message's worth of room is not there: the trim stopped at the first fit.
    assert estimate_tokens(len(raw) + len(json.dumps(messages[1], separators=(",", ":"))) + 1) + 500 > window


def test_required_content_that_cannot_fit_stops_with_the_sizes():
    huge = [constraint(i, "z" * 2000) for i in range(1, 11)]  # 20 KB of constraints
    with pytest.raises(Overflow) as err:
        build_request(SPEC, context(entries(["a", "b"]), huge), provider(window=8000))
    message = str(err.value)
    assert "10 active constraints" in message and "the context window is 8,000" in message
    assert "500 reserved for the reply" in message and "nothing was sent" in message


# -- the ledger on a real SQLite file ----------------------------------------------------------


@pytest.fixture
async def store(tmp_path):
    db = await Database.open(os.path.join(tmp_path, "qledge.db"))
    yield db, SqliteMissionLedger(db)
    await db.close()


def start(run_id: str, mission_id: str | None = None, project: str = "default") -> AttemptStart:
    return AttemptStart(project_id=project, run_id=run_id, task_id="ask", task_revision=1, goal="the goal",
                        mission_id=mission_id)


async def test_versions_supersession_and_revocation(store):
    _, ledger = store
    at = await ledger.begin_attempt(start("run-1"), 1000)
    assert (at.mission_id, at.attempt) == ("run-1", 1)
    d1 = (await ledger.delegate(at, DelegateArgs(child="log-analyst", instruction="scope one", round=1, call="a",
                                                 work_items=[ItemDraft("find it", "names the step")]), 1)).constraint
    c1 = (await ledger.correct(at, CorrectArgs(child="log-analyst", text="fix one", round=2, call="b"), 2)).constraint
    change = await ledger.correct(at, CorrectArgs(child="log-analyst", text="fix two", replaces=c1.id, round=3,
                                                  call="c"), 3)
    c2 = change.constraint
    assert (c2.version, c2.replaces, change.superseded) == (2, c1.id, c1.id)
    d2 = await ledger.delegate(at, DelegateArgs(child="log-analyst", instruction="scope two", round=4, call="d"), 4)
    assert (d2.constraint.version, d2.superseded) == (2, d1.id)
    c3 = (await ledger.correct(at, CorrectArgs(child="log-analyst", text="fix three", round=5, call="e"), 5)).constraint
    await ledger.revoke(at, RevokeArgs(constraint=c3.id, round=6, call="f"), 6)
    ctx = await ledger.prepare(at, PrepareArgs(child="log-analyst", message="go", round=7, call="g"), 7)
    assert [(c.text, c.version) for c in ctx.constraints] == [("fix two", 2), ("scope two", 2)]
    assert [c.source for c in ctx.constraints] == [Source(1, 3, "c"), Source(1, 4, "d")]
    # What is superseded or revoked cannot be replaced or revoked again.
    for call in (ledger.revoke(at, RevokeArgs(constraint=c1.id, round=8, call="h"), 8),
                 ledger.correct(at, CorrectArgs(child="log-analyst", text="x", replaces=c3.id, round=8, call="h"), 8)):
        with pytest.raises(ToolError) as err:
            await call
        assert err.value.code == "conflict"
    with pytest.raises(ToolError) as err:  # a delegation is replaced by delegating again
        await ledger.correct(at, CorrectArgs(child="log-analyst", text="x", replaces=d2.constraint.id, round=8,
                                             call="h"), 8)
    assert err.value.code == "invalid_argument"
    view = await ledger.mission("default", "run-1")
    assert [(c.id, c.status, c.superseded_by) for c in view.constraints] == [
        (d1.id, "superseded", d2.constraint.id), (c1.id, "superseded", c2.id), (c2.id, "active", None),
        (d2.constraint.id, "active", None), (c3.id, "revoked", None)]


async def test_consumption_is_idempotent_and_receipts_bind_to_the_attempt(store):
    db, ledger = store
    one = await ledger.begin_attempt(start("run-1"), 1)
    first = await ledger.prepare(one, PrepareArgs(child="log-analyst", message="m-one", round=1, call="a"), 1)
    (m1,) = [m.id for m in first.pending]
    done = await ledger.commit(one, CommitArgs(child="log-analyst", request_id="q1", round=2, messages=[m1],
                                               reply="r-one"), 2)
    again = await ledger.commit(one, CommitArgs(child="log-analyst", request_id="q1", round=2, messages=[m1],
                                                reply="r-one"), 3)
    assert (done.consumed, done.repeated, again.consumed, again.repeated) == ([m1], False, [m1], True)
    # Attempt 1 leaves a message pending (its request went out, no reply came: a crash).
    crashed = await ledger.prepare(one, PrepareArgs(child="log-analyst", message="m-two", round=3, call="b"), 4)
    m2 = crashed.pending[-1].id
    two = await ledger.begin_attempt(start("run-2", "run-1"), 5)
    assert (two.mission_id, two.attempt, two.mission) == ("run-1", 2, one.mission)
    ctx = await ledger.prepare(two, PrepareArgs(child="log-analyst", message="m-three", round=1, call="a"), 6)
    assert [m.text for m in ctx.pending] == ["m-two", "m-three"]  # the crash's message is delivered now
    assert [(e.sender, e.text) for e in ctx.history] == [("parent", "m-one"), ("child", "r-one")]
    m3 = ctx.pending[-1].id
    # A stale commit naming m1 again consumes nothing of it.
    done = await ledger.commit(two, CommitArgs(child="log-analyst", request_id="q2", round=2, messages=[m1, m2, m3],
                                               reply="r-two"), 7)
    assert done.consumed == [m2, m3]
    receipts = await db.run(lambda c: c.execute(
        "SELECT message, attempt, run_id, request_id FROM agent_receipts ORDER BY message, attempt").fetchall())
    assert receipts == [(m1, 1, "run-1", "q1"), (m2, 2, "run-2", "q2"), (m3, 2, "run-2", "q2")]
    later = await ledger.prepare(two, PrepareArgs(child="log-analyst", message="m-four", round=3, call="b"), 8)
    assert [m.text for m in later.pending] == ["m-four"]
    assert [e.text for e in later.history] == ["m-one", "r-one", "m-two", "m-three", "r-two"]


async def test_children_and_missions_never_mix(store):
    _, ledger = store
    a = await ledger.begin_attempt(start("run-a"), 1)
    b = await ledger.begin_attempt(start("run-b"), 2)
    await ledger.delegate(a, DelegateArgs(child="log-analyst", instruction="A-LOGS", round=1, call="x",
                                          work_items=[ItemDraft("A-ITEM")]), 3)
    await ledger.delegate(a, DelegateArgs(child="schedule-advisor", instruction="A-SCHEDULE", round=1, call="y"), 3)
    await ledger.delegate(b, DelegateArgs(child="log-analyst", instruction="B-LOGS", round=1, call="z"), 3)
    a_logs = await ledger.prepare(a, PrepareArgs(child="log-analyst", message="A-MSG", round=1, call="x"), 4)
    a_sched = await ledger.prepare(a, PrepareArgs(child="schedule-advisor", message="A-SMSG", round=1, call="y"), 4)
    b_logs = await ledger.prepare(b, PrepareArgs(child="log-analyst", message="B-MSG", round=1, call="z"), 4)
    assert [c.text for c in a_logs.constraints] == ["A-LOGS"] and [i.text for i in a_logs.items] == ["A-ITEM"]
    assert [c.text for c in a_sched.constraints] == ["A-SCHEDULE"] and a_sched.items == []
    assert [m.text for m in a_sched.pending] == ["A-SMSG"]
    assert [c.text for c in b_logs.constraints] == ["B-LOGS"] and [m.text for m in b_logs.pending] == ["B-MSG"]
    # Ids are per mission: mission B cannot touch mission A's constraint, even by its id.
    with pytest.raises(ToolError) as err:
        await ledger.revoke(b, RevokeArgs(constraint=a_logs.constraints[0].id + 100, round=1, call="z"), 5)
    assert err.value.code == "not_found"
    assert [c.status for c in (await ledger.mission("default", "run-a")).constraints] == ["active", "active"]
    # A project sees only its own missions.
    assert await ledger.attempt_of("other", "run-a") is None and await ledger.mission("other", "run-a") is None


async def test_bounds_are_checked_inside_the_write(store):
    _, ledger = store
    at = await ledger.begin_attempt(start("run-1"), 1)
    for i in range(PENDING_MAX):
        await ledger.prepare(at, PrepareArgs(child="log-analyst", message=f"m{i}", round=1, call="a"), 2)
    with pytest.raises(ToolError) as err:
        await ledger.prepare(at, PrepareArgs(child="log-analyst", message="one too many", round=1, call="a"), 3)
    assert err.value.code == "resource_exhausted"
    for i in range(ACTIVE_CONSTRAINTS_MAX):
        await ledger.correct(at, CorrectArgs(child="log-analyst", text=f"c{i}", round=1, call="a"), 4)
    with pytest.raises(ToolError) as err:
        await ledger.correct(at, CorrectArgs(child="log-analyst", text="over", round=1, call="a"), 5)
    assert err.value.code == "resource_exhausted"
    with pytest.raises(ToolError) as err:
        await ledger.items(at, ItemsArgs(child="log-analyst", close=[10_000], round=1, call="a"), 6)
    assert err.value.code == "not_found"


async def test_a_reopened_database_has_the_same_constraints_and_sources(tmp_path):
    path = os.path.join(tmp_path, "qledge.db")
    db = await Database.open(path)
    ledger = SqliteMissionLedger(db)
    at = await ledger.begin_attempt(start("run-1"), 1)
    await ledger.delegate(at, DelegateArgs(child="log-analyst", instruction="scope", round=1, call="call_d"), 2)
    await ledger.correct(at, CorrectArgs(child="log-analyst", text="fix", round=2, call="call_c"), 3)
    before = await ledger.prepare(at, PrepareArgs(child="log-analyst", message="hi", round=3, call="q"), 4)
    await db.close()
    db = await Database.open(path)
    ledger = SqliteMissionLedger(db)
    again = await ledger.begin_attempt(start("run-1"), 9)  # bound already: the same attempt
    assert again == at
    two = await ledger.begin_attempt(start("run-2", "run-1"), 10)
    after = await ledger.prepare(two, PrepareArgs(child="log-analyst", message="hi again", round=1, call="q"), 11)
    assert after.constraints == before.constraints
    assert [(c.source.attempt, c.source.round, c.source.call) for c in after.constraints] == [
        (1, 1, "call_d"), (1, 2, "call_c")]
    await db.close()


async def test_missions_are_pruned_on_insert_with_their_ledger(store, monkeypatch):
    db, ledger = store
    monkeypatch.setattr(ledger_module, "MISSIONS_MAX", 3)
    for i in range(5):
        at = await ledger.begin_attempt(start(f"run-{i}"), 1000 + i)
        await ledger.correct(at, CorrectArgs(child="log-analyst", text=f"t{i}", round=1, call="a"), 1000 + i)
    missions = await db.run(lambda c: c.execute("SELECT id FROM agent_missions ORDER BY seq").fetchall())
    assert [m[0] for m in missions] == ["run-2", "run-3", "run-4"]
    left = await db.run(lambda c: c.execute("SELECT count(*) FROM agent_constraints").fetchone()[0])
    assert left == 3  # the pruned missions took their ledger along
    with pytest.raises(ToolError) as err:
        await ledger.begin_attempt(start("run-9", "run-0"), 2000)
    assert err.value.code == "not_found"
    # Older than 90 days, by the inserting write's clock.
    await ledger.begin_attempt(start("run-late"), 1004 + ledger_module.MISSIONS_MAX_AGE_MS + 1)
    missions = await db.run(lambda c: c.execute("SELECT id FROM agent_missions ORDER BY seq").fetchall())
    assert [m[0] for m in missions] == ["run-late"]


def test_the_shapes_refuse_what_the_bounds_refuse():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"child": "log-analyst", "text": "x" * 2001, "round": 1, "call": "a"}, CorrectArgs)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"child": "Log Analyst", "text": "x", "round": 1, "call": "a"}, CorrectArgs)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"child": "log-analyst", "message": "x", "round": 1, "call": "a b"}, PrepareArgs)


def test_the_child_fills_in_the_built_in_texts_and_refuses_a_specialist_without_any():
    from edge.airun.specialists import DEFAULTS, resolved

    built_in = resolved(SpecialistSpec(name="schedule-advisor", description=None, system=None, max_output_tokens=9))
    assert (built_in.description, built_in.system) == DEFAULTS["schedule-advisor"]
    own = resolved(SpecialistSpec(name="log-analyst", description=None, system="mine", max_output_tokens=9))
    assert (own.description, own.system) == (DEFAULTS["log-analyst"][0], "mine")
    with pytest.raises(ValueError, match="specialist 'wifi' has no description or system text"):
        resolved(SpecialistSpec(name="wifi", description="knows wireless", system=None, max_output_tokens=9))


async def test_only_a_message_this_attempt_recorded_and_no_request_carried_can_be_withdrawn(store):
    db, ledger = store
    one = await ledger.begin_attempt(start("run-1"), 1)
    left = (await ledger.prepare(one, PrepareArgs(child="log-analyst", message="left by a crash", round=1, call="a"),
                                 2)).pending[-1].id
    two = await ledger.begin_attempt(start("run-2", "run-1"), 3)
    ctx = await ledger.prepare(two, PrepareArgs(child="log-analyst", message="too long", round=1, call="b"), 4)
    mine = ctx.pending[-1].id
    other = (await ledger.prepare(two, PrepareArgs(child="schedule-advisor", message="theirs", round=1, call="c"),
                                  5)).pending[-1].id

    def withdraw(at, child, message):
        return ledger.withdraw(at, WithdrawArgs(child=child, message=message, round=1, call="w"), 6)

    assert not await withdraw(two, "log-analyst", left)  # an earlier attempt's: it may have been sent
    assert not await withdraw(two, "log-analyst", other)  # another child's
    assert await withdraw(two, "log-analyst", mine)
    assert not await withdraw(two, "log-analyst", mine)  # once
    after = await ledger.prepare(two, PrepareArgs(child="log-analyst", message="shorter", round=2, call="d"), 7)
    assert [m.text for m in after.pending] == ["left by a crash", "shorter"]
    await ledger.commit(two, CommitArgs(child="log-analyst", request_id="q1", round=3,
                                        messages=[m.id for m in after.pending], reply="r"), 8)
    assert not await withdraw(two, "log-analyst", after.pending[-1].id)  # consumed: delivered, kept
    texts = await db.run(lambda c: c.execute("SELECT text, status FROM agent_messages ORDER BY id").fetchall())
    assert texts == [("left by a crash", "consumed"), ("theirs", "pending"), ("shorter", "consumed")]
