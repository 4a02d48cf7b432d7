"""The real clock and timers, the adapters of the Clock and Timers ports
(edge.core.ports.runtime); tests inject their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class LoopTimers:
    """Timers on the running event loop."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)
