"""Human-readable output; `--json` bypasses all of it."""

from __future__ import annotations

import sys
import time

import msgspec

from edge.core.runs import Run
from edge.core.tasks import AgentInstruction, ShellCommand, TaskSpec

_json = msgspec.json.Encoder()


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def duration(start_ms: int | None, end_ms: int | None) -> str:
    if start_ms is None or end_ms is None:
        return "-"
    seconds = (end_ms - start_ms) / 1000
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


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
        extra.append(f"exit {run.exit_code}")
    took = duration(run.started_at_ms, run.finished_at_ms)
    if took != "-":
        extra.append(took)
    if run.error_summary and run.status != "succeeded":
        extra.append(run.error_summary)
    return f"run {run.id} {run.status}" + (f" ({', '.join(extra)})" if extra else "")
