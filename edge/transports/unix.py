"""Unix-socket listening shared by the tool socket and MCP: a 0660 socket, the peer's uid
(SO_PEERCRED), stale-socket handling, the limits every connection lives under, and the
graceful stop every transport follows (stop accepting and reading, answer what is in
flight within a grace period, then cancel).

Anyone who can connect may be hostile, so before a single call is authenticated:
- a socket holds at most `max_connections`; the daemon as a whole holds no more than its
  descriptor limit allows after a reserve for runs (`Shared`). At the cap, the connection
  that has been silent longest and has not authenticated is closed to make room; when
  there is none, the newcomer gets an error and is closed;
- a frame or line, once started, must arrive whole within `frame_timeout_s`; a connection
  silent with nothing in flight is closed after `idle_timeout_s` (`session_idle_timeout_s`
  once a call on it has authenticated; 0: never);
- what connections hold of partially received frames beyond `FREE_BYTES` each is drawn
  from one budget shared by every connection (`Shared.partial_bytes`); a frame that does
  not fit is refused;
- every write waits for the peer to read (drain), within `frame_timeout_s`;
- the accept loop pauses, with one log line, when the process is out of descriptors.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable, Iterable
from typing import SupportsIndex, cast

import msgspec

from edge.core.handoff import wait_within

MAX_IN_FLIGHT = 16  # calls per connection; beyond it we stop reading (backpressure)
STOP_GRACE_S = 5.0  # on stop, how long calls in flight may take to be answered
FREE_BYTES = 16 * 1024  # of a partial frame or line, what a connection holds outside the shared budget
READ_CHUNK = 64 * 1024
STREAM_LIMIT = 16 * 1024  # the stream buffers at most about twice this before it stops reading the socket
CLOSE_WAIT_S = 1.0  # for the peer to take a last error; then the connection is cut
ACCEPT_PAUSE_S = 1.0
BACKLOG = 256  # connections the kernel queues for us; a burst beyond it is told EAGAIN
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_UCRED = struct.Struct("3i")  # pid, uid, gid

log = logging.getLogger("qledge.server")


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-socket connection limits (config `[connections]`)."""

    max_connections: int = 32
    frame_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    session_idle_timeout_s: float = 0.0  # 0: an authenticated connection may stay silent


class Shared:
    """What every listener of the daemon draws on together: the bytes of partially received
    frames beyond each connection's `FREE_BYTES`, and the number of open connections (kept
    below the descriptor limit, so runs and the database always get theirs)."""

    def __init__(self, partial_bytes: int = 4 << 20, max_connections: int = 1 << 16) -> None:
        self.partial_bytes = partial_bytes
        self.max_connections = max_connections
        self.held = 0
        self.connections = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.partial_bytes:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


def descriptor_allowance(reserve: int) -> int:
    """How many connections the process may hold: its soft RLIMIT_NOFILE, less what is open
    now, less `reserve` for runs (pipes, log files), log reads and the database."""
    soft = _open_files_limit()
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 16
    return max(1, soft - open_now - reserve)


def _open_files_limit() -> int:
    """The soft RLIMIT_NOFILE, from /proc (the `resource` module would stay loaded for one
    call); the usual 1024 when it cannot be read."""
    try:
        with open("/proc/self/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    return 1 << 20 if soft == "unlimited" else int(soft)
    except (OSError, ValueError, IndexError):
        pass
    return 1024


class Refused(Exception):
    """A limit ends the connection; the peer is told `code: message` in its protocol."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Input(asyncio.StreamReader):
    """A stream reader that can tell, once, that input arrived while nobody was reading
    (`Connection.on_input`)."""

    notify: Callable[[], None] | None = None

    @property
    def waiting(self) -> bool:
        """Bytes have arrived that no read has taken yet."""
        return bool(self._buffer)  # type: ignore[attr-defined]  # StreamReader's own buffer

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        super().feed_data(data)
        if self.notify is not None:
            notify, self.notify = self.notify, None
            notify()


class Connection:
    """One accepted connection: its streams, its state under the limits, budgeted reads and
    drained writes. Reads raise `Refused` when a limit ends the connection.

    `attached`: one end of a connection the daemon made for a child it started (an AI run's),
    not accepted from the socket. Its peer's uid is not believed (the daemon made both
    ends), it is never closed to make room nor for being silent (its run's own limits end
    it), and it does not count toward the socket's cap; the frame timeout, the shared
    budget and drained writes apply to it as to any other."""

    def __init__(
        self, listener: UnixListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        attached: bool = False,
    ) -> None:
        self._listener = listener
        self.attached = attached
        self.believe_uid = not attached  # SO_PEERCRED names the peer
        self._limits = listener.limits
        self._shared = listener.shared
        self.reader = reader
        self.writer = writer
        self._loop = asyncio.get_running_loop()
        self.opened = self.last_active = self._loop.time()
        self.in_flight = 0
        self.trusted = False  # a call on this connection has authenticated
        self._buffer = bytearray()
        self._charged = 0  # of the shared budget
        self._started = 0.0  # when the first byte of the pending frame or line arrived
        self._timeout: asyncio.Timeout | None = None

    # -- state --------------------------------------------------------------------

    @property
    def evictable(self) -> bool:
        """Nothing in flight and never authenticated: a peer that only holds a slot. (The
        newest connection is the last to go, so a client's request is read before its
        connection could be chosen.)"""
        return not self.trusted and not self.attached and self.in_flight == 0

    def call_started(self) -> None:
        self.in_flight += 1
        self._rearm()

    def call_finished(self, authenticated: bool) -> None:
        self.in_flight -= 1
        self.trusted = self.trusted or authenticated
        self.last_active = self._loop.time()
        self._rearm()

    def authenticated(self) -> None:
        self.trusted = True
        self._rearm()

    @property
    def input_waiting(self) -> bool:
        """Bytes have arrived that no request has taken yet (a pipelined request)."""
        return bool(self._buffer) or (isinstance(self.reader, _Input) and self.reader.waiting)

    def on_input(self, notify: Callable[[], None] | None) -> bool:
        """Call `notify` once, when input arrives while nothing reads it (None: no more).
        False when this connection's reader cannot tell."""
        if not isinstance(self.reader, _Input):
            return False
        self.reader.notify = notify
        return True

    def _deadline(self) -> float | None:
        if self._buffer:
            return self._started + self._limits.frame_timeout_s
        if self.in_flight or self.attached:
            return None
        idle = self._limits.session_idle_timeout_s if self.trusted else self._limits.idle_timeout_s
        return self.last_active + idle if idle > 0 else None

    def _unbounded(self) -> bool:
        """Waiting for the next request has no deadline, whatever finishes meanwhile: an
        attached connection, or one that may stay silent once (or before) it authenticated."""
        limits = self._limits
        return self.attached or (limits.session_idle_timeout_s <= 0 and (self.trusted or limits.idle_timeout_s <= 0))

    def _rearm(self) -> None:
        if self._timeout is not None and not self._timeout.expired():
            self._timeout.reschedule(self._deadline())

    # -- reading ------------------------------------------------------------------

    async def read_exactly(self, n: int) -> bytes | None:
        """The next `n` bytes; None at a clean end of input (nothing pending).
        Raises asyncio.IncompleteReadError when the input ends mid-way."""
        if not self._settle(max(n, len(self._buffer)) - FREE_BYTES):
            raise self._over_budget()
        while len(self._buffer) < n:
            if not await self._fill(min(READ_CHUNK, max(n - len(self._buffer), 4096))):
                if not self._buffer:
                    return None
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
        data = bytes(self._buffer[:n])
        self._consume(n)
        return data

    def take(self, n: int) -> bytes | None:
        """The next `n` bytes when they have all arrived already (a frame's body, which
        came with its header); None otherwise (then `read_exactly`)."""
        if len(self._buffer) < n:
            return None
        data = bytes(self._buffer[:n])
        self._consume(n)
        return data

    async def read_line(self, max_bytes: int) -> bytes | None:
        """The next line with its newline (the last one may lack it); None at a clean end.
        Raises Refused beyond `max_bytes`, or when the shared budget cannot hold it."""
        searched = 0
        while True:
            at = self._buffer.find(b"\n", searched)
            if at >= 0:
                if at + 1 > max_bytes:
                    raise Refused("resource_exhausted", f"message exceeds the {max_bytes}-byte line limit")
                data = bytes(self._buffer[: at + 1])
                self._consume(at + 1)
                return data
            searched = len(self._buffer)
            if searched > max_bytes:
                raise Refused("resource_exhausted", f"message exceeds the {max_bytes}-byte line limit")
            if not await self._fill(FREE_BYTES):
                if not self._buffer:
                    return None
                data = bytes(self._buffer)
                self._consume(len(data))
                return data
            if not self._settle(len(self._buffer) - FREE_BYTES):
                raise self._over_budget()

    async def _fill(self, size: int) -> bool:
        """Read more into the buffer under the deadline that applies; False at end of input."""
        deadline = self._deadline()
        if deadline is None and not self._buffer and self._unbounded():
            chunk = await self.reader.read(size)  # no deadline can come up meanwhile: no timer to keep
        else:
            try:
                async with asyncio.timeout_at(deadline) as self._timeout:
                    chunk = await self.reader.read(size)
            except TimeoutError:
                raise self._expired() from None
            finally:
                self._timeout = None
        if not chunk:
            return False
        if not self._buffer:
            self._started = self._loop.time()
        self.last_active = self._loop.time()
        self._buffer += chunk
        return True

    def _expired(self) -> Refused:
        if self._buffer:
            return Refused("deadline_exceeded",
                           f"a request must arrive whole within {self._limits.frame_timeout_s:g}s; closing")
        idle = self._limits.session_idle_timeout_s if self.trusted else self._limits.idle_timeout_s
        return Refused("deadline_exceeded", f"idle for {idle:g}s; closing")

    def _over_budget(self) -> Refused:
        return Refused("resource_exhausted",
                       "the daemon holds too many partly received requests; try again shortly")

    def _settle(self, target: int) -> bool:
        """Hold `target` bytes of the shared budget (at least 0): giving back always
        works; taking more fails when the budget cannot spare it."""
        if target <= 0 and not self._charged:
            return True  # the usual case: a frame within what a connection holds for free
        target = max(0, target)
        if target > self._charged:
            if not self._shared.take(target - self._charged):
                return False
        else:
            self._shared.give(self._charged - target)
        self._charged = target
        return True

    def _consume(self, n: int) -> None:
        del self._buffer[:n]
        if self._buffer:
            self._started = self._loop.time()  # what follows is the start of the next request
        # Pipelined requests still waiting are paid for as far as the budget allows; they
        # are already here, and what cannot be paid is at most one read's worth.
        if not self._settle(len(self._buffer) - FREE_BYTES):
            self._settle(0)

    def release(self) -> None:
        """Give back what this connection holds of the shared budget."""
        self._settle(0)

    def discard(self) -> None:
        """The connection has ended: drop what it buffered, and the traceback of the error
        that ended it, which asyncio keeps on the reader (a cycle through the transport that
        would hold everything here until the cycle collector runs)."""
        self.release()
        self._buffer = bytearray()
        error: BaseException | None = self.reader.exception()
        while error is not None:
            error.__traceback__ = None
            error = error.__context__

    # -- writing ------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write and wait until the peer has taken enough of it (raises ConnectionError
        when it is gone, or does not read within `frame_timeout_s`)."""
        if self.writer.is_closing():
            raise ConnectionResetError("the connection is closing")
        self.writer.write(data)
        if not self.writer.transport.get_write_buffer_size():
            return  # all of it went to the kernel: nothing to wait for, no timer to set
        try:
            async with asyncio.timeout(self._limits.frame_timeout_s):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()
            raise ConnectionResetError("the peer does not read its answers") from None

    def say_and_close(self, data: bytes) -> None:
        """A last error for the peer, then the connection ends (cut if it will not read)."""
        transport = self.writer.transport
        if transport.is_closing():
            return
        with contextlib.suppress(Exception):
            transport.write(data)
        _stop_reading(self.reader, self.writer)
        transport.close()
        self._loop.call_later(CLOSE_WAIT_S, transport.abort)


class UnixListener(abc.ABC):
    """A 0660 Unix-socket listener under `Limits` and `Shared`, tracking its connections so
    `stop` can end them."""

    def __init__(self, path: str, limits: Limits | None = None, shared: Shared | None = None) -> None:
        self.path = path
        self.limits = limits or Limits()
        self.shared = shared or Shared()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._attached = 0  # of the connections, those the daemon made (`adopt`)
        self._adopting: set[asyncio.Task[None]] = set()

    def adopt(self, sock: socket.socket) -> None:
        """Serve `sock`, one end of a connection the daemon made for a child it started, as
        an attached connection (Connection.attached)."""
        task = asyncio.get_running_loop().create_task(self._connect(sock, attached=True), name="adopt")
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def start(self) -> None:
        remove_stale_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)  # socket is created 0660
        try:
            sock.bind(self.path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        os.chmod(self.path, 0o660)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept_loop(sock), name=f"accept {self.path}")

    async def stop(self, grace_s: float = STOP_GRACE_S, forced: asyncio.Event | None = None) -> None:
        """Stop accepting and reading; let every connection answer the calls it has in
        flight within `grace_s` (or until `forced` is set), then cancel what is left."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        for adopting in list(self._adopting):
            adopting.cancel()
        if self._sock is not None:
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for conn in list(self._connections.values()):
            _stop_reading(conn.reader, conn.writer)
        await wait_within(list(self._connections), grace_s, forced or asyncio.Event())
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        paused = False
        while True:
            try:
                client, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    continue  # e.g. the peer gave up before we accepted it
                if not paused:  # one line per episode, not one per attempt
                    log.warning("%s: cannot accept connections (%s); pausing", self.path, exc.strerror)
                paused = True
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            if paused:
                log.warning("%s: accepting connections again", self.path)
                paused = False
            await self._admit(client)

    async def _admit(self, client: socket.socket) -> None:
        if len(self._connections) - self._attached >= self.limits.max_connections or (
                self.shared.connections >= self.shared.max_connections):
            victim = self._evictable()
            if victim is None:
                with contextlib.suppress(OSError):
                    client.setblocking(False)
                    client.send(self._refusal("resource_exhausted", "too many connections; try again shortly"))
                client.close()
                return
            victim.say_and_close(self._refusal(
                "resource_exhausted", "too many connections: closing the one idle the longest"))
        await self._connect(client)

    async def _connect(self, client: socket.socket, attached: bool = False) -> None:
        loop = asyncio.get_running_loop()
        reader = _Input(limit=STREAM_LIMIT)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, client)
        except OSError:
            client.close()
            return
        except asyncio.CancelledError:  # stopping while a child's connection was being adopted
            client.close()
            raise
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        conn = Connection(self, reader, writer, attached)
        self.shared.connections += 1
        self._attached += attached
        task = asyncio.create_task(self._track(conn))
        self._connections[task] = conn

    def _evictable(self) -> Connection | None:
        candidates = [c for c in self._connections.values() if c.evictable and not c.writer.transport.is_closing()]
        return min(candidates, key=lambda c: c.last_active, default=None)

    async def _track(self, conn: Connection) -> None:
        try:
            await self._serve_connection(conn)
        finally:
            conn.release()
            self.shared.connections -= 1
            self._attached -= conn.attached
            task = asyncio.current_task()
            if task is not None:
                self._connections.pop(task, None)
            await _close(conn.writer)
            conn.discard()

    @abc.abstractmethod
    async def _serve_connection(self, conn: Connection) -> None:
        """Serve one connection until its input ends, answering what it asked before that."""

    @abc.abstractmethod
    def _refusal(self, code: str, message: str) -> bytes:
        """An error in this socket's protocol, for a peer whose connection a limit ends."""


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()
    except TimeoutError:
        writer.transport.abort()  # the peer does not take what is left: cut it
    except Exception:  # noqa: S110 - already gone: nothing left to close
        pass


def _stop_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Make the connection's reader see the end of input now; what it already buffered is still read."""
    transport = cast(asyncio.Transport, writer.transport)  # a stream's transport reads as well as writes
    if not transport.is_closing():
        transport.pause_reading()  # nothing more arrives, so nothing is fed after the EOF
    if not reader.at_eof():
        reader.feed_eof()


def remove_stale_socket(path: str) -> None:
    """A socket file left by a crashed daemon is removed; anything else is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RuntimeError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listening: stale
        return
    finally:
        probe.close()
    raise RuntimeError(f"another qledge daemon is already listening on {path}")


def peer_uid(sock: socket.socket | None) -> int | None:
    """The uid of the process at the other end (Linux SO_PEERCRED)."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return uid
