"""The cluster's connection to PostgreSQL: a small pool of psycopg 3 async connections,
one transaction per unit of work, and every driver error turned into `unavailable`.

The DSN goes to libpq untouched (so TLS and every other libpq option pass through) and is
never logged: `describe` gives the host and database name only. Each session gets timeouts
so that a node stopped mid-transaction (SIGSTOP, a partition) cannot hold a lock for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql as pgsql

from edge.core.errors import ToolError, unavailable

log = logging.getLogger("qledge.cluster")
T = TypeVar("T")
Row = tuple[Any, ...]

# Held by a stopped node's session for at most this long, then PostgreSQL ends it.
SESSION_SETTINGS = (
    ("lock_timeout", "3s"),
    ("statement_timeout", "15s"),
    ("idle_in_transaction_session_timeout", "5s"),
    ("timezone", "UTC"),
)
RETRY_PAUSE_S = (0.1, 0.25, 0.5, 1.0, 2.0)


def describe(dsn: str) -> str:
    """`host/dbname` of a DSN, without user or password, for status lines and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(unparsable DSN)"
    host = str(info.get("host") or "localhost")
    if host.startswith("/"):
        host = f"socket {host}"
    return f"{host}/{info.get('dbname') or info.get('user') or 'postgres'}"


class Tx:
    """One transaction on one connection: the only thing adapter code touches."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Row]) -> None:
        self.conn = conn

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self.conn.execute(query, params)
        return await cur.fetchall() if cur.description else []

    async def row(self, query: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self.conn.execute(query, params)
        return await cur.fetchone()

    async def one(self, query: str, params: Sequence[Any] = ()) -> Row:
        found = await self.row(query, params)
        if found is None:
            raise unavailable("storage returned no row where one was certain")
        return found

    async def execute(self, query: str, params: Sequence[Any] = ()) -> int:
        cur = await self.conn.execute(query, params)
        return cur.rowcount

    async def notify(self, payload: str) -> None:
        """A wake-up hint, delivered when (and only if) this transaction commits."""
        await self.conn.execute("SELECT pg_notify('qledge', %s)", (payload,))


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


class PgDatabase:
    """Up to `size` pooled connections. `tx` runs one function in one transaction; a
    connection that failed is dropped and a new one made on the next use."""

    def __init__(self, dsn: str, size: int = 4, connect_timeout_s: int = 5, application: str = "qledge") -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._application = application
        self._idle: list[psycopg.AsyncConnection[Row]] = []
        self._slots = asyncio.Semaphore(size)
        self._closed = False
        self.location = describe(dsn)
        self.down_since: float | None = None  # wall time of the first failure since the last success
        self.down_reason = ""
        self._pending: list[tuple[Callable[..., Awaitable[object]], tuple[Any, ...]]] = []
        self._ahead = asyncio.Lock()  # held while the pending work runs: later calls wait behind it

    def before_next(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run `fn(Tx, *args)` in a transaction of its own before any `tx` called from now on
        begins (calls already under way are not waited for); used when storage must change
        before anything else is written. A failure is logged, never raised."""
        self._pending.append((fn, args))

    async def connect(self, autocommit: bool = True) -> psycopg.AsyncConnection[Row]:
        conn = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=autocommit, connect_timeout=self._connect_timeout_s,
            application_name=self._application,
        )
        for name, value in SESSION_SETTINGS:
            await conn.execute(pgsql.SQL("SET {} = {}").format(pgsql.Identifier(name), pgsql.Literal(value)))
        return conn

    async def _acquire(self) -> psycopg.AsyncConnection[Row]:
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and not conn.broken:
                    return conn
            return await self.connect()
        except BaseException:
            self._slots.release()
            raise

    def _release(self, conn: psycopg.AsyncConnection[Row], keep: bool) -> None:
        self._slots.release()
        if keep and not self._closed and not conn.closed and not conn.broken:
            self._idle.append(conn)
        else:
            asyncio.get_running_loop().create_task(_close_quietly(conn))

    def _failed(self, exc: BaseException, what: str) -> None:
        if self.down_since is None:
            self.down_since = time.time()
            log.error("postgresql (%s) unavailable in %s: %s", self.location, what, type(exc).__name__)
        self.down_reason = type(exc).__name__

    async def tx(self, fn: Callable[..., Awaitable[T]], *args: Any, retry_s: float = 0.0) -> T:
        """Run `fn(Tx, *args)` in one transaction. Driver errors become `unavailable`; with
        `retry_s`, a lost connection is retried (a new connection, a new transaction) for
        that long: callers whose writes are compare-and-set can safely repeat them."""
        if self._pending or self._ahead.locked():
            await self._run_pending()
        deadline = time.monotonic() + retry_s
        attempt = 0
        while True:
            try:
                return await self._once(fn, args)
            except _Retry as again:
                if time.monotonic() >= deadline or self._closed:
                    raise unavailable() from again.__cause__
                await asyncio.sleep(RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)])
                attempt += 1

    async def _run_pending(self) -> None:
        async with self._ahead:
            while self._pending:
                fn, args = self._pending.pop(0)  # taken: never applied twice, even if cancelled now
                try:
                    await self._once(fn, args)
                except (ToolError, _Retry) as exc:
                    log.error("postgresql: %s did not run: %s", getattr(fn, "__qualname__", fn),
                              type(exc.__cause__ or exc).__name__)

    async def _once(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
        what = getattr(fn, "__qualname__", "a transaction")
        try:
            conn = await self._acquire()
        except (psycopg.Error, OSError) as exc:
            self._failed(exc, what)
            raise _Retry() from exc
        keep = False
        try:
            async with conn.transaction():
                result = await fn(Tx(conn), *args)
            keep = True
        except ToolError:
            keep = not conn.broken
            raise
        except psycopg.Error as exc:
            if _connection_lost(exc) or conn.broken:
                self._failed(exc, what)
                raise _Retry() from exc
            keep = not conn.broken
            log.error("postgresql error in %s: %s", what, type(exc).__name__)
            raise unavailable() from exc
        finally:
            self._release(conn, keep)
        if self.down_since is not None:
            log.info("postgresql (%s) reachable again", self.location)
            self.down_since = None
        return result

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)


class _Retry(Exception):
    """The connection failed: the transaction did not happen (or its outcome is unknown)."""


async def _close_quietly(conn: psycopg.AsyncConnection[Row]) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
