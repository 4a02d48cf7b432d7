"""Helpers for the MCP tests: line-speaking clients (blocking and asyncio) and the envelope."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from typing import Any

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
}
INITIALIZE = {
    "jsonrpc": "2.0", "id": "init", "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tests", "version": "1"}},
}


def request(rid: int | str, method: str, params: dict | None = None, modern: bool = False) -> dict:
    params = dict(params or {})
    if modern:
        params["_meta"] = MODERN_META
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def encode(message: Any) -> bytes:
    return message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"


class LineClient:
    """A blocking MCP socket client that speaks raw lines (for a daemon in another process)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self._buffer = b""

    def send(self, message: Any) -> None:
        self.sock.sendall(encode(message))

    def recv(self) -> dict | None:
        """The next line as JSON; None when the daemon closed the connection."""
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def ask(self, message: Any) -> dict | None:
        self.send(message)
        return self.recv()

    def close(self) -> None:
        self.sock.close()


class AsyncLineClient:
    """The same over asyncio, for a server running in the test's own event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: str) -> AsyncLineClient:
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 22)
        return cls(reader, writer)

    async def send(self, message: Any) -> None:
        self.writer.write(encode(message))
        await self.writer.drain()

    async def recv(self, timeout: float = 10.0) -> dict | None:
        line = await asyncio.wait_for(self.reader.readline(), timeout)
        return json.loads(line) if line else None

    async def ask(self, message: Any) -> dict | None:
        await self.send(message)
        return await self.recv()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def bridge_env(home: str, token: str | None = None) -> dict[str, str]:
    env = {**os.environ, "QLEDGE_HOME": home}
    env.pop("QLEDGE_SOCKET", None)
    env.pop("QLEDGE_TOKEN", None)
    if token is not None:
        env["QLEDGE_TOKEN"] = token
    return env


def run_bridge(home: str, *args: str, stdin: bytes = b"", token: str | None = None,
               timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge", "mcp", *args], input=stdin, env=bridge_env(home, token),
        capture_output=True, timeout=timeout,
    )


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS and RssAnon of a process, in KiB."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon"):
                values[key] = int(rest.split()[0])
    return values
