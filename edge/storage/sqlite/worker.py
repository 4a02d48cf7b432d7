"""The thread the one SQLite connection lives in: functions sent from the event loop run
there one at a time, in the order sent, and their outcome comes back to the awaiting task.

apsw's own async connections (`Connection.as_async`) do the same, but an async connection
also builds every cursor's description in its three forms on each statement that returns a
row (so that it can be read from the loop without a hop): about as many instructions as the
statement itself for a read of a task. A plain connection driven from this thread does not.

Outcomes come back through an eventfd the loop watches: one write and one read per batch of
outcomes (the thread writes only when the loop has not been woken since it last took them),
where `call_soon_threadsafe` costs a handle per outcome and a self-pipe the loop drains until
it fails (an exception raised and caught on every hop).

A call cancelled before the worker takes it never runs; once taken, it runs to its end
(its transaction commits or rolls back whole) and its outcome is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Job:
    __slots__ = ("future", "fn", "args")

    def __init__(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future, self.fn, self.args = future, fn, args


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # its caller was cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Worker:
    """One thread running what `run` sends it, in order. `stop` ends it after what was sent
    (outcomes that come back after `stop` are dropped)."""

    def __init__(self, name: str = "sqlite worker") -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._outcomes: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        # The eventfd is the thread's to close (after its last write); the loop stops watching
        # it at `stop`. Where there is none, outcomes come back by call_soon_threadsafe.
        self._wake: int | None = None
        self._woken = False  # the eventfd was written since the loop last took the outcomes
        if hasattr(os, "eventfd"):
            self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._loop.add_reader(self._wake, self._deliver)
        self._thread = threading.Thread(target=self._work, name=name)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """The future of `fn(*args)` run in the thread. Awaited as it is (no coroutine
        around it, a frame fewer on every hop): a task cancelled while it waits cancels
        the future, and a job whose future is cancelled before the thread takes it never runs."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put(_Job(future, fn, args))
        return future

    def stop(self) -> None:
        if self._wake is not None:
            self._loop.remove_reader(self._wake)
        self._queue.put(None)

    def _deliver(self) -> None:
        """In the loop: the outcomes that came back."""
        assert self._wake is not None
        try:  # noqa: SIM105 - on every hop: no context manager to build
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass  # delivered already, with an earlier wake
        # After the read, before taking them: an outcome added from now on wakes the loop
        # again (cleared before the read, a wake written in between would be read here and
        # the next outcome would find the flag set, with no wake on its way).
        self._woken = False
        outcomes = self._outcomes
        while outcomes:
            _settle(*outcomes.popleft())

    def _work(self) -> None:
        take, wake = self._queue.get, self._wake
        try:
            while (job := take()) is not None:
                if job.future.cancelled():  # read under the GIL; set only by the loop
                    continue
                try:
                    outcome = (job.future, True, job.fn(*job.args))
                except BaseException as exc:  # the caller's to handle, whatever it is
                    outcome = (job.future, False, exc)
                if wake is not None:
                    self._outcomes.append(outcome)  # before looking: the loop clears first, then takes
                    if not self._woken:
                        self._woken = True
                        os.eventfd_write(wake, 1)
                    continue
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                    self._loop.call_soon_threadsafe(_settle, *outcome)
        finally:
            if wake is not None:
                os.close(wake)
