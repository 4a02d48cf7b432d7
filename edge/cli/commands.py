"""One function per CLI verb: call tools, print results, return an exit code.

Arguments and results are the tools' own Structs (edge.tools.builtin, edge.core), the
same types the daemon decodes and encodes, so every field read here is checked by mypy.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeVar

import msgspec

from edge.cli import edit, render
from edge.cli.client import CallFailed, Client, UsageError
from edge.core.auth import Credential, SecretInfo
from edge.core.runs import Run, RunDefaults
from edge.core.tasks import (
    DEFAULT_TIMEOUT_MS,
    AgentBudget,
    AgentInstruction,
    ArgvCommand,
    Command,
    NotifyRule,
    RetryPolicy,
    SecretRef,
    ShellCommand,
    Task,
    TaskSpec,
)
from edge.tools.builtin import backup as backup_tools
from edge.tools.builtin import credentials as credential_tools
from edge.tools.builtin import runs as run_tools
from edge.tools.builtin import credentials as secret_tools
from edge.tools.builtin import status as status_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.definition import Empty

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from types import ModuleType

    from edge.core.ledger import MissionView
    from edge.tools import agent as agent_tools

    from edge.tools.ai.projections import TaskView

OK, TOOL_ERROR = 0, 1

T = TypeVar("T")


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


env_pairs = _env  # the --env and --secret-env pairs, for `task update` too


def shell_command(a: argparse.Namespace) -> Command:
    """The command after `--`: argv words, or with --shell the one shell command."""
    if a.shell:
        # Joining words would re-split them in the shell: `a b` and `c;echo x` must not become
        # `a b c;echo x`. The shell command is one argument, quoted as the shell reads it.
        if len(a.command) != 1:
            raise UsageError(f"--shell takes exactly one argument after `--`, the shell command, but got"
                             f" {len(a.command)}: quote it as one, e.g. --shell -- 'echo a; echo b'")
        return ShellCommand(command=a.command[0])
    return ArgvCommand(file=a.command[0], args=a.command[1:])


def task_spec(a: argparse.Namespace) -> TaskSpec:
    """A new task's spec from the flags of `task add` (`task update` takes its command from
    here too, so both follow the same rules)."""
    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    edit.check_task_flags(a)
    command = shell_command(a)
    try:
        spec = TaskSpec(
            command=command, env=_env(a.env, a.secret_env), overlap=a.overlap or "forbid", working_dir=a.cwd or None,
            timeout_ms=DEFAULT_TIMEOUT_MS if a.timeout is None else int(a.timeout * 1000), log_cap_bytes=a.log_cap,
            user=a.user or None, group=a.group or None, retry=edit.retry_policy(a, None),
            notify=edit.notify_rules(a, None),
        )
    except ValueError as exc:  # TaskSpec's own checks (e.g. a QLEDGE_ variable)
        raise UsageError(str(exc)) from None
    try:  # the daemon checks this too; here the message can name the flag
        return msgspec.convert(msgspec.to_builtins(spec), TaskSpec)
    except msgspec.ValidationError as exc:
        raise UsageError(f"task spec: {exc}") from None


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


def _task_fields(t: Task, defaults: RunDefaults | None) -> None:
    spec = t.spec
    if isinstance(spec.command, AgentInstruction):
        _agent_task_fields(t, spec.command)
        return
    cap = spec.log_cap_bytes
    cwd = spec.working_dir
    render.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision),
        ("enabled", _yes(t.enabled)), ("command", render.command_text(spec)),
        ("kind", t.kind), ("timeout", render.span(spec.timeout_ms / 1000)),
        ("overlap", spec.overlap), ("user", _user(t)),
        ("working dir", cwd if cwd else f"{defaults.work_dir} (the default)" if defaults else "the daemon's default"),
        ("log cap", render.size(cap) if cap else f"{render.size(defaults.log_cap_bytes)} (the default)"
         if defaults else "the daemon's default"),
        ("retries", _retry_text(spec.retry)), ("notify", _notify_text(spec.notify)),
        ("env", ", ".join(sorted(spec.env)) or None), ("digest", t.content_digest),
        ("created", render.when(t.created_at_ms)), ("updated", render.when(t.updated_at_ms)),
    ])


def _retry_text(policy: RetryPolicy | None) -> str | None:
    if policy is None:
        return None
    text = f"{policy.count} after {policy.delay_s:g}s"
    if policy.backoff != 1:
        text += f", ×{policy.backoff:g} each time"
    return text + (f", at most {policy.max_delay_s:g}s" if policy.max_delay_s is not None else "")


def _notify_text(rules: list[NotifyRule] | None) -> str | None:
    if rules is None:
        return None  # the project's rules
    return "; ".join(f"{','.join(r.on)} → {','.join(r.channels)}" for r in rules) or "none"


def _user(t: Task) -> str:
    spec = t.spec
    who = spec.user or "the daemon's user"
    who += f" (group {spec.group})" if spec.group else ""
    return who + (", written with task.privileged" if t.privileged else "")


def task_add(c: Client, a: argparse.Namespace) -> int:
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=task_spec(a)), Task)
    return show(a, task, lambda t: print(f"task {t.id} created (revision {t.revision})"))


def _task_page(c: Client, after: str | None) -> tuple[list[Task], str | None]:
    page = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
    return page.tasks, page.next


# A viewer holds task.read and trigger.read, not .inspect: it is shown the low-sensitivity
# projections (no command, environment, cron expression), through the tools it may call.

def _head_page(c: Client, after: str | None) -> tuple[list[TaskView], str | None]:
    from edge.tools.ai.projections import TaskCursor, TaskListArgs, TaskPage

    page = c.typed("qinglong.task.list", TaskListArgs(after=TaskCursor(task_id=after) if after else None, limit=64),
                   TaskPage)
    return page.tasks, page.next.task_id if isinstance(page.next, TaskCursor) else None


def task_list(c: Client, a: argparse.Namespace) -> int:
    empty = "no tasks yet: qledge task add NAME -- COMMAND"
    if not c.may_call("qledge.task.list"):
        return show_list(
            a, all_pages(lambda after: _head_page(c, after)), empty,
            lambda t: [t.task_id, str(t.revision), _yes(t.enabled), t.kind, render.when(t.updated_at_ms)],
            ["TASK", "REV", "ENABLED", "KIND", "UPDATED"],
        )
    return show_list(
        a, all_pages(lambda after: _task_page(c, after)), empty,
        lambda t: [t.id, str(t.revision), _yes(t.enabled), render.command_text(t.spec)],
        ["TASK", "REV", "ENABLED", "COMMAND"],
    )


def _defaults(c: Client) -> RunDefaults | None:
    return c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status).defaults


def task_get(c: Client, a: argparse.Namespace) -> int:
    if not c.may_call("qledge.task.get"):
        from edge.tools.ai.projections import TaskDetailView, TaskGetArgs, TaskGetResult

        found = c.typed("qinglong.task.get", TaskGetArgs(task_id=a.name), TaskGetResult)
        if not isinstance(found.task, TaskDetailView):
            raise CallFailed("not_found", f"task {a.name!r} not found")
        return show(a, found.task, lambda t: render.fields([
            ("task", t.task_id), ("name", t.name), ("revision", t.revision), ("enabled", _yes(t.enabled)),
            ("kind", t.kind), ("digest", t.content_digest), ("created", render.when(t.created_at_ms)),
            ("updated", render.when(t.updated_at_ms)),
            ("command", "not shown: it needs task.inspect"),
        ]))
    task = c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task)
    if a.json:
        return show(a, task, lambda t: None)
    defaults = _defaults(c)
    return show(a, task, lambda t: _task_fields(t, defaults))


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    task = c.typed(tool, task_tools.TaskRef(task_id=a.name), Task)
    return show(a, task, lambda t: print(f"task {t.id} {a.action}d (revision {t.revision})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    args = task_tools.DeleteArgs(task_id=a.name, with_triggers=a.with_triggers)
    try:
        done = c.typed("qledge.task.delete", args, task_tools.Deleted)
    except CallFailed as exc:
        if exc.code == "conflict" and "would be deleted with it" in exc.message:
            raise CallFailed(exc.code, f"{exc.message}: delete them first, or run"
                                       f" `qledge task rm {a.name} --with-triggers`") from None
        raise
    return show(a, done, lambda d: print(f"task {d.task_id} deleted with its {d.runs_deleted} finished runs"
                                         + (" and its triggers" if a.with_triggers else "")))


def _waited(c: Client, run_id: str) -> Run:
    while True:
        waited = c.typed("qledge.run.wait", run_tools.WaitArgs(run_id=run_id, timeout_ms=30_000), run_tools.WaitResult)
        if waited.done:
            return waited.run


def run_start(c: Client, a: argparse.Namespace) -> int:
    run = c.typed("qledge.run.start", run_tools.StartArgs(task_id=a.task), Run)
    if not a.wait and not a.follow:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}"))
    # Following: the output goes to stdout, the run's own lines to stderr.
    status_out = sys.stderr if a.follow else sys.stdout
    if not a.json:
        print(f"run {run.id} {run.status}", file=status_out, flush=True)
    if a.follow:
        from edge.cli.history import follow

        follow(c, run.id)
    final = _waited(c, run.id)
    if a.json:
        render.json_out(final)
    else:
        print(render.run_line(final), file=status_out)
    return OK if final.status == "succeeded" else TOOL_ERROR


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
    hidden = 0 if a.all else sum(1 for x in creds if x.revoked_at_ms)
    if not a.all:
        creds = [x for x in creds if not x.revoked_at_ms]
    if a.json:
        render.json_out(creds)
        return OK
    if creds:
        render.table(
            [[x.id, x.name, x.role, ",".join(x.permissions) if x.permissions else "-", render.when(x.created_at_ms),
              _credential_state(x)] for x in creds],
            ["ID", "NAME", "ROLE", "PERMISSIONS", "CREATED", "STATE"],
        )
    elif not hidden:
        print("no credentials")
    if hidden:
        print(f"({hidden} revoked not shown: qledge token list --all)")
    return OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    # The daemon takes a whole token for its id and never says it back; neither does this.
    revoked = c.typed("qledge.credential.revoke", credential_tools.RevokeArgs(id=a.id), Credential)
    return show(a, revoked, lambda x: print(f"credential {x.id} ({x.name}) revoked"))


def _read_secret(name: str) -> str:
    """From a prompt on a terminal, else all of stdin minus one trailing newline."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value for secret {name}: ")
        if value != getpass.getpass("again: "):
            raise UsageError("the two values differ; nothing was stored")
    else:
        raw = sys.stdin.buffer.read()
        try:
            value = raw.decode()
        except UnicodeDecodeError as exc:
            raise UsageError(f"the value on stdin is not UTF-8 text (byte {exc.start}); nothing was stored"
                             " (encode binary values, e.g. base64)") from None
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


def _status_fields(s: status_tools.Status) -> None:
    counts = s.counts
    render.fields([
        ("qledge", f"{s.version} (pid {s.pid}, up {render.duration(0, int(s.uptime_s * 1000))})"),
        ("loop", s.loop + (" (ssl loaded)" if s.ssl_loaded else " (ssl not loaded)")),
        ("memory", f"{render.size(s.rss_bytes)} RSS, {render.size(s.hwm_bytes)} peak,"
                   f" {render.size(s.rss_anon_bytes)} anon"),
        ("modules", s.module_count), ("database", f"{s.db_path} ({render.size(s.db_bytes)})"),
        ("project", s.project),
        ("tasks", f"{counts.tasks} tasks, {counts.triggers} triggers, {counts.credentials} credentials"),
        ("runs", f"{counts.runs} stored, {counts.active_runs} active"),
        ("written", f"{render.size(s.written_bytes)} since start, about {render.size(s.written_bytes_per_day)} a day"
                    " at this rate"),
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


def _log(c: Client, run_id: str) -> bytes:
    data = bytearray()
    while True:
        chunk = c.typed("qledge.run.log.read", run_tools.LogArgs(run_id=run_id, offset=len(data)), run_tools.LogChunk)
        data += chunk.data
        if chunk.eof:
            return bytes(data)


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


def _run_id(c: Client, reference: str) -> str:
    """The run a person named (an id, a unique prefix of one, TASK:latest, TASK:latest-failed)
    as its id. A whole id the daemon keeps no run for stays as it is: an AI run's record and
    mission may outlive the run."""
    try:
        return c.typed("qledge.run.get", run_tools.RunId(run_id=reference), Run).id
    except CallFailed as exc:
        if exc.code == "not_found" and ":" not in reference:
            return reference
        raise


def agent_get(c: Client, a: argparse.Namespace) -> int:
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
    final = _waited(c, run.id)
    log = _log(c, final.id).decode("utf-8", "replace")
    found = c.typed("qinglong.agent.history.get", tools.HistoryGetArgs(run_id=final.id), tools.HistoryGetResult)
    result = _check_result(final, log, found.found)
    show(a, result, _check_lines)
    return OK if result.passed else TOOL_ERROR


def call(c: Client, a: argparse.Namespace) -> int:
    """Untyped on purpose: any tool, any JSON args, whatever JSON the tool returned."""
    try:
        args = msgspec.json.decode(a.args) if a.args else {}
    except msgspec.DecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    render.json_out(c.call(a.tool, args))
    return OK


# -- export and import ------------------------------------------------------------------

_document = msgspec.json.Decoder(backup_tools.Document)
MAX_EXPORT_FILE = 64 << 20  # far beyond any router's tasks; a bound on what import reads
_BATCH_BYTES = 128 << 10  # each import call stays well inside the 256 KiB frame cap


class Exported(msgspec.Struct, rename="camel"):
    file: str
    tasks: int
    triggers: int
    secrets: int | None = None
    channels: int = 0
    scripts: int = 0
    scripts_archive: str | None = None
    not_exported: list[str] = []


def _export_pages(c: Client) -> tuple[list[backup_tools.ExportedTask], list[backup_tools.ExportedTrigger]]:
    tasks: list[backup_tools.ExportedTask] = []
    triggers: list[backup_tools.ExportedTrigger] = []
    cursor: backup_tools.ExportCursor | None = None
    while True:
        page = c.typed("qledge.export", backup_tools.ExportArgs(cursor=cursor), backup_tools.ExportPage)
        tasks += page.tasks
        triggers += page.triggers
        if page.next is None:
            return tasks, triggers
        cursor = page.next


def _secret_page(c: Client, after: str | None) -> tuple[list[backup_tools.SecretValue], str | None]:
    page = c.typed("qledge.secret.export", backup_tools.SecretExportArgs(after=after), backup_tools.SecretPage)
    return page.secrets, page.next


def write_private(path: str, data: bytes) -> None:
    """Replace `path` with a new 0600 file holding `data`, all or nothing."""
    import contextlib
    import os

    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def export_state(c: Client, a: argparse.Namespace) -> int:
    import time

    import edge

    from edge.cli import import_commands as moving

    tasks, triggers = _export_pages(c)
    secrets = all_pages(lambda after: _secret_page(c, after)) if a.with_secrets else None
    notify, not_exported = moving.export_notify(c, a.with_secrets)
    scripts, more = moving.export_scripts(c, a.file)
    doc = backup_tools.Document(
        format=backup_tools.FORMAT, version=backup_tools.FORMAT_VERSION, qledge_version=edge.__version__,
        exported_at_ms=int(time.time() * 1000), tasks=tasks, triggers=triggers, secrets=secrets, notify=notify,
        scripts=scripts, not_exported=not_exported + more,
    )
    write_private(a.file, msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    done = Exported(file=a.file, tasks=len(tasks), triggers=len(triggers),
                    secrets=None if secrets is None else len(secrets),
                    channels=len(notify.channels) if notify else 0, scripts=scripts.files if scripts else 0,
                    scripts_archive=scripts.archive if scripts else None, not_exported=doc.not_exported)

    def human(e: Exported) -> None:
        what = f"{e.tasks} tasks, {e.triggers} triggers" + ("" if e.secrets is None else f", {e.secrets} secrets")
        what += f", {e.channels} notification channels" if e.channels else ""
        print(f"exported {what} to {e.file} (mode 0600)")
        if e.scripts_archive:
            print(f"exported {e.scripts} scripts to {e.scripts_archive} beside it (mode 0600): keep the two together")
        for note in e.not_exported:
            print(f"note: {note}")

    return show(a, done, human)


def read_document(path: str) -> backup_tools.Document:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_EXPORT_FILE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_EXPORT_FILE:
        raise UsageError(f"{path} is larger than {MAX_EXPORT_FILE} bytes; not a qledge export")
    try:
        return _document.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise UsageError(f"{path} is not a qledge export file (format {backup_tools.FORMAT!r}, version"
                         f" {backup_tools.FORMAT_VERSION}): {' '.join(str(exc).split())}") from None


def batches(items: list[T]) -> list[list[T]]:
    """Consecutive runs of at most BATCH items and about _BATCH_BYTES each."""
    out: list[list[T]] = []
    size = 0
    for item in items:
        n = len(msgspec.msgpack.encode(item))
        if not out or len(out[-1]) >= backup_tools.BATCH or size + n > _BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def _import_calls(doc: backup_tools.Document, replace: bool, dry: bool) -> list[tuple[str, msgspec.Struct]]:
    """Tasks and triggers as the parts of one session (checked together and written in one
    transaction by its last part), then secrets."""
    import os

    parts: list[tuple[list[backup_tools.ExportedTask], list[backup_tools.ExportedTrigger]]] = [
        (b, []) for b in batches(doc.tasks)] + [([], b) for b in batches(doc.triggers)]
    session = os.urandom(12).hex()
    calls: list[tuple[str, msgspec.Struct]] = [
        ("qledge.import", backup_tools.ImportArgs(tasks=tasks, triggers=triggers, replace=replace, dry_run=dry,
                                                  session=backup_tools.ImportSession(id=session, part=n,
                                                                                     last=n == len(parts) - 1)))
        for n, (tasks, triggers) in enumerate(parts)]
    calls += [("qledge.secret.import", backup_tools.SecretImportArgs(secrets=b, replace=replace, dry_run=dry))
              for b in batches(doc.secrets or [])]
    return calls


def import_state(c: Client, a: argparse.Namespace) -> int:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="qledge-move-") as tmp:
        return _import_state(c, a, read_document(a.file), tmp)


def _import_state(c: Client, a: argparse.Namespace, doc: backup_tools.Document, tmp: str) -> int:
    from edge.cli import import_commands as moving

    move = moving.prepare_move(c, doc, a.file, tmp)  # the scripts unpacked, their tasks' paths moved here
    doc = msgspec.structs.replace(doc, tasks=move.tasks)
    # A dry pass over everything first: every entry that would be refused (a permission, a
    # user, a secret, a schedule, a changed spec, a channel's secret) or that differs is
    # found before anything is written, and all of them are named.
    report = backup_tools.ImportReport(refused=list(move.refused), refused_count=len(move.refused),
                                       refused_code="invalid_argument" if move.refused else None)
    for tool_name, args in _import_calls(doc, a.replace, dry=True):
        report.add(c.typed(tool_name, args, backup_tools.ImportReport))
    if report.refused_count or report.conflicts:
        if a.json:
            render.json_out(report)
        if report.refused_count:
            line = backup_tools.refused_line(report.refused, report.refused_count)
            if report.conflicts:
                line += f"; {len(report.conflicts)} more differ from what this daemon has (--replace overwrites them)"
            raise CallFailed(report.refused_code or "invalid_argument", line)
        raise CallFailed("conflict", backup_tools.refusal(report.conflicts) + " (qledge import --replace overwrites)")
    notes = moving.import_scripts(move, a.dry_run)
    if not a.dry_run:
        # The scripts and secrets first (their own transactions), then every task and trigger in one.
        calls = _import_calls(doc, a.replace, dry=False)
        report = backup_tools.ImportReport()
        for tool_name, args in [*(x for x in calls if x[0] != "qledge.import"),
                                *(x for x in calls if x[0] == "qledge.import")]:
            report.add(c.typed(tool_name, args, backup_tools.ImportReport))
    report.notes += notes + moving.import_notify(c, doc, a.replace, a.dry_run)

    def human(r: backup_tools.ImportReport) -> None:
        would = "would be " if a.dry_run else ""
        for verb, items in (("created", r.created), ("updated", r.updated), ("skipped (identical)", r.skipped)):
            if items:
                print(f"{would}{verb}: {', '.join(items)}")
        for note in r.notes:
            print(f"note: {note}")
        print(f"{a.file}: {len(r.created)} {would}created, {len(r.updated)} {would}updated,"
              f" {len(r.skipped)} skipped")

    return show(a, report, human)
