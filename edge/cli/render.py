"""Human-readable output; `--json` bypasses all of it."""

from __future__ import annotations

import sys
import time
from typing import Any

import msgspec

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


def json_out(value: Any) -> None:
    sys.stdout.write(_json.encode(value).decode() + "\n")


def table(rows: list[list[str]], headers: list[str]) -> None:
    if not rows:
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


def fields(pairs: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        print(f"{key + ':':<{width + 1}} {'-' if value is None else value}")


def command_text(spec: dict) -> str:
    cmd = spec.get("command", {})
    if cmd.get("kind") == "shell":
        return cmd.get("command", "")
    return " ".join([cmd.get("file", ""), *cmd.get("args", [])])


def run_line(run: dict) -> str:
    status = run["status"]
    extra = []
    if run.get("exitCode") is not None:
        extra.append(f"exit {run['exitCode']}")
    took = duration(run.get("startedAtMs"), run.get("finishedAtMs"))
    if took != "-":
        extra.append(took)
    if run.get("errorSummary") and status not in ("succeeded",):
        extra.append(run["errorSummary"])
    return f"run {run['id']} {status}" + (f" ({', '.join(extra)})" if extra else "")
