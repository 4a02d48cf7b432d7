"""Clocks are injected so scheduling and retention can be tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time, UTC epoch milliseconds."""
        ...

    def monotonic(self) -> float:
        """Seconds from a monotonic clock, for durations and deadlines."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()
