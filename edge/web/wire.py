"""The panel's side of the tool protocol: a blocking client that makes every call with the
signed-in user's token and names its transport `web`, and the small part of msgpack it needs.

The protocol's shapes are edge.transports.tool_protocol's (`{id, tool, args, token?,
transport?}` → `{id, ok, result | error{code, message}}`, 4-byte big-endian length then a
msgpack body). They are written here by hand rather than with msgspec: msgspec and the
modules it loads cost the panel about 3.4 MiB, a quarter of its budget, for the handful of
frames it sends. tests/test_web_parts.py checks this codec against msgspec's both ways
(test_msgpack_agrees_with_msgspec_both_ways).

A call without a token is never made: the daemon would take the panel's own uid for the
caller (an owner, if that uid is one), which no browser may ever be.
"""

from __future__ import annotations

import itertools
import socket
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_FRAME = 256 * 1024  # edge.transports.tool_protocol.DEFAULT_MAX_FRAME: the daemon's own bound
MAX_DEPTH = 64
TRANSPORT = "web"


class WireError(Exception):
    """A frame this codec cannot encode or decode; the message is one line."""


class CallFailed(Exception):
    """The daemon answered with an error: its stable code and its message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


# -- msgpack (the subset the tool protocol uses: no extension types) ------------------


class Raw:
    """Bytes that are already msgpack: embedded as they are (a request's `args`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def encode(value: object) -> bytes:
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: object, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireError("value nests too deeply")
    if value is None:
        out.append(0xC0)
    elif value is True:
        out.append(0xC3)
    elif value is False:
        out.append(0xC2)
    elif isinstance(value, int):
        _int(value, out)
    elif isinstance(value, float):
        out += b"\xcb" + struct.pack(">d", value)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        _head(len(data), out, 0xA0, 32, b"\xd9", b"\xda", b"\xdb")
        out += data
    elif isinstance(value, (bytes, bytearray)):
        _head(len(value), out, None, 0, b"\xc4", b"\xc5", b"\xc6")
        out += value
    elif isinstance(value, Raw):
        out += value.data
    elif isinstance(value, (list, tuple)):
        _head(len(value), out, 0x90, 16, None, b"\xdc", b"\xdd")
        for item in value:
            _encode(item, out, depth + 1)
    elif isinstance(value, dict):
        _head(len(value), out, 0x80, 16, None, b"\xde", b"\xdf")
        for key, item in value.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    else:
        raise WireError(f"cannot encode a {type(value).__name__}")


def _int(value: int, out: bytearray) -> None:
    if 0 <= value < 128:
        out.append(value)
    elif -32 <= value < 0:
        out.append(value & 0xFF)
    elif 0 <= value < 1 << 64:
        for tag, fmt, limit in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16), (0xCE, ">I", 1 << 32),
                                (0xCF, ">Q", 1 << 64)):
            if value < limit:
                out += bytes((tag,)) + struct.pack(fmt, value)
                return
    elif -(1 << 63) <= value < 0:
        for tag, fmt, limit in ((0xD0, ">b", 1 << 7), (0xD1, ">h", 1 << 15), (0xD2, ">i", 1 << 31),
                                (0xD3, ">q", 1 << 63)):
            if value >= -limit:
                out += bytes((tag,)) + struct.pack(fmt, value)
                return
    else:
        raise WireError("integer out of range")


def _head(n: int, out: bytearray, fix: int | None, fix_limit: int, one: bytes | None, two: bytes,
          four: bytes) -> None:
    if fix is not None and n < fix_limit:
        out.append(fix | n)
    elif one is not None and n < 1 << 8:
        out += one + bytes((n,))
    elif n < 1 << 16:
        out += two + struct.pack(">H", n)
    else:
        out += four + struct.pack(">I", n)


def decode(data: bytes) -> object:
    """One msgpack value that is the whole of `data`."""
    try:
        value, end = _decode(memoryview(data), 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError):
        raise WireError("truncated or malformed msgpack") from None
    if end != len(data):
        raise WireError("trailing bytes after the msgpack value")
    return value


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_NUMBERS = {0xCA: (">f", 4), 0xCB: (">d", 8), 0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8),
            0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8)}
_LENGTHS = {0xC4: (1, "bin"), 0xC5: (2, "bin"), 0xC6: (4, "bin"), 0xD9: (1, "str"), 0xDA: (2, "str"),
            0xDB: (4, "str"), 0xDC: (2, "array"), 0xDD: (4, "array"), 0xDE: (2, "map"), 0xDF: (4, "map")}


def _decode(buf: memoryview, pos: int, depth: int) -> tuple[object, int]:
    if depth > MAX_DEPTH:
        raise WireError("msgpack nests too deeply")
    tag = buf[pos]
    pos += 1
    if tag < 0x80:
        return tag, pos
    if tag >= 0xE0:
        return tag - 0x100, pos
    if tag < 0x90:
        return _map(buf, pos, tag & 0x0F, depth)
    if tag < 0xA0:
        return _array(buf, pos, tag & 0x0F, depth)
    if tag < 0xC0:
        n = tag & 0x1F
        return str(buf[pos : pos + n], "utf-8"), _past(buf, pos, n)
    if tag in _FIXED:
        return _FIXED[tag], pos
    if tag in _NUMBERS:
        fmt, size = _NUMBERS[tag]
        return struct.unpack(fmt, buf[pos : pos + size])[0], _past(buf, pos, size)
    if tag in _LENGTHS:
        size, kind = _LENGTHS[tag]
        n = int.from_bytes(buf[pos : pos + size], "big")
        pos = _past(buf, pos, size)
        if kind == "array":
            return _array(buf, pos, n, depth)
        if kind == "map":
            return _map(buf, pos, n, depth)
        chunk = buf[pos : pos + n]
        end = _past(buf, pos, n)
        return (str(chunk, "utf-8") if kind == "str" else bytes(chunk)), end
    raise WireError(f"unsupported msgpack type 0x{tag:02x}")


def _past(buf: memoryview, pos: int, n: int) -> int:
    if pos + n > len(buf):
        raise IndexError
    return pos + n


def _array(buf: memoryview, pos: int, n: int, depth: int) -> tuple[object, int]:
    items = []
    for _ in range(n):
        item, pos = _decode(buf, pos, depth + 1)
        items.append(item)
    return items, pos


def _map(buf: memoryview, pos: int, n: int, depth: int) -> tuple[object, int]:
    found: dict[object, object] = {}
    for _ in range(n):
        key, pos = _decode(buf, pos, depth + 1)
        value, pos = _decode(buf, pos, depth + 1)
        if isinstance(key, (list, dict)):
            raise WireError("unhashable msgpack map key")
        found[key] = value
    return found, pos


# -- the client -----------------------------------------------------------------------


def unreachable(message: str) -> CallFailed:
    return CallFailed("unavailable", message)


class ToolClient:
    """Calls on the daemon's tool socket, one connection per call (the panel's calls are few
    and loopback connections are cheap; nothing is kept open while a page is idle)."""

    def __init__(self, path: str, timeout_s: float = 40.0,
                 connect: Callable[[str, float], socket.socket] | None = None) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._connect = connect or _unix
        self._ids = itertools.count(1)

    def call(self, tool: str, args: object, token: str, timeout_s: float | None = None) -> object:
        """The result of one call made as the holder of `token`; CallFailed with the daemon's
        code (or `unavailable`, when it cannot be reached or answers out of shape)."""
        if not token:
            raise CallFailed("unauthenticated", "no credential: sign in first")
        body = encode({"id": next(self._ids), "tool": tool, "args": Raw(encode(args if args is not None else {})),
                       "token": token, "transport": TRANSPORT})
        if len(body) > MAX_FRAME:
            raise CallFailed("resource_exhausted", f"request of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
        try:
            sock = self._connect(self.path, timeout_s or self.timeout_s)
        except OSError as exc:
            raise unreachable(f"the daemon is not reachable at {self.path}: {exc.strerror or exc}") from None
        try:
            sock.sendall(len(body).to_bytes(4, "big") + body)
            size = int.from_bytes(_exactly(sock, 4), "big")
            if size > MAX_FRAME * 4:
                raise unreachable("the daemon's answer is larger than any answer it gives")
            response = decode(_exactly(sock, size))
        except (OSError, WireError) as exc:
            raise unreachable(f"lost the connection to the daemon: {exc}") from None
        finally:
            sock.close()
        if not isinstance(response, dict):
            raise unreachable("the daemon's answer is not a response")
        if response.get("ok") is True:
            return response.get("result")
        error = response.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            raise CallFailed(error["code"], str(error.get("message", "")))
        raise unreachable("the daemon's answer is not a response")


def _unix(path: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1 << 16))
        if not chunk:
            raise ConnectionResetError("the daemon closed the connection")
        chunks += chunk
    return bytes(chunks)
