"""What a tool handler receives: the caller, the project and the services it may use."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from edge.core.auth import Principal
from edge.core.clock import Clock
from edge.core.ports import AuditLog, CredentialStore, RunStore, SecretStore, TaskStore
from edge.core.runs import Run
from edge.core.tasks import Task


class Caller(msgspec.Struct, frozen=True):
    """Transport facts about one call, before authentication."""

    transport: str  # "socket" | "mcp"
    token: str | None = None
    peer_uid: int | None = None
    request_id: str | None = None


class RunController(Protocol):
    """The runner, as tools see it."""

    async def start(self, task: Task, actor: str) -> Run: ...

    async def cancel(self, project: str, run_id: str, reason: str) -> Run: ...

    async def wait(self, project: str, run_id: str, timeout_s: float) -> Run | None: ...

    def log_path(self, run_id: str) -> str: ...


class Services:
    """Everything composition hands to tools.

    The constructor takes what every daemon has; capabilities set their own attribute
    after construction (composition owns that wiring), so adding one never widens it.
    """

    secrets: SecretStore | None = None
    triggers: Any = None  # the trigger store and scheduler (edge.scheduler)
    readers: Any = None  # narrow readers behind the AI read tools (edge.tools.ai)
    catalog: Any = None  # the tool registry (edge.tools.definition.Registry), for qledge.tools.list

    def __init__(
        self,
        *,
        project: str,
        clock: Clock,
        tasks: TaskStore,
        runs: RunStore,
        credentials: CredentialStore,
        audit: AuditLog,
        runner: RunController,
        pepper: bytes,
        facts: Any,
    ) -> None:
        self.project = project
        self.clock = clock
        self.tasks = tasks
        self.runs = runs
        self.credentials = credentials
        self.audit = audit
        self.runner = runner
        self.pepper = pepper
        self.facts = facts  # daemon facts for qledge.status (see edge.app.facts)


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
