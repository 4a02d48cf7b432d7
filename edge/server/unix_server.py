"""Serve the tool protocol on a Unix socket; many requests may be in flight per connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct

import msgspec

from edge.core.errors import ToolError
from edge.core.handoff import wait_within
from edge.server import frames
from edge.tools.chain import Chain
from edge.tools.context import Caller

log = logging.getLogger("qledge.server")

MAX_IN_FLIGHT = 16  # per connection; beyond it we stop reading (backpressure)
STOP_GRACE_S = 5.0  # on stop, how long calls in flight may take to be answered
_UCRED = struct.Struct("3i")  # pid, uid, gid


class UnixListener:
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

    async def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = (reader, writer)
        try:
            await self._serve_connection(reader, writer)
        finally:
            self._connections.pop(task, None)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class ToolServer(UnixListener):
    def __init__(self, chain: Chain, path: str, max_frame: int = frames.DEFAULT_MAX_FRAME) -> None:
        super().__init__(path)
        self._chain = chain
        self._max_frame = max_frame

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = peer_uid(writer.get_extra_info("socket"))
        in_flight: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await self._read_requests(reader, writer, uid, in_flight, slots)
            # End of input: answer what was asked before it (each call has its deadline).
            if in_flight:
                await asyncio.wait(set(in_flight))
        except asyncio.CancelledError:
            for call in list(in_flight):
                call.cancel()
            raise
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uid: int | None,
        in_flight: set[asyncio.Task[None]], slots: asyncio.Semaphore,
    ) -> None:
        while True:
            body = await self._read_frame(reader, writer)
            if body is None:
                break
            try:
                request = frames.request_decoder.decode(body)
            except msgspec.ValidationError as exc:
                writer.write(frames.error_frame(
                    frames.salvage_id(body), "invalid_argument", f"invalid request: {exc}"))
                continue
            except msgspec.DecodeError:
                writer.write(frames.error_frame(None, "invalid_argument", "frame is not a msgpack request"))
                await writer.drain()
                break  # garbage: we no longer trust this peer's framing
            await slots.acquire()
            call = asyncio.create_task(self._answer(request, uid, writer, slots))
            in_flight.add(call)
            call.add_done_callback(in_flight.discard)

    async def _read_frame(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        try:
            header = await reader.readexactly(frames.HEADER_BYTES)
        except asyncio.IncompleteReadError:
            return None  # clean end of stream
        size = int.from_bytes(header, "big")
        if size > self._max_frame:
            writer.write(frames.error_frame(
                None, "resource_exhausted", f"frame of {size} bytes exceeds the {self._max_frame}-byte limit"))
            await writer.drain()
            return None  # the stream cannot be resynchronised: close
        return await reader.readexactly(size)

    async def _answer(
        self, request: frames.Request, uid: int | None, writer: asyncio.StreamWriter, slots: asyncio.Semaphore
    ) -> None:
        try:
            writer.write(await self._reply(request, uid))
            await writer.drain()
        except ConnectionError:
            pass  # the peer is gone; the call itself has finished
        finally:
            slots.release()

    async def _reply(self, request: frames.Request, uid: int | None) -> bytes:
        caller = Caller(transport="socket", token=request.token, peer_uid=uid, request_id=str(request.id))
        try:
            result = await self._chain.call(request.tool, bytes(request.args), "msgpack", caller)
            return frames.result_frame(request.id, result)
        except ToolError as exc:
            return frames.error_frame(request.id, exc.code, exc.message)
        except Exception:
            log.exception("unexpected failure answering %s", request.tool)
            return frames.error_frame(request.id, "internal", "internal error; see the daemon log")


def _stop_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Make the connection's reader see the end of input now; what it already buffered is still read."""
    transport = writer.transport
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
