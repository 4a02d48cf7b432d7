"""sd_notify without libsystemd: datagrams to $NOTIFY_SOCKET (path or abstract `@name`)."""

from __future__ import annotations

import os
import socket

from edge.core.clock import LoopTimers
from edge.core.ports.runtime import TimerHandle, Timers


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address: str | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, message: str) -> bool:
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self._address)
            return True
        except OSError:
            return False

    def watchdog_interval_s(self) -> float | None:
        """Half of $WATCHDOG_USEC when the watchdog is meant for us, else None."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            interval = int(usec) / 2_000_000
        except ValueError:
            return None
        return interval if interval > 0 else None


class Watchdog:
    """Sends WATCHDOG=1 from a timer on the event loop.

    A timer rather than a thread: if the loop is stuck, nothing pets the watchdog and
    the service manager restarts us, which is the point.
    """

    def __init__(self, notifier: Notifier, interval_s: float, timers: Timers | None = None) -> None:
        self._notifier = notifier
        self._interval_s = interval_s
        self._timers = timers or LoopTimers()
        self._handle: TimerHandle | None = None

    def start(self) -> None:
        self.pet()

    def pet(self) -> None:
        """Send WATCHDOG=1 and push the fallback timer back.

        The scheduler calls this on its own wake-ups (at least once a minute), so an
        idle daemon wakes once per minute, not once for each timer.
        """
        self._notifier.notify("WATCHDOG=1")
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._timers.call_later(self._interval_s, self.pet)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def start_watchdog(notifier: Notifier) -> Watchdog | None:
    """A running Watchdog when the service manager asked for one, else None."""
    interval = notifier.watchdog_interval_s() if notifier.enabled else None
    if interval is None:
        return None
    watchdog = Watchdog(notifier, interval)
    watchdog.start()
    return watchdog
