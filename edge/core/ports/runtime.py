"""Runtime ports: time, timers, and what the parts of a running daemon need from each
other (the scheduler from the executor, tools from the runner, the trigger service and
the daemon's facts). Adapters live beside what they adapt; composition wires them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

from edge.core.tasks import ImportedTask
from edge.core.ports.stores import TriggerStore
from edge.core.reads import Counts
from edge.core.runs import ActorType, Run, RunDefaults
from edge.core.tasks import RunAs, Task, TaskRef, TaskSpec
from edge.core.triggers import ImportPlan, PreparedImport


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


class RunInputs(msgspec.Struct, frozen=True):
    """What a runner reads before it starts a run, read already in the transaction that
    handed the run over (a cluster node's claim): the task revision it runs (None: it is
    gone) and every secret value of its project (its output must not show them)."""

    task: Task | None
    secret_values: list[str]


class RunExecutor(Protocol):
    """The runner, as the scheduler sees it."""

    def submit(self, run: Run, inputs: RunInputs | None = None) -> None:
        """Take an admitted (queued) run: it is executed when a slot is free, or recorded
        cancelled (`shutdown`) when the runner is stopping. Never raises, never drops it.
        `inputs`: read with the hand-over, so the runner need not read them again."""
        ...

    async def cancel(self, project: str, run_id: str, reason: str) -> Run:
        """Stop a queued or running run and wait until its end is recorded. Raises
        not_found, or conflict when it has already finished."""
        ...


class TaskUsers(Protocol):
    """Who tasks run as, and where, on this system: the facts the permission rule
    (edge.core.auth.task_permissions) needs about a task, at write time and at run time."""

    @property
    def default_user(self) -> str:
        """The user a new task gets when it names none."""
        ...

    @property
    def can_switch(self) -> bool:
        """Whether runs can be another user than the daemon's (the daemon is root)."""
        ...

    def resolve(self, user: str | None, group: str | None) -> RunAs:
        """Who a run of a task naming `user` and `group` is (user None: the daemon's own
        user; group None: the user's own), with why running so needs task.privileged, if
        it does. Reads the system's user and group databases each time. Raises
        invalid_argument when the user or group does not exist, or when the daemon cannot
        switch to that user (it is not root)."""
        ...

    def working_dir(self, path: str | None, run_as: RunAs | None = None) -> str:
        """The directory a run starts in: `path`, or the default; `@data` (DATA_DIR): the
        task's data directory (`run_as.data_dir`; at write time, `@data` itself). Raises
        invalid_argument when it is not absolute, lies inside the state directory
        (resolving links), or, given who the run is, lies where that user may not go (the
        run enters it before switching users)."""
        ...

    def program(self, spec: TaskSpec, run_as: RunAs) -> None:
        """Check, where it can, that `run_as` may execute the spec's program: an absolute
        path that exists must be reached through directories that user may search and carry
        an execute bit for it (a name looked up in PATH, or a path not there yet, is left to
        the run). Raises invalid_argument naming the user and what stops it."""
        ...

    async def for_task(self, task: Task) -> RunAs:
        """Who a run of `task` is, now (resolve, plus what only a run needs): a task that
        references a secret and would run as a shared, unprivileged task user runs as a
        uid of its own instead ([runner] dynamic_uids: recorded per task, never another
        task's or a system user's; HOME is its data directory); every run gets its task's
        data directory, made (0700, owned by the run's uid) when missing and made anew when
        another uid owns it. Raises as resolve does, resource_exhausted when every uid of
        the range is taken, unavailable when the directory cannot be made."""
        ...

    def forget(self, project: str, task_id: str) -> None:
        """The task is gone: remove its data directory (never following a link in it)."""
        ...

    def describe(self) -> str:
        """One line for `qledge status`: how tasks run here."""
        ...


class RunController(RunExecutor, Protocol):
    """The runner, as tools see it."""

    async def start(self, task: Task | TaskRef, actor: ActorType) -> Run:
        """Admit a manual run of `task` (RunAdmission.admit_manual: of its revision, or of
        a TaskRef's current one, read in the admission's transaction) and hand it to the
        executor; the hand-off completes even when the caller is cancelled."""
        ...

    async def wait(self, project: str, run_id: str, timeout_s: float) -> Run | None:
        """The run once it has finished or `timeout_s` has passed; None when missing."""
        ...

    def disk_shortfall(self) -> str | None:
        """Why a run could not start now for lack of free space in the state directory
        (one line for the caller), or None when there is room."""
        ...

    async def output_mark(self, project: str, run_id: str, seen: int | None, timeout_s: float) -> int | None:
        """How far the run's output has come: a count that moves with every chunk its log
        receives. With `seen` given, first wait up to `timeout_s` until the count differs
        from it or the run ends (no polling: the pump wakes the waiters); when a bounded
        number of callers are waiting already, it returns at once instead (the count
        unchanged), so followers never hold more than that. None when this runner is not
        executing the run (it has ended, or was never handed over)."""
        ...


class TriggerService(TriggerStore, Protocol):
    """The trigger store as tools see it: every change wakes the scheduler."""

    @property
    def default_timezone(self) -> str:
        """The zone a trigger gets when none is given."""
        ...

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        """TaskStore.apply_import, then the scheduler looks at the triggers."""
        ...

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        """TaskStore.import_tasks, then the scheduler looks at the new triggers."""
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

    def run_defaults(self) -> RunDefaults:
        """The working directory and log cap a run gets when its task names none (the cap
        as currently configured: a reload may change it)."""
        ...

    def extra(self) -> dict[str, str]:
        """Capability-specific lines (the scheduler's clock state, the MCP socket)."""
        ...
