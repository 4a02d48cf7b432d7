"""The scheduler loop: a heap of next fires and one sleep until the earliest of them.

It sleeps at most a minute at a time, so a wall-clock jump is noticed within a minute;
with nothing due that is its only wake-up. Each due trigger goes through one admission
transaction in the store; admitted runs go to the runner (after their jitter). While
the wall clock is earlier than the newest time on record (a router booting at 1970
before NTP), nothing is scheduled until the clock has caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from edge.core.clock import EPOCH_FLOOR_MS, LoopTimers
from edge.core.errors import ToolError
from edge.core.handoff import Background, shielded
from edge.core.ids import random_fraction, uuid7
from edge.core.notices import Notices, fires_skipped, more_fires_skipped
from edge.core.ports.runtime import Clock, RunExecutor, Sleeper, TimerHandle, Timers
from edge.core.tasks import ImportedTask
from edge import moment
from edge.core.ports.stores import RunAdmission, RunStore, TaskStore, TriggerStore
from edge.core.runs import Run
from edge.core.schedule import GRACE_MS
from edge.core.triggers import Admission, CronSpec, ImportPlan, PreparedImport, SkippedFires, Trigger, TriggerEvent

log = logging.getLogger("qledge.scheduler")

MAX_SLEEP_S = 60.0
BIG_HEAP = 4096  # armed triggers from which reading them all again is paced
RETRY_MS = 60_000  # storage unavailable or zone data missing: try that trigger again later
SAVE_EVERY_MS = 3_600_000  # idle: persist the clock mark hourly (admissions persist it anyway)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"  # the kernel's id of this boot
RETRY_KEY = "retry:"  # heap entries of pending retries: no trigger id contains a colon


def read_boot_id(path: str) -> str | None:
    """The boot id in `path`, or None when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(128).strip()
    except OSError:
        return None
    return text or None


class Waker:
    """The Sleeper (edge.core.ports.runtime) on the event loop: one timer per sleep; `wake`
    ends the current sleep, or the next one at once."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self._pending = False

    async def sleep(self, seconds: float) -> None:
        if self._pending:
            self._pending = False
            return
        loop = asyncio.get_running_loop()
        self._future = future = loop.create_future()
        handle = loop.call_later(seconds, _resolve, future)
        try:
            await future
        finally:
            handle.cancel()
            self._future = None

    def wake(self) -> None:
        if self._future is not None:
            _resolve(self._future)
        else:
            self._pending = True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _local(ms: int) -> str:
    """The daemon's local time with its zone abbreviation, the format `qledge` prints."""
    return moment(ms)


class _Streak:
    """Consecutive fires of a trigger with one outcome: the first had its line."""

    __slots__ = ("first", "last", "more")

    def __init__(self, first: SkippedFires) -> None:
        self.first = first
        self.last = first
        self.more: int | None = 0  # fires since the first; None: too many to count


class Scheduler:
    def __init__(
        self,
        admission: RunAdmission,
        runs: RunStore,
        runner: RunExecutor,
        clock: Clock,
        project: str,
        *,
        sleeper: Sleeper | None = None,
        timers: Timers | None = None,
        rng: Callable[[], float] = random_fraction,
        grace_ms: int = GRACE_MS,
        boot_id_path: str = BOOT_ID_PATH,
        notices: Notices | None = None,
    ) -> None:
        self._store = admission
        self._runs = runs
        self._runner = runner
        self._clock = clock
        self._project = project
        self._sleeper = sleeper or Waker()
        self._timers = timers or LoopTimers()
        self._rng = rng
        self._grace_ms = grace_ms
        self._boot_id_path = boot_id_path
        self._notices = notices or Notices(clock, self._timers)
        self._streaks: dict[str, _Streak] = {}  # trigger id → fires skipped in a row
        self._heap: list[tuple[int, str]] = []
        self._reload = True
        self._reload_after = 0.0  # monotonic: when a large heap may be read again
        self._newest = 0
        self._held_at: int | None = None
        self._saved_at = 0
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[str, TimerHandle] = {}  # jittered runs not yet released
        self._rereads: list[asyncio.Future[None]] = []  # reread() callers, told when the heap is read
        self._background = Background(log)  # admissions and the hand-offs that follow them
        # Called on every wake-up: other once-a-minute chores (the service watchdog)
        # ride on this timer instead of waking the process themselves.
        self.on_wake: Callable[[], None] | None = None

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        await self.load()
        self._task = asyncio.create_task(self._loop(), name="scheduler")

    async def load(self) -> None:
        """Read the clock mark and, on the first start of a boot, arm the `@reboot`
        triggers; the heap is read by the first tick. A wall clock before EPOCH_FLOOR_MS
        was never set, even on a fresh database."""
        self._newest = max(EPOCH_FLOOR_MS, await self._store.newest_time(self._project))
        now = self._clock.now_ms()
        self._saved_at = now
        boot_id = read_boot_id(self._boot_id_path)
        if boot_id is None:  # no kernel boot id: every daemon start counts as a boot
            log.warning("cannot read the boot id from %s; @reboot triggers fire at every start", self._boot_id_path)
            boot_id = f"start:{uuid7(now)}"
        # At the newest time on record: the first tick after the clock-sync hold fires them.
        armed = await self._store.arm_boot(self._project, boot_id, max(now, self._newest))
        if armed:
            log.info("new boot: %d @reboot triggers armed", armed)
        self._reload = True

    async def stop(self) -> None:
        """Stop scheduling. An admission in progress completes and hands its runs to the
        executor; runs still waiting out their jitter are cancelled (`shutdown`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._background.wait()
        for run_id, handle in list(self._pending.items()):
            handle.cancel()
            with contextlib.suppress(ToolError):
                await self._runner.cancel(self._project, run_id, "shutdown")
        self._pending.clear()
        for waiter in self._rereads:
            waiter.cancel()
        self._rereads.clear()
        for trigger_id in list(self._streaks):
            self._end_streak(trigger_id)
        with contextlib.suppress(ToolError):
            await self._store.save_time(self._newest)

    async def settle(self) -> None:
        """Wait until the admissions and hand-offs in progress are done."""
        await self._background.wait()

    def changed(self) -> None:
        """Triggers changed (created, enabled, …): reload the heap and look again."""
        self._reload = True
        self._sleeper.wake()

    async def reread(self) -> None:
        """Read the triggers again now, and return once the heap holds what the store says
        (a SIGHUP: another writer may have changed them). A large heap's rate limit on
        reads does not delay it. Waits for as long as the store refuses the read: the
        caller bounds the wait."""
        waiter = asyncio.get_running_loop().create_future()
        self._rereads.append(waiter)
        self.changed()
        await waiter

    async def _loop(self) -> None:
        while True:
            try:
                delay = await self.tick()
            except ToolError as exc:  # the store is unavailable (PostgreSQL down): one line, and on
                log.error("scheduler tick failed: %s", exc.message)
                delay = MAX_SLEEP_S  # a reconnect asks for a reload, which wakes the loop sooner
            except Exception:  # keep scheduling whatever one tick ran into
                log.exception("scheduler tick failed")
                delay = MAX_SLEEP_S
            await self._sleeper.sleep(delay)

    # -- one pass -----------------------------------------------------------------

    async def tick(self) -> float:
        """Admit everything due now; returns how long to sleep (seconds)."""
        if self.on_wake is not None:
            self.on_wake()
        now = self._clock.now_ms()
        deferred = None
        if (self._reload and not self._rereads and len(self._heap) >= BIG_HEAP
                and time.monotonic() < self._reload_after):
            # A large heap is read again at most so often that reading it costs a tenth of
            # the time (an import of many triggers changes them once per batch).
            deferred = self._reload_after - time.monotonic()
        elif self._reload:
            self._reload = False  # before the reads: a change made while they run reloads again
            waiting, self._rereads = self._rereads, []  # told once these reads are done
            started = time.monotonic()
            try:
                retries = [(due, RETRY_KEY + rid) for due, rid in await self._store.armed_retries(self._project)]
                heap = await self._store.armed(self._project)  # sorted by cursor: already a heap
            except ToolError:
                self._reload = True  # a reload the store refused is tried again
                self._rereads[:0] = waiting
                raise
            self._heap = heap
            if retries:
                self._heap += retries
                heapq.heapify(self._heap)
            self._reload_after = time.monotonic() + 9 * (time.monotonic() - started)
            for waiter in waiting:
                if not waiter.done():  # a caller that gave up cancelled it
                    waiter.set_result(None)
        if now < self._newest:
            if self._held_at is None:
                log.warning("clock is behind the newest time seen (%s); scheduling holds", _local(self._newest))
            self._held_at = now
            return min(MAX_SLEEP_S, (self._newest - now) / 1000 + 0.001)
        if self._held_at is not None:
            log.info("clock caught up; scheduling resumes")
            self._held_at = None
        self._newest = now
        while self._heap and self._heap[0][0] <= now:
            _, trigger_id = heapq.heappop(self._heap)
            # Shielded: once the admission commits, its runs reach the executor even if
            # the scheduler is being stopped.
            await shielded(self._background, self._admit(trigger_id, now), f"admit-{trigger_id}")
        if now - self._saved_at >= SAVE_EVERY_MS:
            await self._store.save_time(now)
            self._saved_at = now
        if not self._heap:
            return MAX_SLEEP_S if deferred is None else deferred
        # A millisecond over, so the timer never ends just before the fire is due.
        return min(MAX_SLEEP_S, (self._heap[0][0] - now) / 1000 + 0.001, deferred or MAX_SLEEP_S)

    def retry_due(self, run_id: str, due_ms: int) -> None:
        """A failed run's retry falls due at `due_ms` (it is in the database already)."""
        heapq.heappush(self._heap, (due_ms, RETRY_KEY + run_id))
        self._sleeper.wake()

    async def _admit(self, key: str, now: int) -> None:
        try:
            if key.startswith(RETRY_KEY):
                admission = await self._store.admit_retry(self._project, key[len(RETRY_KEY):], now)
            else:
                admission = await self._store.admit_fires(self._project, key, now, self._grace_ms, self._rng)
        except ToolError as exc:
            log.error("admission of %s failed: %s", key, exc.message)
            admission = Admission(cursor=now, retry=True)
        self._apply(key, admission, now)

    def _apply(self, trigger_id: str, admission: Admission, now: int) -> None:
        self._announce(trigger_id, admission)
        if admission.gone:
            return
        if admission.cursor is not None:  # else disabled or never firing again (a spent @reboot, @once): off the heap
            cursor = now + RETRY_MS if admission.retry else max(admission.cursor, now + 1)
            heapq.heappush(self._heap, (cursor, trigger_id))
        if admission.cancel:
            self._spawn(self._replace(admission.runs, admission.cancel))
        else:
            for run in admission.runs:
                self._start(run)

    async def _replace(self, runs: list[Run], cancel: list[str]) -> None:
        for run_id in cancel:
            with contextlib.suppress(ToolError):  # it may have finished meanwhile
                await self._runner.cancel(self._project, run_id, "replaced")
        for run in runs:
            if run.id not in cancel:
                self._start(run)

    def _start(self, run: Run) -> None:
        if not run.jitter_ms:
            self._runner.submit(run)
            return
        self._pending[run.id] = self._timers.call_later(run.jitter_ms / 1000, lambda: self._release(run.id))

    def _release(self, run_id: str) -> None:
        self._pending.pop(run_id, None)
        self._spawn(self._submit_if_queued(run_id))

    async def _submit_if_queued(self, run_id: str) -> None:
        run = await self._runs.get(self._project, run_id)  # it may have been cancelled while waiting
        if run is not None and run.status == "queued":
            self._runner.submit(run)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    # -- the system log -------------------------------------------------------------

    def _announce(self, trigger_id: str, admission: Admission) -> None:
        """A line for the first of consecutive fires with one outcome; the others are
        counted and said in one line when that streak ends (a run is admitted, the outcome
        changes, the scheduler stops)."""
        order: list[tuple[int, SkippedFires | None]] = [(s.first_ms, s) for s in admission.skipped]
        order += [(r.scheduled_for_ms or 0, None) for r in admission.runs]
        for _, fires in sorted(order, key=lambda item: item[0]):
            if fires is None:
                self._end_streak(trigger_id)
                continue
            streak = self._streaks.get(trigger_id)
            if streak is not None and (streak.first.type, streak.first.reason) == (fires.type, fires.reason):
                if streak.last.last_ms is None or fires.first_ms > streak.last.last_ms:  # not a retry of one fire
                    streak.more = None if streak.more is None or fires.fires is None else streak.more + fires.fires
                    streak.last = fires
                continue
            self._end_streak(trigger_id)
            self._say(*fires_skipped(trigger_id, fires), fires)
            self._streaks[trigger_id] = _Streak(fires)

    def _end_streak(self, trigger_id: str) -> None:
        streak = self._streaks.pop(trigger_id, None)
        if streak is not None and streak.more != 0:
            self._say(*more_fires_skipped(trigger_id, streak.last, streak.more), streak.last)

    def _say(self, level: int, line: str, fires: SkippedFires) -> None:
        self._notices.say(log, fires.task_id, level, line, f"{fires.type} ({fires.reason})")

    # -- status -------------------------------------------------------------------

    def status(self) -> dict[str, str]:
        lines: dict[str, str] = {}
        if self._held_at is not None:
            lines["clock"] = (
                f"waiting for sync (wall clock {_local(self._held_at)} is behind {_local(self._newest)},"
                " the newest time seen; scheduling resumes when it catches up)"
            )
        retries = sum(1 for _, key in self._heap if key.startswith(RETRY_KEY))
        armed = f"{len(self._heap) - retries} triggers armed" + (f", {retries} retries waiting" if retries else "")
        lines["scheduler"] = armed + (f", next fire {_local(self._heap[0][0])}" if self._heap else "")
        return lines


class Triggers:
    """TriggerService (edge.core.ports.runtime): the trigger store as tools see it, where
    every change wakes the scheduler."""

    def __init__(self, store: TriggerStore, scheduler: Scheduler, default_timezone: str,
                 tasks: TaskStore | None = None) -> None:
        self._store = store
        self._scheduler = scheduler
        self._default_timezone = default_timezone
        self._tasks = tasks  # imports create a task with its triggers

    @property
    def default_timezone(self) -> str:
        return self._default_timezone

    def _changed(self) -> None:
        self._scheduler.changed()

    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec, now_ms: int
    ) -> Trigger:
        trigger = await self._store.create(project, trigger_id, task_id, task_revision, spec, now_ms)
        self._changed()
        return trigger

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        if self._tasks is None:
            raise ToolError("unavailable", "imports are not wired in this daemon")
        imported = await self._tasks.import_tasks(project, items, now_ms)
        if any(i.status == "created" for i in imported):
            self._changed()
        return imported

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        if self._tasks is None:
            raise ToolError("unavailable", "imports are not wired in this daemon")
        await self._tasks.apply_import(project, plan, now_ms)
        if plan.tasks or plan.triggers:  # triggers that followed a task moved with it
            self._changed()

    async def get(self, project: str, trigger_id: str) -> Trigger | None:
        return await self._store.get(project, trigger_id)

    async def page(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        return await self._store.page(project, after, limit)

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        trigger = await self._store.set_enabled(project, trigger_id, enabled, expected_revision, now_ms)
        self._changed()
        return trigger

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        trigger = await self._store.repin(project, trigger_id, task_revision, expected_revision, now_ms)
        self._changed()
        return trigger

    async def update(
        self, project: str, trigger_id: str, spec: CronSpec, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        trigger = await self._store.update(project, trigger_id, spec, expected_revision, now_ms)
        self._changed()
        return trigger

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None:
        await self._store.delete(project, trigger_id, expected_revision)
        self._changed()

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        return await self._store.events(project, trigger_id, before_id, limit)
