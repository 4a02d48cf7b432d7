"""What a tool handler receives: the caller, the project and the services it may use."""

from __future__ import annotations

import msgspec

from edge.core.auth import Principal
from edge.core.ports.runtime import Clock, RunController, StatusFacts, TriggerService
from edge.core.ports.stores import (
    AuditLog,
    AuditReader,
    CredentialStore,
    Readers,
    RunLogFiles,
    RunStore,
    SecretStore,
    TaskStore,
)


class Caller(msgspec.Struct, frozen=True):
    """Transport facts about one call, before authentication."""

    transport: str  # "socket" | "mcp"
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
    readers: Readers
    runner: RunController
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
