"""One function per CLI verb: call tools, print results, return an exit code.

Arguments and results are the tools' own Structs (edge.tools.builtin, edge.core), the
same types the daemon decodes and encodes, so every field read here is checked by mypy.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeVar

import msgspec

from edge.cli import render
from edge.cli.client import CallFailed, Client
from edge.core.auth import Credential, SecretInfo
from edge.core.runs import Run
from edge.core.tasks import (
    DEFAULT_TIMEOUT_MS,
    AgentBudget,
    AgentInstruction,
    ArgvCommand,
    Command,
    SecretRef,
    ShellCommand,
    Task,
    TaskSpec,
)
from edge.tools.builtin import credentials as credential_tools
from edge.tools.builtin import runs as run_tools
from edge.tools.builtin import secrets as secret_tools
from edge.tools.builtin import status as status_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.definition import Empty

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from types import ModuleType

    from edge.core.ledger import MissionView
    from edge.tools import agent as agent_tools

OK, TOOL_ERROR = 0, 1

T = TypeVar("T")


class UsageError(Exception):
    pass


def _env(pairs: list[str], secret_pairs: list[str]) -> dict[str, str | SecretRef]:
    env: dict[str, str | SecretRef] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    for pair in secret_pairs:
        key, sep, name = pair.partition("=")
        if not sep or not key or not name:
            raise UsageError(f"--secret-env expects KEY=SECRET_NAME, got {pair!r}")
        env[key] = SecretRef(secret=name)
    return env


def task_spec(a: argparse.Namespace) -> TaskSpec:
    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    command: Command
    if a.shell:
        command = ShellCommand(command=" ".join(a.command))
    else:
        command = ArgvCommand(file=a.command[0], args=a.command[1:])
    return TaskSpec(
        command=command, env=_env(a.env, a.secret_env), overlap=a.overlap, working_dir=a.cwd or None,
        timeout_ms=DEFAULT_TIMEOUT_MS if a.timeout is None else int(a.timeout * 1000), log_cap_bytes=a.log_cap,
    )


def show(a: argparse.Namespace, value: T, human: Callable[[T], None]) -> int:
    if a.json:
        render.json_out(value)
    else:
        human(value)
    return OK


def all_pages(page: Callable[[str | None], tuple[list[T], str | None]]) -> list[T]:
    """Every item of a keyset-paged list tool: `page(after)` is one page's items and its `next`."""
    items: list[T] = []
    after: str | None = None
    while True:
        found, after = page(after)
        items += found
        if not after:
            return items


def show_list(a: argparse.Namespace, items: list[T], empty: str, row: Callable[[T], list[str]],
              headers: list[str]) -> int:
    if a.json:
        render.json_out(items)
    elif not items:
        print(empty)
    else:
        render.table([row(item) for item in items], headers)
    return OK


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _task_fields(t: Task) -> None:
    spec = t.spec
    if isinstance(spec.command, AgentInstruction):
        _agent_task_fields(t, spec.command)
        return
    render.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision),
        ("enabled", _yes(t.enabled)), ("command", render.command_text(spec)),
        ("kind", t.kind), ("timeout", f"{spec.timeout_ms / 1000:g}s"),
        ("overlap", spec.overlap), ("working dir", spec.working_dir),
        ("env", ", ".join(sorted(spec.env)) or None), ("digest", t.content_digest),
        ("updated", render.when(t.updated_at_ms)),
    ])


def task_add(c: Client, a: argparse.Namespace) -> int:
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=task_spec(a)), Task)
    return show(a, task, lambda t: print(f"task {t.id} created (revision {t.revision})"))


def _task_page(c: Client, after: str | None) -> tuple[list[Task], str | None]:
    page = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
    return page.tasks, page.next


def task_list(c: Client, a: argparse.Namespace) -> int:
    return show_list(
        a, all_pages(lambda after: _task_page(c, after)), "no tasks yet: qledge task add NAME -- COMMAND",
        lambda t: [t.id, str(t.revision), _yes(t.enabled), render.command_text(t.spec)],
        ["TASK", "REV", "ENABLED", "COMMAND"],
    )


def task_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task), _task_fields)


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    task = c.typed(tool, task_tools.TaskRef(task_id=a.name), Task)
    return show(a, task, lambda t: print(f"task {t.id} {a.action}d (revision {t.revision})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.typed("qledge.task.delete", task_tools.TaskRef(task_id=a.name), task_tools.Deleted)
    return show(a, done, lambda d: print(f"task {d.task_id} deleted with {d.runs_deleted} runs"))


def _waited(c: Client, run_id: str) -> Run:
    while True:
        waited = c.typed("qledge.run.wait", run_tools.WaitArgs(run_id=run_id, timeout_ms=30_000), run_tools.WaitResult)
        if waited.done:
            return waited.run


def run_start(c: Client, a: argparse.Namespace) -> int:
    run = c.typed("qledge.run.start", run_tools.StartArgs(task_id=a.task), Run)
    if not a.wait:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}"))
    if not a.json:
        print(f"run {run.id} {run.status}", flush=True)
    final = _waited(c, run.id)
    show(a, final, lambda r: print(render.run_line(r)))
    return OK if final.status == "succeeded" else TOOL_ERROR


def run_list(c: Client, a: argparse.Namespace) -> int:
    page = c.typed("qledge.run.list", run_tools.ListArgs(task_id=a.task or None, limit=a.limit), run_tools.RunPage)
    runs = page.runs
    if a.json:
        render.json_out(runs)
    elif not runs:
        print("no runs")
    else:
        render.table(
            [[r.id, r.task_id, r.status, r.origin, render.when(r.created_at_ms),
              render.duration(r.started_at_ms, r.finished_at_ms),
              "-" if r.exit_code is None else str(r.exit_code)] for r in runs],
            ["RUN", "TASK", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
        )
    return OK


def _run_fields(r: Run) -> None:
    render.fields([
        ("run", r.id), ("task", f"{r.task_id} (revision {r.task_revision})"), ("status", r.status),
        ("origin", r.origin), ("trigger", r.trigger_id), ("created", render.when(r.created_at_ms)),
        ("started", render.when(r.started_at_ms)), ("finished", render.when(r.finished_at_ms)),
        ("took", render.duration(r.started_at_ms, r.finished_at_ms)), ("exit code", r.exit_code),
        ("error", r.error_code), ("summary", r.error_summary),
        ("log", f"{r.log_bytes} bytes" + (" (truncated)" if r.log_truncated else "")
         + (f", dropped {render.when(r.log_dropped_at_ms)} (log quota)" if r.log_dropped_at_ms else "")),
    ])


def run_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.run.get", run_tools.RunId(run_id=a.run), Run), _run_fields)


def _log(c: Client, run_id: str) -> bytes:
    data = bytearray()
    while True:
        chunk = c.typed("qledge.run.log.read", run_tools.LogArgs(run_id=run_id, offset=len(data)), run_tools.LogChunk)
        data += chunk.data
        if chunk.eof:
            return bytes(data)


def run_log(c: Client, a: argparse.Namespace) -> int:
    sys.stdout.buffer.write(_log(c, a.run))
    sys.stdout.buffer.flush()
    return OK


def run_cancel(c: Client, a: argparse.Namespace) -> int:
    cancelled = c.typed("qledge.run.cancel", run_tools.RunId(run_id=a.run), Run)
    return show(a, cancelled, lambda r: print(render.run_line(r)))


def token_create(c: Client, a: argparse.Namespace) -> int:
    args = credential_tools.CreateArgs(role=a.role, name=a.name or None, permissions=a.permission or None)
    created = c.typed("qledge.credential.create", args, credential_tools.Created)

    def human(v: credential_tools.Created) -> None:
        print(v.token)
        print(f"credential {v.credential.id} ({v.credential.role}): store this token now;"
              " it cannot be shown again", file=sys.stderr)

    return show(a, created, human)


def _credential_state(x: Credential) -> str:
    return "revoked " + render.when(x.revoked_at_ms) if x.revoked_at_ms else "active"


def token_list(c: Client, a: argparse.Namespace) -> int:
    creds = c.typed("qledge.credential.list", Empty(), credential_tools.CredentialList).credentials
    if a.json:
        render.json_out(creds)
    elif not creds:
        print("no credentials")
    else:
        render.table(
            [[x.id, x.name, x.role, render.when(x.created_at_ms), _credential_state(x)] for x in creds],
            ["ID", "NAME", "ROLE", "CREATED", "STATE"],
        )
    return OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    revoked = c.typed("qledge.credential.revoke", credential_tools.RevokeArgs(id=a.id), Credential)
    return show(a, revoked, lambda x: print(f"credential {x.id} revoked"))


def _read_secret(name: str) -> str:
    """From a prompt on a terminal, else all of stdin minus one trailing newline."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value for secret {name}: ")
        if value != getpass.getpass("again: "):
            raise UsageError("the two values differ; nothing was stored")
    else:
        value = sys.stdin.read()
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise UsageError("empty value; nothing was stored")
    return value


def secret_set(c: Client, a: argparse.Namespace) -> int:
    info = c.typed("qledge.secret.set", secret_tools.SetArgs(name=a.name, value=_read_secret(a.name)), SecretInfo)
    return show(a, info, lambda s: print(f"secret {s.name} stored"))


def secret_list(c: Client, a: argparse.Namespace) -> int:
    found = c.typed("qledge.secret.list", Empty(), secret_tools.SecretList).secrets
    if a.json:
        render.json_out(found)
    elif not found:
        print("no secrets")
    else:
        render.table([[s.name, render.when(s.created_at_ms), render.when(s.updated_at_ms)] for s in found],
                     ["NAME", "CREATED", "UPDATED"])
    return OK


def secret_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.typed("qledge.secret.delete", secret_tools.NameArgs(name=a.name), secret_tools.Deleted)
    return show(a, done, lambda d: print(f"secret {d.name} deleted"))


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _status_fields(s: status_tools.Status) -> None:
    counts = s.counts
    render.fields([
        ("qledge", f"{s.version} (pid {s.pid}, up {s.uptime_s:.0f}s)"),
        ("loop", s.loop + (" (ssl loaded)" if s.ssl_loaded else " (ssl not loaded)")),
        ("memory", f"{_mib(s.rss_bytes)} RSS, {_mib(s.hwm_bytes)} peak, {_mib(s.rss_anon_bytes)} anon"),
        ("modules", s.module_count), ("database", f"{s.db_path} ({_mib(s.db_bytes)})"),
        ("project", s.project),
        ("tasks", f"{counts.tasks} tasks, {counts.triggers} triggers, {counts.credentials} credentials"),
        ("runs", f"{counts.runs} stored, {counts.active_runs} active"),
        *sorted(s.extra.items()),
    ])


def status(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status), _status_fields)


# -- the AI operator ---------------------------------------------------------------------

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
    try:
        return c.typed(tool, args, result)
    except CallFailed as exc:
        if exc.code == "invalid_argument" and exc.message == f"unknown tool {tool!r}":
            raise UsageError(AGENT_OFF) from None
        raise


class AskResult(msgspec.Struct, rename="camel"):
    run: Run
    answer: str | None  # the run's log when it succeeded


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
    final = _waited(c, run.id)
    text = _log(c, final.id).decode("utf-8", "replace") if final.status == "succeeded" else None
    if a.json:
        render.json_out(AskResult(run=final, answer=text))
    elif text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        print(render.run_line(final), file=sys.stderr)
    return OK if final.status == "succeeded" else TOOL_ERROR


def agent_add(c: Client, a: argparse.Namespace) -> int:
    budget = AgentBudget(rounds=a.rounds, input_tokens=a.input_tokens, output_tokens=a.output_tokens,
                         cost_usd=a.cost_usd, wall_clock_s=a.wall_clock)
    given = any(getattr(budget, f) is not None for f in budget.__struct_fields__)
    spec = TaskSpec(command=AgentInstruction(instruction=a.instruction, budget=budget if given else None,
                                             profile=a.profile), overlap=a.overlap)
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=spec), Task)
    return show(a, task, lambda t: print(f"AI task {t.id} created (revision {t.revision});"
                                         f" run it with qledge run start {t.id}, or add a trigger"))


def _agent_task_fields(t: Task, command: AgentInstruction) -> None:
    budget = command.budget
    overrides = ", ".join(f"{k} {getattr(budget, k):g}" for k in AgentBudget.__struct_fields__
                          if budget is not None and getattr(budget, k) is not None)
    render.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision), ("enabled", _yes(t.enabled)),
        ("kind", "agent (qinglong/agent@v1)"), ("instruction", command.instruction),
        ("profile", command.profile), ("budget", overrides or "the configured defaults"),
        ("overlap", t.spec.overlap), ("digest", t.content_digest), ("updated", render.when(t.updated_at_ms)),
    ])


def _cost(usd: float | None) -> str:
    return "unknown" if usd is None else f"${usd:.6f}"


def agent_list(c: Client, a: argparse.Namespace) -> int:
    tools = _agent_tools()
    page = _agent(c, "qinglong.agent.history.list", tools.HistoryListArgs(limit=a.limit), tools.HistoryPage)
    return show_list(
        a, page.records, "no AI runs yet: qledge ask \"...\"",
        lambda r: [r.run_id, r.task_id, r.state + (f" ({r.budget})" if r.budget else ""), str(r.rounds),
                   f"{r.input_tokens}/{r.output_tokens}" + ("~" if r.usage_estimated else ""), _cost(r.cost_usd),
                   render.when(r.created_at_ms)],
        ["RUN", "TASK", "STATE", "ROUNDS", "TOKENS IN/OUT", "COST", "CREATED"],
    )


def _record_fields(r: agent_tools.HistoryDetailView) -> None:
    render.fields([
        ("run", r.run_id), ("task", f"{r.task_id} (revision {r.task_revision})"),
        ("state", r.state + (f" ({r.budget})" if r.budget else "")), ("error", r.error_code), ("why", r.error),
        ("provider", f"{r.model} at {r.provider}"), ("instruction", r.instruction),
        ("usage", f"{r.input_tokens} in, {r.output_tokens} out" + (" (estimated)" if r.usage_estimated else "")),
        ("cost", _cost(r.cost_usd)), ("tools", ", ".join(t for rnd in r.per_round for t in rnd.tools) or None),
        ("answer", r.answer_summary), ("created", render.when(r.created_at_ms)),
        ("finished", render.when(r.finished_at_ms)), ("position", f"{r.position_before} -> {r.position_after}"),
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


def agent_get(c: Client, a: argparse.Namespace) -> int:
    tools = _agent_tools()
    record: agent_tools.HistoryDetailView | None = None
    after = 0
    while True:  # the record comes with its rounds a page at a time
        found = _agent(c, "qinglong.agent.history.get", tools.HistoryGetArgs(run_id=a.run, after_round=after),
                       tools.HistoryGetResult)
        if not isinstance(found.record, tools.HistoryDetailView):
            raise CallFailed("not_found", f"no evidence record for run {a.run}")
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

    retried = _agent(c, "qledge.agent.retry", missions.RetryArgs(run_id=a.run), missions.Retried)
    if not a.wait:
        return show(a, retried, lambda r: print(f"run {r.run.id} {r.run.status}: attempt {r.attempt} of mission"
                                                f" {r.mission_id}"))
    if not a.json:
        print(f"run {retried.run.id} {retried.run.status}: attempt {retried.attempt} of mission {retried.mission_id}",
              file=sys.stderr, flush=True)
    final = _waited(c, retried.run.id)
    text = _log(c, final.id).decode("utf-8", "replace") if final.status == "succeeded" else None
    if a.json:
        render.json_out(AskResult(run=final, answer=text))
    elif text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        print(render.run_line(final), file=sys.stderr)
    return OK if final.status == "succeeded" else TOOL_ERROR


def _mission_fields(m: MissionView) -> None:
    render.fields([
        ("mission", m.mission_id), ("task", f"{m.task_id} (revision {m.task_revision})"), ("goal", m.goal),
        ("attempts", ", ".join(f"{n}: {run}" for n, run in enumerate(m.attempts, 1))),
        ("messages", f"{m.messages_consumed} consumed, {m.messages_pending} pending; {m.replies} replies"),
        ("created", render.when(m.created_at_ms)),
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

    view = _agent(c, "qledge.agent.mission", missions.MissionArgs(run_id=a.run), MissionView)
    return show(a, view, _mission_fields)


def call(c: Client, a: argparse.Namespace) -> int:
    """Untyped on purpose: any tool, any JSON args, whatever JSON the tool returned."""
    try:
        args = msgspec.json.decode(a.args) if a.args else {}
    except msgspec.DecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    render.json_out(c.call(a.tool, args))
    return OK
