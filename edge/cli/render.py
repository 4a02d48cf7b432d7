"""Human-readable output; `--json` bypasses all of it.

One format for every time a person reads: local time with its zone abbreviation
(`2026-11-30 10:06:36 CET`); durations humanized (`0.01s`, `4m05s`, `1h`); a process a
signal ended is `killed by SIGTERM`, never a negative exit code.
"""

from __future__ import annotations

import sys
import time

import msgspec

from edge.core.runs import Run, exit_text
from edge.core.tasks import AgentInstruction, ShellCommand, TaskSpec

_json = msgspec.json.Encoder()
TIME_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def when(ms: int | None) -> str:
    """An instant in the local time zone (the C library's: $TZ, else /etc/localtime)."""
    if ms is None:
        return "-"
    return time.strftime(TIME_FORMAT, time.localtime(ms / 1000))


def duration(start_ms: int | None, end_ms: int | None) -> str:
    """How long something took: hundredths under a minute, then 4m05s, 1h02m03s, 2d03h04m."""
    if start_ms is None or end_ms is None:
        return "-"
    seconds = (end_ms - start_ms) / 1000
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def span(seconds: float, units: int = 4) -> str:
    """A length of time in whole units, the largest first: 30s, 1h, 1h30m, 7d, 0.5s; with
    `units`, only that many of them (the rest rounded away): span(49490, 2) is 13h45m."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    sizes = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    rest = int(seconds)
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
    return str(code) if code >= 0 else exit_text(code).removeprefix("killed by ")


def json_out(value: object) -> None:
    """Any encodable value; Structs as their wire JSON (camelCase names, their omit_defaults)."""
    sys.stdout.write(_json.encode(value).decode() + "\n")


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
    cmd = spec.command
    if isinstance(cmd, ShellCommand):
        return cmd.command
    if isinstance(cmd, AgentInstruction):
        return "AI: " + " ".join(cmd.instruction.split())
    return " ".join([cmd.file, *cmd.args])


def run_line(run: Run) -> str:
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
