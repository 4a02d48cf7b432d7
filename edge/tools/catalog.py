"""The daemon's tools: the `qledge.*` management tools the CLI uses, and the `qinglong.*`
read tools offered to AI clients.

Tools an idle daemon rarely needs (export and import, API credentials, secrets) are
declared here and their modules loaded by their first call (edge.tools.definition.Deferred):
each module builds its tools from these declarations, so the two agree.
"""

from __future__ import annotations

from edge.tools.ai import log_excerpt, projections, runs, task_runs_compare
from edge.tools.builtin import status, tasks, triggers
from edge.tools.builtin import runs as run_tools
from edge.tools.context import ToolInfo
from edge.tools.definition import WRITE_DEADLINE_S, Deferred, Tool, info

IMPORT_DEADLINE_S = 4 * WRITE_DEADLINE_S

BACKUP: tuple[ToolInfo, ...] = (
    info("qledge.export", effect="read", risk="high", permission=("task.inspect", "trigger.inspect"),
         title="Tasks and triggers at their heads, for an export"),
    info("qledge.secret.export", effect="read", risk="high", permission="secret.export",
         title="Secret values, for an export made with secrets"),
    info("qledge.import", effect="write", risk="high", permission=("task.write", "trigger.write"),
         deadline_s=IMPORT_DEADLINE_S, title="Create or (with replace) overwrite tasks and triggers from an export"),
    info("qledge.secret.import", effect="write", risk="high", permission="secret.write",
         deadline_s=IMPORT_DEADLINE_S, title="Store secrets from an export"),
)
CREDENTIALS: tuple[ToolInfo, ...] = (
    info("qledge.credential.create", effect="write", risk="high", permission="credential.admin",
         title="Create an API credential"),
    info("qledge.credential.list", effect="read", risk="high", permission="credential.admin",
         title="API credentials", deadline_s=WRITE_DEADLINE_S),
    info("qledge.credential.revoke", effect="write", risk="high", permission="credential.admin",
         title="Revoke an API credential"),
    info("qledge.audit.list", effect="read", risk="high", permission="audit.read",
         title="The security audit, newest first"),
)
SECRETS: tuple[ToolInfo, ...] = (
    info("qledge.secret.set", effect="write", risk="high", permission="secret.write",
         title="Store a secret (create or replace); its value is never returned"),
    info("qledge.secret.list", effect="read", risk="high", permission="secret.read", title="Secret names and dates",
         deadline_s=WRITE_DEADLINE_S),
    info("qledge.import.secret", effect="write", risk="high", permission="secret.write",
         title="Store a secret from an import, once per import key; never replaces one"),
    info("qledge.secret.delete", effect="write", risk="high", permission="secret.write", title="Delete a secret"),
)


def builtin_tools() -> list[Tool]:
    """The management tools loaded with the daemon."""
    return [*tasks.TOOLS, *triggers.TOOLS, *run_tools.TOOLS, *status.TOOLS]


def _backup() -> list[Tool]:
    from edge.tools.builtin import backup

    return backup.TOOLS


def _credentials() -> list[Tool]:
    from edge.tools.builtin import credentials

    return credentials.TOOLS


def _secrets() -> list[Tool]:
    from edge.tools.builtin import secrets

    return secrets.TOOLS


def deferred_tools() -> list[Deferred]:
    """The management tools loaded by their first call."""
    return [Deferred(infos=BACKUP, load=_backup), Deferred(infos=CREDENTIALS, load=_credentials),
            Deferred(infos=SECRETS, load=_secrets)]


def ai_tools() -> list[Tool]:
    return [*projections.TOOLS, *runs.TOOLS, *task_runs_compare.TOOLS, *log_excerpt.TOOLS]
