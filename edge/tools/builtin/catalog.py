"""Tools the CLI uses to manage the daemon (namespace `qledge.*`)."""

from __future__ import annotations

from edge.tools.builtin import credentials, runs, status, tasks, triggers
from edge.tools.definition import Tool


def builtin_tools() -> list[Tool]:
    return [*tasks.TOOLS, *triggers.TOOLS, *runs.TOOLS, *credentials.TOOLS, *status.TOOLS]
