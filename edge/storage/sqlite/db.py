"""The one SQLite connection: opening, pragmas, and running work in its worker thread."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import apsw
import apsw.aio

from edge.core.errors import ToolError, unavailable
from edge.storage.sqlite.schema import migrate

log = logging.getLogger("qledge.store")
T = TypeVar("T")

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

# A row as SQLite returns it. Its column types are those of the query that read it: each
# adapter knows its own queries, and every shape that leaves an adapter is a typed Struct.
Row = tuple[Any, ...]


def one(conn: apsw.Connection, sql: str, params: tuple[Any, ...] = ()) -> Row:
    """The row of a query that always returns one (an aggregate, RETURNING, a row the
    transaction knows exists); its absence is a storage fault."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise apsw.CorruptError(f"expected a row from: {sql.split(chr(10))[0][:80]}")
    return row


def rows(conn: apsw.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
    return conn.execute(sql, params).fetchall()


# Flash wear: every page a transaction changes is written whole to the WAL (and again at
# the checkpoint), and a finished run changes about twenty small B-tree pages. At 512
# bytes a page that is about 13 KiB per run; at SQLite's default 4096, about 60 KiB.
PAGE_SIZE = 512
# Checkpoint once the WAL holds about 4 MiB (the bound it had with 1000 pages of 4 KiB):
# pages changed again meanwhile are copied into the database once, not once per change.
WAL_CHECKPOINT_BYTES = 4 << 20
# A database made with another page size is rewritten once (VACUUM) when it is at most
# this big and the file system has room for the copy; a bigger one keeps its page size.
CONVERT_MAX_BYTES = 64 << 20


def configure(conn: apsw.Connection, synchronous: str, cache_kib: int, exclusive: bool = False) -> None:
    """Apply what apsw.bestpractice recommends, as plain pragmas.

    Importing apsw.bestpractice pulls in apsw.ext (~3.4 MiB RSS), so the same settings
    are spelled out here: busy timeout, WAL, foreign keys, no double-quoted string
    literals, the planner's optimize hook, recursive triggers. Before WAL: the page size
    (a new database takes it at once, an existing one only by being rewritten) and, when
    `exclusive`, the exclusive locking mode: then WAL keeps its index in this process's
    memory instead of a shared `-shm` file, whose pages the kernel would write back to
    flash after every transaction, and no other process can open the database.
    """
    conn.set_busy_timeout(5000)
    adopt_page_size(conn)
    if exclusive:
        conn.pragma("locking_mode", "exclusive")
    conn.pragma("journal_mode", "wal")
    conn.pragma("foreign_keys", "ON")
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
    conn.pragma("optimize", 0x10002)
    conn.pragma("recursive_triggers", "ON")
    conn.pragma("synchronous", synchronous)
    conn.pragma("cache_size", -cache_kib)
    # Keep the WAL from growing without bound on small flash between checkpoints.
    conn.pragma("journal_size_limit", WAL_CHECKPOINT_BYTES)
    conn.pragma("wal_autocheckpoint", WAL_CHECKPOINT_BYTES // conn.pragma("page_size"))


def adopt_page_size(conn: apsw.Connection) -> None:
    """Give the database PAGE_SIZE pages: a new (empty) one at once; an existing one by a
    one-time VACUUM, when it is small enough and nothing else holds it open. Call before
    the journal mode is set."""
    if conn.pragma("page_count") == 0:
        conn.pragma("page_size", PAGE_SIZE)
        return
    current = conn.pragma("page_size")
    if current == PAGE_SIZE:
        return
    size = current * conn.pragma("page_count")
    path = conn.filename
    st = os.statvfs(os.path.dirname(path) or ".")
    if size > CONVERT_MAX_BYTES or st.f_bavail * st.f_frsize < 3 * size:
        log.info("database keeps its %d-byte pages (%d bytes; too big or too little room to rewrite it)",
                 current, size)
        return
    # The page size of a WAL database cannot change: leave WAL (a checkpoint), rewrite in
    # rollback-journal mode (a crash midway rolls back), then configure goes back to WAL.
    conn.set_busy_timeout(0)  # someone else has it open: do not wait, keep the pages
    try:
        mode = conn.pragma("journal_mode", "delete")
    except apsw.BusyError:
        mode = "busy"
    finally:
        conn.set_busy_timeout(5000)
    if mode != "delete":
        log.info("database keeps its %d-byte pages: another connection has it open", current)
        return
    conn.pragma("page_size", PAGE_SIZE)
    conn.execute("VACUUM")
    log.info("database rewritten with %d-byte pages (was %d; %d bytes): fewer bytes written per run",
             conn.pragma("page_size"), current, size)


@contextmanager
def immediate(conn: apsw.Connection) -> Iterator[None]:
    """One `BEGIN IMMEDIATE` transaction: all of it commits or none of it does."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class _Pending:
    """Work queued by `Database.before_next`; `done` once it ran (well or not)."""

    __slots__ = ("fn", "args", "done")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.fn, self.args, self.done = fn, args, False


def _first(conn: apsw.Connection, pending: list[_Pending], fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    for item in pending:
        item.done = True
        try:
            item.fn(conn, *item.args)
        except apsw.Error as exc:  # its own fault must not fail the call it rides on
            log.error("storage error in %s: %s", getattr(item.fn, "__qualname__", item.fn), exc)
    return fn(conn, *args)


class Database:
    """Owns the connection; `run` executes a function with it in the worker thread."""

    def __init__(self, conn: apsw.AsyncConnection, path: str) -> None:
        self._conn = conn
        self.path = path
        self._pending: list[_Pending] = []

    def before_next(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(conn, *args)` in the worker before whatever `run` is called next, so it
        precedes every call made from now on (not a task that starts later); used when
        storage must change before anything else is written."""
        self._pending.append(_Pending(fn, args))

    @classmethod
    async def open(
        cls, path: str, synchronous: str = "NORMAL", cache_kib: int = 512, exclusive: bool = False
    ) -> Database:
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        # apsw documents passing the controller class; its stub declares the protocol for instances.
        apsw.async_controller.set(apsw.aio.AsyncIO)  # type: ignore[arg-type]
        old = os.umask(0o077)  # the database holds credentials digests and secrets
        try:
            conn = await apsw.Connection.as_async(path)
            await conn.async_run(configure, conn, synchronous.upper(), cache_kib, exclusive)
        finally:
            os.umask(old)
        db = cls(conn, path)
        await db.run(migrate)
        return db

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in the worker; storage faults become `unavailable`."""
        pending, self._pending = self._pending, []
        try:
            if pending:
                return await self._conn.async_run(_first, self._conn, pending, fn, args)
            return await self._conn.async_run(fn, self._conn, *args)
        except ToolError:
            raise
        except BaseException as exc:
            # Cancelled before the worker took it: what rode on it goes with the next call.
            self._pending[:0] = [item for item in pending if not item.done]
            if isinstance(exc, apsw.Error):
                log.error("storage error in %s: %s", getattr(fn, "__qualname__", fn), exc)
                raise unavailable() from exc
            raise

    async def close(self) -> None:
        if self._pending:
            with suppress(ToolError):
                await self.run(_nothing)
        with suppress(apsw.Error):  # closing matters more than the planner's statistics
            await self._conn.async_run(_optimize, self._conn)
        await self._conn.aclose()


def _nothing(conn: apsw.Connection) -> None:
    pass


def _optimize(conn: apsw.Connection) -> None:
    conn.pragma("optimize")
