"""A blocking tool-protocol client (the CLI needs no event loop)."""

from __future__ import annotations

import itertools
import socket
from typing import Any

import msgspec

from edge.transports import tool_protocol as frames


class Unreachable(Exception):
    """The daemon could not be reached; the message is one line for the user."""


class CallFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Client:
    def __init__(self, path: str, token: str | None = None, timeout_s: float = 90.0) -> None:
        self.path = path
        self.token = token
        self._ids = itertools.count(1)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, tool: str, args: Any = None) -> Any:
        """Call a tool; returns the decoded result or raises CallFailed."""
        request_id = next(self._ids)
        body = frames.encoder.encode(
            frames.Request(
                id=request_id, tool=tool, token=self.token,
                args=msgspec.Raw(frames.encoder.encode(args if args is not None else {})),
            )
        )
        try:
            self._sock.sendall(frames.frame(body))
            response = frames.response_decoder.decode(self._read_frame())
        except (OSError, msgspec.DecodeError) as exc:
            raise Unreachable(f"lost the connection to the daemon at {self.path}: {exc}") from None
        if not response.ok:
            err = response.error or frames.ErrorBody("internal", "malformed error response")
            raise CallFailed(err.code, err.message)
        return msgspec.msgpack.decode(response.result) if len(response.result) else None

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
