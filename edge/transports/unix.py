"""Unix-socket listening shared by the tool socket and MCP: a 0660 socket, the peer's uid
(SO_PEERCRED), stale-socket handling, and the graceful stop every transport follows
(stop accepting and reading, answer what is in flight within a grace period, then cancel)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import socket
import stat
import struct
from typing import cast

from edge.core.handoff import wait_within

MAX_IN_FLIGHT = 16  # calls per connection; beyond it we stop reading (backpressure)
STOP_GRACE_S = 5.0  # on stop, how long calls in flight may take to be answered
_UCRED = struct.Struct("3i")  # pid, uid, gid


class UnixListener(abc.ABC):
    """A 0660 Unix-socket listener that tracks its connections so `stop` can end them."""

    def __init__(self, path: str, limit: int = 1 << 16) -> None:
        self.path = path
        self._limit = limit  # StreamReader buffer limit (line-based protocols read up to it)
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.Task[None], tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def start(self) -> None:
        remove_stale_socket(self.path)
        old = os.umask(0o117)  # socket is created 0660
        try:
            self._server = await asyncio.start_unix_server(self._track, path=self.path, limit=self._limit)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o660)

    async def stop(self, grace_s: float = STOP_GRACE_S, forced: asyncio.Event | None = None) -> None:
        """Stop accepting and reading; let every connection answer the calls it has in
        flight within `grace_s` (or until `forced` is set), then cancel what is left."""
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for reader, writer in list(self._connections.values()):
            _stop_reading(reader, writer)
        await wait_within(list(self._connections), grace_s, forced or asyncio.Event())
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trusted: bool = True) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = (reader, writer)
        try:
            await self._serve_connection(reader, writer, trusted)
        finally:
            self._connections.pop(task, None)

    @abc.abstractmethod
    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trusted: bool = True
    ) -> None:
        """Serve one connection until its input ends, answering what it asked before that.
        `trusted` False: the peer's uid (SO_PEERCRED) is not to be believed."""


def _stop_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Make the connection's reader see the end of input now; what it already buffered is still read."""
    transport = cast(asyncio.Transport, writer.transport)  # a stream's transport reads as well as writes
    if not transport.is_closing():
        transport.pause_reading()  # nothing more arrives, so nothing is fed after the EOF
    if not reader.at_eof():
        reader.feed_eof()


def remove_stale_socket(path: str) -> None:
    """A socket file left by a crashed daemon is removed; anything else is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RuntimeError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listening: stale
        return
    finally:
        probe.close()
    raise RuntimeError(f"another qledge daemon is already listening on {path}")


def peer_uid(sock: socket.socket | None) -> int | None:
    """The uid of the process at the other end (Linux SO_PEERCRED)."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return uid
