"""What a tool handler receives: the caller, the project and the services it may use."""

from __future__ import annotations

import msgspec

from edge.core.auth import TASK_PRIVILEGED, Principal, first_missing, task_permissions
from edge.core.errors import ToolError
from edge.core.ports.runtime import Clock, RunController, StatusFacts, TaskUsers, TriggerService
from edge.core.ports.stores import (
    AuditLog,
    AuditReader,
    CredentialStore,
    Readers,
    RunLogFiles,
    RunLogReader,
    RunStore,
    SecretStore,
    TaskStore,
)
from edge.core.tasks import AgentInstruction, TaskSpec


class Caller(msgspec.Struct, frozen=True):
    """Transport facts about one call, before authentication."""

    transport: str  # "socket" | "mcp" | "web" (the panel's calls, on the tool socket)
    token: str | None = None
    peer_uid: int | None = None
    request_id: str | None = None


class ToolInfo(msgspec.Struct, rename="camel"):
    """One entry of `qledge.tools.list`: what a tool is, without its handler."""

    name: str
    version: str
    effect: str
    risk: str
    permissions: list[str]  # besides tool.call:<name>
    deadline_s: float
    title: str
    ai: bool


class Services(msgspec.Struct, frozen=True, kw_only=True):
    """Everything composition hands to tools, complete at construction (edge.app.graph)."""

    project: str
    clock: Clock
    pepper: bytes  # the HMAC key for credential digests
    tasks: TaskStore
    runs: RunStore
    triggers: TriggerService
    credentials: CredentialStore
    secrets: SecretStore
    audit: AuditLog
    audit_reader: AuditReader
    logs: RunLogFiles
    log_reader: RunLogReader  # logs as tools read them (on a cluster, of a run on any node)
    readers: Readers
    runner: RunController
    users: TaskUsers
    facts: StatusFacts
    catalog: list[ToolInfo]  # every registered tool, for qledge.tools.list


class ToolContext:
    __slots__ = ("services", "principal", "caller")

    def __init__(self, services: Services, principal: Principal, caller: Caller) -> None:
        self.services = services
        self.principal = principal
        self.caller = caller

    @property
    def project(self) -> str:
        return self.services.project

    def now_ms(self) -> int:
        return self.services.clock.now_ms()

    def may_run(self, what: str, spec: TaskSpec) -> bool:
        """Check that the caller may write `spec`, or make it runnable: the permissions
        edge.core.auth.task_permissions names for it. Returns whether the caller holds
        task.privileged (recorded on a revision it writes). Raises invalid_argument for a
        user, group or working directory this system refuses, permission_denied naming
        the first permission missing."""
        grant = self.principal.permissions
        if isinstance(spec.command, AgentInstruction):
            # Its runs are the [agent] user's, not the task's, and name no secrets: what
            # they may do is read, through the AI read tools, and the writer must hold that.
            missing = first_missing(grant, task_permissions(False, (), self.ai_reads()))
            if missing is not None:
                raise ToolError("permission_denied", f"{what}: an AI task's runs call the AI read tools;"
                                f" that requires permission {missing}")
            return first_missing(grant, (TASK_PRIVILEGED,)) is None
        users = self.services.users
        run_as = users.resolve(spec.user, spec.group)
        users.working_dir(spec.working_dir, run_as)
        users.program(spec, run_as)
        missing = first_missing(grant, task_permissions(run_as.privileged is not None, spec.secrets()))
        if missing is not None:
            why = run_as.privileged if missing == TASK_PRIVILEGED else f"it uses secret {missing.split(':', 1)[1]!r}"
            raise ToolError("permission_denied", f"{what}: {why}; that requires permission {missing}")
        return first_missing(grant, (TASK_PRIVILEGED,)) is None

    def ai_reads(self) -> list[str]:
        """What an AI run's credential may do at most: call each AI read tool, with its
        permissions (edge.tools.agent grants a run these, or fewer)."""
        tools = [t for t in self.services.catalog if t.ai and t.effect == "read"]
        return sorted({f"tool.call:{t.name}" for t in tools} | {p for t in tools for p in t.permissions})
