"""`qledge ask` and `qledge agent …`: the AI operator's verbs (add an AI task, its history,
one run's evidence record, the next attempt of a mission, the mission, a check of the
provider). Ships with the AI operator (packaging/build.py `OPTIONAL["agent"]`); a build
without it says so in one line.
"""

from __future__ import annotations

import sys

import msgspec

from edge.cli import shared
from edge.cli.run import RUN_HELP, log_bytes, waited
from edge.cli.shared import EXIT_OK, EXIT_TOOL, UsageError, Verb, show, show_list
from edge.core.runs import Run

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from types import ModuleType
    from typing import TypeVar

    from edge.core.ledger import MissionView
    from edge.tools import agent as agent_tools
    from edge.transports.client import Client

    T = TypeVar("T")

AGENT_OFF = (
    "the AI operator is off; to turn it on, set [agent] enabled = true, base_url and model (and api_key_file)"
    " in the daemon's config and restart it"
)


def _agent_tools() -> ModuleType:
    """The agent's tool shapes: only builds that include the AI operator have them."""
    try:
        from edge.tools import agent
    except ImportError:
        raise UsageError("the AI operator is not included in this build") from None
    return agent


def _agent(c: Client, tool: str, args: msgspec.Struct, result: type[T]) -> T:
    """An agent tool, which only a daemon with [agent] enabled has."""
    from edge.transports.client import CallFailed

    try:
        return c.typed(tool, args, result)
    except CallFailed as exc:
        if exc.code == "invalid_argument" and exc.message == f"unknown tool {tool!r}":
            raise UsageError(AGENT_OFF) from None
        raise


class AskResult(msgspec.Struct, rename="camel"):
    run: Run
    answer: str | None  # the run's log when it succeeded


def _answer(c: Client, a: argparse.Namespace, run: Run) -> int:
    """Wait for an AI run; print its answer (its log), or why there is none."""
    final = waited(c, run.id)
    text = log_bytes(c, final.id).decode("utf-8", "replace") if final.status == "succeeded" else None
    if a.json:
        shared.json_out(AskResult(run=final, answer=text))
    elif text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        print(shared.run_line(final), file=sys.stderr)
    return EXIT_OK if final.status == "succeeded" else EXIT_TOOL


def ask(c: Client, a: argparse.Namespace) -> int:
    question = " ".join(a.question).strip()
    if not question:
        raise UsageError("ask a question, e.g. qledge ask \"why did backup fail last night?\"")
    tools = _agent_tools()
    run = _agent(c, "qledge.agent.ask", tools.AskArgs(instruction=question, profile=a.profile), Run)
    if not a.wait:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}; its answer will be its log:"
                                            f" qledge run log {r.id}"))
    if not a.json:
        print(f"run {run.id} {run.status}", file=sys.stderr, flush=True)
    return _answer(c, a, run)


def agent_add(c: Client, a: argparse.Namespace) -> int:
    from edge.core.tasks import AgentBudget, AgentInstruction, Task, TaskSpec
    from edge.tools.builtin import tasks as task_tools

    budget = AgentBudget(rounds=a.rounds, input_tokens=a.input_tokens, output_tokens=a.output_tokens,
                         cost_usd=a.cost_usd, wall_clock_s=a.wall_clock)
    given = any(getattr(budget, f) is not None for f in budget.__struct_fields__)
    spec = TaskSpec(command=AgentInstruction(instruction=a.instruction, budget=budget if given else None,
                                             profile=a.profile), overlap=a.overlap)
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=spec), Task)
    return show(a, task, lambda t: print(f"AI task {t.id} created (revision {t.revision});"
                                         f" run it with qledge run start {t.id}, or add a trigger"))


def _cost(usd: float | None) -> str:
    return "unknown" if usd is None else f"${usd:.6f}"


def agent_list(c: Client, a: argparse.Namespace) -> int:
    tools = _agent_tools()
    page = _agent(c, "qinglong.agent.history.list", tools.HistoryListArgs(limit=a.limit), tools.HistoryPage)
    return show_list(
        a, page.records, "no AI runs yet: qledge ask \"...\"",
        lambda r: [r.run_id, r.task_id, r.state + (f" ({r.budget})" if r.budget else ""), str(r.rounds),
                   f"{r.input_tokens}/{r.output_tokens}" + ("~" if r.usage_estimated else ""), _cost(r.cost_usd),
                   shared.when(r.created_at_ms)],
        ["RUN", "TASK", "STATE", "ROUNDS", "TOKENS IN/OUT", "COST", "CREATED"],
    )


def _record_fields(r: agent_tools.HistoryDetailView) -> None:
    shared.fields([
        ("run", r.run_id), ("task", f"{r.task_id} (revision {r.task_revision})"),
        ("state", r.state + (f" ({r.budget})" if r.budget else "")), ("error", r.error_code), ("why", r.error),
        ("provider", f"{r.model} at {r.provider}"), ("instruction", r.instruction),
        ("usage", f"{r.input_tokens} in, {r.output_tokens} out" + (" (estimated)" if r.usage_estimated else "")),
        ("cost", _cost(r.cost_usd)), ("tools", ", ".join(t for rnd in r.per_round for t in rnd.tools) or None),
        ("answer", r.answer_summary), ("created", shared.when(r.created_at_ms)),
        ("finished", shared.when(r.finished_at_ms)), ("position", f"{r.position_before} -> {r.position_after}"),
    ])
    for rnd in r.per_round:
        who = ""
        if rnd.specialist is not None:
            s = rnd.specialist
            who = (f" specialist {s.child} ({s.constraints} constraints, history {s.history_sent} sent,"
                   f" {s.history_trimmed} not)")
        print(f"  round {rnd.round}:{who} {rnd.model}, {rnd.input_tokens}/{rnd.output_tokens} tokens,"
              f" {rnd.response_chars} chars" + (f", {', '.join(rnd.tools)}" if rnd.tools else "")
              + (f": {rnd.plan}" if rnd.plan else ""))


def _run_id(c: Client, reference: str) -> str:
    """The run a person named (an id, a unique prefix of one, TASK:latest, TASK:latest-failed)
    as its id. A whole id the daemon keeps no run for stays as it is: an AI run's record and
    mission may outlive the run."""
    from edge.tools.builtin import runs as run_tools
    from edge.transports.client import CallFailed

    try:
        return c.typed("qledge.run.get", run_tools.RunId(run_id=reference), Run).id
    except CallFailed as exc:
        if exc.code == "not_found" and ":" not in reference:
            return reference
        raise


def agent_get(c: Client, a: argparse.Namespace) -> int:
    from edge.transports.client import CallFailed

    tools = _agent_tools()
    record: agent_tools.HistoryDetailView | None = None
    after = 0
    run_id = _run_id(c, a.run)
    while True:  # the record comes with its rounds a page at a time
        found = _agent(c, "qinglong.agent.history.get", tools.HistoryGetArgs(run_id=run_id, after_round=after),
                       tools.HistoryGetResult)
        if not isinstance(found.record, tools.HistoryDetailView):
            raise CallFailed("not_found", f"no evidence record for run {run_id}")
        if record is None:
            record = found.record
        else:
            record.per_round += found.record.per_round
        if not isinstance(found.next_after_round, int):
            return show(a, record, _record_fields)
        after = found.next_after_round


def agent_retry(c: Client, a: argparse.Namespace) -> int:
    _agent_tools()
    from edge.tools import missions

    retried = _agent(c, "qledge.agent.retry", missions.RetryArgs(run_id=_run_id(c, a.run)), missions.Retried)
    if not a.wait:
        return show(a, retried, lambda r: print(f"run {r.run.id} {r.run.status}: attempt {r.attempt} of mission"
                                                f" {r.mission_id}"))
    if not a.json:
        print(f"run {retried.run.id} {retried.run.status}: attempt {retried.attempt} of mission {retried.mission_id}",
              file=sys.stderr, flush=True)
    return _answer(c, a, retried.run)


def _mission_fields(m: MissionView) -> None:
    shared.fields([
        ("mission", m.mission_id), ("task", f"{m.task_id} (revision {m.task_revision})"), ("goal", m.goal),
        ("attempts", ", ".join(f"{n}: {run}" for n, run in enumerate(m.attempts, 1))),
        ("messages", f"{m.messages_consumed} consumed, {m.messages_pending} pending; {m.replies} replies"),
        ("created", shared.when(m.created_at_ms)),
    ])
    for k in m.constraints:
        by = f" by c{k.superseded_by}" if k.superseded_by is not None else ""
        print(f"  c{k.id} {k.child} {k.kind} v{k.version} {k.status}{by} (attempt {k.source.attempt} round"
              f" {k.source.round}): {k.text}")
    for w in m.items:
        print(f"  w{w.id} {w.child} {w.status}: {w.text}" + (f" (acceptance: {w.acceptance})" if w.acceptance else ""))


def agent_mission(c: Client, a: argparse.Namespace) -> int:
    _agent_tools()
    from edge.core.ledger import MissionView
    from edge.tools import missions

    view = _agent(c, "qledge.agent.mission", missions.MissionArgs(run_id=_run_id(c, a.run)), MissionView)
    return show(a, view, _mission_fields)


CHECK_PREFIX = "qledge agent check: "


class CheckStep(msgspec.Struct):
    status: str  # ok | failed
    step: str  # what was checked, or the failure's class (unreachable, tls, key, not_found, …)
    text: str


class CheckResult(msgspec.Struct, rename="camel"):
    run_id: str
    passed: bool
    failure: str | None  # the failed step's class
    error_code: str | None
    hint: str | None  # what to change
    steps: list[CheckStep]
    recorded: bool  # its evidence record is in the history (qledge agent get RUN)


def _check_result(run: Run, log: str, recorded: bool) -> CheckResult:
    steps: list[CheckStep] = []
    hint = None
    for line in log.splitlines():
        if not line.startswith(CHECK_PREFIX):
            continue
        rest = line[len(CHECK_PREFIX):]
        if rest.startswith("to fix: "):
            hint = rest[len("to fix: "):]
            continue
        status, _, rest = rest.partition(": ")
        step, _, text = rest.partition(": ")
        if status in ("ok", "failed") and text:
            steps.append(CheckStep(status=status, step=step, text=text))
    passed = run.status == "succeeded"
    failed = next((s for s in steps if s.status == "failed"), None)
    if not passed and failed is None:  # the child never said (killed, timed out, not started)
        failed = CheckStep(status="failed", step=run.error_code or run.status, text=run.error_summary or run.status)
        steps.append(failed)
    return CheckResult(run_id=run.id, passed=passed, failure=None if passed or failed is None else failed.step,
                       error_code=run.error_code, hint=hint, steps=steps, recorded=recorded)


def _check_lines(r: CheckResult) -> None:
    for step in r.steps:
        print(f"{'ok' if step.status == 'ok' else 'FAILED'}  {step.step}: {step.text}")
    if r.hint:
        print(f"to fix: {r.hint}")
    print("passed" if r.passed else f"failed ({r.failure}): run {r.run_id}")
    if r.recorded:
        print(f"recorded: qledge agent get {r.run_id}")
    else:
        print("not recorded: its evidence record could not be written (the daemon's log says why)")


def agent_check(c: Client, a: argparse.Namespace) -> int:
    tools = _agent_tools()
    run = _agent(c, "qledge.agent.check", tools.CheckArgs(profile=a.profile), Run)
    if not a.json:
        print(f"run {run.id} {run.status}: one request to the provider", file=sys.stderr, flush=True)
    final = waited(c, run.id)
    log = log_bytes(c, final.id).decode("utf-8", "replace")
    found = c.typed("qinglong.agent.history.get", tools.HistoryGetArgs(run_id=final.id), tools.HistoryGetResult)
    result = _check_result(final, log, found.found)
    show(a, result, _check_lines)
    return EXIT_OK if result.passed else EXIT_TOOL


# -- argparse ---------------------------------------------------------------------------


def _profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="NAME", help="an [agent.profiles.NAME] of the daemon's config")


def _ask_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("question", nargs="+", metavar="QUESTION")
    p.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    _profile(p)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="task id (letters, digits, . _ -)")
    p.add_argument("instruction", help="what the operator is to do (at most 2000 characters)")
    _profile(p)
    p.add_argument("--overlap", choices=("forbid", "allow", "replace"), default="forbid",
                   help="what a new run does while one is active (default forbid)")
    p.add_argument("--rounds", type=int, metavar="N", help="at most N model rounds (never above the config's)")
    p.add_argument("--input-tokens", type=int, metavar="N", help="input token budget")
    p.add_argument("--output-tokens", type=int, metavar="N", help="output token budget")
    p.add_argument("--cost-usd", type=float, metavar="USD", help="estimated cost budget")
    p.add_argument("--wall-clock", type=int, metavar="S", help="wall-clock budget in seconds")


def _list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=20, choices=range(1, 65), metavar="N", help="1..64 (default 20)")


def _run_named(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help=RUN_HELP)


def _retry_options(p: argparse.ArgumentParser) -> None:
    _run_named(p)
    p.add_argument("--wait", action="store_true", help="wait for the answer and print it")


VERBS = {
    "ask": Verb("ask", ask, options=_ask_options),
    "agent": (
        Verb("add", agent_add, 'add an AI task: qledge agent add NAME "instruction"', _add_options),
        Verb("list", agent_list, "the AI operator's past runs (its evidence history), newest first", _list_options),
        Verb("get", agent_get, "one AI run's evidence record", _run_named),
        Verb("retry", agent_retry, "start the next attempt of an AI run's mission (its ledger carries over)",
             _retry_options),
        Verb("mission", agent_mission, "an AI run's mission: attempts, specialists' constraints and work items",
             _run_named),
        Verb("check", agent_check, "check the provider with one request that exercises tool calling, and say"
             " what to change", _profile),
    ),
}
