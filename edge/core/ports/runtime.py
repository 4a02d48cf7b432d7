"""Runtime ports: time, timers, and what the parts of a running daemon need from each
other (the scheduler from the executor, tools from the runner, the trigger service and
the daemon's facts). Adapters live beside what they adapt; composition wires them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from edge.core.auth import Principal
from edge.core.ports.stores import TriggerStore
from edge.core.reads import Counts
from edge.core.runs import ActorType, Run, RunStatus, RunUpdate
from edge.core.tasks import Task

if TYPE_CHECKING:  # the AI operator's shapes load only with it
    from edge.core.agent import AgentLaunch


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


class RunCredentials(Protocol):
    """Credentials minted for one run, held in memory only: a daemon that dies takes them
    with it, so nothing outlives the run it was made for."""

    def mint(self, run_id: str, permissions: frozenset[str]) -> str:
        """A new token for `run_id` alone, granting exactly `permissions`; its principal is
        `agent:<run id>`."""
        ...

    def revoke(self, run_id: str) -> bool:
        """The run's credential stops working at once, for the next call and for the chain's
        re-check of calls in flight. True when one was live."""
        ...

    def lookup(self, credential_id: str) -> tuple[bytes, Principal] | None:
        """For authentication: the HMAC digest of a live credential's secret and its principal."""
        ...


class AgentRuns(Protocol):
    """AI runs (tasks whose command is an agent instruction) as the runner sees them."""

    @property
    def concurrency(self) -> int:
        """How many AI runs may execute at once: they have slots of their own, beside the
        runner's, so they never hold up commands."""
        ...

    async def launch(self, task: Task, run: Run) -> AgentLaunch:
        """Mint the run's credential, open its evidence record, and say how to start its
        child. Raises ToolError (e.g. a profile that is not configured): the run then fails
        with error code `agent_config` and that message."""
        ...

    def exited(self, run_id: str, status: RunStatus, update: RunUpdate) -> RunStatus:
        """The child is gone: revoke its credential now, and fold in the outcome it reported
        (a failure it explained keeps its own error code and summary). Updates `update`;
        returns the status to record."""
        ...

    async def ended(self, run: Run, task: Task | None) -> None:
        """Finish the evidence of an AI run that reached a terminal status, whatever the path
        (runs that never started and runs recovered as `lost` too; `task` None: look it up,
        and do nothing for a command task), and revoke its credential if still live. Never
        raises: a record that cannot be written is logged once and changes nothing else."""
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
