"""Work that must not be lost once it has begun.

Cancelling an await does not undo what it awaited: a transaction committed in the store's
worker thread stays committed when the coroutine waiting for it is cancelled. So every
hand-off that follows a commit (a queued run to the executor, a finished run's record) runs
in a task of its own, shielded from its caller's cancellation and referenced until it ends
(the event loop holds tasks only weakly).
"""

from __future__ import annotations

import asyncio
import logging
import contextlib
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from edge.core.errors import ToolError
from edge.core.notices import Notices, start_refused

if TYPE_CHECKING:
    from edge.core.ports.runtime import Clock, RunExecutor
    from edge.core.ports.stores import RunAdmission
    from edge.core.runs import ActorType, Run
    from edge.core.tasks import Task, TaskRef

T = TypeVar("T")


class Background:
    """A set of tasks kept alive until they finish; failures are logged, never lost.

    A task whose caller awaits it (`shielded`) hands its failure to that caller, who
    answers or logs it; it is logged here only once the caller has gone. An expected
    refusal (a ToolError: a coded answer such as `conflict`) is one line, never a
    traceback: a traceback in the system log means a bug.
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._tasks: set[asyncio.Task[Any]] = set()
        self._awaited: set[asyncio.Task[Any]] = set()  # a caller receives their outcome

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None, awaited: bool = False) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        if awaited:
            self._awaited.add(task)
        task.add_done_callback(self._done)
        return task

    def abandoned(self, task: asyncio.Task[Any]) -> None:
        """The caller awaiting `task` has gone: its failure is logged here."""
        if task in self._awaited:
            self._awaited.discard(task)
            if task.done():
                self._report(task)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task in self._awaited:
            self._awaited.discard(task)
            return
        self._report(task)

    def _report(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or (exc := task.exception()) is None:
            return
        if isinstance(exc, ToolError):
            self._log.warning("%s: %s: %s", task.get_name(), exc.code, exc.message)
        else:
            self._log.error("background task %s failed", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Until every task has finished, including those started meanwhile."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.wait()


async def shielded(background: Background, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
    """Run `coro` to its end even when the caller is cancelled (the caller still sees
    CancelledError; the work goes on in `background`, which then logs its failure). The
    caller that waits for the end gets its result or its exception, and nothing is logged."""
    task = background.spawn(coro, name, awaited=True)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        background.abandoned(task)
        raise


class ManualStart:
    """RunController.start, one rule for the local runner and a cluster node's: admit a
    manual run (RunAdmission.admit_manual), cancel the runs it replaces, then hand it to the
    executor (RunExecutor.submit: the local queue, or the cluster's claim loop). The hand-off
    is shielded: once admission has committed it completes even when the caller is cancelled
    (its client hung up, its deadline passed). A refusal is said once (Notices) and raised."""

    def __init__(self, executor: RunExecutor, admission: RunAdmission, clock: Clock, notices: Notices,
                 background: Background, log: logging.Logger) -> None:
        self._executor = executor
        self._admission = admission
        self._clock = clock
        self._notices = notices
        self._background = background
        self._log = log

    async def start(self, task: Task | TaskRef, actor: ActorType) -> Run:
        try:
            return await shielded(self._background, self._admit(task, actor), f"admit-{task.id}")
        except ToolError as refusal:
            if refusal.code == "not_found":  # a name that is no task: the caller's mistake alone
                raise
            self._notices.say(self._log, task.id, *start_refused(task.id, refusal), "start refused")
            raise

    async def _admit(self, task: Task | TaskRef, actor: ActorType) -> Run:
        admitted = await self._admission.admit_manual(task, actor, self._clock.now_ms())
        try:
            for run_id in admitted.replaces:
                with contextlib.suppress(ToolError):  # it may have finished meanwhile
                    await self._executor.cancel(task.project_id, run_id, "replaced")
        finally:
            self._executor.submit(admitted.run)
        return admitted.run


async def wait_within(tasks: Iterable[asyncio.Task[Any]], timeout_s: float, interrupt: asyncio.Event) -> None:
    """Wait for `tasks` until they are all done, `timeout_s` has passed or `interrupt` is
    set, whichever comes first. Nothing is cancelled here."""
    pending = set(tasks)
    if not pending or interrupt.is_set():
        return
    everything = asyncio.ensure_future(asyncio.wait(pending))
    interrupted = asyncio.ensure_future(interrupt.wait())
    try:
        await asyncio.wait({everything, interrupted}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        everything.cancel()  # cancels the waiting, not the tasks waited for
        interrupted.cancel()
