"""Runs: a status machine whose every transition is recorded as an event."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from edge.core.errors import conflict
from edge.core.text import Millis, ReadId

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"]
Origin = Literal["scheduled", "manual", "fire_once", "agent", "retry"]
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
    retry_of: str | None = None  # the run this one retries (origin `retry`)
    attempt: int = 1  # 1 for a first run, n + 1 for the n-th retry
    retry_due_at_ms: int | None = None  # this run failed and its retry is admitted then

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


# A retry runs again what failed or timed out; a run that never got to start for want of
# its task, or that someone cancelled, or that a dead daemon lost, is not retried.
RETRIED: frozenset[str] = frozenset({"failed", "timed_out"})
NOT_RETRIED_CODES: frozenset[str] = frozenset({"task_missing"})


def retry_delay_ms(delay_s: float, backoff: float, max_delay_s: float | None, attempt: int) -> int:
    """How long after run `attempt` ended its retry is due: delay_s * backoff**(attempt-1),
    at most max_delay_s."""
    delay = delay_s * backoff ** max(0, min(attempt - 1, 64))
    if max_delay_s is not None:
        delay = min(delay, max_delay_s)
    return int(min(delay, 86_400.0) * 1000)


def _ignore(*_: object) -> None:
    return None


class Followers:
    """Who hears, once its transaction has committed, what a write set in motion: a retry
    falling due (the scheduler arms it) and notifications queued (the notifier wakes).
    Composition fills it in; the stores call it. Callbacks never raise into the store."""

    def __init__(self) -> None:
        self.retry: Callable[[str, int], None] = _ignore  # (run id, due at ms)
        self.notify: Callable[[], None] = _ignore


def check_transition(current: str, target: str) -> None:
    if target not in _NEXT.get(current, frozenset()):
        raise conflict(f"run is {current}; it cannot become {target}")


def event_type(status: str) -> str:
    return f"run.{status}"


def summary(text: str) -> str:
    """Bound free text stored on a run (one paste must not blow up a row)."""
    text = text.strip()
    return text if len(text) <= ERROR_SUMMARY_MAX else text[: ERROR_SUMMARY_MAX - 1] + "…"
