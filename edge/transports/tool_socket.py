"""The tool socket: the tool protocol (edge.transports.tool_protocol) on a Unix socket,
many requests in flight per connection, every one through the tool chain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import msgspec

from edge.core.errors import ToolError
from edge.tools.chain import Chain
from edge.tools.context import Caller
from edge.transports import tool_protocol as frames
from edge.transports.unix import MAX_IN_FLIGHT, UnixListener, peer_uid

log = logging.getLogger("qledge.server")


class ToolServer(UnixListener):
    def __init__(self, chain: Chain, path: str, max_frame: int = frames.DEFAULT_MAX_FRAME) -> None:
        super().__init__(path)
        self._chain = chain
        self._max_frame = max_frame
        self._attaching: set[asyncio.Task[None]] = set()  # attached connections not yet tracked

    def attach(self, sock: socket.socket) -> None:
        """Serve `sock`, one end of a connection the daemon made for a child it started (an
        AI run's). Its peer is never trusted by uid (the daemon made both ends, so the
        kernel names the daemon's own): every call on it needs a token."""
        task = asyncio.get_running_loop().create_task(self._attached(sock), name="tool-attached")
        self._attaching.add(task)
        task.add_done_callback(self._attaching.discard)

    async def _attached(self, sock: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except OSError:
            sock.close()
            return
        await self._track(reader, writer, trusted=False)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trusted: bool = True
    ) -> None:
        uid = peer_uid(writer.get_extra_info("socket")) if trusted else None
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
