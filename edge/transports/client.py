"""A blocking tool-protocol client: the CLI, the AI run's child and the tests (no event loop).

`typed` sends an argument Struct and decodes the result into the Struct the tool declares:
the daemon's own types, so a renamed or retyped field is a type error at the caller, and a
reply of another shape (a daemon of another version) is one clear line, never a traceback.
`call` is untyped (`qledge call`, test helpers). `raw` and `decode` read a reply with the
small msgpack reader below instead of msgspec, for a command whose start-up is most of what
it costs: importing msgspec alone takes as long as starting the interpreter three times over.

The frames are edge.transports.tool_protocol's (4-byte big-endian length, a msgpack body:
`{id, tool, args, token?}` → `{id, ok, result | error{code, message}}`), read and written
here by hand so that this module loads nothing but the interpreter's own socket and struct
(tests/test_cli.py checks both against msgspec's).
"""

from __future__ import annotations

import _socket  # socket.py loads enum and selectors (~0.4 of a bare start) for nothing used here
import struct
import time

TYPE_CHECKING = False  # not `typing`: the commands that need no msgspec must not pay for it either
if TYPE_CHECKING:
    from collections.abc import Callable
    from socket import socket
    from typing import Any, TypeVar

    import msgspec

    T = TypeVar("T")

MAX_FRAME = 256 * 1024  # edge.transports.tool_protocol.DEFAULT_MAX_FRAME: the daemon's own bound
HEADER_BYTES = 4
_MAX_DEPTH = 64


class Unreachable(Exception):
    """The daemon could not be reached; the message is one line for the user."""


class CallFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class BadReply(Exception):
    """The daemon answered, but not in the shape the caller expects; the message is one line."""


# Keyed by result type; each value decodes into its key, which the mapping cannot express.
_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def decoder(result: type[T]) -> msgspec.msgpack.Decoder[T]:
    """The result decoder for one type: one per type, built once."""
    found = _decoders.get(result)
    if found is None:
        import msgspec

        found = _decoders[result] = msgspec.msgpack.Decoder(result)
    return found


def all_pages(page: Callable[[str | None], tuple[list[T], str | None]]) -> list[T]:
    """Every item of a keyset-paged list tool: `page(after)` is one page's items and its `next`."""
    items: list[T] = []
    after: str | None = None
    while True:
        found, after = page(after)
        items += found
        if not after:
            return items


def _connect(sock: _socket.socket, path: str, patience_s: float = 5.0) -> None:
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
        max_frame_bytes: int = MAX_FRAME, connected: socket | None = None,
    ) -> None:
        """Connect to the daemon's socket at `path`, or use `connected`, a connection the
        daemon made for this process (an AI run's child), named `path` in messages."""
        self.path = path
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self._next_id = 1
        self._allowed: set[str] | None = None
        if connected is not None:
            self._sock: _socket.socket = connected
            self._sock.settimeout(timeout_s)
            return
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def may_call(self, tool: str) -> bool:
        """Whether this caller may call `tool`, so a command can pick the tool it may use
        rather than be refused (and leave a denied row in the audit). Without a token the
        caller is an owner by uid, who may call anything; with one, `qledge.tools.list`
        says (asked once per connection)."""
        if self.token is None:
            return True
        if self._allowed is None:
            found = self.call("qledge.tools.list", {})
            tools = found.get("tools") if isinstance(found, dict) else None
            if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                      for t in tools):
                raise BadReply("qledge.tools.list: the daemon's reply is not a list of tools (is the daemon"
                               " another version?)")
            self._allowed = {t["name"] for t in tools}
        return tool in self._allowed

    def call(self, tool: str, args: Any = None) -> Any:
        """Call a tool with any encodable args; returns the result as plain values or raises CallFailed."""
        import msgspec

        result = self._result(tool, msgspec.msgpack.encode(args if args is not None else {}))
        return msgspec.msgpack.decode(result) if len(result) else None

    def typed(self, tool: str, args: msgspec.Struct, result: type[T]) -> T:
        """Call a tool with its argument Struct; returns its result decoded (and validated) as `result`.

        Raises CallFailed for a tool error, BadReply when the reply is not a `result`.
        """
        import msgspec

        return self.decoded(tool, self._result(tool, msgspec.msgpack.encode(args)), result)

    @staticmethod
    def decoded(tool: str, raw: bytes, result: type[T]) -> T:
        """The reply `raw` of `tool` decoded (and validated) as `result`; BadReply when it is not one."""
        import msgspec

        try:
            return decoder(result).decode(raw)
        except msgspec.DecodeError as exc:  # msgspec.ValidationError included
            raise BadReply(
                f"{tool}: the daemon's reply is not a {result.__name__} (is the daemon another version?):"
                f" {_one_line(str(exc))}"
            ) from None

    def raw(self, tool: str, args: dict[str, object] | None = None) -> bytes:
        """Call a tool with plain args (see `encode`), without loading msgspec: its result as
        the msgpack it came in, for `decode` (plain values) or `decoded` (a Struct)."""
        return self._result(tool, encode(args or {}))

    def _result(self, tool: str, args: bytes) -> bytes:
        """Send one request; the raw msgpack result of a successful call."""
        request_id = self._next_id
        self._next_id += 1
        request: dict[str, object] = {"id": request_id, "tool": tool, "args": Raw(args)}
        if self.token is not None:
            request["token"] = self.token
        body = encode(request)
        # The daemon would refuse it and hang up mid-send: say so before sending.
        if len(body) > self.max_frame_bytes:
            raise CallFailed("resource_exhausted",
                             f"request of {len(body)} bytes exceeds the {self.max_frame_bytes}-byte limit")
        try:
            # A daemon that refused the frame and hung up left its answer to read.
            try:  # noqa: SIM105 (contextlib.suppress: a module more to load, for one line)
                self._sock.sendall(len(body).to_bytes(HEADER_BYTES, "big") + body)
            except (BrokenPipeError, ConnectionResetError):
                pass
            ok, result, error = _response(self._read_frame())
        except (OSError, ValueError) as exc:
            raise Unreachable(f"lost the connection to the daemon at {self.path}: {exc}") from None
        if not ok:
            raise CallFailed(*(error or ("internal", "malformed error response")))
        return result

    def _read_frame(self) -> bytes:
        header = self._recv_exactly(HEADER_BYTES)
        return self._recv_exactly(int.from_bytes(header, "big"))

    def _recv_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            chunks += chunk
        return bytes(chunks)


# -- msgpack, the part the tool protocol uses (no extension types) -------------------------


class Raw:
    """Bytes that are msgpack already: written as they are (a request's `args`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def encode(value: object) -> bytes:
    """Plain values (None, bool, int, float, str, bytes, list, tuple, dict, Raw) as msgpack,
    in the forms msgspec writes them."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: object, out: bytearray, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError("value nests too deeply")
    if value is None:
        out.append(0xC0)
    elif value is True or value is False:
        out.append(0xC3 if value else 0xC2)
    elif isinstance(value, int):
        out += _int(value)
    elif isinstance(value, float):
        out += b"\xcb" + struct.pack(">d", value)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        out += _head(len(data), 0xA0, 32, b"\xd9", b"\xda", b"\xdb") + data
    elif isinstance(value, (bytes, bytearray)):
        out += _head(len(value), None, 0, b"\xc4", b"\xc5", b"\xc6") + value
    elif isinstance(value, Raw):
        out += value.data
    elif isinstance(value, (list, tuple)):
        out += _head(len(value), 0x90, 16, None, b"\xdc", b"\xdd")
        for item in value:
            _encode(item, out, depth + 1)
    elif isinstance(value, dict):
        out += _head(len(value), 0x80, 16, None, b"\xde", b"\xdf")
        for key, item in value.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    else:
        raise TypeError(f"cannot encode a {type(value).__name__}")


def _int(value: int) -> bytes:
    if -32 <= value < 128:
        return bytes((value & 0xFF,))
    for tag, fmt, low, high in ((0xCC, ">B", 0, 1 << 8), (0xCD, ">H", 0, 1 << 16), (0xCE, ">I", 0, 1 << 32),
                                (0xCF, ">Q", 0, 1 << 64), (0xD0, ">b", -(1 << 7), 0), (0xD1, ">h", -(1 << 15), 0),
                                (0xD2, ">i", -(1 << 31), 0), (0xD3, ">q", -(1 << 63), 0)):
        if low <= value < high:
            return bytes((tag,)) + struct.pack(fmt, value)
    raise ValueError("integer out of range")


def _head(n: int, fix: int | None, fix_limit: int, one: bytes | None, two: bytes, four: bytes) -> bytes:
    if fix is not None and n < fix_limit:
        return bytes((fix | n,))
    if one is not None and n < 1 << 8:
        return one + bytes((n,))
    return two + struct.pack(">H", n) if n < 1 << 16 else four + struct.pack(">I", n)


def decode(data: bytes) -> object:
    """The one msgpack value that is the whole of `data`; ValueError for anything else."""
    try:
        value, end = _decode(memoryview(data), 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError):
        raise ValueError("truncated or malformed msgpack") from None
    if end != len(data):
        raise ValueError("trailing bytes after the msgpack value")
    return value


def _response(data: bytes) -> tuple[bool, bytes, tuple[str, str] | None]:
    """A response frame's `ok`, its `result` as the msgpack it is, and its error's code and
    message; ValueError when it is not a response (tool_protocol.Response)."""
    value = decode_map(data, keep={"result"})
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        raise ValueError("the daemon's answer is not a response frame")
    error = value.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str):
        return value["ok"], b"", (error["code"], error["message"])
    if error is not None:
        raise ValueError("the daemon's answer carries an error of another shape")
    result = value.get("result", b"")
    return value["ok"], result if isinstance(result, bytes) else b"", None


def decode_map(data: bytes, keep: set[str]) -> object:
    """Like decode, but the values of the top-level keys in `keep` stay msgpack bytes."""
    try:
        buf = memoryview(data)
        tag = buf[0]
        if 0x80 <= tag < 0x90:
            n, pos = tag & 0x0F, 1
        elif tag == 0xDE:
            n, pos = int.from_bytes(buf[1:3], "big"), 3
        else:
            return decode(data)
        found: dict[object, object] = {}
        for _ in range(n):
            key, pos = _decode(buf, pos, 1)
            if key in keep:
                end = _skip(buf, pos, 1)
                found[key] = bytes(buf[pos:end])
                pos = end
            else:
                found[key], pos = _decode(buf, pos, 1)
    except (IndexError, struct.error, UnicodeDecodeError):
        raise ValueError("truncated or malformed msgpack") from None
    if pos != len(data):
        raise ValueError("trailing bytes after the msgpack value")
    return found


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_NUMBERS = {0xCA: (">f", 4), 0xCB: (">d", 8), 0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8),
            0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8)}
# tag: (bytes of the length, what follows)
_SIZED = {0xC4: (1, "bin"), 0xC5: (2, "bin"), 0xC6: (4, "bin"), 0xD9: (1, "str"), 0xDA: (2, "str"),
          0xDB: (4, "str"), 0xDC: (2, "array"), 0xDD: (4, "array"), 0xDE: (2, "map"), 0xDF: (4, "map")}


def _kind(buf: memoryview, pos: int) -> tuple[str, int, int]:
    """The value at `pos`: its kind (int, float, fixed, str, bin, array, map), its length or
    count (or the tag), and where its contents start."""
    tag = buf[pos]
    if tag < 0x80 or tag >= 0xE0:
        return "int", tag, pos + 1
    if tag < 0x90:
        return "map", tag & 0x0F, pos + 1
    if tag < 0xA0:
        return "array", tag & 0x0F, pos + 1
    if tag < 0xC0:
        return "str", tag & 0x1F, pos + 1
    if tag in _FIXED:
        return "fixed", tag, pos + 1
    if tag in _NUMBERS:
        return "number", tag, pos + 1
    if tag in _SIZED:
        size, kind = _SIZED[tag]
        return kind, int.from_bytes(buf[pos + 1 : pos + 1 + size], "big"), pos + 1 + size
    raise ValueError(f"unsupported msgpack type 0x{tag:02x}")


def _decode(buf: memoryview, pos: int, depth: int) -> tuple[object, int]:
    if depth > _MAX_DEPTH:
        raise ValueError("msgpack nests too deeply")
    kind, n, pos = _kind(buf, pos)
    if kind == "int":
        return (n if n < 0x80 else n - 0x100), pos
    if kind == "fixed":
        return _FIXED[n], pos
    if kind == "number":
        fmt, size = _NUMBERS[n]
        return struct.unpack(fmt, buf[pos : _past(buf, pos, size)])[0], pos + size
    if kind in ("str", "bin"):
        end = _past(buf, pos, n)
        return (str(buf[pos:end], "utf-8") if kind == "str" else bytes(buf[pos:end])), end
    if kind == "array":
        items = []
        for _ in range(n):
            item, pos = _decode(buf, pos, depth + 1)
            items.append(item)
        return items, pos
    found: dict[object, object] = {}
    for _ in range(n):
        key, pos = _decode(buf, pos, depth + 1)
        if isinstance(key, (list, dict)):
            raise ValueError("a map key that is a list or a map")
        found[key], pos = _decode(buf, pos, depth + 1)
    return found, pos


def _skip(buf: memoryview, pos: int, depth: int) -> int:
    """Where the value at `pos` ends."""
    if depth > _MAX_DEPTH:
        raise ValueError("msgpack nests too deeply")
    kind, n, pos = _kind(buf, pos)
    if kind in ("int", "fixed"):
        return pos
    if kind == "number":
        return _past(buf, pos, _NUMBERS[n][1])
    if kind in ("str", "bin"):
        return _past(buf, pos, n)
    for _ in range(n * 2 if kind == "map" else n):
        pos = _skip(buf, pos, depth + 1)
    return pos


def _past(buf: memoryview, pos: int, n: int) -> int:
    if pos + n > len(buf):
        raise IndexError
    return pos + n
