"""`qledge mcp`: a stdio ⇄ MCP-socket pump for AI clients (often run as `ssh router qledge mcp`).

It presents the credential once, as the first line on the socket (`{"qledge": {"token": …}}`),
consumes the daemon's answer, then copies bytes both ways, each direction on its own (one
poll loop, bounded buffers): the daemon's answers are read while requests are still being
written, so a client that pipelines thousands of requests never stalls either side. Only
whole lines reach stdout; a connection the daemon cuts mid-line, or while input is still
coming, ends the bridge with one line on stderr and a non-zero exit. The daemon parses MCP
and re-authenticates every call. Kept to the standard library's smallest parts (no argparse,
msgspec, asyncio, typing or json on the way in, nor the tool layer) so the bridge stays near the
bare interpreter's RSS: stdout carries only what the daemon sends, every problem is one line on
stderr.
"""

from __future__ import annotations

import _socket  # socket.py drags in enum, selectors and collections (+1.1 MiB) for nothing used here
import os
import select
import stat
import sys

from edge import default_home, home_socket
from edge.cli.shared import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, Verb, report
from edge.cli.shared import EXIT_TOOL as EXIT_REFUSED

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
USAGE = "usage: qledge mcp [--token-file FILE] [--home DIR] [--socket PATH] [--mcp-socket PATH] [--config FILE]"
HELP = f"""{USAGE}

bridge stdio to the daemon's MCP socket, for AI clients (the daemon needs [mcp] enabled = true)

options:
  --token-file FILE  read the API token from FILE (else $QLEDGE_TOKEN; none: your uid, for owners)
  --home DIR         the daemon's state directory ($QLEDGE_HOME)
  --socket PATH      the daemon's tool socket ($QLEDGE_SOCKET)
  --mcp-socket PATH  the MCP socket (default <home>/mcp.sock)
  --config FILE      take home and sockets from the daemon's config file ($QLEDGE_CONFIG)"""
_VALUED = ("--home", "--socket", "--mcp-socket", "--token-file", "--config")
_CHUNK = 1 << 16
_HELLO_TIMEOUT_S = 10.0
_DRAIN_MS = 30_000  # after stdin ends, how long answers to what was already sent may take
_BUFFERED = 1 << 20  # bytes held each way before the bridge stops reading that side
_LINE_MAX = 8 << 20  # an answer line longer than this is not one of the daemon's
_PIPE_BUF = 4096  # a write this small to a pipe that poll says is writable never blocks
_CUT = "the daemon cut the connection in the middle of an answer"
_ACCEPTED = b'{"qledge":{"ok":true}}'


class _Fail(Exception):
    """One line, `qledge: <code>: <message>`, as every qledge command says what went wrong."""

    def __init__(self, message: str, exit_code: int, code: str = "unavailable") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code


def main(argv: list[str]) -> int | None:
    """Run the bridge when the verb is `mcp`; None means `argv` is some other command."""
    try:
        options = _parse(argv)
        if options is None:
            return None
        if "help" in options:
            print(HELP)
            return EXIT_OK
        return _bridge(options)
    except _Fail as exc:
        report(exc.code, str(exc), as_json=False)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _parse(argv: list[str]) -> dict[str, str] | None:
    if _verb(argv) != "mcp":
        return None
    options: dict[str, str] = {}
    tokens = iter(argv)
    for token in tokens:
        name, eq, value = token.partition("=")
        if token in ("-h", "--help"):
            options["help"] = ""
        elif name in _VALUED:
            if not eq:
                value = next(tokens, "")
            if not value:
                raise _Fail(f"{name} needs a value ({USAGE})", EXIT_USAGE, "invalid_argument")
            options[name[2:]] = value
        elif token not in ("mcp", "--json"):  # --json: a global CLI flag, meaningless here
            raise _Fail(f"unexpected argument {token!r} ({USAGE})", EXIT_USAGE, "invalid_argument")
    return options


def _verb(argv: list[str]) -> str | None:
    """The first word that is neither an option nor an option's value."""
    tokens = iter(argv)
    for token in tokens:
        if token in _VALUED:
            next(tokens, None)
        elif not token.startswith("-"):
            return token
    return None


def _token(options: dict[str, str]) -> str | None:
    path = options.get("token-file")
    if path is None:
        return os.environ.get("QLEDGE_TOKEN") or None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError) as exc:
        raise _Fail(f"cannot read token file {path}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE,
                    "invalid_argument") from None


def _configured(path: str) -> tuple[str | None, str | None, str | None]:
    """home, socket and [mcp] socket from the daemon's config file (tomllib: only with one)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise _Fail(f"cannot read config {path}: {exc.strerror}", EXIT_USAGE, "invalid_argument") from None
    except tomllib.TOMLDecodeError as exc:
        raise _Fail(f"config {path} is not valid TOML: {exc}", EXIT_USAGE, "invalid_argument") from None
    section = data.get("mcp")
    mcp = section if isinstance(section, dict) else {}

    def text(value: object) -> str | None:
        return value if isinstance(value, str) else None

    return text(data.get("home")), text(data.get("socket")), text(mcp.get("socket"))


def _bridge(options: dict[str, str]) -> int:
    token = _token(options)
    home = options.get("home")
    config = options.get("config") or os.environ.get("QLEDGE_CONFIG")
    tool_socket = options.get("socket") or os.environ.get("QLEDGE_SOCKET")
    path = options.get("mcp-socket")
    if config:  # as the daemon resolves them: flags and environment first, then the file
        c_home, c_socket, c_mcp = _configured(config)
        home = os.path.abspath(home or os.environ.get("QLEDGE_HOME") or c_home or default_home())
        tool_socket = tool_socket or c_socket or os.path.join(home, "qledge.sock")
        path = path or c_mcp or os.path.join(home, "mcp.sock")
    tool_socket = tool_socket or home_socket("qledge.sock", home)
    path = path or home_socket("mcp.sock", home)
    sock = _connect(path, tool_socket)
    try:
        pending = _hello(sock, path, token)
        return _pump(sock, pending)
    finally:
        sock.close()


def _connect(path: str, tool_socket: str) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(_HELLO_TIMEOUT_S)
    try:
        sock.connect(path)
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        if _listening(tool_socket):
            raise _Fail("MCP is not enabled on this daemon (set [mcp] enabled = true)", EXIT_UNREACHABLE) from None
        raise _Fail(f"daemon not running at {tool_socket}", EXIT_UNREACHABLE) from None
    except OSError as exc:
        sock.close()
        raise _Fail(f"cannot connect to {path}: {(exc.strerror or str(exc)).lower()}", EXIT_UNREACHABLE) from None


def _listening(path: str) -> bool:
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _hello(sock: _socket.socket, path: str, token: str | None) -> bytes:
    """Present the credential; returns whatever arrived after the daemon's answer line."""
    try:
        sock.sendall(b'{"qledge":{"token":%s}}\n' % _json_string(token))
        buffered = b""
        while b"\n" not in buffered and len(buffered) < _CHUNK:
            chunk = sock.recv(_CHUNK)
            if not chunk:
                break
            buffered += chunk
    except TimeoutError:
        raise _Fail(f"no answer from the daemon at {path}", EXIT_UNREACHABLE) from None
    except OSError as exc:
        raise _Fail(f"lost the connection to {path}: {exc.strerror or exc}", EXIT_UNREACHABLE) from None
    answer, _, rest = buffered.partition(b"\n")
    if answer != _ACCEPTED:
        _refused(answer, path)
    return rest


def _json_string(token: str | None) -> bytes:
    if token is None:
        return b"null"
    if token.isascii() and token.isprintable() and '"' not in token and "\\" not in token:
        return b'"%s"' % token.encode()
    import json  # only for a token no qledge token looks like: the daemon will say what is wrong

    return json.dumps(token).encode()


def _refused(answer: bytes, path: str) -> None:
    import json  # the rare path: worth its 1 MiB only here

    try:
        reply = json.loads(answer)["qledge"]
    except (ValueError, KeyError, TypeError):
        raise _Fail(f"the daemon at {path} did not accept the session", EXIT_REFUSED, "internal") from None
    if reply.get("ok") is not True:
        raise _Fail(str(reply.get("message", "refused")), EXIT_REFUSED, str(reply.get("code", "unauthenticated")))


class _Pump:
    """stdin → socket and socket → stdout, each as far as its buffer and its peer allow."""

    def __init__(self, sock: _socket.socket, pending: bytes) -> None:
        self.sock = sock
        self.stdin, self.stdout = sys.stdin.fileno(), sys.stdout.fileno()
        # A regular file takes any write at once; a pipe, a socket or a terminal may not.
        self.piece = 1 << 30 if stat.S_ISREG(os.fstat(self.stdout).st_mode) else _PIPE_BUF
        self.up = bytearray()  # from stdin, not yet sent to the daemon
        self.down = bytearray(pending)  # from the daemon, not yet on stdout
        self.reading = True  # stdin has not ended
        self.open = True  # the daemon has not closed its side
        self.shut = False  # the daemon has been told that input ended
        self.unsent = False  # the daemon's side ended before it took every request
        self.poller = select.poll()
        self.masks: dict[int, int] = {}

    def run(self) -> int:
        while True:
            whole = self.down.rfind(b"\n") + 1  # only whole lines are written
            if not self.open and not whole:
                if self.down:
                    raise _Fail(_CUT, EXIT_REFUSED)
                if self.reading or self.unsent:
                    raise _Fail("the daemon closed the connection", EXIT_REFUSED)
                return EXIT_OK
            if not self.reading and not self.up and not self.shut and self.open:
                self.sock.shutdown(_socket.SHUT_WR)  # it answers what is in flight, then closes
                self.shut = True
            self._want(self.stdin, select.POLLIN if self.reading and len(self.up) < _BUFFERED else 0)
            self._want(self.sock.fileno(), (select.POLLIN if self.open and whole < _BUFFERED else 0)
                       | (select.POLLOUT if self.up and self.open else 0))
            self._want(self.stdout, select.POLLOUT if whole else 0)
            waiting = not self.reading and not self.up and not whole
            events = self.poller.poll(_DRAIN_MS if waiting else None)
            if not events:  # stdin ended and the daemon has said nothing more for a long while
                if self.down:
                    raise _Fail(_CUT, EXIT_REFUSED)
                return EXIT_OK
            for fd, event in events:
                if fd == self.stdout:
                    if not event & select.POLLOUT:
                        return EXIT_OK  # the client went away
                    try:
                        with memoryview(self.down) as view:
                            written = os.write(self.stdout, view[:min(whole, self.piece)])
                    except (BrokenPipeError, ConnectionResetError):
                        return EXIT_OK  # the client went away
                    del self.down[:written]
                    whole -= written
                elif fd == self.stdin:
                    data = os.read(self.stdin, _CHUNK)
                    if data:
                        self.up += data
                    else:
                        self.reading = False
                else:
                    self._socket(event)

    def _socket(self, event: int) -> None:
        if event & select.POLLOUT and self.up:
            try:
                del self.up[:self.sock.send(self.up)]
            except BlockingIOError:
                pass
            except ConnectionError:
                return self._closed()
        if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
            try:
                data = self.sock.recv(_CHUNK)
            except BlockingIOError:
                return
            except ConnectionError:
                data = b""  # reset: what arrived whole is still written, then the cut is reported
            if not data:
                return self._closed()
            self.down += data
            if len(self.down) - (self.down.rfind(b"\n") + 1) > _LINE_MAX:
                raise _Fail(f"an answer from the daemon is longer than {_LINE_MAX >> 20} MiB", EXIT_REFUSED,
                            "internal")

    def _closed(self) -> None:
        """The daemon's side ended: what it sent whole is still written, then the bridge
        says how it ended."""
        self.open = False
        self.unsent = bool(self.up)  # requests it never took
        self.up.clear()

    def _want(self, fd: int, mask: int) -> None:
        had = self.masks.get(fd, 0)
        if mask == had:
            return
        if not mask:
            self.poller.unregister(fd)
            del self.masks[fd]
            return
        if had:
            self.poller.modify(fd, mask)
        else:
            self.poller.register(fd, mask)
        self.masks[fd] = mask


def _pump(sock: _socket.socket, pending: bytes) -> int:
    sock.setblocking(False)
    try:
        return _Pump(sock, pending).run()
    except ConnectionError as exc:
        raise _Fail(f"lost the connection to the daemon: {exc.strerror or exc}", EXIT_REFUSED) from None
    except OSError as exc:  # stdin or stdout failed under us
        raise _Fail(f"i/o error: {exc.strerror or exc}", EXIT_REFUSED) from None


def _options(p: argparse.ArgumentParser) -> None:
    """What `qledge --help` and the tests' full parser say of `qledge mcp`; the bridge parses
    its own command line (above), so argparse never runs for it."""
    p.add_argument("--token-file", metavar="FILE", help="read the API token from FILE ($QLEDGE_TOKEN)")
    p.add_argument("--mcp-socket", metavar="PATH", help="MCP socket (default <home>/mcp.sock)")


VERBS = {"mcp": Verb("mcp", None, options=_options)}
