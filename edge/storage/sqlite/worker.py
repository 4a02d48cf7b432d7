"""The thread the one SQLite connection lives in: functions sent from the event loop run
there one at a time, in the order sent, and their outcome comes back to the awaiting task.

apsw's own async connections (`Connection.as_async`) do the same, but an async connection
also builds every cursor's description in its three forms on each statement that returns a
row (so that it can be read from the loop without a hop): about as many instructions as the
statement itself for a read of a task. A plain connection driven from this thread does not.

A call cancelled before the worker takes it never runs; once taken, it runs to its end
(its transaction commits or rolls back whole) and its outcome is dropped.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Job:
    __slots__ = ("future", "fn", "args", "cancelled")

    def __init__(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future, self.fn, self.args, self.cancelled = future, fn, args, False


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # its caller was cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Worker:
    """One thread running what `run` sends it, in order. `stop` ends it after what was sent."""

    def __init__(self, name: str = "sqlite worker") -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        job = _Job(self._loop.create_future(), fn, args)
        self._queue.put(job)
        try:
            return await job.future  # type: ignore[no-any-return]
        except BaseException:
            job.cancelled = True  # not taken yet: it never runs
            raise

    def stop(self) -> None:
        self._queue.put(None)

    def _work(self) -> None:
        take, call_soon = self._queue.get, self._loop.call_soon_threadsafe
        while (job := take()) is not None:
            if job.cancelled:
                continue
            try:
                outcome = (True, job.fn(*job.args))
            except BaseException as exc:  # the caller's to handle, whatever it is
                outcome = (False, exc)
            try:
                call_soon(_settle, job.future, *outcome)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
