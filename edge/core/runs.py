"""Runs: a status machine whose every transition is recorded as an event."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec

from edge.core.errors import conflict
from edge.core.ids import uuid7_named
from edge.core.text import Millis, Name, ReadId

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"]
Origin = Literal["scheduled", "manual", "fire_once", "agent", "retry"]
ActorType = Literal["user", "scheduler", "runner", "system"]

ACTIVE: frozenset[str] = frozenset({"queued", "running"})
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
# What `TASK:latest-failed` means: the run did not succeed and nobody cancelled it.
FAILED_STATUSES: tuple[RunStatus, ...] = ("failed", "timed_out", "lost")
# Finished but not succeeded; rare, so an index of these alone costs writes only then
# (schema migration 7: runs_unsuccessful_idx, runs_task_unsuccessful_idx).
UNSUCCESSFUL: tuple[str, ...] = ("failed", "timed_out", "lost", "cancelled")
STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost")
ORIGINS: tuple[str, ...] = ("scheduled", "manual", "fire_once", "agent", "retry")
# How a run comes to be, as people filter by it. `agent` stays readable in the wire shape but
# nothing creates it: an AI task's runs are scheduled, manual or retries like any task's.
STARTED: dict[str, str] = {
    "scheduled": "a trigger's fire",
    "manual": "qledge run start (or the run.start tool, from the panel or an AI client)",
    "fire_once": "the one catch-up run of fires missed while the daemon was down (--misfire fire_once)",
    "retry": "an automatic retry of a failed run (the task's --retries)",
}

_NEXT: dict[str, frozenset[str]] = {
    # A queued run may end without starting: cancelled, refused (failed) or lost.
    "queued": frozenset({"running", "failed", "cancelled", "lost"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"}),
}

ERROR_SUMMARY_MAX = 500

# The runs of cron fires (not of `@once` or `@reboot`, whose keys are stored): what a fire
# admitted twice would repeat.
CRON_ORIGINS: frozenset[str] = frozenset({"scheduled", "fire_once"})


def cron_key(trigger_id: str, trigger_revision: int, fire_ms: int) -> str:
    """The idempotency key of a cron fire's run, as every reader shows it."""
    return f"cron:{trigger_id}:{trigger_revision}:{fire_ms}"


def fire_run_id(project: str, trigger_id: str, trigger_revision: int, fire_ms: int) -> str:
    """The id of a cron fire's run: named by the fire (edge.core.ids.uuid7_named), so the
    run's primary key itself makes a repeat impossible, in each project apart; the key is
    then derived from the run's columns instead of stored (`derived_key`)."""
    return uuid7_named(fire_ms, f"{project}\n{cron_key(trigger_id, trigger_revision, fire_ms)}")


def derived_key(origin: str, trigger_id: str | None, trigger_revision: int | None,
                scheduled_for_ms: int | None) -> str | None:
    """The key of a run stored without one: a cron fire's, from its columns; else None."""
    if origin in CRON_ORIGINS and trigger_id is not None and trigger_revision is not None \
            and scheduled_for_ms is not None:
        return cron_key(trigger_id, trigger_revision, scheduled_for_ms)
    return None


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


class RunQuery(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """Which of a project's runs a list shows: every field given narrows it."""

    task_id: Name | None = None
    statuses: Annotated[list[RunStatus], msgspec.Meta(max_length=7)] = []  # any of these
    origins: Annotated[list[Origin], msgspec.Meta(max_length=4)] = []  # any of these
    since_ms: Millis | None = None  # created at or after
    until_ms: Millis | None = None  # created before


class RunSearch(msgspec.Struct):
    """One page of a search: the runs found, and where the next page starts (None: no more)."""

    runs: list[Run]
    next: RunCursor | None


class RunDefaults(msgspec.Struct, rename="camel"):
    """What a run gets when its task does not say: shown beside a task's own settings."""

    work_dir: str
    log_cap_bytes: int


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


def exit_text(code: int) -> str:
    """`exit 3`, or `killed by SIGTERM` for a process a signal ended (a negative code)."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


# -- capped logs: the format every reader of a log may rely on ----------------------

LOG_HEAD_MAX = 64 * 1024  # a log over its cap keeps at most this much of its beginning
LOG_CAP_MARKER = re.compile(rb"\n\[qledge: log cap reached; [0-9]+ bytes dropped here\]\n")


def log_cap_marker(dropped: int) -> bytes:
    """The line between a capped log's head and its tail."""
    return f"\n[qledge: log cap reached; {dropped} bytes dropped here]\n".encode()


# -- naming a run -------------------------------------------------------------------

MIN_PREFIX = 8
_PREFIX = re.compile(r"^[0-9a-f-]+$")
LATEST, LATEST_FAILED = "latest", "latest-failed"


class RunReference(msgspec.Struct, frozen=True):
    """How a person named a run: a whole id (`run_id`), possibly an id prefix (`prefix`,
    tried when no run has that whole id), or a task's newest run (`TASK:latest`) or newest
    failed one (`TASK:latest-failed`)."""

    run_id: str | None = None
    prefix: str | None = None
    task_id: str | None = None
    failed: bool = False


def parse_reference(text: str) -> RunReference:
    """Raises ValueError (one line) for a reference that cannot name a run."""
    task, colon, which = text.rpartition(":")
    if colon:
        if which not in (LATEST, LATEST_FAILED) or not task:
            raise ValueError(f"{text!r} names no run: use a run id, its first {MIN_PREFIX} or more characters,"
                             f" TASK:{LATEST} or TASK:{LATEST_FAILED}")
        return RunReference(task_id=task, failed=which == LATEST_FAILED)
    lowered = text.lower()
    if len(text) > 36 or not _PREFIX.match(lowered):
        return RunReference(run_id=text)
    # Could still be a whole id (ids are the store's to choose): looked up as one first.
    return RunReference(run_id=text, prefix=lowered)


def short_prefix(prefix: str) -> str:
    """The message for a prefix too short to name a run."""
    return (f"run id prefix {prefix!r} is too short: give at least {MIN_PREFIX} characters"
            f" (or TASK:{LATEST})")


def event_type(status: str) -> str:
    return f"run.{status}"


def summary(text: str) -> str:
    """Bound free text stored on a run (one paste must not blow up a row)."""
    text = text.strip()
    return text if len(text) <= ERROR_SUMMARY_MAX else text[: ERROR_SUMMARY_MAX - 1] + "…"
