"""The read tools offered to AI clients (namespace `qinglong.*`, all `ai=True`)."""

from __future__ import annotations

from edge.tools.ai import log_excerpt, projections, runs, task_runs_compare
from edge.tools.definition import Tool


def ai_tools() -> list[Tool]:
    return [*projections.TOOLS, *runs.TOOLS, *task_runs_compare.TOOLS, *log_excerpt.TOOLS]
