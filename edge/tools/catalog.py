"""The daemon's tools: the `qledge.*` management tools the CLI uses, and the `qinglong.*`
read tools offered to AI clients."""

from __future__ import annotations

from edge.tools.ai import log_excerpt, projections, runs, task_runs_compare
from edge.tools.builtin import backup, credentials, secrets, status, tasks, triggers
from edge.tools.builtin import runs as run_tools
from edge.tools.definition import Tool


def builtin_tools() -> list[Tool]:
    return [*tasks.TOOLS, *triggers.TOOLS, *run_tools.TOOLS, *credentials.TOOLS, *secrets.TOOLS, *status.TOOLS,
            *backup.TOOLS]


def ai_tools() -> list[Tool]:
    return [*projections.TOOLS, *runs.TOOLS, *task_runs_compare.TOOLS, *log_excerpt.TOOLS]
