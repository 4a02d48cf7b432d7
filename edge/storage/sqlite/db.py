"""The one SQLite connection: opening, pragmas, running work (and the storage rules, in
`BEGIN IMMEDIATE` transactions) in its worker thread, and the ballast that keeps it
writable when the disk fills up."""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Generic, TypeVar

import apsw

from edge.core.errors import ToolError, unavailable
from edge.storage.sqlite.apart import run_apart
from edge.storage.sqlite.schema import APPLICATION_ID, MIGRATIONS, NotOurs, SchemaTooNew, check_owned, migrate
from edge.storage.sqlite.worker import Worker
from edge.storage.tx import Params, Row

log = logging.getLogger("qledge.store")
T = TypeVar("T")

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def one(conn: apsw.Connection, sql: str, params: Params = ()) -> Row:
    """The row of a query that always returns one (an aggregate, RETURNING, a row the
    transaction knows exists); its absence is a storage fault."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise apsw.CorruptError(f"expected a row from: {sql.split(chr(10))[0][:80]}")
    return row


def rows(conn: apsw.Connection, sql: str, params: Params = ()) -> list[Row]:
    return conn.execute(sql, params).fetchall()


# Flash wear: every page a transaction changes is written whole to the WAL (and again at
# the checkpoint), and a finished run changes about twenty small B-tree pages. At 512
# bytes a page that is about 11 KiB per run; at SQLite's default 4096, about 60 KiB.
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
    literals, the planner's optimize hook, recursive triggers; and plans that do not depend
    on bound values (the query planner stability guarantee). Before WAL: the page size
    (a new database takes it at once, an existing one only by being rewritten) and, when
    `exclusive`, the exclusive locking mode: then WAL keeps its index in this process's
    memory instead of a shared `-shm` file, whose pages the kernel would write back to
    flash after every transaction, and no other process can open the database.
    """
    conn.set_busy_timeout(5000)
    if exclusive:  # before the first read: a WAL database read before it would map its -shm for good
        conn.pragma("locking_mode", "exclusive")
    check_owned(conn)  # a database this qledge refuses is never written, not even its page size
    adopt_page_size(conn)
    conn.pragma("journal_mode", "wal")
    conn.pragma("foreign_keys", "ON")
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
    # The plan of a statement must not depend on the values bound to it: otherwise every
    # join with a parameter (a task's head and revision, a run and its task) is marked to be
    # prepared again whenever a value is bound, and is, on every call (most of a read's time).
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    conn.pragma("optimize", 0x10002)
    conn.pragma("recursive_triggers", "ON")
    conn.pragma("synchronous", synchronous)
    conn.pragma("cache_size", -cache_kib)
    # Keep the WAL from growing without bound on small flash between checkpoints.
    conn.pragma("journal_size_limit", WAL_CHECKPOINT_BYTES)
    conn.pragma("wal_autocheckpoint", WAL_CHECKPOINT_BYTES // conn.pragma("page_size"))


def adopt_page_size(conn: apsw.Connection) -> None:
    """Give the database PAGE_SIZE pages: a new (empty) one at once; an existing one by a
    one-time VACUUM, when it is small enough, the file system has room for the copy
    (about twice the file) and nothing else holds it open. Call before the journal mode
    is set, and only on a database check_owned accepted."""
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
    """One `BEGIN IMMEDIATE` transaction: all of it commits or none of it does. Inside a
    transaction already, a savepoint of it: what the enclosing one does with it holds
    (an import writes many tasks and triggers in one transaction)."""
    if conn.in_transaction:
        conn.execute("SAVEPOINT nested")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO nested")
            conn.execute("RELEASE nested")
            raise
        conn.execute("RELEASE nested")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class SqliteTx:
    """edge.storage.tx.Tx on the connection, in its worker thread. `lock` and `hint` do
    nothing: `BEGIN IMMEDIATE` already holds the database's one write lock, and one daemon
    owns the database, so there is no other node to wake."""

    __slots__ = ("conn", "after")

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self.after: list[Callable[[], None]] = []

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def each(self, sql: str, params: Params = ()) -> Iterator[Row]:
        cursor = self.conn.execute(sql, params)
        try:
            yield from cursor
        finally:
            cursor.close()

    def row(self, sql: str, params: Params = ()) -> Row | None:
        return self.conn.execute(sql, params).fetchone()

    def one(self, sql: str, params: Params = ()) -> Row:
        # Read to its end: a statement that is its own transaction (a `one_statement` rule
        # riding a hop) commits there, and a failure to commit is raised here, not lost
        # when the cursor is dropped.
        found = self.conn.execute(sql, params).fetchall()
        if not found:
            raise apsw.CorruptError(f"expected a row from: {sql.split(chr(10))[0][:80]}")
        return found[0]

    def execute(self, sql: str, params: Params = ()) -> int:
        self.conn.execute(sql, params)
        return self.conn.changes()

    def lock(self, key: int) -> None:
        pass

    def hint(self, topic: str) -> None:
        pass

    def after_commit(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)


def _read(conn: apsw.Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    return fn(SqliteTx(conn), *args)


def _write(conn: apsw.Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> tuple[T, list[Callable[[], None]]]:
    tx = SqliteTx(conn)
    with immediate(conn):
        result = fn(tx, *args)
    return result, tx.after


def free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


class Ballast:
    """A file of `size` bytes beside the database, given back when a write fails for lack
    of space: the audit row of a call (and what it records) can still be written on a
    full disk, so reads keep working. It is made again once twice its size is free."""

    RETRY_S = 5.0  # while released, how often free space is looked at again (one statvfs)

    def __init__(self, path: str, size: int, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.size = size
        self._monotonic = monotonic
        self._directory = os.path.dirname(path) or "."
        self.released_at: float | None = None
        self._next_try = 0.0

    @property
    def held(self) -> bool:
        return self.size > 0 and self.released_at is None

    def ensure(self) -> None:
        """At start: keep the ballast there is, or make it when there is room; with the
        disk already full, give it back at once."""
        if self.size <= 0:
            with suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        try:
            info = os.lstat(self.path)
            if stat.S_ISREG(info.st_mode) and info.st_size >= self.size:
                if free_bytes(self._directory) < self.size:
                    self.release()
                return
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if not self._try_make():
            self.released_at = self._monotonic()
            self._next_try = self.released_at + self.RETRY_S
            log.warning("not enough free space for the %s ballast in %s", _mib(self.size), self._directory)

    def release(self) -> bool:
        """Give the space back; True when there was some to give."""
        if not self.held:
            return False
        self.released_at = self._monotonic()
        self._next_try = self.released_at + self.RETRY_S
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        log.warning("the disk is full: released the %s ballast in %s so that audited calls keep working",
                    _mib(self.size), self._directory)
        return True

    def poll(self) -> None:
        """While released, at most every RETRY_S: make it again when there is room."""
        if self.held or self.size <= 0 or self._monotonic() < self._next_try:
            return
        self._next_try = self._monotonic() + self.RETRY_S
        if self._try_make():
            self.released_at = None
            log.info("space is back: the %s ballast is in place again", _mib(self.size))

    def _try_make(self) -> bool:
        try:
            if free_bytes(self._directory) < 2 * self.size:
                return False
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            _fill(fd, self.size)
        except OSError:
            os.close(fd)
            with suppress(OSError):
                os.unlink(self.path)
            return False
        os.close(fd)
        return True

    def describe(self) -> str:
        free = _mib(free_bytes(self._directory)) + " free"
        if self.size <= 0:
            return f"{free}; no ballast ([store] ballast_bytes = 0)"
        if self.held:
            return f"{free}; {_mib(self.size)} ballast held"
        return (f"{free}; the {_mib(self.size)} ballast was released (the disk filled up);"
                f" it is made again once {_mib(2 * self.size)} are free")


def _fill(fd: int, size: int) -> None:
    """Really take `size` bytes: allocate them, or write bytes no compressing file system
    (UBIFS, JFFS2) can shrink where allocation is not supported."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    chunk = os.urandom(64 * 1024)
    written = 0
    while written < size:
        written += os.write(fd, chunk[: size - written])


_NEARLY_FULL = 256 * 1024


class OpenError(Exception):
    """The database cannot be opened; the message is one line naming the cause."""


def _why_not(path: str, exc: Exception) -> str:
    name = os.path.basename(path)
    if isinstance(exc, (SchemaTooNew, NotOurs)):
        return str(exc)
    if isinstance(exc, apsw.NotADBError):
        return f"{name} is not a SQLite database: {exc}; move it away (or restore a backup) to start afresh"
    if isinstance(exc, apsw.CorruptError):
        return f"{name} is damaged: {exc}; restore a backup"
    try:
        free: int | None = free_bytes(os.path.dirname(path))
    except OSError:
        free = None
    full = isinstance(exc, apsw.FullError) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
    # SQLite reports a full disk met while mapping the WAL index as an I/O error.
    if full or (isinstance(exc, apsw.IOError) and free is not None and free < _NEARLY_FULL):
        where = f" ({_mib(free)} free)" if free is not None else ""
        return f"the disk holding {path} is full{where}: free some space"
    if isinstance(exc, apsw.CantOpenError):
        return f"cannot open {path}: {exc} (a link, a directory or no permission in its place?)"
    return f"cannot open {path}: {exc}"


_MAGIC = b"SQLite format 3\x00"


def check_header(path: str) -> int | None:
    """Refuse, from the file's own 100-byte header and before SQLite opens it, a database
    this qledge must not touch: a newer schema (`user_version`, offset 60) or another
    program's (`application_id`, offset 68). SQLite's opening is itself a write when a
    `-wal` or a hot `-journal` lies beside the file (the WAL index is made, the journal is
    rolled back), so a refusal must come first. A header that is stale (a newer page 1 in a
    WAL) and still ours is taken as ours. Returns the header's schema version (0: no file
    yet, or an empty one); None when it is left to SQLite (a link, unreadable, short, not
    SQLite), whose open names what is wrong."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return 0  # made afresh
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        header = os.pread(fd, 100, 0)
    finally:
        os.close(fd)
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(_MAGIC):
        return None
    version = int.from_bytes(header[60:64], "big", signed=True)
    if version > len(MIGRATIONS):
        raise SchemaTooNew(
            f"database schema version {version} is newer than this qledge ({len(MIGRATIONS)}):"
            " upgrade qledge or restore a backup"
        )
    app = int.from_bytes(header[68:72], "big")
    if app not in (0, APPLICATION_ID):
        raise NotOurs(f"{os.path.basename(path)} belongs to another program (application id {app:#x}), not qledge:"
                      " move it away (or point home at another directory)")
    if app == 0:  # not marked: another program's, or an older qledge's (told by its tables)
        _check_unmarked(path)
    return version


def _check_unmarked(path: str) -> None:
    """check_owned on the file alone, opened `immutable`: SQLite then takes no lock, reads
    no `-wal` and rolls back no `-journal`, so nothing beside the file is made or changed
    (what a normal open of a file in WAL mode, or with a hot journal, would do)."""
    uri = "file:" + path.replace("%", "%25").replace("?", "%3f").replace("#", "%23") + "?mode=ro&immutable=1"
    try:
        conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_NOFOLLOW)
    except apsw.Error:
        return  # the real open names what is wrong
    try:
        check_owned(conn)
    except (SchemaTooNew, NotOurs):
        raise
    except apsw.Error:
        return
    finally:
        conn.close()


class _Pending:
    """Work queued by `Database.before_next` or `Database.ride`; `done` once it ran (well or
    not), with its result or the error it met (a ride's is its caller's to handle)."""

    __slots__ = ("fn", "args", "done", "keep", "result", "error")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...], keep: bool = False) -> None:
        self.fn, self.args, self.done, self.keep = fn, args, False, keep
        self.result: object = None
        self.error: BaseException | None = None


def _first(conn: apsw.Connection, pending: list[_Pending], fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    tx = SqliteTx(conn)  # what the rules ask to follow their commit is not kept: they ask none
    for item in pending:
        if item.done:  # taken by a hop whose caller was cancelled, and put back
            continue
        item.done = True
        try:
            if not conn.in_transaction and getattr(item.fn, "one_statement", False):
                # Its own transaction (autocommit): it commits, or fails, within its last step.
                item.result = item.fn(tx, *item.args)
                continue
            # `immediate`, spelled out: this runs ahead of every audited read.
            conn.execute("BEGIN IMMEDIATE")
            try:
                item.result = item.fn(tx, *item.args)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except apsw.Error as exc:  # its own fault must not fail the call it rides on
            if item.keep:
                item.error = exc
            else:
                log.error("storage error in %s: %s", getattr(item.fn, "__qualname__", item.fn), exc)
    return fn(conn, *args)


class _Ride(Generic[T]):
    """edge.storage.tx.Ride on the SQLite worker."""

    __slots__ = ("_db", "_item")

    def __init__(self, db: Database, item: _Pending) -> None:
        self._db, self._item = db, item

    async def committed(self) -> T:
        item = self._item
        while not item.done:  # nothing has carried it yet: a hop of its own
            await self._db.run(_nothing)
        if item.error is not None:  # rolled back where it rode: once more, as a write
            item.error = None
            item.result = await self._db.write(item.fn, *item.args)
        return item.result  # type: ignore[return-value]  # what `fn` returned


class Database:
    """Owns the connection; `run` executes a function with it in the worker thread."""

    def __init__(self, conn: apsw.Connection, worker: Worker, path: str, ballast: Ballast | None = None) -> None:
        self._conn = conn
        self._worker = worker
        self.path = path
        self.ballast = ballast
        self._pending: list[_Pending] = []

    def before_next(self, fn: Callable[..., object], *args: Any) -> None:
        """Run the rule `fn(tx, *args)` in a transaction of its own in the worker before
        whatever `run` is called next, so it precedes every call made from now on (not a
        task that starts later); used when storage must change before anything else is
        written. A failure is logged, never raised."""
        self._pending.append(_Pending(fn, args))

    def ride(self, fn: Callable[..., T], *args: Any) -> _Ride[T]:
        """Run the rule `fn(tx, *args)` in a transaction of its own at the start of the next
        hop to the worker (before whatever `run` is called next), its outcome kept for
        `committed()` instead of logged: one hop for an audited read's row and its read."""
        item = _Pending(fn, args, keep=True)
        self._pending.append(item)
        return _Ride(self, item)

    @classmethod
    async def open(
        cls, path: str, synchronous: str = "NORMAL", cache_kib: int = 128, ballast: Ballast | None = None,
        exclusive: bool = False,
    ) -> Database:
        """Open (creating it when missing, never through a link) and migrate. Raises
        OpenError with one line; nothing is left running when it does."""
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        try:
            version = check_header(path)
        except (SchemaTooNew, NotOurs) as exc:
            raise OpenError(str(exc)) from None
        if version is not None and version < len(MIGRATIONS):  # made or migrated in a child, when one can be
            failed = run_apart(lambda: _prepare(path, synchronous.upper(), cache_kib, exclusive),
                               lambda exc: _why_not(path, exc) if isinstance(exc, (apsw.Error, OSError))
                               else f"cannot prepare {path}: {exc!r}")
            if failed:
                raise OpenError(failed)
        worker = Worker()
        old = os.umask(0o077)  # the database holds credentials digests and secrets
        try:
            conn = await worker.run(apsw.Connection, path, _OPEN_FLAGS)
        except apsw.Error as exc:
            worker.stop()
            raise OpenError(_why_not(path, exc)) from None
        except BaseException:
            worker.stop()
            raise
        finally:
            os.umask(old)
        try:
            # Until the checks pass, closing must not checkpoint a WAL left beside the file
            # into it: a database that is refused keeps every byte it had.
            await worker.run(_checkpoint_on_close, conn, False)
            old = os.umask(0o077)  # the WAL and its index are created on first use
            try:
                await worker.run(configure, conn, synchronous.upper(), cache_kib, exclusive)
            finally:
                os.umask(old)
            await worker.run(migrate, conn)
            await worker.run(_checkpoint_on_close, conn, True)
        except BaseException as exc:
            # The worker thread would keep the interpreter alive: close before raising.
            await _close(worker, conn)
            if isinstance(exc, (apsw.Error, OSError)):
                raise OpenError(_why_not(path, exc)) from None
            raise
        return cls(conn, worker, path, ballast)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in the worker; storage faults become `unavailable`.

        A write that fails for lack of space releases the ballast and is tried once more
        (its transaction was rolled back): the audit row of a call still gets written."""
        pending, self._pending = self._pending, []
        try:
            if pending:
                result = await self._worker.run(_first, self._conn, pending, fn, args)
            else:
                result = await self._worker.run(fn, self._conn, *args)
        except ToolError:
            raise
        except apsw.FullError as exc:
            return await self._after_full(fn, args, exc)
        except BaseException as exc:
            # Cancelled before the worker took it: what rode on it goes with the next call.
            self._pending[:0] = [item for item in pending if not item.done]
            if isinstance(exc, apsw.Error):
                log.error("storage error in %s: %s", getattr(fn, "__qualname__", fn), exc)
                raise unavailable() from exc
            raise
        if self.ballast is not None:
            self.ballast.poll()
        return result

    def read(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """Run the rule `fn(tx, *args)` in the worker, outside a transaction: a read. (The
        coroutine of `run` itself: no frame of its own on every read's hop.)"""
        return self.run(_read, fn, args)

    async def write(self, fn: Callable[..., T], *args: Any, retry_s: float = 0.0) -> T:
        """Run the rule `fn(tx, *args)` in the worker in one `BEGIN IMMEDIATE` transaction,
        then what it asked to follow the commit. (`retry_s` is for a database across a
        network; this one is never out of reach.)"""
        result, after = await self.run(_write, fn, args)
        for follow in after:
            follow()
        return result

    async def _after_full(self, fn: Callable[..., T], args: tuple[Any, ...], exc: apsw.Error) -> T:
        if self.ballast is not None:
            self.ballast.release()
        try:
            await self._worker.run(_reuse_wal, self._conn)
            return await self._worker.run(fn, self._conn, *args)
        except ToolError:
            raise
        except apsw.Error as again:
            log.error("storage error in %s: %s", getattr(fn, "__qualname__", fn), again)
            raise unavailable("storage is unavailable: the disk is full") from exc

    async def close(self) -> None:
        if self._pending:
            with suppress(ToolError):
                await self.run(_nothing)
        with suppress(apsw.Error):  # closing matters more than the planner's statistics
            await self._worker.run(_optimize, self._conn)
        await _close(self._worker, self._conn)


_OPEN_FLAGS = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_NOFOLLOW


def _prepare(path: str, synchronous: str, cache_kib: int, exclusive: bool) -> None:
    """What `Database.open` does before it serves, in one thread (a child's): made (never
    through a link, 0600), configured, migrated, checkpointed on close."""
    old = os.umask(0o077)
    try:
        conn = apsw.Connection(path, _OPEN_FLAGS)
        try:
            _checkpoint_on_close(conn, False)  # a database that is refused keeps every byte it had
            configure(conn, synchronous, cache_kib, exclusive)
            migrate(conn)
            _checkpoint_on_close(conn, True)
        finally:
            conn.close()
    finally:
        os.umask(old)


async def _close(worker: Worker, conn: apsw.Connection) -> None:
    """Close the connection in its thread, then end the thread (even when cancelled meanwhile)."""
    try:
        await worker.run(conn.close)
    finally:
        worker.stop()


def _checkpoint_on_close(conn: apsw.Connection, on: bool) -> None:
    conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0 if on else 1)


def _nothing(conn: apsw.Connection) -> None:
    pass


def _optimize(conn: apsw.Connection) -> None:
    conn.pragma("optimize")


def _reuse_wal(conn: apsw.Connection) -> None:
    """After a failed write: end what is left of its transaction, and checkpoint so the
    next writes reuse the WAL from its start instead of growing it."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    with suppress(apsw.Error):
        conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_RESTART)
