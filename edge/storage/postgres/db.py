"""The cluster's connection to PostgreSQL: the storage rules run as transactions on psycopg
3's blocking connections, one worker thread per connection of a small pool; every driver
error becomes `unavailable`. (The hint listener has an asyncio connection of its own,
`connect`: it waits for notifications on the event loop.)

The DSN goes to libpq untouched (so TLS and every other libpq option pass through) and is
never logged: `describe` gives the host and database name only. Each session gets timeouts
so that a node stopped mid-transaction (SIGSTOP, a partition) cannot hold a lock for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql as pgsql

from edge.core.errors import ToolError, unavailable
from edge.storage.tx import Params, Row

log = logging.getLogger("qledge.cluster")
T = TypeVar("T")

# Held by a stopped node's session for at most this long, then PostgreSQL ends it.
SESSION_SETTINGS = (
    ("lock_timeout", "3s"),
    ("statement_timeout", "15s"),
    ("idle_in_transaction_session_timeout", "5s"),
    ("timezone", "UTC"),
)
RETRY_PAUSE_S = (0.1, 0.25, 0.5, 1.0, 2.0)
CLOSE_WAIT_S = 5.0  # at close, how long the workers get to end their transactions


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


class PgTx:
    """edge.storage.tx.Tx on one connection, in its worker thread."""

    __slots__ = ("conn", "after")

    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self.conn = conn
        self.after: list[Callable[[], None]] = []

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def each(self, sql: str, params: Params = ()) -> list[Row]:
        return self.rows(sql, params)

    def row(self, sql: str, params: Params = ()) -> Row | None:
        return self.conn.execute(sql, params).fetchone()

    def one(self, sql: str, params: Params = ()) -> Row:
        found = self.row(sql, params)
        if found is None:
            raise unavailable("storage returned no row where one was certain")
        return found

    def execute(self, sql: str, params: Params = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    def lock(self, key: int) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def hint(self, topic: str) -> None:
        self.conn.execute("SELECT pg_notify('qledge', %s)", (topic,))

    def after_commit(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)


class Carry:
    """A rule that rides at the head of the next transaction its context (the call that
    armed it, and the tasks it starts) asks the pool for, so that it costs no transaction
    of its own: an audited call's row, committed with the call's first storage work or not
    at all. When that transaction does not commit, or no transaction takes it in time,
    `fallback` writes it (in a transaction of its own, or wherever its owner puts it)."""

    __slots__ = ("fn", "args", "fallback", "state")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...],
                 fallback: Callable[[], Awaitable[object]]) -> None:
        self.fn, self.args, self.fallback = fn, args, fallback
        self.state = "armed"  # then taken (by a transaction, or by its fallback), then written or dropped

    def take(self) -> bool:
        if self.state != "armed":
            return False
        self.state = "taken"
        return True


_carried: contextvars.ContextVar[Carry | None] = contextvars.ContextVar("qledge_pg_carry", default=None)


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


class _Retry(Exception):
    """The connection failed: the transaction did not happen (or its outcome is unknown)."""


class _Job:
    """One transaction for a worker. `state`: waiting, taken (a worker runs it) or dropped
    (its caller went away before any worker took it: it never runs)."""

    __slots__ = ("fn", "args", "write", "loop", "future", "state", "carry")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...], write: bool,
                 loop: asyncio.AbstractEventLoop, carry: Carry | None = None) -> None:
        self.fn, self.args, self.write, self.loop, self.carry = fn, args, write, loop, carry
        self.future: asyncio.Future[tuple[object, list[Callable[[], None]]]] = loop.create_future()
        self.state = "waiting"


def _deliver(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class PgDatabase:
    """Up to `size` connections, each in its worker thread. `read` and `write` run one rule
    in one transaction; a connection that failed is dropped and a new one made on the next
    use. A call cancelled before a worker took its transaction leaves it undone; once
    taken, it runs to its end (as on SQLite: what was committed stays committed)."""

    def __init__(self, dsn: str, size: int = 4, connect_timeout_s: int = 5, application: str = "qledge") -> None:
        self._dsn = dsn
        self._size = size
        self._connect_timeout_s = connect_timeout_s
        self._application = application
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._state = threading.Lock()  # guards the jobs' states and the workers' count
        self._workers: list[threading.Thread] = []
        self._idle = 0  # workers waiting for a job
        self._waiting = 0  # jobs no worker took yet
        self._closed = False
        self.location = describe(dsn)
        self.down_since: float | None = None  # wall time of the first failure since the last success
        self.down_reason = ""
        self._pending: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._ahead = asyncio.Lock()  # held while the pending work runs: later calls wait behind it
        self._fallbacks: set[asyncio.Future[object]] = set()  # carries written after their call was cancelled

    def before_next(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(tx, *args)` in a transaction of its own before any `read` or `write` called
        from now on begins (calls already under way are not waited for); used when storage
        must change before anything else is written. A failure is logged, never raised."""
        self._pending.append((fn, args))

    def ride(self, fn: Callable[..., T], *args: Any) -> None:
        """None: a pool has no one next hop to ride on (the caller writes it itself)."""
        return None

    def carry(self, fn: Callable[..., object], *args: Any, fallback: Callable[[], Awaitable[object]]) -> Carry:
        """Arm `fn(tx, *args)` to run at the head of the next `read` or `write` asked for in
        the current context (Carry): that transaction then writes. A carry armed before
        and not taken yet is replaced (its owner's `fallback` still writes it)."""
        armed = Carry(fn, args, fallback)
        _carried.set(armed)
        return armed

    async def connect(self) -> psycopg.AsyncConnection[Row]:
        """An asyncio connection of its own, with the session settings (the hint listener's)."""
        conn = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=self._connect_timeout_s, application_name=self._application)
        for name, value in SESSION_SETTINGS:
            await conn.execute(pgsql.SQL("SET {} = {}").format(pgsql.Identifier(name), pgsql.Literal(value)))
        return conn

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._call(fn, args, False, 0.0)

    async def write(self, fn: Callable[..., T], *args: Any, retry_s: float = 0.0) -> T:
        """Run `fn(tx, *args)` in one transaction. With `retry_s`, a lost connection is retried
        (a new connection, a new transaction) for that long: callers whose writes are
        compare-and-set can safely repeat them."""
        return await self._call(fn, args, True, retry_s)

    async def _call(self, fn: Callable[..., T], args: tuple[Any, ...], write: bool, retry_s: float) -> T:
        carry = _carried.get()
        if carry is not None:  # taken before any await: nothing else of this context runs first
            _carried.set(None)
            if not carry.take():
                carry = None
        try:
            if self._pending or self._ahead.locked():
                await self._run_pending()
            deadline = time.monotonic() + retry_s
            attempt = 0
            while True:
                try:
                    result = await self._once(fn, args, write or carry is not None, carry)
                except _Retry as again:
                    if time.monotonic() >= deadline or self._closed:
                        raise unavailable() from again.__cause__
                    await asyncio.sleep(RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)])
                    attempt += 1
                    continue
                if carry is not None:
                    carry.state = "written"
                return result
        except asyncio.CancelledError:
            if carry is not None and carry.state == "dropped":  # no worker took it: it never runs
                self._fallbacks.add(task := asyncio.ensure_future(carry.fallback()))
                task.add_done_callback(self._fallbacks.discard)
            raise
        except BaseException:
            if carry is not None and carry.state != "written":
                await carry.fallback()  # its failure (unavailable) is the call's answer
            raise

    async def _run_pending(self) -> None:
        async with self._ahead:
            while self._pending:
                fn, args = self._pending.pop(0)  # taken: never applied twice, even if cancelled now
                try:
                    await self._once(fn, args, True)
                except (ToolError, _Retry) as exc:
                    log.error("postgresql: %s did not run: %s", getattr(fn, "__qualname__", fn),
                              type(exc.__cause__ or exc).__name__)

    async def _once(self, fn: Callable[..., T], args: tuple[Any, ...], write: bool, carry: Carry | None = None) -> T:
        if self._closed:
            raise _Retry()
        job = _Job(fn, args, write, asyncio.get_running_loop(), carry)
        with self._state:
            self._waiting += 1
            if self._waiting > self._idle and len(self._workers) < self._size:
                worker = threading.Thread(target=self._work, name=f"qledge-pg-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                self._idle += 1
                worker.start()
        self._jobs.put(job)
        try:
            result, after = await job.future
        except asyncio.CancelledError:
            with self._state:
                if job.state == "waiting":
                    job.state = "dropped"
                    if carry is not None:
                        carry.state = "dropped"
            raise
        except _Retry as exc:
            self._failed(exc.__cause__ or exc, getattr(fn, "__qualname__", "a transaction"))
            raise
        if self.down_since is not None:
            log.info("postgresql (%s) reachable again", self.location)
            self.down_since = None
        for follow in after:
            follow()
        return result  # type: ignore[return-value]

    def _failed(self, exc: BaseException, what: str) -> None:
        if self.down_since is None:
            self.down_since = time.time()
            log.error("postgresql (%s) unavailable in %s: %s", self.location, what, type(exc).__name__)
        self.down_reason = type(exc).__name__

    # -- the workers (threads) ------------------------------------------------------

    def _work(self) -> None:
        conn: psycopg.Connection[Row] | None = None
        try:
            while (job := self._jobs.get()) is not None:
                with self._state:
                    self._idle -= 1
                    self._waiting -= 1
                    taken = job.state == "waiting"
                    job.state = "taken"
                if taken:
                    conn = self._transaction(conn, job)
                with self._state:
                    self._idle += 1
        finally:
            if conn is not None:
                with contextlib.suppress(psycopg.Error, OSError):
                    conn.close()

    def _transaction(self, conn: psycopg.Connection[Row] | None, job: _Job) -> psycopg.Connection[Row] | None:
        """Run the job on `conn` (connecting first when there is none); the connection to
        keep for the next job."""
        result: object = None
        error: BaseException | None = None
        try:
            if conn is None or conn.closed or conn.broken:
                conn = self._connect()
            tx = PgTx(conn)
            with conn.transaction():
                if job.carry is not None:
                    job.carry.fn(tx, *job.carry.args)
                value = job.fn(tx, *job.args)
            result = (value, tx.after)
        except ToolError as exc:
            error = exc
        except (psycopg.Error, OSError) as exc:
            if conn is None or _connection_lost(exc) or conn.broken:
                error = _Retry()
                error.__cause__ = exc
            else:
                log.error("postgresql error in %s: %s", getattr(job.fn, "__qualname__", job.fn), type(exc).__name__)
                error = unavailable()
                error.__cause__ = exc
        except BaseException as exc:  # a bug in a rule: its caller gets the traceback
            error = exc
        if conn is not None and (conn.closed or conn.broken):
            with contextlib.suppress(psycopg.Error, OSError):
                conn.close()
            conn = None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            job.loop.call_soon_threadsafe(_deliver, job.future, result, error)
        return conn

    def _connect(self) -> psycopg.Connection[Row]:
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout_s,
                               application_name=self._application)
        try:
            for name, value in SESSION_SETTINGS:
                conn.execute(pgsql.SQL("SET {} = {}").format(pgsql.Identifier(name), pgsql.Literal(value)))
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Let the workers end what they run, close their connections, and stop them."""
        self._closed = True
        for _ in self._workers:
            self._jobs.put(None)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for worker in self._workers:
            await asyncio.to_thread(worker.join, max(0.0, deadline - time.monotonic()))
        # One still in a transaction past the wait stays referenced (and ends with the process).
        self._workers = [worker for worker in self._workers if worker.is_alive()]
        with contextlib.suppress(queue.Empty):
            while True:  # behind the workers' ends: never to run
                job = self._jobs.get_nowait()
                if job is not None:
                    _deliver(job.future, None, _Retry())

