"""Sessions and the login rate limit, in memory only.

A session holds the user's API token behind a random id (the cookie) and a second random
value, the CSRF token every state-changing request must carry. The token itself is never
sent back to the browser, written to a log or put in a URL. A session ends at logout, after
`idle_s` without a request, after `max_s` whatever happens, and with the process.

Both tables are bounded: a full session table drops its least recently used session; the
rate limit keeps at most `MAX_ADDRESSES` addresses, forgetting the oldest first.
"""

from __future__ import annotations

import os
import threading
import time
from _operator import _compare_digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

IDLE_S = 30 * 60
MAX_S = 12 * 3600
MAX_SESSIONS = 64
LOGIN_FAILURES = 5  # failed logins per address within LOGIN_WINDOW_S before it must wait
LOGIN_WINDOW_S = 300.0
MAX_ADDRESSES = 1024


def random_id() -> str:
    """256 bits from the kernel, as 64 hex digits."""
    return os.urandom(32).hex()


def same(a: str, b: str) -> bool:
    """Constant-time equality of two ASCII strings (a CSRF token against the session's)."""
    try:
        return _compare_digest(a.encode("ascii"), b.encode("ascii"))
    except UnicodeEncodeError:
        return False


class Session:
    __slots__ = ("id", "token", "csrf", "created", "seen", "tools", "role", "followers")

    def __init__(self, token: str, tools: frozenset[str], role: str, now: float) -> None:
        self.id = random_id()
        self.token = token
        self.csrf = random_id()
        self.created = now
        self.seen = now
        self.tools = tools  # what this user may call (qledge.tools.list at login)
        self.role = role
        self.followers = 0  # live logs this session has open

    def __repr__(self) -> str:  # never the token, nor the ids
        return f"Session(role={self.role!r})"


class Sessions:
    def __init__(self, clock: Callable[[], float] = time.monotonic, idle_s: float = IDLE_S, max_s: float = MAX_S,
                 limit: int = MAX_SESSIONS) -> None:
        self._clock = clock
        self.idle_s = idle_s
        self.max_s = max_s
        self._limit = limit
        self._by_id: dict[str, Session] = {}  # in order of last use, oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self, token: str, tools: frozenset[str], role: str) -> Session:
        with self._lock:
            self._expire()
            while len(self._by_id) >= self._limit:
                del self._by_id[next(iter(self._by_id))]
            session = Session(token, tools, role, self._clock())
            self._by_id[session.id] = session
            return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, its idle time restarted; None: no such session,
        or it has expired (and is gone now)."""
        if not session_id:
            return None
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            now = self._clock()
            if not self._alive(session, now):
                del self._by_id[session_id]
                return None
            session.seen = now
            self._by_id[session_id] = self._by_id.pop(session_id)  # most recently used last
            return session

    def alive(self, session: Session) -> bool:
        """Whether `session` is still live, without counting this as use (a live log's check)."""
        with self._lock:
            return self._by_id.get(session.id) is session and self._alive(session, self._clock())

    def end(self, session: Session) -> None:
        with self._lock:
            if self._by_id.get(session.id) is session:
                del self._by_id[session.id]

    def _alive(self, session: Session, now: float) -> bool:
        return now - session.seen < self.idle_s and now - session.created < self.max_s

    def _expire(self) -> None:
        now = self._clock()
        for sid in [sid for sid, s in self._by_id.items() if not self._alive(s, now)]:
            del self._by_id[sid]


class LoginLimit:
    """At most `failures` failed logins per client address within `window_s`; then that
    address waits until its oldest failure in the window is `window_s` old."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, failures: int = LOGIN_FAILURES,
                 window_s: float = LOGIN_WINDOW_S, addresses: int = MAX_ADDRESSES) -> None:
        self._clock = clock
        self._failures = failures
        self._window_s = window_s
        self._addresses = addresses
        self._seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def wait_s(self, address: str) -> float:
        """How long `address` must wait before it may try again (0: it may now)."""
        with self._lock:
            times = self._recent(address)
            if len(times) < self._failures:
                return 0.0
            return max(0.0, times[0] + self._window_s - self._clock())

    def failed(self, address: str) -> None:
        with self._lock:
            times = self._recent(address)
            times.append(self._clock())
            del times[: -self._failures]
            self._seen[address] = times
            while len(self._seen) > self._addresses:
                del self._seen[next(iter(self._seen))]

    def _recent(self, address: str) -> list[float]:
        cutoff = self._clock() - self._window_s
        times = [t for t in self._seen.pop(address, ()) if t > cutoff]
        if times:
            self._seen[address] = times  # most recent address last
        return times
