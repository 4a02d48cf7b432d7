"""Runs: a status machine whose every transition is recorded as an event."""

from __future__ import annotations

from typing import Literal

import msgspec

from edge.core.errors import conflict
from edge.core.text import Millis, ReadId

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"]
Origin = Literal["scheduled", "manual", "fire_once", "agent"]
ActorType = Literal["user", "scheduler", "runner", "system"]

ACTIVE: frozenset[str] = frozenset({"queued", "running"})
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})

_NEXT: dict[str, frozenset[str]] = {
    # A queued run may end without starting: cancelled, refused (failed) or lost.
    "queued": frozenset({"running", "failed", "cancelled", "lost"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"}),
}

ERROR_SUMMARY_MAX = 500


class Run(msgspec.Struct, rename="camel"):
    id: str
    project_id: str
    task_id: str
    task_revision: int
    origin: Origin
    status: RunStatus
    version: int
    event_seq: int
    created_at_ms: int
    trigger_id: str | None = None
    trigger_revision: int | None = None
    queued_at_ms: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    scheduled_for_ms: int | None = None
    exit_code: int | None = None
    error_code: str | None = None
    error_summary: str | None = None
    log_bytes: int = 0
    log_truncated: bool = False
    idempotency_key: str | None = None
    jitter_ms: int | None = None
    log_dropped_at_ms: int | None = None  # the log quota removed the log (log_bytes is what it had)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class RunCursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """A position in (created_at_ms DESC, id DESC) order: the key of every run page, on
    the wire (`after`, `next`) and in storage."""

    created_at_ms: Millis
    run_id: ReadId


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


class RunEvent(msgspec.Struct, rename="camel"):
    run_id: str
    sequence: int
    type: str
    actor_type: ActorType
    created_at_ms: int
    detail: str | None = None


def check_transition(current: str, target: str) -> None:
    if target not in _NEXT.get(current, frozenset()):
        raise conflict(f"run is {current}; it cannot become {target}")


def event_type(status: str) -> str:
    return f"run.{status}"


def summary(text: str) -> str:
    """Bound free text stored on a run (one paste must not blow up a row)."""
    text = text.strip()
    return text if len(text) <= ERROR_SUMMARY_MAX else text[: ERROR_SUMMARY_MAX - 1] + "…"
