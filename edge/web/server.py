"""The panel's listener: accept, a thread per connection, and the bounds that keep a slow or
hostile browser from growing the process.

At most `max_connections` connections at once (and `per_address` from one client address);
one more is answered 503 and closed at once. Each connection reads bounded requests under
deadlines (edge.web.http) and writes under a timeout; live logs are capped by the panel
(edge.web.panel.MAX_FOLLOWERS). Threads have small stacks: the handlers never recurse deeply.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

from edge.web import http

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

    from edge.web.panel import Panel

MAX_CONNECTIONS = 32
PER_ADDRESS = 16  # a browser opens about six, plus its live logs
MAX_REQUESTS = 1000  # per connection
STACK_BYTES = 512 * 1024
_BUSY = http.response(503, [("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "2")],
                      b"too many connections; try again shortly\n", keep_alive=False)


class Listener:
    def __init__(self, panel: Panel, sock: socket.socket, tls: ssl.SSLContext | None = None,
                 max_connections: int = MAX_CONNECTIONS, per_address: int = PER_ADDRESS) -> None:
        self.panel = panel
        self.sock = sock
        self.tls = tls
        self.max_connections = max_connections
        self.per_address = per_address
        self._open: dict[str, int] = {}
        self._count = 0
        self._lock = threading.Lock()
        threading.stack_size(STACK_BYTES)

    @property
    def connections(self) -> int:
        return self._count

    def serve_forever(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except InterruptedError:
                continue
            except OSError as exc:  # EMFILE and the like: the listener stays, this peer waits
                say(f"accept failed: {exc.strerror or exc}")
                threading.Event().wait(0.1)
                continue
            address = str(peer[0]) if isinstance(peer, tuple) else "local"
            with self._lock:
                admitted = self._count < self.max_connections and self._open.get(address, 0) < self.per_address
                if admitted:
                    self._count += 1
                    self._open[address] = self._open.get(address, 0) + 1
            if not admitted:
                _refuse(conn)
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, address), daemon=True).start()
            except RuntimeError:  # no thread could be made: as if the cap were reached
                self._done(address)
                _refuse(conn)

    def _done(self, address: str) -> None:
        with self._lock:
            self._count -= 1
            left = self._open.get(address, 1) - 1
            if left:
                self._open[address] = left
            else:
                self._open.pop(address, None)

    def _serve(self, conn: socket.socket, address: str) -> None:
        try:
            if self.tls is not None:
                conn.settimeout(http.HEAD_TIMEOUT_S)
                conn = self.tls.wrap_socket(conn, server_side=True)
            self._requests(conn, address)
        except (OSError, ValueError):
            pass  # the peer went away, or spoke no TLS
        except Exception:
            import traceback

            say(f"unexpected failure serving {address}:\n{traceback.format_exc()}")
        finally:
            try:
                conn.close()
            finally:
                self._done(address)

    def _requests(self, conn: socket.socket, address: str) -> None:
        reader = http.Reader(conn, address)
        for n in range(MAX_REQUESTS):
            try:
                request = reader.next(first=n == 0)
            except http.BadRequest as bad:
                conn.settimeout(http.WRITE_TIMEOUT_S)
                headers = [*self.panel.headers, ("Content-Type", "text/plain; charset=utf-8")]
                conn.sendall(http.response(bad.status, headers, bad.message.encode() + b"\n", keep_alive=False))
                return
            if request is None:
                return
            if n == MAX_REQUESTS - 1:
                request.keep_alive = False
            answer = self.panel.handle(request, conn)
            if answer is None:  # streamed; the stream's end is the connection's
                return
            conn.settimeout(http.WRITE_TIMEOUT_S)
            conn.sendall(answer)
            if not request.keep_alive:
                return


def say(line: str) -> None:
    """One line on stderr (the service's log): the panel imports no logging for its few lines."""
    try:
        sys.stderr.write(f"qledge web: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _refuse(conn: socket.socket) -> None:
    """Answer 503 without waiting for anything: what the peer sent so far is read and dropped
    (closing on unread bytes would reset the connection before the answer is read)."""
    try:
        conn.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            conn.recv(65536)
        conn.send(_BUSY)  # whatever fits in the socket buffer at once
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()
