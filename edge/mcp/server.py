"""MCP over a second Unix socket: one connection is one MCP session, one JSON-RPC message per line.

Every `tools/call` goes through the same per-call chain as the tool socket (authenticate,
policy, audit, credential re-check, deadline). Only protocol lines are ever written to the
stream; a misbehaving peer gets a JSON-RPC error (or its connection closed), never a traceback,
and the daemon keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec

from edge.core.errors import ToolError
from edge.mcp import protocol as p
from edge.transports.unix import MAX_IN_FLIGHT, Connection, Limits, Refused, Shared, UnixListener, peer_uid
from edge.tools.chain import Chain
from edge.tools.context import Caller

log = logging.getLogger("qledge.mcp")

_LIMIT_CODES = {"resource_exhausted": p.INVALID_REQUEST}  # the rest are -32000, a server error
_MISSING_ENVELOPE = (
    f"params._meta must carry {p.VERSION_KEY} and {p.CAPABILITIES_KEY} "
    "(or open a handshake-era session with initialize first)"
)


class McpServer(UnixListener):
    def __init__(
        self, chain: Chain, path: str, max_line_bytes: int, limits: Limits | None = None, shared: Shared | None = None,
    ) -> None:
        super().__init__(path, limits, shared)
        self.chain = chain
        self.catalog = p.Catalog(chain.registry.ai_tools())
        self.max_line_bytes = max_line_bytes

    def _refusal(self, code: str, message: str) -> bytes:
        return p.error_line(None, _LIMIT_CODES.get(code, p.SERVER_ERROR), f"{code}: {message}")

    async def _serve_connection(self, conn: Connection) -> None:
        session = Session(self, conn)
        try:
            await session.run()
        except Refused as refused:  # a limit ends the session: say which, once
            with contextlib.suppress(ConnectionError):
                await conn.send(self._refusal(refused.code, refused.message))
        except (ConnectionError, _Close):
            pass
        except Exception:
            log.exception("MCP session failed")
        finally:
            session.cancel_all()


class _Close(Exception):
    """The session ends here (refused credential)."""


class Session:
    """Per-connection state: the presented credential, the handshake flag and calls in flight."""

    def __init__(self, server: McpServer, conn: Connection) -> None:
        self.server = server
        self.conn = conn
        self.uid = peer_uid(conn.writer.get_extra_info("socket")) if conn.believe_uid else None
        self.token: str | None = None
        self.initialized = False  # a handshake-era session: requests may omit the _meta envelope
        self.calls: dict[int | str, asyncio.Task] = {}
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def run(self) -> None:
        first = True
        while (line := await self.conn.read_line(self.server.max_line_bytes)) is not None:
            if not line.strip():
                continue
            too_deep = False
            try:
                if first:
                    first = False
                    if await self._hello(line):
                        continue
                await self._message(line)
            except RecursionError:  # nested deeper than any decoder goes: answered, never logged
                too_deep = True
            if too_deep:
                await self._send(p.error_line(None, p.PARSE_ERROR, "parse error: message nests too deeply"))
        if self.calls:  # end of input: answer what was asked before it
            await asyncio.gather(*self.calls.values(), return_exceptions=True)

    def cancel_all(self) -> None:
        for task in self.calls.values():
            task.cancel()

    async def _send(self, data: bytes) -> None:
        if not self.conn.writer.is_closing():
            await self.conn.send(data)

    async def _hello(self, line: bytes) -> bool:
        """The bridge's credential line, if this is one; a refused credential ends the session."""
        try:
            if not len(p.probe_decoder.decode(line).qledge):
                return False
        except msgspec.DecodeError:
            return False  # not an object at all: the MCP parser answers it
        refusal: tuple[str, str] | None = None
        try:
            hello = p.hello_decoder.decode(line)
            self.token = hello.qledge.token
            caller = Caller(transport="mcp", token=self.token, peer_uid=self.uid)
            await self.server.chain.authenticate(caller, "mcp.session", "mcp_session_open")
        except msgspec.DecodeError as exc:
            refusal = ("invalid_argument", f"invalid qledge hello: {exc}")
        except ToolError as exc:
            refusal = (exc.code, exc.message)
        if refusal is not None:  # answered outside the handler: no exception outlives the line
            await self._refuse(*refusal)
        self.conn.authenticated()
        await self._send(p.line(p.HelloAnswer(p.HelloReply(ok=True))))
        return True

    async def _refuse(self, code: str, message: str) -> None:
        await self._send(p.line(p.HelloAnswer(p.HelloReply(ok=False, code=code, message=message))))
        raise _Close

    async def _message(self, line: bytes) -> None:
        msg, problem = _envelope(line)
        if msg is None:
            return await self._send(problem)
        rid = msg.id if type(msg.id) in (int, str) else None
        if msg.jsonrpc != "2.0":
            return await self._send(p.error_line(rid, p.INVALID_REQUEST, 'jsonrpc must be "2.0"'))
        if not isinstance(msg.method, str):
            if msg.method is msgspec.UNSET and (len(msg.result) or len(msg.error)):
                return None  # a response; we never send requests, so there is nothing to match
            return await self._send(p.error_line(rid, p.INVALID_REQUEST, "method must be a string"))
        if msg.id is msgspec.UNSET:
            return self._notification(msg.method, msg.params)
        if rid is None:
            return await self._send(p.error_line(None, p.INVALID_REQUEST, "id must be a string or an integer"))
        if rid in self.calls:
            return await self._send(p.error_line(rid, p.INVALID_REQUEST, f"request {rid!r} is still in flight"))
        await self._request(rid, msg.method, msg.params)

    def _notification(self, method: str, params: msgspec.Raw) -> None:
        """Never answered. `initialized` needs no action; unknown ones are ignored."""
        if method != "notifications/cancelled":
            return
        try:
            target = p.cancel_decoder.decode(params).request_id
        except msgspec.DecodeError:
            return
        task = self.calls.get(target)
        if task is not None:
            task.cancel()  # its response is never sent

    async def _request(self, rid: int | str, method: str, params: msgspec.Raw) -> None:
        try:
            meta = p.meta_decoder.decode(params).meta
        except msgspec.DecodeError:
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, "params must be an object; _meta an object"))
        if method == "initialize":  # always the handshake era, whatever its _meta says
            return await self._initialize(rid, params)
        is_modern = meta is not None and p.VERSION_KEY in meta
        if meta is not None and is_modern:
            problem = _envelope_problem(meta)
            if problem is not None:
                return await self._send(p.error_line(rid, *problem))
            methods = ("server/discover", "tools/list", "tools/call")
        else:
            methods = ("ping", "tools/list", "tools/call")
            if method == "server/discover" or (method in methods[1:] and not self.initialized):
                return await self._send(p.error_line(rid, p.INVALID_PARAMS, _MISSING_ENVELOPE))
        if method not in methods:
            return await self._send(p.error_line(rid, p.METHOD_NOT_FOUND, f"method not found: {method}"))
        if method == "tools/call":
            return await self._start_call(rid, params, is_modern)
        if method == "tools/list":
            return await self._list(rid, params, is_modern)
        if method == "ping":
            return await self._send(p.result_line(rid, p.EmptyResult()))
        discovered = p.DiscoverResult(p.SUPPORTED, p.Capabilities(), p.INSTRUCTIONS, p.LIST_TTL_MS, "public")
        await self._send(p.result_line(rid, discovered))

    async def _initialize(self, rid: int | str, params: msgspec.Raw) -> None:
        try:
            asked = p.initialize_decoder.decode(params).protocol_version
        except msgspec.DecodeError as exc:
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, f"invalid initialize params: {exc}"))
        self.initialized = True
        version = asked if asked in p.HANDSHAKE else p.HANDSHAKE[0]
        result = p.InitializeResult(version, p.Capabilities(), p.SERVER, p.INSTRUCTIONS)
        await self._send(p.result_line(rid, result))

    async def _list(self, rid: int | str, params: msgspec.Raw, is_modern: bool) -> None:
        try:
            cursor = p.list_decoder.decode(params).cursor
        except msgspec.DecodeError:
            cursor = ""
        if cursor is not None:  # we never hand one out
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, "invalid cursor: the tool list is one page"))
        listing = p.ToolsListResult(self.server.catalog.listing)
        if is_modern:
            listing.ttl_ms, listing.cache_scope = p.LIST_TTL_MS, "public"
            p.modern(listing)
        await self._send(p.result_line(rid, listing))

    async def _start_call(self, rid: int | str, params: msgspec.Raw, is_modern: bool) -> None:
        try:
            call = p.call_decoder.decode(params)
        except msgspec.DecodeError as exc:
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, f"invalid tools/call params: {exc}"))
        if call.name not in self.server.catalog.tools:
            caller = Caller(transport="mcp", token=self.token, peer_uid=self.uid, request_id=str(rid)[:128])
            with contextlib.suppress(ToolError):  # the answer is the same either way
                await self.server.chain.refuse(call.name[:128], caller, "tool_not_offered")
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, f"Unknown tool: {call.name}"))
        args = bytes(call.arguments)
        if args == b"null":
            args = b"{}"
        if args[:1] != b"{":
            return await self._send(p.error_line(rid, p.INVALID_PARAMS, "arguments must be an object"))
        await self.slots.acquire()  # backpressure: stop reading while too much is in flight
        self.conn.call_started()
        task = asyncio.create_task(self._call(rid, call.name, args, is_modern))
        self.calls[rid] = task
        task.add_done_callback(lambda done: self._finished(rid, done))

    def _finished(self, rid: int | str, task: asyncio.Task) -> None:
        if self.calls.get(rid) is task:
            del self.calls[rid]
        self.conn.call_finished(authenticated=False)  # _call says when it authenticated
        self.slots.release()

    async def _call(self, rid: int | str, name: str, args: bytes, is_modern: bool) -> None:
        caller = Caller(transport="mcp", token=self.token, peer_uid=self.uid, request_id=str(rid)[:128])
        try:
            data = p.encoder.encode(await self.server.chain.call(name, args, "json", caller))
            result = p.CallToolResult([p.TextContent(data.decode())], False, msgspec.Raw(data))
            self.conn.authenticated()
        except ToolError as exc:
            result = p.CallToolResult([p.TextContent(f"{exc.code}: {exc.message}")], True)
            if exc.code not in ("unauthenticated", "unavailable"):
                self.conn.authenticated()
        except Exception:
            log.exception("MCP call of %s failed", name)
            result = p.CallToolResult([p.TextContent("internal: internal error; see the daemon log")], True)
        with contextlib.suppress(ConnectionError):
            await self._send(p.result_line(rid, p.modern(result) if is_modern else result))


def _envelope(line: bytes) -> tuple[p.Envelope, bytes] | tuple[None, bytes]:
    """The message, or (None, the error line that answers it). The error is built here and
    sent by the caller, so no exception (nor the line its traceback holds) lives across a
    write that may wait on the peer."""
    try:
        return p.envelope_decoder.decode(line), b""
    except msgspec.ValidationError:
        batch = line.lstrip()[:1] == b"["
        text = "batch arrays are not supported: send one message per line" if batch else "not a JSON-RPC object"
        return None, p.error_line(None, p.INVALID_REQUEST, text)
    except msgspec.DecodeError as exc:
        return None, p.error_line(None, p.PARSE_ERROR, f"parse error: {exc}")
    except RecursionError:
        return None, p.error_line(None, p.PARSE_ERROR, "parse error: message nests too deeply")


def _envelope_problem(meta: dict[str, Any]) -> tuple[int, str, Any] | None:
    """The 2026-07-28 envelope rules: required keys (-32602), then a version we serve (-32022)."""
    if p.CAPABILITIES_KEY not in meta:
        return p.INVALID_PARAMS, f"params._meta is missing {p.CAPABILITIES_KEY}", None
    version = meta[p.VERSION_KEY]
    if not isinstance(version, str) or not isinstance(meta[p.CAPABILITIES_KEY], dict):
        return p.INVALID_PARAMS, f"{p.VERSION_KEY} must be a string and {p.CAPABILITIES_KEY} an object", None
    if version != p.MODERN:
        return p.UNSUPPORTED_VERSION, "Unsupported protocol version", {"supported": p.SUPPORTED, "requested": version}
    return None
