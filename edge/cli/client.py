"""A blocking tool-protocol client (the CLI needs no event loop).

`call` is untyped (`qledge call`, test helpers). `typed` sends an argument Struct and
decodes the result into the Struct the tool declares: the daemon's own types, so a
renamed or retyped field is a type error here, and a reply of another shape (a daemon
of another version) is one clear line, never a traceback.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from typing import Any, TypeVar

import msgspec

from edge.transports import tool_protocol as frames

T = TypeVar("T")


class UsageError(Exception):
    """Input this CLI refuses before (or instead of) asking the daemon: `invalid_argument`."""


class Unreachable(Exception):
    """The daemon could not be reached; the message is one line for the user."""


class CallFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class BadReply(Exception):
    """The daemon answered, but not in the shape this CLI expects; the message is one line."""


# Keyed by result type; each value decodes into its key, which the mapping cannot express.
_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def decoder(result: type[T]) -> msgspec.msgpack.Decoder[T]:
    """The result decoder for one type: one per type, built once."""
    found = _decoders.get(result)
    if found is None:
        found = _decoders[result] = msgspec.msgpack.Decoder(result)
    return found


def _connect(sock: socket.socket, path: str, patience_s: float = 5.0) -> None:
    """Connect; while the daemon's listen queue is full (a Unix socket says EAGAIN at once,
    e.g. while it refuses a flood of connections), try again for a few seconds."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Client:
    def __init__(
        self, path: str, token: str | None = None, timeout_s: float = 90.0,
        max_frame_bytes: int = frames.DEFAULT_MAX_FRAME, connected: socket.socket | None = None,
    ) -> None:
        """Connect to the daemon's socket at `path`, or use `connected`, a connection the
        daemon made for this process (an AI run's child), named `path` in messages."""
        self.path = path
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._allowed: set[str] | None = None
        if connected is not None:
            self._sock = connected
            self._sock.settimeout(timeout_s)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            _connect(self._sock, path)
        except (FileNotFoundError, ConnectionRefusedError):
            self._sock.close()
            raise Unreachable(f"daemon not running at {path}") from None
        except PermissionError:
            self._sock.close()
            raise Unreachable(f"cannot connect to {path}: permission denied") from None
        except OSError as exc:
            self._sock.close()
            raise Unreachable(f"cannot connect to {path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        self._sock.close()

    def may_call(self, tool: str) -> bool:
        """Whether this caller may call `tool`, so a command can pick the tool it may use
        rather than be refused (and leave a denied row in the audit). Without a token the
        caller is an owner by uid, who may call anything; with one, `qledge.tools.list`
        says (asked once per connection)."""
        if self.token is None:
            return True
        if self._allowed is None:
            from edge.tools.builtin.status import ToolList
            from edge.tools.definition import Empty

            self._allowed = {t.name for t in self.typed("qledge.tools.list", Empty(), ToolList).tools}
        return tool in self._allowed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, tool: str, args: Any = None) -> Any:
        """Call a tool with any encodable args; returns the result as plain values or raises CallFailed."""
        result = self._result(tool, frames.encoder.encode(args if args is not None else {}))
        return msgspec.msgpack.decode(result) if len(result) else None

    def typed(self, tool: str, args: msgspec.Struct, result: type[T]) -> T:
        """Call a tool with its argument Struct; returns its result decoded (and validated) as `result`.

        Raises CallFailed for a tool error, BadReply when the reply is not a `result`.
        """
        raw = self._result(tool, frames.encoder.encode(args))
        try:
            return decoder(result).decode(raw)
        except msgspec.DecodeError as exc:  # msgspec.ValidationError included
            raise BadReply(
                f"{tool}: the daemon's reply is not a {result.__name__} (is the daemon another version?):"
                f" {_one_line(str(exc))}"
            ) from None

    def _result(self, tool: str, args: bytes) -> msgspec.Raw:
        """Send one request; the raw msgpack result of a successful call."""
        body = frames.encoder.encode(
            frames.Request(id=next(self._ids), tool=tool, token=self.token, args=msgspec.Raw(args))
        )
        # The daemon would refuse it and hang up mid-send: say so before sending.
        if len(body) > self.max_frame_bytes:
            raise CallFailed("resource_exhausted",
                             f"request of {len(body)} bytes exceeds the {self.max_frame_bytes}-byte limit")
        try:
            # A daemon that refused the frame and hung up left its answer to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._sock.sendall(frames.frame(body))
            response = frames.response_decoder.decode(self._read_frame())
        except (OSError, msgspec.DecodeError) as exc:
            raise Unreachable(f"lost the connection to the daemon at {self.path}: {exc}") from None
        if not response.ok:
            err = response.error or frames.ErrorBody("internal", "malformed error response")
            raise CallFailed(err.code, err.message)
        return response.result

    def _read_frame(self) -> bytes:
        header = self._recv_exactly(frames.HEADER_BYTES)
        return self._recv_exactly(int.from_bytes(header, "big"))

    def _recv_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            chunks += chunk
        return bytes(chunks)
