"""Runtime ports: time, timers, and what the parts of a running daemon need from each
other (the scheduler from the executor, tools from the runner, the trigger service and
the daemon's facts). Adapters live beside what they adapt; composition wires them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from edge.core.ports.stores import TriggerStore
from edge.core.reads import Counts
from edge.core.runs import ActorType, Run
from edge.core.tasks import Task


class Clock(Protocol):
    """Injected so that scheduling, retention and audit can be tested without sleeping."""

    def now_ms(self) -> int:
        """Wall-clock time, UTC epoch milliseconds. May jump (NTP, a 1970 boot)."""
        ...

    def monotonic(self) -> float:
        """Seconds from a monotonic clock, for durations and deadlines."""
        ...


class TimerHandle(Protocol):
    def cancel(self) -> None:
        """The callback will not run (no-op when it already has)."""
        ...


class Timers(Protocol):
    """One-shot callbacks on the event loop (jitter, the service watchdog)."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once, on the loop, after at least `delay_s` seconds."""
        ...


class Sleeper(Protocol):
    """The scheduler's only wait."""

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds`, or earlier once woken."""
        ...

    def wake(self) -> None:
        """End the current sleep now; with none in progress, make the next one return at once."""
        ...


class RunExecutor(Protocol):
    """The runner, as the scheduler sees it."""

    def submit(self, run: Run) -> None:
        """Take an admitted (queued) run: it is executed when a slot is free, or recorded
        cancelled (`shutdown`) when the runner is stopping. Never raises, never drops it."""
        ...

    async def cancel(self, project: str, run_id: str, reason: str) -> Run:
        """Stop a queued or running run and wait until its end is recorded. Raises
        not_found, or conflict when it has already finished."""
        ...


class RunController(RunExecutor, Protocol):
    """The runner, as tools see it."""

    async def start(self, task: Task, actor: ActorType) -> Run:
        """Admit a manual run of `task` (RunAdmission.admit_manual) and hand it to the
        executor; the hand-off completes even when the caller is cancelled."""
        ...

    async def wait(self, project: str, run_id: str, timeout_s: float) -> Run | None:
        """The run once it has finished or `timeout_s` has passed; None when missing."""
        ...


class TriggerService(TriggerStore, Protocol):
    """The trigger store as tools see it: every change wakes the scheduler."""

    @property
    def default_timezone(self) -> str:
        """The zone a trigger gets when none is given."""
        ...


class StatusFacts(Protocol):
    """What `qledge.status` reports about the daemon itself."""

    @property
    def loop(self) -> str: ...

    @property
    def db_path(self) -> str: ...

    @property
    def started_monotonic(self) -> float: ...

    async def counts(self, project: str) -> Counts: ...

    def extra(self) -> dict[str, str]:
        """Capability-specific lines (the scheduler's clock state, the MCP socket)."""
        ...
