"""Storage ports: what the tools and the runner need from storage, and nothing more.

Adapters (edge/storage/sqlite) implement these; composition (edge/app) wires them.
Every method is scoped by project id. Storage faults raise ToolError("unavailable").
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from edge.core.audit import AuditRecord
from edge.core.auth import Credential
from edge.core.runs import ActorType, Run, RunEvent
from edge.core.tasks import Task, TaskSpec


class RunUpdate(msgspec.Struct, omit_defaults=True):
    """Columns a transition sets besides status; None means unchanged."""

    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    exit_code: int | None = None
    error_code: str | None = None
    error_summary: str | None = None
    log_bytes: int | None = None
    log_truncated: bool | None = None
    pid: int | None = None
    pid_start_ticks: int | None = None


class RunProcess(msgspec.Struct, frozen=True):
    """Where an active run's process was: its pid and /proc start time (for recovery)."""

    pid: int | None
    start_ticks: int | None


class Counts(msgspec.Struct, rename="camel"):
    tasks: int
    triggers: int
    runs: int
    active_runs: int
    credentials: int


class RunCursor(msgspec.Struct, frozen=True):
    created_at_ms: int
    run_id: str


class TaskStore(Protocol):
    async def create(self, project: str, task_id: str, name: str, spec: TaskSpec, now_ms: int) -> Task: ...

    async def update(
        self, project: str, task_id: str, expected_revision: int, spec: TaskSpec, name: str | None, now_ms: int
    ) -> Task: ...

    async def set_enabled(
        self, project: str, task_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Task: ...

    async def get(self, project: str, task_id: str, revision: int | None = None) -> Task | None: ...

    async def list(self, project: str, after: str | None, limit: int) -> list[Task]: ...

    async def delete(self, project: str, task_id: str, expected_revision: int | None) -> list[str]:
        """Delete a task with its triggers and finished runs; returns the deleted run ids."""
        ...


class RunStore(Protocol):
    async def create(self, run: Run, actor: ActorType) -> Run: ...

    async def transition(
        self,
        run_id: str,
        expected_version: int,
        status: str,
        now_ms: int,
        actor: ActorType,
        update: RunUpdate,
        detail: str | None = None,
    ) -> Run: ...

    async def get(self, project: str, run_id: str) -> Run | None: ...

    async def list(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]: ...

    async def active(self) -> list[Run]:
        """Runs of every project that are queued or running."""
        ...

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        """Active runs with their recorded process, for reconciling after a crash."""
        ...

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]: ...


class CredentialStore(Protocol):
    async def create(self, credential: Credential, digest: bytes) -> None: ...

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None: ...

    async def list(self, project: str) -> list[Credential]: ...

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None: ...


class AuditLog(Protocol):
    async def append(self, record: AuditRecord) -> None:
        """Durably record one call. Raises ToolError("unavailable") when it cannot."""
        ...


class SecretInfo(msgspec.Struct, rename="camel"):
    """What may be shown about a secret: never its value."""

    name: str
    created_at_ms: int
    updated_at_ms: int


class SecretStore(Protocol):
    """Write-only from the outside: values leave only to the runner and to redaction."""

    async def set(self, project: str, name: str, value: str, now_ms: int) -> SecretInfo: ...

    async def list(self, project: str) -> list[SecretInfo]: ...

    async def delete(self, project: str, name: str) -> bool: ...

    async def resolve(self, project: str, names: list[str]) -> dict[str, str]:
        """Values of the named secrets that exist (for a run's environment)."""
        ...

    async def values(self, project: str) -> list[str]:
        """Every secret value of the project (for redacting output)."""
        ...
