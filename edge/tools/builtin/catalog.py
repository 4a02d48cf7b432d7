"""Tools the CLI uses to manage the daemon (namespace `qledge.*`)."""

from __future__ import annotations

from edge.tools.builtin import credentials, runs, secrets, status, tasks, triggers
from edge.tools.definition import Tool


def builtin_tools() -> list[Tool]:
    return [*tasks.TOOLS, *triggers.TOOLS, *runs.TOOLS, *credentials.TOOLS, *secrets.TOOLS, *status.TOOLS]
