"""Tasks and triggers from command-line flags: the flags of `task add`/`task update` and
`trigger add`/`trigger update`, their limits said in the user's units, and the two updates
(read the head, change what the flags name, compare-and-set, retry once).

Every limit comes from the types the daemon decodes with (edge.core.tasks, edge.core.text,
edge.core.triggers); the daemon checks them again, so these checks only make the message
speak of flags and seconds instead of fields and milliseconds.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from edge.cli import render
from edge.cli.client import CallFailed, Client, UsageError
from edge.core import tasks as limits
from edge.core.tasks import DEFAULT_NOTIFY_ON, DEFAULT_TIMEOUT_MS, NotifyRule, RetryPolicy, SecretRef, Task, TaskSpec
from edge.core.text import ENV_NAME_PATTERN, ENV_NAME_RULE, MAX_NAME, NAME_PATTERN, NAME_RULE
from edge.core.triggers import MAX_JITTER_S, Trigger
from edge.tools.builtin import tasks as task_tools
from edge.tools.builtin import triggers as trigger_tools

if TYPE_CHECKING:
    import argparse

T = TypeVar("T")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZES = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_NAME = re.compile(NAME_PATTERN)
_ENV_NAME = re.compile(ENV_NAME_PATTERN)

TASK_LIMITS = f"""\
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

TRIGGER_LIMITS = """\
limits:
  --cron    5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, or
            @hourly/@daily/@weekly/@monthly/@yearly, @reboot (once per boot), @once (one shot);
            at most 256 characters; day-of-month and day-of-week both restricted: either matches
  --tz      an IANA zone name (Europe/Berlin), at most 64 characters
  --jitter  0 to 3600 seconds (S: seconds, or 90s, 5m, 1h)"""


# -- argparse types: each says what is wrong in the flag's own terms --------------------


def _seconds(flag: str, text: str) -> float:
    """`90`, `1.5`, `90s`, `5m`, `2h`, `1d` as seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([smhd]?)\s*", text.lower())
    if not match:
        raise UsageError(f"{flag} {text!r} is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(value):
        raise UsageError(f"{flag} {text!r} is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)")
    return value


def timeout(text: str) -> float:
    """--timeout: seconds, 1 s to 7 days."""
    value = _seconds("--timeout", text)
    if value < limits.MIN_TIMEOUT_MS / 1000:
        raise UsageError("--timeout must be at least 1 second")
    if value > limits.MAX_TIMEOUT_MS / 1000:
        raise UsageError(f"--timeout must be at most 7 days ({limits.MAX_TIMEOUT_MS // 1000} seconds)")
    return value


def jitter(text: str) -> int:
    """--jitter: whole seconds, 0 to 3600."""
    value = _seconds("--jitter", text)
    if value != int(value) or not 0 <= value <= MAX_JITTER_S:
        raise UsageError(f"--jitter must be a whole number of seconds from 0 to {MAX_JITTER_S} (1 hour)")
    return int(value)


def log_cap(text: str) -> int:
    """--log-cap: bytes (64K, 1M, 1G are KiB, MiB, GiB), 4 KiB to 1 GiB."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _SIZES:
        raise UsageError(f"--log-cap {text!r} is not a size (bytes, or e.g. 64K, 1M)")
    value = int(match.group(1)) * _SIZES[match.group(2)]
    if not limits.MIN_LOG_CAP <= value <= limits.MAX_LOG_CAP:
        raise UsageError("--log-cap must be from 4 KiB (4096 bytes) to 1 GiB")
    return value


def zone_arg(text: str) -> str:
    """--tz: a zone name; the empty string is not a silent default."""
    if not text.strip():
        raise UsageError("--tz must name a time zone (e.g. Europe/Berlin or UTC), not be empty")
    return text


def bounded_int(flag: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{flag} {text!r} is not a whole number ({low}..{high})") from None
        if not low <= value <= high:
            raise UsageError(f"{flag} must be from {low} to {high}")
        return value

    return parse


def retry_seconds(flag: str) -> Callable[[str], float]:
    """--retry-delay, --retry-max-delay: seconds, 0 to a day."""
    def parse(text: str) -> float:
        value = _seconds(flag, text)
        if value > limits.MAX_RETRY_DELAY_S:
            raise UsageError(f"{flag} must be at most 1 day ({limits.MAX_RETRY_DELAY_S} seconds)")
        return value

    return parse


def backoff(text: str) -> float:
    """--retry-backoff: a factor from 1 to 10."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--retry-backoff {text!r} is not a number (1..10)") from None
    if not 1 <= value <= 10:
        raise UsageError("--retry-backoff must be from 1 to 10")
    return value


def name(what: str, text: str) -> str:
    if len(text) > MAX_NAME or not _NAME.match(text):
        raise UsageError(f"{what} {text!r} is not a valid name: use {NAME_RULE}")
    return text


# -- the flags ------------------------------------------------------------------------


def task_options(p: argparse.ArgumentParser, update: bool) -> None:
    """The flags of `task add` (and, all optional, of `task update`)."""
    import argparse

    if update:
        p.usage = "%(prog)s TASK [options] [-- COMMAND [ARGS...]]"
        p.add_argument("name", metavar="TASK", help="the task to change; options not given keep their value")
    else:
        p.usage = "%(prog)s NAME [options] -- COMMAND [ARGS...]"
        p.add_argument("name", metavar="NAME", help="task id: " + NAME_RULE)
    p.epilog = TASK_LIMITS
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=timeout, metavar="S", help="kill the run after S (1s..7d, default 1h)")
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
    p.add_argument("--log-cap", type=log_cap, metavar="BYTES", help="log cap for this task's runs (4K..1G)")
    p.add_argument("--retries", type=bounded_int("--retries", 1, limits.MAX_RETRIES), metavar="N",
                   help="run a failed or timed-out run again, up to N times (see Retries in docs/guide.md)")
    p.add_argument("--retry-delay", type=retry_seconds("--retry-delay"), metavar="S",
                   help="wait before a retry (default 60s)")
    p.add_argument("--retry-backoff", type=backoff, metavar="F", help="multiply the delay by F for each next retry")
    p.add_argument("--retry-max-delay", type=retry_seconds("--retry-max-delay"), metavar="S",
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


def trigger_options(p: argparse.ArgumentParser) -> None:
    """The flags of `trigger update`: each one given replaces that part of the schedule."""
    p.epilog = TRIGGER_LIMITS
    p.add_argument("--cron", metavar="EXPR", help="a new cron expression")
    p.add_argument("--tz", type=zone_arg, metavar="TZ", help="a new IANA time zone")
    p.add_argument("--misfire", choices=("skip", "fire_once"), help="a new misfire policy")
    p.add_argument("--jitter", type=jitter, metavar="S", help="a new jitter (0..3600 seconds)")


# -- retries and notification rules -------------------------------------------------------


def retry_policy(a: argparse.Namespace, head: RetryPolicy | None) -> RetryPolicy | None:
    """The retry policy the flags say: `head`'s (None for a new task, or after --reset
    retries) with --retries, --retry-delay, --retry-backoff and --retry-max-delay applied."""
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
        name("--notify channel", channel)
    if len(channels) > 16:
        raise UsageError("--notify names at most 16 channels")
    try:
        return [msgspec.convert({"channels": channels, "on": on or list(DEFAULT_NOTIFY_ON)}, NotifyRule)]
    except msgspec.ValidationError as exc:
        events = ", ".join(limits.NOTIFY_EVENTS)
        raise UsageError(f"--notify-on takes events among {events}: {exc}") from None


# -- checks and path resolution ----------------------------------------------------------


def _resolve(path: str) -> str:
    """Relative to where the command was typed, never to the daemon's own directory."""
    return path if path.startswith("/") else os.path.abspath(path)


def check_task_flags(a: argparse.Namespace) -> None:
    """Check the task flags in their own terms, and resolve relative paths in place."""
    name("task", a.name)
    if a.cwd is not None:
        if not a.cwd:
            raise UsageError("--cwd must name a directory")
        a.cwd = a.cwd if a.cwd == limits.DATA_DIR else _resolve(a.cwd)  # @data: the task's own data directory
    if a.command:
        program = a.command[0]
        if not a.shell and "/" in program and not program.startswith("/"):
            a.command[0] = _resolve(program)
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
            if key and not _ENV_NAME.match(key) or len(key) > MAX_NAME:
                raise UsageError(f"{flag} {key!r}: a variable name is {ENV_NAME_RULE}")
            if flag == "--env" and len(value) > limits.MAX_ENV_VALUE_CHARS:
                raise UsageError(f"--env {key}: the value is longer than {limits.MAX_ENV_VALUE_CHARS} characters")
    if len(a.env) + len(a.secret_env) > limits.MAX_ENV:
        raise UsageError(f"at most {limits.MAX_ENV} --env and --secret-env entries are allowed")


def _env_count(env: dict[str, str | SecretRef]) -> None:
    if len(env) > limits.MAX_ENV:
        raise UsageError(f"the task would have {len(env)} environment entries; at most {limits.MAX_ENV} are allowed")


# -- compare-and-set with one retry ------------------------------------------------------


def _moved(exc: CallFailed) -> bool:
    """The refusal of a compare-and-set: the head is at another revision than was read."""
    return exc.code == "conflict" and " is at revision " in exc.message


def _compare_and_set(attempt: Callable[[], T], winner: Callable[[], str]) -> T:
    """Run `attempt` (read the head, write with its revision); on a concurrent change run it
    once more on the new head; a second loss says who won and changes nothing."""
    try:
        return attempt()
    except CallFailed as exc:
        if not _moved(exc):
            raise
    try:
        return attempt()
    except CallFailed as exc:
        if not _moved(exc):
            raise
        raise CallFailed("conflict", winner()) from None


# -- task update ------------------------------------------------------------------------


def updated_spec(head: TaskSpec, a: argparse.Namespace) -> TaskSpec:
    """`head` with what the flags name changed; everything else as it was."""
    from edge.cli.commands import shell_command

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
        from edge.cli.commands import env_pairs

        env.update(env_pairs(a.env, a.secret_env))
        _env_count(env)
        changes["env"] = env
    try:
        return msgspec.structs.replace(head, **changes)
    except ValueError as exc:  # TaskSpec's own checks (e.g. a QLEDGE_ variable)
        raise UsageError(str(exc)) from None


def task_update(c: Client, a: argparse.Namespace) -> int:
    from edge.cli.commands import show

    check_task_flags(a)
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
                f" revision {now.revision} (updated {render.when(now.updated_at_ms)}); this update changed"
                f" nothing: see `qledge task get {a.name}` and run it again")

    task = _compare_and_set(attempt, winner)
    unchanged = bool(before) and before[0].revision == task.revision

    def human(t: Task) -> None:
        if unchanged:
            print(f"task {t.id} unchanged (revision {t.revision})")
        else:
            print(f"task {t.id} updated to revision {t.revision}; its history is kept and the triggers that"
                  " followed it run the new revision")

    return show(a, task, human)


# -- trigger update ---------------------------------------------------------------------


def trigger_update(c: Client, a: argparse.Namespace) -> int:
    from edge.cli.commands import show
    from edge.cli.schedule_commands import next_fire

    if a.cron is None and a.tz is None and a.misfire is None and a.jitter is None:
        raise UsageError("nothing to change: give --cron, --tz, --misfire or --jitter")
    before: list[Trigger] = []

    def attempt() -> Trigger:
        head = c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger)
        before[:] = [head]
        args = trigger_tools.UpdateArgs(trigger_id=head.id, expected_revision=head.revision, expression=a.cron,
                                        timezone=a.tz, misfire=a.misfire, jitter_s=a.jitter)
        return c.typed("qledge.trigger.update", args, Trigger)

    def winner() -> str:
        now = c.typed("qledge.trigger.get", trigger_tools.TriggerId(trigger_id=a.trigger), Trigger)
        return (f"trigger {a.trigger!r} was changed by another writer while this update was made, twice: it is"
                f" now at revision {now.revision} (updated {render.when(now.updated_at_ms)}); this update changed"
                f" nothing: see `qledge trigger get {a.trigger}` and run it again")

    trigger = _compare_and_set(attempt, winner)
    unchanged = bool(before) and before[0].revision == trigger.revision

    def human(t: Trigger) -> None:
        what = "unchanged" if unchanged else "updated"
        print(f"trigger {t.id} {what} (revision {t.revision}): {t.spec.expression} in {t.spec.timezone};"
              f" next fire {next_fire(t)}")

    return show(a, trigger, human)
