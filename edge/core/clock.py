"""The real clock and timers, the adapters of the Clock and Timers ports
(edge.core.ports.runtime); tests inject their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from edge.core.ports.runtime import Clock


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class LoopTimers:
    """Timers on the running event loop."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)


# No qledge runs before this (2024-01-01T00:00Z): an earlier wall clock is one that has
# not been set yet (a router boots at 1970 until NTP answers). Like systemd's TIME_EPOCH.
EPOCH_FLOOR_MS = 1_704_067_200_000


class SteadyClock:
    """The Clock that stamps records: the wall clock, except while it is behind the newest
    time on record (`hold_from`, at start-up). Meanwhile time counts on from that time by
    the monotonic clock, so what is stamped keeps its order and its durations.

    When the wall clock then jumps past that count (NTP answered), `on_jump(after, upto,
    shift)` is called once: the stamps in (after, upto] happened `shift` ms later than they
    say. When it catches up by itself instead, stamps stay at the last one handed out
    until the wall clock passes it, so they never go backwards. From then on it is the
    wall clock alone.
    """

    def __init__(self, clock: Clock, on_jump: Callable[[int, int, int], None] | None = None) -> None:
        self._clock = clock
        self._floor: int | None = None  # holding: the newest time on record
        self._start = 0.0
        self._last = 0  # the newest stamp handed out while holding or settling
        self.on_jump = on_jump

    def hold_from(self, floor_ms: int) -> None:
        """Hold when the wall clock is behind `floor_ms`; call before anything is stamped."""
        if self._clock.now_ms() < floor_ms:
            self._floor, self._start, self._last = floor_ms, self._clock.monotonic(), floor_ms

    @property
    def holding(self) -> bool:
        return self._floor is not None

    def now_ms(self) -> int:
        wall = self._clock.now_ms()
        if self._floor is not None:
            # +1: a stamp made now is newer than everything on record.
            counted = self._floor + 1 + int((self._clock.monotonic() - self._start) * 1000)
            if wall < self._floor:
                self._last = max(self._last, counted)
                return self._last
            floor, self._floor = self._floor, None
            if wall > counted and self._last > floor and self.on_jump is not None:
                self.on_jump(floor, self._last, wall - counted)
                self._last = 0
        if wall < self._last:  # caught up by itself: never backwards
            return self._last
        self._last = 0
        return wall

    def monotonic(self) -> float:
        return self._clock.monotonic()
