"""`qledge task …`: add, update, list, get, enable, disable, rm; the flags of `task add` and
`task update`, their limits said in the user's units, and the update (read the head, change
what the flags name, compare-and-set, retry once).

Every limit comes from the types the daemon decodes with (edge.core.tasks, edge.core.text);
the daemon checks them again, so these checks only make the message speak of flags and
seconds instead of fields and milliseconds. Arguments and results are the tools' own
Structs, loaded by the verb that sends them: listing the verbs loads none of them.
"""

from __future__ import annotations

from edge.cli import shared
from edge.cli.shared import UsageError, Verb, show, show_list, yes

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from edge.core.runs import RunDefaults
    from edge.core.tasks import AgentInstruction, Command, NotifyRule, RetryPolicy, SecretRef, Task, TaskSpec
    from edge.tools.ai.projections import TaskView
    from edge.transports.client import Client


def _limits() -> str:
    from edge.core import tasks as limits
    from edge.core.text import ENV_NAME_RULE, NAME_RULE

    return f"""\
limits:
  NAME       {NAME_RULE}
  --timeout  1 second to 7 days (S: seconds, or 90s, 5m, 2h, 1d; default 1h)
  --log-cap  4 KiB to 1 GiB (BYTES: 65536, 64K, 1M, 1G; default: the daemon's [runner] log_cap_bytes)
  COMMAND    a program (a name looked up in PATH, or a path) of at most {limits.MAX_ARG_CHARS} characters and
             at most {limits.MAX_ARGS} arguments of at most {limits.MAX_ARG_CHARS} characters each; with --shell,
             one command for /bin/sh -c of at most {limits.MAX_SHELL_CHARS} characters
  --env      at most {limits.MAX_ENV} entries (with --secret-env); KEY is {ENV_NAME_RULE};
             a VALUE has at most {limits.MAX_ENV_VALUE_CHARS} characters
  --cwd      a directory, at most {limits.MAX_PATH_CHARS} characters, never inside the state directory
             (default: [runner] work_dir, /)
  --user     a user name of at most 32 characters (default: [runner] default_user); a task that runs
             as root, as the daemon's user or as a user outside [runner] task_users needs
             task.privileged; --group likewise (default: the user's own)
  --retries  1 to {limits.MAX_RETRIES} retries of a failed or timed-out run; --retry-delay and --retry-max-delay
             0 seconds to 1 day (S: seconds, or 90s, 5m, 2h; default delay 60s); --retry-backoff 1 to 10
  --notify   at most 16 channels (repeatable, or CHANNEL,CHANNEL); --notify-on EVENT,… of failure,
             recovery, success, lost, skipped, every (default failure,recovery)
A relative --cwd or program path is resolved against the current directory here.
The run's environment: HOME, USER, LOGNAME, SHELL (of the user it runs as), PATH, LANG, TZ,
then --env and --secret-env (no QLEDGE_* names), then QLEDGE_RUN_ID and QLEDGE_TASK_ID."""


# -- the flags ------------------------------------------------------------------------


def task_options(p: argparse.ArgumentParser, update: bool) -> None:
    """The flags of `task add` (and, all optional, of `task update`)."""
    import argparse

    from edge.core import tasks as limits
    from edge.core.text import NAME_RULE

    if update:
        p.usage = "%(prog)s TASK [options] [-- COMMAND [ARGS...]]"
        p.add_argument("name", metavar="TASK", help="the task to change; options not given keep their value")
    else:
        p.usage = "%(prog)s NAME [options] -- COMMAND [ARGS...]"
        p.add_argument("name", metavar="NAME", help="task id: " + NAME_RULE)
    p.epilog = _limits()
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=shared.timeout, metavar="S", help="kill the run after S (1s..7d, default 1h)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable (repeatable)" + ("; replaces that key" if update else ""))
    p.add_argument("--secret-env", action="append", default=[], metavar="K=SECRET",
                   help="environment variable taken from a stored secret (repeatable)")
    p.add_argument("--cwd", metavar="DIR", help="working directory (default /; never inside the state directory;"
                   " @data: the task's own data directory)")
    p.add_argument("--user", help="run as this user (default: [runner] default_user, e.g. nobody)")
    p.add_argument("--group", help="run with this group (default: the user's own)")
    p.add_argument("--shell", action="store_true",
                   help="run COMMAND, one argument, through /bin/sh -c" + (" (with a new COMMAND)" if update else ""))
    p.add_argument("--overlap", choices=("forbid", "allow", "replace"), default=None if update else "forbid",
                   help="what a new run does while one is active" + ("" if update else " (default forbid)"))
    p.add_argument("--log-cap", type=shared.log_cap, metavar="BYTES", help="log cap for this task's runs (4K..1G)")
    p.add_argument("--retries", type=shared.bounded_int("--retries", 1, limits.MAX_RETRIES), metavar="N",
                   help="run a failed or timed-out run again, up to N times (see Retries in docs/guide.md)")
    p.add_argument("--retry-delay", type=shared.retry_seconds("--retry-delay"), metavar="S",
                   help="wait before a retry (default 60s)")
    p.add_argument("--retry-backoff", type=shared.backoff, metavar="F",
                   help="multiply the delay by F for each next retry")
    p.add_argument("--retry-max-delay", type=shared.retry_seconds("--retry-max-delay"), metavar="S",
                   help="never wait longer than S before a retry")
    p.add_argument("--notify", action="append", metavar="CHANNEL[,…]",
                   help="notify these channels (instead of the project's rules)")
    p.add_argument("--notify-on", metavar="EVENT[,…]",
                   help="failure, recovery, success, lost, skipped, every (default failure,recovery)")
    p.add_argument("--no-notify", action="store_true", help="no notifications for this task")
    if update:
        p.add_argument("--unset-env", action="append", default=[], metavar="K", help="remove this variable")
        p.add_argument("--reset", action="append", default=[],
                       choices=("cwd", "log-cap", "timeout", "env", "user", "group", "retries", "notify"),
                       help="back to the default (env: no variables; user: [runner] default_user; group: the"
                            " user's own; retries: none; notify: the project's rules), before the other options"
                            " apply")


def _named(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="TASK")


def _rm_options(p: argparse.ArgumentParser) -> None:
    _named(p)
    p.description = ("delete a task: its revisions, its finished runs and their logs; refused while a run is"
                     " queued or running, and while the task has triggers unless --with-triggers")
    p.add_argument("--with-triggers", action="store_true", help="delete the task's triggers (and their events) too")


# -- retries, notification rules, environment ---------------------------------------------


def retry_policy(a: argparse.Namespace, head: RetryPolicy | None) -> RetryPolicy | None:
    """The retry policy the flags say: `head`'s (None for a new task, or after --reset
    retries) with --retries, --retry-delay, --retry-backoff and --retry-max-delay applied."""
    import msgspec

    from edge.core.tasks import RetryPolicy

    given = {k: v for k, v in (("count", a.retries), ("delay_s", a.retry_delay), ("backoff", a.retry_backoff),
                               ("max_delay_s", a.retry_max_delay)) if v is not None}
    if not given:
        return head
    if head is None and "count" not in given:
        raise UsageError("--retry-delay, --retry-backoff and --retry-max-delay need --retries N")
    base = head if head is not None else RetryPolicy(count=given["count"])
    return msgspec.structs.replace(base, **given)


def notify_rules(a: argparse.Namespace, head: list[NotifyRule] | None) -> list[NotifyRule] | None:
    """--notify CHANNEL,… [--notify-on EVENT,…] (the task's own rule), or --no-notify (none);
    neither: `head` (None: the project's rules)."""
    import msgspec

    from edge.core import tasks as limits
    from edge.core.tasks import DEFAULT_NOTIFY_ON, NotifyRule

    channels = [c for value in a.notify or [] for c in value.split(",") if c]
    on = [e for e in (a.notify_on or "").split(",") if e]
    if a.no_notify:
        if channels or on:
            raise UsageError("--no-notify cannot be combined with --notify or --notify-on")
        return []
    if on and not channels:
        raise UsageError("--notify-on needs --notify CHANNEL")
    if not channels:
        return head
    for channel in channels:
        shared.name("--notify channel", channel)
    if len(channels) > 16:
        raise UsageError("--notify names at most 16 channels")
    try:
        return [msgspec.convert({"channels": channels, "on": on or list(DEFAULT_NOTIFY_ON)}, NotifyRule)]
    except msgspec.ValidationError as exc:
        events = ", ".join(limits.NOTIFY_EVENTS)
        raise UsageError(f"--notify-on takes events among {events}: {exc}") from None


def env_pairs(pairs: list[str], secret_pairs: list[str]) -> dict[str, str | SecretRef]:
    """The --env and --secret-env pairs."""
    from edge.core.tasks import SecretRef

    env: dict[str, str | SecretRef] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    for pair in secret_pairs:
        key, sep, secret = pair.partition("=")
        if not sep or not key or not secret:
            raise UsageError(f"--secret-env expects KEY=SECRET_NAME, got {pair!r}")
        env[key] = SecretRef(secret=secret)
    return env


def _env_count(env: dict[str, str | SecretRef]) -> None:
    from edge.core import tasks as limits

    if len(env) > limits.MAX_ENV:
        raise UsageError(f"the task would have {len(env)} environment entries; at most {limits.MAX_ENV} are allowed")


def check_task_flags(a: argparse.Namespace, new: bool = True) -> None:
    """Check the task flags in their own terms, and resolve relative paths in place; the
    name of a `new` task too (an existing one may be given by the name it was imported with)."""
    import re

    from edge.core import tasks as limits
    from edge.core.text import ENV_NAME_PATTERN, ENV_NAME_RULE, MAX_NAME

    if new:
        shared.name("task", a.name)
    if a.cwd is not None:
        if not a.cwd:
            raise UsageError("--cwd must name a directory")
        a.cwd = a.cwd if a.cwd == limits.DATA_DIR else shared.resolve(a.cwd)  # @data: the task's own data directory
    if a.command:
        program = a.command[0]
        if not a.shell and "/" in program and not program.startswith("/"):
            a.command[0] = shared.resolve(program)
        if a.shell and len(" ".join(a.command)) > limits.MAX_SHELL_CHARS:
            raise UsageError(f"the --shell command is longer than {limits.MAX_SHELL_CHARS} characters")
        if not a.shell and len(a.command) - 1 > limits.MAX_ARGS:
            raise UsageError(f"the command has {len(a.command) - 1} arguments; at most {limits.MAX_ARGS} are allowed")
        long = next((x for x in a.command if len(x) > limits.MAX_ARG_CHARS), None)
        if long is not None and not a.shell:
            raise UsageError(f"an argument of the command is longer than {limits.MAX_ARG_CHARS} characters:"
                             f" {long[:40]!r}…")
    for flag, pairs in (("--env", a.env), ("--secret-env", a.secret_env)):
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key and not re.match(ENV_NAME_PATTERN, key) or len(key) > MAX_NAME:
                raise UsageError(f"{flag} {key!r}: a variable name is {ENV_NAME_RULE}")
            if flag == "--env" and len(value) > limits.MAX_ENV_VALUE_CHARS:
                raise UsageError(f"--env {key}: the value is longer than {limits.MAX_ENV_VALUE_CHARS} characters")
    if len(a.env) + len(a.secret_env) > limits.MAX_ENV:
        raise UsageError(f"at most {limits.MAX_ENV} --env and --secret-env entries are allowed")


def shell_command(a: argparse.Namespace) -> Command:
    """The command after `--`: argv words, or with --shell the one shell command."""
    from edge.core.tasks import ArgvCommand, ShellCommand

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
    import msgspec

    from edge.core.tasks import DEFAULT_TIMEOUT_MS, TaskSpec

    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    check_task_flags(a)
    command = shell_command(a)
    try:
        spec = TaskSpec(
            command=command, env=env_pairs(a.env, a.secret_env), overlap=a.overlap or "forbid",
            working_dir=a.cwd or None,
            timeout_ms=DEFAULT_TIMEOUT_MS if a.timeout is None else int(a.timeout * 1000), log_cap_bytes=a.log_cap,
            user=a.user or None, group=a.group or None, retry=retry_policy(a, None), notify=notify_rules(a, None),
        )
    except ValueError as exc:  # TaskSpec's own checks (e.g. a QLEDGE_ variable)
        raise UsageError(str(exc)) from None
    try:  # the daemon checks this too; here the message can name the flag
        return msgspec.convert(msgspec.to_builtins(spec), TaskSpec)
    except msgspec.ValidationError as exc:
        raise UsageError(f"task spec: {exc}") from None


# -- showing a task -------------------------------------------------------------------------


def _task_fields(t: Task, defaults: RunDefaults | None) -> None:
    from edge.core.tasks import AgentInstruction

    spec = t.spec
    if isinstance(spec.command, AgentInstruction):
        _agent_task_fields(t, spec.command)
        return
    cap = spec.log_cap_bytes
    cwd = spec.working_dir
    shared.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision),
        ("enabled", yes(t.enabled)), ("command", shared.command_text(spec)),
        ("kind", t.kind), ("timeout", shared.span(spec.timeout_ms / 1000)),
        ("overlap", spec.overlap), ("user", _user(t)),
        ("working dir", cwd if cwd else f"{defaults.work_dir} (the default)" if defaults else "the daemon's default"),
        ("log cap", shared.size(cap) if cap else f"{shared.size(defaults.log_cap_bytes)} (the default)"
         if defaults else "the daemon's default"),
        ("retries", _retry_text(spec.retry)), ("notify", _notify_text(spec.notify)),
        ("env", _env_text(spec)), ("digest", t.content_digest),
        ("created", shared.when(t.created_at_ms)), ("updated", shared.when(t.updated_at_ms)),
    ])


def _agent_task_fields(t: Task, command: AgentInstruction) -> None:
    from edge.core.tasks import AgentBudget

    budget = command.budget
    overrides = ", ".join(f"{k} {getattr(budget, k):g}" for k in AgentBudget.__struct_fields__
                          if budget is not None and getattr(budget, k) is not None)
    shared.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision), ("enabled", yes(t.enabled)),
        ("kind", "agent (qinglong/agent@v1)"), ("instruction", command.instruction),
        ("profile", command.profile), ("budget", overrides or "the configured defaults"),
        ("overlap", t.spec.overlap), ("digest", t.content_digest), ("updated", shared.when(t.updated_at_ms)),
    ])


def _env_text(spec: TaskSpec) -> str | None:
    """`TOKEN (secret API_TOKEN), USER`: each variable, and where a secret gives its value."""
    from edge.core.tasks import SecretRef

    return ", ".join(f"{k} (secret {v.secret})" if isinstance(v, SecretRef) else k
                     for k, v in sorted(spec.env.items())) or None


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


# -- the verbs -------------------------------------------------------------------------------


def task_add(c: Client, a: argparse.Namespace) -> int:
    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools

    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=task_spec(a)), Task)
    return show(a, task, lambda t: print(f"task {t.id} created (revision {t.revision})"))


def _task_page(c: Client, after: str | None) -> tuple[list[Task], str | None]:
    from edge.tools.builtin import tasks as task_tools

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
    from edge.transports.client import all_pages

    empty = "no tasks yet: qledge task add NAME -- COMMAND"
    # A NAME column only when some task has a name other than its id (imported ones, `每日签到`).
    if not c.may_call("qledge.task.list"):
        views = all_pages(lambda after: _head_page(c, after))
        named = any(t.name != t.task_id for t in views)
        return show_list(
            a, views, empty,
            lambda t: [t.task_id, *([t.name] if named else []), str(t.revision), yes(t.enabled), t.kind,
                       shared.when(t.updated_at_ms)],
            ["TASK", *(["NAME"] if named else []), "REV", "ENABLED", "KIND", "UPDATED"],
        )
    tasks = all_pages(lambda after: _task_page(c, after))
    named = any(t.name != t.id for t in tasks)
    return show_list(
        a, tasks, empty,
        lambda t: [t.id, *([t.name] if named else []), str(t.revision), yes(t.enabled), shared.command_text(t.spec)],
        ["TASK", *(["NAME"] if named else []), "REV", "ENABLED", "COMMAND"],
    )


def _defaults(c: Client) -> RunDefaults | None:
    from edge.tools.builtin import status as status_tools

    return c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status).defaults


def task_get(c: Client, a: argparse.Namespace) -> int:
    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools
    from edge.transports.client import CallFailed

    a.name = shared.task_id(c, a.name)
    if not c.may_call("qledge.task.get"):
        from edge.tools.ai.projections import TaskDetailView, TaskGetArgs, TaskGetResult

        found = c.typed("qinglong.task.get", TaskGetArgs(task_id=a.name), TaskGetResult)
        if not isinstance(found.task, TaskDetailView):
            raise CallFailed("not_found", f"task {a.name!r} not found")
        return show(a, found.task, lambda t: shared.fields([
            ("task", t.task_id), ("name", t.name), ("revision", t.revision), ("enabled", yes(t.enabled)),
            ("kind", t.kind), ("digest", t.content_digest), ("created", shared.when(t.created_at_ms)),
            ("updated", shared.when(t.updated_at_ms)),
            ("command", "not shown: it needs task.inspect"),
        ]))
    task = c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task)
    if a.json:
        return show(a, task, lambda t: None)
    defaults = _defaults(c)
    return show(a, task, lambda t: _task_fields(t, defaults))


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools

    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    a.name = shared.task_id(c, a.name)
    task = c.typed(tool, task_tools.TaskRef(task_id=a.name), Task)
    return show(a, task, lambda t: print(f"task {t.id} {a.action}d (revision {t.revision})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import tasks as task_tools
    from edge.transports.client import CallFailed

    a.name = shared.task_id(c, a.name)
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


# -- task update -------------------------------------------------------------------------


def updated_spec(head: TaskSpec, a: argparse.Namespace) -> TaskSpec:
    """`head` with what the flags name changed; everything else as it was."""
    import msgspec

    from edge.core.tasks import DEFAULT_TIMEOUT_MS

    changes: dict[str, object] = {}
    resets = set(a.reset)
    if a.command:
        changes["command"] = shell_command(a)  # the rules of `task add`, --shell's one argument too
    elif a.shell:
        raise UsageError("--shell applies to a new command: give it after `--`")
    if "cwd" in resets:
        changes["working_dir"] = None
    if a.cwd is not None:
        changes["working_dir"] = a.cwd
    if "timeout" in resets:
        changes["timeout_ms"] = DEFAULT_TIMEOUT_MS
    if a.timeout is not None:
        changes["timeout_ms"] = int(a.timeout * 1000)
    if "log-cap" in resets:
        changes["log_cap_bytes"] = None
    if a.log_cap is not None:
        changes["log_cap_bytes"] = a.log_cap
    if a.overlap is not None:
        changes["overlap"] = a.overlap
    if "user" in resets:
        changes["user"] = None  # the daemon gives it the default user again
    if a.user:
        changes["user"] = a.user
    if "group" in resets:
        changes["group"] = None
    if a.group:
        changes["group"] = a.group
    retry = retry_policy(a, None if "retries" in resets else head.retry)
    if retry != head.retry:
        changes["retry"] = retry
    rules = notify_rules(a, None if "notify" in resets else head.notify)
    if rules != head.notify:
        changes["notify"] = rules
    if resets & {"env"} or a.env or a.secret_env or a.unset_env:
        env: dict[str, str | SecretRef] = {} if "env" in resets else dict(head.env)
        for key in a.unset_env:
            if key not in env:
                raise UsageError(f"--unset-env {key}: the task has no such variable")
            del env[key]
        env.update(env_pairs(a.env, a.secret_env))
        _env_count(env)
        changes["env"] = env
    try:
        return msgspec.structs.replace(head, **changes)
    except ValueError as exc:  # TaskSpec's own checks (e.g. a QLEDGE_ variable)
        raise UsageError(str(exc)) from None


def task_update(c: Client, a: argparse.Namespace) -> int:
    from edge.core.tasks import Task
    from edge.tools.builtin import tasks as task_tools

    check_task_flags(a, new=False)
    a.name = shared.task_id(c, a.name)
    before: list[Task] = []

    def attempt() -> Task:
        head = c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task)
        before[:] = [head]
        spec = updated_spec(head.spec, a)
        if spec == head.spec:
            return head
        args = task_tools.UpdateArgs(task_id=head.id, expected_revision=head.revision, spec=spec)
        return c.typed("qledge.task.update", args, Task)

    def winner() -> str:
        now = c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task)
        return (f"task {a.name!r} was changed by another writer while this update was made, twice: it is now at"
                f" revision {now.revision} (updated {shared.when(now.updated_at_ms)}); this update changed"
                f" nothing: see `qledge task get {a.name}` and run it again")

    task = shared.compare_and_set(attempt, winner)
    unchanged = bool(before) and before[0].revision == task.revision

    def human(t: Task) -> None:
        if unchanged:
            print(f"task {t.id} unchanged (revision {t.revision})")
        else:
            print(f"task {t.id} updated to revision {t.revision}; its history is kept and the triggers that"
                  " followed it run the new revision")

    return show(a, task, human)


VERBS = {"task": (
    Verb("add", task_add, "add a task: qledge task add NAME [options] -- COMMAND [ARGS...]",
         lambda p: task_options(p, update=False)),
    Verb("update", task_update, "change a task: qledge task update TASK [options] [-- COMMAND [ARGS...]]",
         lambda p: task_options(p, update=True)),
    Verb("list", task_list, "list tasks"),
    Verb("get", task_get, "get a task", _named),
    Verb("enable", task_toggle, "enable a task", _named),
    Verb("disable", task_toggle, "disable a task", _named),
    Verb("rm", task_rm, "rm a task", _rm_options),
)}
