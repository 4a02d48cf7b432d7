"""What a storage rule sees of its database: one transaction (`Tx`), and the database that
runs rules in transactions (`Db`).

Each use case of the storage ports is written once, as a transaction script: a plain
function `rule(tx, sql, ...)` that reads and writes through `Tx` and takes its statements
from the SQL its backend contributes (a frozen Struct of strings per port, in
edge/storage/sqlite and edge/storage/postgres). The scripts are synchronous: SQLite runs
them in apsw's worker thread, PostgreSQL in a worker thread of its pool with psycopg's
blocking connection (ARCHITECTURE.md, "one rule, two backends"). The backends differ only
in their SQL and in the primitives below: `lock` (PostgreSQL's advisory lock; on SQLite
`BEGIN IMMEDIATE` holds the one write lock already), `hint` (PostgreSQL's NOTIFY to the
other nodes; nothing on SQLite) and the placeholder of their statements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# A row as the driver returns it. Its column types are those of the query that read it:
# each rule knows its own queries, and every shape that leaves storage is a typed Struct.
Row = tuple[Any, ...]
Params = Sequence[object] | Mapping[str, object]  # by position, or by name (`:name`, `%(name)s`)

NO_ROW = 1 << 62  # ahead of every id and millisecond time a keyset reads back from

F = TypeVar("F", bound=Callable[..., Any])


def one_statement(rule: F) -> F:
    """Mark a rule that runs one statement, to its end (every row it returns read): that
    statement is atomic and durable by itself, so where it rides (`Db.ride`) a database may
    run it as its own transaction instead of wrapping it in one (on SQLite two statements
    fewer). Anywhere else it runs as any rule does."""
    rule.one_statement = True  # type: ignore[attr-defined]
    return rule


class Tx(Protocol):
    """One transaction of a rule (a read of a reader: its statements)."""

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        """Every row the statement returns ([] for one that returns none)."""
        ...

    def each(self, sql: str, params: Params = ()) -> Iterable[Row]:
        """The rows one at a time, read only as far as they are iterated (a bounded walk
        may stop early)."""
        ...

    def row(self, sql: str, params: Params = ()) -> Row | None:
        """The first row, or None."""
        ...

    def one(self, sql: str, params: Params = ()) -> Row:
        """The row of a statement that always returns one (an aggregate, RETURNING, a row
        the transaction knows exists); its absence is a storage fault (`unavailable`)."""
        ...

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run a statement that changes rows; how many it changed."""
        ...

    def lock(self, key: int) -> None:
        """Serialize the rest of this transaction with every other one that takes `key`,
        on every node, until it ends."""
        ...

    def hint(self, topic: str) -> None:
        """Tell the other nodes, once (and only if) this transaction commits, that
        `topic` changed (`run`, `trigger`, `notify`, `cancel`): a wake-up, never the news."""
        ...

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Call `fn` on the event loop once this transaction has committed (never when it
        rolls back): what follows a write outside the database, such as removing the log
        files of deleted runs or waking the scheduler."""
        ...


class Ride(Protocol[T_co]):
    """A rule queued to run ahead of the database's next hop (`Db.ride`)."""

    async def committed(self) -> T_co:
        """Its result once its transaction has committed: at once when it rode on a hop
        that has run; otherwise after a hop of its own. Written again (through `Db.write`,
        with its full-disk handling) when it failed where it rode; raises
        ToolError("unavailable") when it cannot be written."""
        ...


class Db(Protocol):
    """A database that runs rules: `read` without writing, `write` in one transaction that
    all commits or none of it does. Driver faults become ToolError("unavailable")."""

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        ...

    async def write(self, fn: Callable[..., T], *args: Any, retry_s: float = 0.0) -> T:
        """(`retry_s`: for how long a lost connection is retried, where it can be lost.)"""
        ...

    def before_next(self, fn: Callable[..., object], *args: Any) -> None:
        """Run the rule `fn(tx, *args)` in a transaction of its own before anything called
        from now on; a failure is logged, never raised (storage must change before
        anything else is written: the clock's restamp)."""
        ...

    def ride(self, fn: Callable[..., T], *args: Any) -> Ride[T] | None:
        """Queue the rule `fn(tx, *args)` to run in a transaction of its own at the start of
        the next hop to the database's worker, ahead of anything asked for after this call,
        so that it costs no hop of its own (an audited read's row and the read in one hop).
        None where there is no one next hop (a pool of connections): write it yourself."""
        ...
