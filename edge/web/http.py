"""HTTP/1.1 as the panel speaks it: one bounded request read from a socket, one response
written with the panel's headers. Nothing here grows with what a peer sends: the request
head and body have caps, and both must arrive before a deadline (a peer that trickles
bytes is cut off when its time is up, not when it pauses).

Only what browsers need: GET, HEAD and POST; bodies by Content-Length (no chunked
uploads); keep-alive.
"""

from __future__ import annotations

import socket
import time

MAX_HEAD = 8 * 1024  # request line and headers
MAX_HEADERS = 64
MAX_BODY = 256 * 1024  # the daemon's frame cap: no bigger request could be forwarded
HEAD_TIMEOUT_S = 10.0  # the whole request head, from its first byte
BODY_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 5.0  # between two requests on one connection
WRITE_TIMEOUT_S = 10.0
METHODS = ("GET", "HEAD", "POST")

REASONS = {200: "OK", 204: "No Content", 304: "Not Modified", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
           411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
           421: "Misdirected Request", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           504: "Gateway Timeout"}


class BadRequest(Exception):
    """A request the panel refuses before reading it further: the status to answer with
    and one line saying why; the connection is closed after the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "client", "keep_alive")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], client: str,
                 keep_alive: bool) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names; a repeated header keeps its first value
        self.body = b""
        self.client = client
        self.keep_alive = keep_alive

    def header(self, name: str) -> str:
        return self.headers.get(name, "")

    def cookies(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for part in self.header("cookie").split(";"):
            name, eq, value = part.strip().partition("=")
            if eq and name not in found:
                found[name] = value
        return found

    def param(self, name: str) -> str | None:
        from urllib.parse import unquote

        for part in self.query.split("&"):
            key, eq, value = part.partition("=")
            if key == name:
                return unquote(value) if eq else ""
        return None


class Reader:
    """Requests from one connection. `buffered` holds bytes read past the previous request
    (a browser may send the next request early)."""

    def __init__(self, sock: socket.socket, client: str) -> None:
        self.sock = sock
        self.client = client
        self.buffered = b""

    def next(self, first: bool) -> Request | None:
        """The next request; None when the peer closed (or stayed silent) between requests."""
        head = self._head(first)
        if head is None:
            return None
        request = _parse(head, self.client)
        length = request.header("content-length")
        if request.header("transfer-encoding"):
            raise BadRequest(501, "chunked request bodies are not accepted; send a Content-Length")
        if length:
            if not length.isdigit() or len(length) > 9:
                raise BadRequest(400, "Content-Length is not a number")
            size = int(length)
            if size > MAX_BODY:
                raise BadRequest(413, f"request body of {size} bytes exceeds the {MAX_BODY}-byte limit")
            request.body = self._body(size)
        elif request.method == "POST":
            raise BadRequest(411, "a POST needs a Content-Length")
        return request

    def _head(self, first: bool) -> bytes | None:
        buf = self.buffered
        deadline: float | None = time.monotonic() + HEAD_TIMEOUT_S if buf else None
        while True:
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                self.buffered = buf[end + 4 :]
                return buf[:end]
            if len(buf) > MAX_HEAD:
                raise BadRequest(431, f"request head exceeds {MAX_HEAD} bytes")
            if deadline is None:
                # Waiting for a request to begin: a new connection gets the head's time, a
                # kept-alive one the idle time.
                wait = HEAD_TIMEOUT_S if first else IDLE_TIMEOUT_S
            else:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise BadRequest(408, "the request head took too long")
            self.sock.settimeout(wait)
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                if not buf:
                    return None  # silent between requests: just close
                raise BadRequest(408, "the request head took too long") from None
            if not chunk:
                if buf.strip():
                    raise BadRequest(400, "the connection closed inside a request head")
                return None
            if deadline is None:
                deadline = time.monotonic() + HEAD_TIMEOUT_S
            buf += chunk

    def _body(self, size: int) -> bytes:
        data = bytearray(self.buffered[:size])
        self.buffered = self.buffered[size:]
        deadline = time.monotonic() + BODY_TIMEOUT_S
        while len(data) < size:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise BadRequest(408, "the request body took too long")
            self.sock.settimeout(wait)
            try:
                chunk = self.sock.recv(min(size - len(data), 65536))
            except TimeoutError:
                raise BadRequest(408, "the request body took too long") from None
            if not chunk:
                raise BadRequest(400, "the connection closed inside a request body")
            data += chunk
        return bytes(data)


def _parse(head: bytes, client: str) -> Request:
    text = head.decode("latin-1")  # every byte decodes; header values are checked where used
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if method not in METHODS:
        raise BadRequest(405, f"method {method[:16]!r} is not allowed")
    if not target.startswith("/") or any(ord(c) < 0x21 or ord(c) > 0x7E for c in target):
        raise BadRequest(400, "malformed request target")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} request headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or any(c in name for c in " \t"):
            raise BadRequest(400, "malformed request header")
        headers.setdefault(name.lower(), value.strip())
    if version == "HTTP/1.1" and "host" not in headers:
        raise BadRequest(400, "an HTTP/1.1 request needs a Host header")
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, client, keep_alive)


def response(status: int, headers: list[tuple[str, str]], body: bytes, keep_alive: bool,
             head_only: bool = False) -> bytes:
    """A whole response: status line, headers (Content-Length and Connection added), body."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def stream_head(headers: list[tuple[str, str]]) -> bytes:
    """The head of a response whose body is written as it comes (an event stream): no
    length, the connection closes at its end."""
    lines = ["HTTP/1.1 200 OK", *(f"{name}: {value}" for name, value in headers), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
