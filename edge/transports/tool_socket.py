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
from edge.transports.unix import MAX_IN_FLIGHT, Connection, Limits, Refused, Shared, UnixListener, peer_uid

log = logging.getLogger("qledge.server")

_NOT_A_REQUEST = "frame is not a msgpack request"
_TOO_DEEP = "request nests too deeply"


class ToolServer(UnixListener):
    def __init__(
        self, chain: Chain, path: str, max_frame: int = frames.DEFAULT_MAX_FRAME,
        limits: Limits | None = None, shared: Shared | None = None,
    ) -> None:
        super().__init__(path, limits, shared)
        self._chain = chain
        self._max_frame = max_frame

    def _refusal(self, code: str, message: str) -> bytes:
        return frames.error_frame(None, code, message)

    def attach(self, sock: socket.socket) -> None:
        """Serve `sock`, one end of a connection the daemon made for a child it started (an
        AI run's). Its peer is never trusted by uid (the daemon made both ends, so the
        kernel names the daemon's own): every call on it needs a token."""
        self.adopt(sock)

    async def _serve_connection(self, conn: Connection) -> None:
        uid = peer_uid(conn.writer.get_extra_info("socket")) if conn.believe_uid else None
        in_flight: set[asyncio.Task[None]] = set()
        slots = _Slots(MAX_IN_FLIGHT)
        try:
            await self._read_until_end(conn, uid, in_flight, slots)
            # End of input (or a reader task reads on): answer what was asked before it
            # (each call has its deadline); a reader task may start calls, or another reader.
            while in_flight:
                await asyncio.wait(set(in_flight))
        except asyncio.CancelledError:
            for call in list(in_flight):
                call.cancel()
            raise

    async def _read_until_end(
        self, conn: Connection, uid: int | None, in_flight: set[asyncio.Task[None]], slots: _Slots,
    ) -> None:
        try:
            await self._read_requests(conn, uid, in_flight, slots)
        except Refused as refused:  # a limit ends the connection: say which, once
            with contextlib.suppress(ConnectionError):
                await conn.send(frames.error_frame(None, refused.code, refused.message))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    async def _read_requests(
        self, conn: Connection, uid: int | None, in_flight: set[asyncio.Task[None]], slots: _Slots,
    ) -> None:
        while True:
            body = await self._read_frame(conn)
            if body is None:
                break
            request, problem = _decode(body)
            if request is None:
                await conn.send(problem)
                if problem is _GARBAGE:
                    break  # garbage: we no longer trust this peer's framing
                continue
            if not slots.free:
                await slots.freed()
            slots.free -= 1
            conn.call_started()
            if conn.in_flight == 1 and not conn.input_waiting:
                # The one call in flight, nothing more asked: answered here, without a task
                # of its own (and the loop turn that starts one). Input arriving meanwhile
                # gets a reader task that reads on from there, so calls asked after this
                # one still run beside it; this one then stops reading.
                if await self._answer_here(request, uid, conn, in_flight, slots):
                    return
                continue
            call = asyncio.create_task(self._answer(request, uid, conn, slots))
            in_flight.add(call)
            call.add_done_callback(in_flight.discard)

    async def _answer_here(
        self, request: frames.Request, uid: int | None, conn: Connection, in_flight: set[asyncio.Task[None]],
        slots: _Slots,
    ) -> bool:
        """Answer `request` in this task; whether a reader task took over reading meanwhile."""
        readers: list[asyncio.Task[None]] = []

        def read_on() -> None:
            reader = asyncio.get_running_loop().create_task(self._read_until_end(conn, uid, in_flight, slots))
            readers.append(reader)
            in_flight.add(reader)  # waited for, and cancelled with the calls, by _serve_connection
            reader.add_done_callback(in_flight.discard)

        if not conn.on_input(read_on):
            read_on()  # this reader cannot tell when input arrives: keep one reading
        try:
            await self._answer(request, uid, conn, slots)
        finally:
            conn.on_input(None)
        return bool(readers)

    async def _read_frame(self, conn: Connection) -> bytes | None:
        header = await conn.read_exactly(frames.HEADER_BYTES)
        if header is None:
            return None  # clean end of stream
        size = int.from_bytes(header, "big")
        if size > self._max_frame:
            await conn.send(frames.error_frame(
                None, "resource_exhausted", f"frame of {size} bytes exceeds the {self._max_frame}-byte limit"))
            return None  # the stream cannot be resynchronised: close
        body = conn.take(size)
        return body if body is not None else await conn.read_exactly(size)

    async def _answer(
        self, request: frames.Request, uid: int | None, conn: Connection, slots: _Slots
    ) -> None:
        authenticated = False
        try:
            answer, authenticated = await self._reply(request, uid)
            await conn.send(answer)
        except ConnectionError:
            pass  # the peer is gone; the call itself has finished
        finally:
            conn.call_finished(authenticated)
            slots.give()

    async def _reply(self, request: frames.Request, uid: int | None) -> tuple[bytes, bool]:
        """The answer frame, and whether the caller authenticated."""
        caller = Caller(transport=request.transport or "socket", token=request.token, peer_uid=uid,
                        request_id=str(request.id))
        try:
            result = await self._chain.call(request.tool, bytes(request.args), "msgpack", caller)
            return frames.result_frame(request.id, result), True
        except ToolError as exc:
            authenticated = exc.code not in ("unauthenticated", "unavailable")
            return frames.error_frame(request.id, exc.code, exc.message), authenticated
        except Exception:
            log.exception("unexpected failure answering %s", request.tool)
            return frames.error_frame(request.id, "internal", "internal error; see the daemon log"), False


class _Slots:
    """The calls a connection may have in flight (`MAX_IN_FLIGHT`): beyond them its one
    reader waits (and so does not read), until a call finishes."""

    __slots__ = ("free", "_waiter")

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiter: asyncio.Future[None] | None = None

    async def freed(self) -> None:
        while not self.free:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def give(self) -> None:
        self.free += 1
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


_GARBAGE = frames.error_frame(None, "invalid_argument", _NOT_A_REQUEST)


def _decode(body: bytes) -> tuple[frames.Request, bytes] | tuple[None, bytes]:
    """The request, or (None, the error frame that answers it). Nothing here raises: a
    hostile frame (deep nesting included) is answered, never logged."""
    try:
        request = frames.request_decoder.decode(body)
        if frames.tool_name_ok(request.tool):
            return request, b""
        return None, frames.error_frame(request.id, "invalid_argument", f"invalid request: {frames.TOOL_REFUSED}")
    except msgspec.ValidationError as exc:
        message = f"invalid request: {exc}"
    except msgspec.DecodeError:
        return None, _GARBAGE
    except RecursionError:
        message = _TOO_DEEP
    return None, frames.error_frame(frames.salvage_id(body), "invalid_argument", message)
