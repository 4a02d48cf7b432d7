"""sd_notify without libsystemd: datagrams to $NOTIFY_SOCKET (path or abstract `@name`)."""

from __future__ import annotations

import os
import socket


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
            return int(usec) / 2_000_000
        except ValueError:
            return None
