"""Lines for the system log about runs and fires (what `logread` or the journal shows),
bounded per task so that a chatty trigger cannot flood a router's small log ring.

Each task may log `burst` lines per `window_s`; beyond that its lines are only counted,
and when the window ends one line says how many were suppressed and what they were.
Lines name tasks, triggers, run id prefixes, statuses and codes; never a task's output
or a secret.
"""

from __future__ import annotations

import logging
import signal
from collections import Counter

from edge.core.errors import ToolError
from edge.core.ports.runtime import Clock, TimerHandle, Timers
from edge.core.runs import Run
from edge import duration_text, moment
from edge.core.triggers import SkippedFires

BURST = 5
WINDOW_S = 60.0
RUN_ID_PREFIX = 18  # the millisecond and the counter of a UUIDv7: unique among one daemon's runs
_MAX_WINDOWS = 256  # tasks with an open window; older windows are closed early beyond that


class _Window:
    __slots__ = ("start", "lines", "suppressed", "level", "logger", "timer")

    def __init__(self, start: float) -> None:
        self.start = start
        self.lines = 0
        self.suppressed: Counter[str] = Counter()
        self.level = logging.INFO
        self.logger: logging.Logger | None = None
        self.timer: TimerHandle | None = None


class Notices:
    """Rate-limited log lines, keyed by task."""

    def __init__(self, clock: Clock, timers: Timers, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self._timers = timers
        self._burst = burst
        self._window_s = window_s
        self._windows: dict[str, _Window] = {}

    def say(self, logger: logging.Logger, task: str, level: int, message: str, tally: str) -> None:
        """Log `message` unless `task` has used its lines for this window; `tally` is what
        the line is counted as when suppressed (a status, a skip reason)."""
        if not logger.isEnabledFor(level):
            return
        now = self._clock.monotonic()
        window = self._windows.get(task)
        if window is not None and now - window.start >= self._window_s:
            self._close(task)
            window = None
        if window is None:
            if len(self._windows) >= _MAX_WINDOWS:
                self._close(next(iter(self._windows)))
            window = self._windows[task] = _Window(now)
        if window.lines < self._burst:
            window.lines += 1
            logger.log(level, "%s", message)
            return
        window.suppressed[tally] += 1
        window.level = max(window.level, level)
        window.logger = logger
        if window.timer is None:  # say how many went unsaid once the window is over
            due = max(0.0, window.start + self._window_s - now)
            window.timer = self._timers.call_later(due, lambda: self._close(task))

    def close(self) -> None:
        """Report what is still suppressed (at shutdown)."""
        for task in list(self._windows):
            self._close(task)

    def _close(self, task: str) -> None:
        window = self._windows.pop(task, None)
        if window is None:
            return
        if window.timer is not None:
            window.timer.cancel()
        if window.suppressed and window.logger is not None:
            total = sum(window.suppressed.values())
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(window.suppressed.items()))
            span = self._clock.monotonic() - window.start
            window.logger.log(window.level, "%s", f"task={task}: {total} more lines suppressed in the last"
                              f" {duration_text(span * 1000)} ({kinds})")


def utc(ms: int) -> str:
    """An instant in a log line: the people's format (device zone, abbreviated), quoted so
    that the line stays `key=value` pairs."""
    return f'"{moment(ms)}"'


def _exit(code: int | None) -> str:
    if code is None:
        return "exit=-"
    if code < 0:
        try:
            return f"signal={signal.Signals(-code).name}"
        except ValueError:
            return f"signal={-code}"
    return f"exit={code}"


def _duration(run: Run) -> str:
    if run.started_at_ms is None or run.finished_at_ms is None:
        return "took=-"
    return f"took={duration_text(run.finished_at_ms - run.started_at_ms)}"


# Failed runs, and everything that did not end as it was meant to, are warnings.
_QUIET = frozenset({"succeeded"})
_EXPECTED_ERRORS = frozenset({None, "exit_nonzero", "killed_by_signal", "timeout", "daemon_lost"})


def run_finished(run: Run, reason: str | None = None) -> tuple[int, str]:
    """(level, line) for a run that reached a terminal status; `reason`: why it was
    cancelled."""
    level = logging.INFO if run.status in _QUIET else logging.WARNING
    parts = [f"run finished: task={run.task_id} run={run.id[:RUN_ID_PREFIX]} status={run.status}",
             _exit(run.exit_code), _duration(run)]
    if run.error_code not in _EXPECTED_ERRORS:
        parts.append(f"error={run.error_code}")
    if reason is not None and run.status == "cancelled":
        parts.append(f"reason={reason}")
    if run.origin != "manual":
        parts.append(f"origin={run.origin}")
    return level, " ".join(parts)


def start_refused(task_id: str, refusal: ToolError) -> tuple[int, str]:
    """(level, line) for a start of a task that was refused (a running `forbid` task, a
    full queue): expected, and answered to whoever asked, so one line and no traceback."""
    return logging.INFO, f"start refused: task={task_id} {refusal.code}: {refusal.message[:200]}"


def fires_skipped(trigger_id: str, fires: SkippedFires) -> tuple[int, str]:
    """(level, line) for fires of a trigger that did not become runs."""
    level = logging.INFO if fires.reason == "task_disabled" else logging.WARNING
    head = f"fire {fires.type}: task={fires.task_id} trigger={trigger_id} reason={fires.reason}"
    if fires.fires == 1 and fires.last_ms == fires.first_ms:
        return level, f"{head} scheduled={utc(fires.first_ms)}"
    count = "many" if fires.fires is None else str(fires.fires)
    last = "" if fires.last_ms is None else f" last={utc(fires.last_ms)}"
    return level, f"{head} fires={count} first={utc(fires.first_ms)}{last}"


def more_fires_skipped(trigger_id: str, fires: SkippedFires, more: int | None) -> tuple[int, str]:
    """(level, line) closing a run of consecutive fires with the same outcome, of which
    only the first had a line: how many more there were, up to which fire."""
    level = logging.INFO if fires.reason == "task_disabled" else logging.WARNING
    count = "many" if more is None else str(more)
    last = "" if fires.last_ms is None else f" last={utc(fires.last_ms)}"
    return level, (f"fire {fires.type}: task={fires.task_id} trigger={trigger_id} reason={fires.reason}"
                   f" {count} more in a row{last}")
