"""What every noun of the CLI shares: how a command ends (the one error line, the exit codes),
the input error, how a verb is declared, the argument types, and the output.

Every error is one line on stderr, `qledge: <code>: <message>` (with --json, a JSON object
`{"error": {"code", "message"}}`), whoever found it. Exit codes follow the code, never the
place it was found: 0 ok; 2 invalid input (`invalid_argument`: usage, configuration, or an
argument the daemon refused) and `qledge serve` refusing to start; 3 the daemon cannot be
reached (`unavailable`); 1 every other error, and a waited run that did not succeed.

Argument types say what is wrong in the flag's own terms; output is one format for every
time a person reads: local time with its zone abbreviation (`2026-11-30 10:06:36 CET`),
durations humanized (`0.01s`, `4m05s`, `1h`), a process a signal ended is `killed by
SIGTERM`, never a negative exit code; `--json` bypasses all of it.

This module loads nothing at import beyond os, sys and time (not argparse, re, msgspec or
typing): `qledge status`, `--version` and the `qledge mcp` bridge use it too.
"""

from __future__ import annotations

import os
import sys
import time

from edge import EXIT_OK, EXIT_TOOL, EXIT_USAGE
from edge import EXIT_UNREACHABLE as EXIT_UNREACHABLE  # for the commands that end with it

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn, TypeVar

    from edge.core.runs import Run
    from edge.core.tasks import TaskSpec
    from edge.transports.client import Client

    T = TypeVar("T")
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
    # (client, args) for verbs that talk to the daemon, (args) for offline ones.
    Handler = Callable[[Client, argparse.Namespace], int] | Callable[[argparse.Namespace], int]

# -- how a command ends ----------------------------------------------------------------

# The exit codes (EXIT_OK, EXIT_TOOL, EXIT_USAGE, EXIT_UNREACHABLE) are edge/__init__.py's.


def exit_code(code: str) -> int:
    """The exit code of an error with this code (see the module docstring)."""
    return EXIT_USAGE if code == "invalid_argument" else EXIT_TOOL


def report(code: str, message: str, as_json: bool) -> None:
    """Print an error the one way it is printed."""
    if as_json:
        import json  # only on this path: the daemon's start-up must not pay for it

        sys.stderr.write(json.dumps({"error": {"code": code, "message": message}}) + "\n")
    else:
        sys.stderr.write(f"qledge: {code}: {message}\n")


class UsageError(Exception):
    """Input the CLI refuses before (or instead of) asking the daemon: `invalid_argument`."""


# -- verbs --------------------------------------------------------------------------------


class Verb:
    """One verb of a noun (or a noun that is a verb itself: `qledge status`): its name, the
    line `--help` lists it with, its handler, and what adds its options. The options are
    added only when the verb is the one given (or every parser is built, for the tests), so
    listing a noun's verbs loads none of what their options need."""

    __slots__ = ("name", "help", "handler", "options", "offline")

    def __init__(self, name: str, handler: Handler | None, help: str = "",
                 options: Callable[[argparse.ArgumentParser], None] | None = None, offline: bool = False) -> None:
        self.name = name
        self.handler = handler
        self.help = help
        self.options = options
        self.offline = offline  # needs no daemon: the handler takes (args)


def parser_class() -> type[argparse.ArgumentParser]:
    """argparse whose usage errors take the one error format (and exit 2) like any other."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{message} (see: {self.prog} --help)")

    return Parser


def common_options() -> argparse.ArgumentParser:
    """--home, --socket, --config and --json, before or after any verb."""
    import argparse

    # SUPPRESS lets these flags appear before or after the verb without clobbering.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--home", default=argparse.SUPPRESS, help="state directory ($QLEDGE_HOME)")
    p.add_argument("--socket", default=argparse.SUPPRESS, help="tool socket path ($QLEDGE_SOCKET)")
    p.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE",
                   help="the daemon's TOML configuration, for its home and socket ($QLEDGE_CONFIG)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="machine-readable output (errors too, as JSON on stderr)")
    return p


def add_verb(sub: Subcommands, name: str, handler: Handler | None, help_text: str,
             common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A verb's parser: the common options, its line as its description, its handler."""
    import argparse

    p = sub.add_parser(name, parents=[common], help=help_text, description=help_text,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=handler)
    return p


# -- argument types: each says what is wrong in the flag's own terms ------------------------
# (argparse has loaded re by the time any of these runs.)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZES = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_BACK = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def seconds(flag: str, text: str) -> float:
    """`90`, `1.5`, `90s`, `5m`, `2h`, `1d` as seconds."""
    import math
    import re

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([smhd]?)\s*", text.lower())
    if not match:
        raise UsageError(f"{flag} {text!r} is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(value):
        raise UsageError(f"{flag} {text!r} is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)")
    return value


def timeout(text: str) -> float:
    """--timeout: seconds, 1 s to 7 days."""
    from edge.core import tasks as limits

    value = seconds("--timeout", text)
    if value < limits.MIN_TIMEOUT_MS / 1000:
        raise UsageError("--timeout must be at least 1 second")
    if value > limits.MAX_TIMEOUT_MS / 1000:
        raise UsageError(f"--timeout must be at most 7 days ({limits.MAX_TIMEOUT_MS // 1000} seconds)")
    return value


def jitter(text: str) -> int:
    """--jitter: whole seconds, 0 to 3600."""
    from edge.core.triggers import MAX_JITTER_S

    value = seconds("--jitter", text)
    if value != int(value) or not 0 <= value <= MAX_JITTER_S:
        raise UsageError(f"--jitter must be a whole number of seconds from 0 to {MAX_JITTER_S} (1 hour)")
    return int(value)


def log_cap(text: str) -> int:
    """--log-cap: bytes (64K, 1M, 1G are KiB, MiB, GiB), 4 KiB to 1 GiB."""
    import re

    from edge.core import tasks as limits

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
        from edge.core import tasks as limits

        value = seconds(flag, text)
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
    import re

    from edge.core.text import MAX_NAME, NAME_PATTERN, NAME_RULE

    if len(text) > MAX_NAME or not re.match(NAME_PATTERN, text):
        raise UsageError(f"{what} {text!r} is not a valid name: use {NAME_RULE}")
    return text


def task_names(c: Client) -> list[tuple[str, str]]:
    """(id, name) of every task, through the list tool this caller may call."""
    from edge.transports.client import all_pages

    if c.may_call("qledge.task.list"):
        from edge.tools.builtin import tasks as task_tools

        def page(after: str | None) -> tuple[list[tuple[str, str]], str | None]:
            found = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
            return [(t.id, t.name) for t in found.tasks], found.next
    else:
        from edge.tools.ai.projections import TaskCursor, TaskListArgs, TaskPage

        def page(after: str | None) -> tuple[list[tuple[str, str]], str | None]:
            args = TaskListArgs(after=TaskCursor(task_id=after) if after else None, limit=64)
            found = c.typed("qinglong.task.list", args, TaskPage)
            return ([(t.task_id, t.name) for t in found.tasks],
                    found.next.task_id if isinstance(found.next, TaskCursor) else None)

    return all_pages(page)


def other_names(c: Client, task_ids: Iterable[str]) -> dict[str, str]:
    """The names of these tasks that differ from their ids (imported ones, `每日签到`): what
    a list's NAME column shows. Empty when none differs, and the column is left out."""
    from edge.transports.client import CallFailed

    wanted = set(task_ids)
    if not wanted:
        return {}
    try:
        return {i: n for i, n in task_names(c) if i in wanted and n != i}
    except CallFailed:  # a caller who may list runs but not tasks: the ids alone
        return {}


def named(names: dict[str, str], task_id: str) -> list[str]:
    """The NAME cell after a TASK cell, when the list has that column (as `task list`: a
    task whose name is its id shows it again)."""
    return [names.get(task_id, task_id)] if names else []


def _task_exists(c: Client, task: str) -> bool:
    from edge.transports.client import CallFailed

    try:
        if c.may_call("qledge.task.get"):
            c.call("qledge.task.get", {"taskId": task})
            return True
        return bool(c.call("qinglong.task.get", {"taskId": task}).get("found"))
    except CallFailed as exc:
        if exc.code == "not_found":
            return False
        raise


def task_id(c: Client, text: str) -> str:
    """The id of the task `text` names: the task with that id, else the one task with that
    name (`每日签到`, as imported). A name two tasks share is refused with both ids; a text
    that names no task gets the daemon's own not_found message."""
    import re

    from edge.core.text import MAX_NAME, NAME_PATTERN
    from edge.transports.client import CallFailed

    shaped = len(text) <= MAX_NAME and re.match(NAME_PATTERN, text) is not None
    if shaped and _task_exists(c, text):  # an id, the common case: one call
        return text
    tasks = task_names(c)
    named = sorted(i for i, n in tasks if n == text)
    if len(named) == 1:
        return named[0]
    if named:
        raise UsageError(f"task name {text!r} is shared by tasks {', '.join(named)}: give one of their ids")
    raise CallFailed("not_found", f"task {text!r} not found" + ("" if shaped else ": no task has that id or name"))


def run_ref(c: Client, text: str) -> str:
    """A run as typed: its id, a prefix, or TASK:latest / TASK:latest-failed, where TASK may
    be the task's name."""
    task, sep, which = text.rpartition(":")
    if sep and task and which in ("latest", "latest-failed"):
        return f"{task_id(c, task)}:{which}"
    return text


class Typed(int):
    """A number parsed from what a person typed, which it keeps (`typed`): a hint that
    repeats a command repeats it as it was written, not as epoch milliseconds."""

    typed: str

    def __new__(cls, value: int, typed: str) -> Typed:
        made = super().__new__(cls, value)
        made.typed = typed
        return made


def plain(value: int | None) -> int | None:
    """A Typed number as the int a wire shape encodes."""
    return None if value is None else int(value)


def time_arg(flag: str) -> Callable[[str], int]:
    """A moment as ms: a duration back from now (`30m`, `12h`, `7d`, `2w`) or a local date
    or time (`2026-11-30`, `2026-11-30 08:00`, any ISO 8601, with or without an offset);
    the value is Typed, so it still says how it was written."""

    def parse(text: str) -> int:
        return Typed(moment(text), text)

    def moment(text: str) -> int:
        import re
        from datetime import datetime

        match = re.match(r"^([0-9]+)([smhdw])$", text.strip().lower())
        if match:
            return int(time.time() * 1000) - int(match.group(1)) * _BACK[match.group(2)] * 1000
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UsageError(f"{flag} {text!r} is neither a duration (30m, 12h, 7d, 2w) nor a date or time"
                             " (2026-11-30, 2026-11-30 08:00)") from None
        return int((when if when.tzinfo else when.astimezone()).timestamp() * 1000)

    return parse


def compare_and_set(attempt: Callable[[], T], winner: Callable[[], str]) -> T:
    """Run `attempt` (read the head, write with its revision); on a concurrent change run it
    once more on the new head; a second loss says who won (`winner`) and changes nothing."""
    from edge.transports.client import CallFailed

    def moved(exc: CallFailed) -> bool:  # the refusal of a compare-and-set: the head moved on
        return exc.code == "conflict" and " is at revision " in exc.message

    try:
        return attempt()
    except CallFailed as exc:
        if not moved(exc):
            raise
    try:
        return attempt()
    except CallFailed as exc:
        if not moved(exc):
            raise
        raise CallFailed("conflict", winner()) from None


def resolve(path: str) -> str:
    """Relative to where the command was typed, never to the daemon's own directory."""
    return path if path.startswith("/") else os.path.abspath(path)


# -- output ---------------------------------------------------------------------------------

_json: list[Any] = []  # msgspec's JSON encoder, built on first use


def when(ms: int | None) -> str:
    """An instant in the local time zone, the one format of edge.moment."""
    from edge import moment

    return moment(ms)


def duration(start_ms: int | None, end_ms: int | None) -> str:
    """How long something took, the one format of edge.duration_text."""
    from edge import duration_text

    return duration_text(None if start_ms is None or end_ms is None else end_ms - start_ms)


def span(secs: float, units: int = 4) -> str:
    """A length of time in whole units, the largest first: 30s, 1h, 1h30m, 7d, 0.5s; with
    `units`, only that many of them (the rest rounded away): span(49490, 2) is 13h45m."""
    if secs < 60 and secs != int(secs):
        return f"{secs:g}s"
    sizes = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    rest = int(secs)
    first = next((i for i, (_, size) in enumerate(sizes) if rest >= size), len(sizes) - 1)
    smallest = sizes[min(first + units, len(sizes)) - 1][1]
    rest = round(rest / smallest) * smallest
    parts = []
    for unit, size in sizes:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def size(n: int) -> str:
    """Bytes for people: 512 B, 64 KiB, 1 MiB, 1.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} B"


def exit_status(code: int | None) -> str:
    """A run's exit column: `0`, `3`, `SIGTERM`; `-` while unknown."""
    if code is None:
        return "-"
    from edge.core.runs import exit_text

    return str(code) if code >= 0 else exit_text(code).removeprefix("killed by ")


def json_out(value: object) -> None:
    """Any encodable value; Structs as their wire JSON (camelCase names, their omit_defaults)."""
    if not _json:
        import msgspec

        _json.append(msgspec.json.Encoder())
    sys.stdout.write(_json[0].encode(value).decode() + "\n")


def table(rows: list[list[str]], headers: list[str]) -> None:
    if not rows:
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)).rstrip())


def fields(pairs: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        print(f"{key + ':':<{width + 1}} {'-' if value is None else value}")


def command_text(spec: TaskSpec) -> str:
    from edge.core.tasks import AgentInstruction, ShellCommand

    cmd = spec.command
    if isinstance(cmd, ShellCommand):
        return cmd.command
    if isinstance(cmd, AgentInstruction):
        return "AI: " + " ".join(cmd.instruction.split())
    return " ".join([cmd.file, *cmd.args])


def run_line(run: Run) -> str:
    from edge.core.runs import exit_text

    extra = []
    if run.exit_code is not None:
        extra.append(exit_text(run.exit_code))
    took = duration(run.started_at_ms, run.finished_at_ms)
    if took != "-":
        extra.append(took)
    # For a non-zero exit or a signal, the exit text already says what the summary would.
    if run.error_summary and run.status != "succeeded" and run.error_code not in ("exit_nonzero", "killed_by_signal"):
        extra.append(run.error_summary)
    return f"run {run.id} {run.status}" + (f" ({', '.join(extra)})" if extra else "")


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def show(a: argparse.Namespace, value: T, human: Callable[[T], None]) -> int:
    """`value` as JSON with --json, else as `human` prints it."""
    if a.json:
        json_out(value)
    else:
        human(value)
    return EXIT_OK


def show_list(a: argparse.Namespace, items: list[T], empty: str, row: Callable[[T], list[str]],
              headers: list[str]) -> int:
    if a.json:
        json_out(items)
    elif not items:
        print(empty)
    else:
        table([row(item) for item in items], headers)
    return EXIT_OK
