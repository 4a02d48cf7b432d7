"""A run's log file: 0600, capped, and never a reason to stop reading the child's pipe."""

from __future__ import annotations

import os


class LogSink:
    """Writes output up to `cap` bytes; beyond that it counts what it drops.

    The child's pipe is always drained, so a chatty task is never blocked or SIGPIPEd.
    """

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self._cap = cap
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.written = 0
        self.dropped = 0
        self._closed = False

    def write(self, chunk: bytes) -> None:
        room = self._cap - self.written
        if room > 0:
            part = chunk[:room]
            os.write(self._fd, part)
            self.written += len(part)
            chunk = chunk[room:]
        self.dropped += len(chunk)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def close(self) -> int:
        """Finish the file; returns its size in bytes. Safe to call twice."""
        if self._closed:
            return self.written
        self._closed = True
        if self.dropped:
            marker = f"\n[qledge: log cap reached, {self.dropped} bytes dropped]\n".encode()
            os.write(self._fd, marker)
            self.written += len(marker)
        os.close(self._fd)
        return self.written
