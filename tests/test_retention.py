"""Retention enforced on write, on real SQLite files and real log files, with injected
times: runs per task, run age, the log quota, bounded work per write, and the audit log."""

from __future__ import annotations

import os

import apsw
import pytest

from edge.core.auth import AuditBounds, AuditRecord
from edge.core.runs import Run, RunUpdate
from edge.core.tasks import ArgvCommand, TaskSpec
from edge.storage import runs as retention
from edge.storage.run_logs import RunLogs
from edge.storage.security import SqlAuditLog
from edge.storage.sqlite.sql import CATALOG, RUNS, SECURITY
from edge.storage.sqlite.db import Database
from edge.storage.runs import BATCH, TRIM, Policy, SqlRunStore
from edge.storage.sqlite.db import SqliteTx
from edge.storage.sqlite.schema import MIGRATIONS, migrate
from edge.storage.catalog import SqlTaskStore
from support import assert_uses_index

DAY = 86_400_000
T0 = 1_700_000_000_000


class Store:
    """A real database and logs directory; runs are made and finished at chosen times."""

    def __init__(self, db: Database, logs: str, policy: Policy) -> None:
        self.db = db
        self.logs = logs
        files = RunLogs(logs)
        self.tasks = SqlTaskStore(db, CATALOG, files)
        self.runs = SqlRunStore(db, RUNS, policy, files)
        keep_all = Policy(runs_per_task=1 << 40, max_age_ms=1 << 60, log_quota_bytes=1 << 60)
        self.plain = SqlRunStore(db, RUNS, keep_all, files)  # nothing to enforce: to build a backlog
        self.seq = 0

    async def task(self, task_id: str) -> None:
        await self.tasks.create("default", task_id, task_id, TaskSpec(command=ArgvCommand(file="true")), T0,
                                privileged=True)

    async def queued(self, task_id: str, at: int) -> Run:
        self.seq += 1
        run = Run(id=f"run-{self.seq:06d}", project_id="default", task_id=task_id, task_revision=1,
                  origin="manual", status="queued", version=1, event_seq=1, created_at_ms=at)
        return await self.runs.create(run, "user")

    async def finished(self, task_id: str, at: int, log: int = 10, via: SqlRunStore | None = None) -> Run:
        run = await self.queued(task_id, at)
        store = via or self.runs
        run = await store.transition(run.id, 1, "running", at, "runner", RunUpdate(started_at_ms=at))
        with open(os.path.join(self.logs, f"{run.id}.log"), "wb") as f:
            f.write(b"x" * log)
        return await store.transition(run.id, 2, "succeeded", at + 1, "runner",
                                      RunUpdate(finished_at_ms=at + 1, exit_code=0, log_bytes=log))

    def ids(self, conn: apsw.Connection, task_id: str | None = None) -> list[str]:
        sql, args = "SELECT id FROM runs ORDER BY id", ()
        if task_id:
            sql, args = "SELECT id FROM runs WHERE task_id = ? ORDER BY id", (task_id,)
        return [r[0] for r in conn.execute(sql, args)]

    def log_files(self) -> set[str]:
        return {name[: -len(".log")] for name in os.listdir(self.logs)}


@pytest.fixture
async def make(home):
    opened: list[Database] = []

    async def factory(**policy) -> Store:
        db = await Database.open(os.path.join(home, f"r{len(opened)}.db"))
        opened.append(db)
        logs = os.path.join(home, f"logs{len(opened)}")
        os.mkdir(logs)
        return Store(db, logs, Policy(**policy))

    yield factory
    for db in opened:
        await db.close()


def _check(home: str, index: int = 0) -> apsw.Connection:
    conn = apsw.Connection(os.path.join(home, f"r{index}.db"))
    conn.set_busy_timeout(5000)
    return conn


def _total_is_consistent(conn: apsw.Connection) -> None:
    running = retention.log_total(SqliteTx(conn), RUNS, "default")
    on_disk = "SELECT coalesce(sum(log_bytes), 0) FROM runs WHERE log_dropped_at_ms IS NULL"
    assert running == conn.execute(on_disk).fetchone()[0]


async def test_keeps_exactly_n_finished_runs_per_task_never_an_active_one(make, home):
    s = await make(runs_per_task=65)
    await s.task("a")
    await s.task("b")
    oldest_active = await s.queued("a", T0)  # older than everything: still never eligible
    for i in range(100):
        await s.finished("a", T0 + 1000 + i)
    for i in range(10):
        await s.finished("b", T0 + 5000 + i)
    conn = _check(home)
    kept = s.ids(conn, "a")
    assert len(kept) == 66 and oldest_active.id in kept
    finished_a = [r for r in kept if r != oldest_active.id]
    assert finished_a == [f"run-{n:06d}" for n in range(37, 102)]  # the newest 65
    assert len(s.ids(conn, "b")) == 10
    # A removed run's events and log file went with its row; kept ones are intact.
    assert conn.execute("SELECT count(*) FROM runs WHERE id = 'run-000002'").fetchone()[0] == 0
    assert s.log_files() == set(finished_a) | set(s.ids(conn, "b"))
    _total_is_consistent(conn)


@pytest.mark.parametrize(("limit", "low"), [(100, 100 - TRIM), (70, 65)])
async def test_a_task_over_its_limit_loses_its_oldest_runs_together(make, home, limit, low):
    """Never more than the limit, never fewer than 65 (the AI comparison's window), and a
    deletion only once every few runs: neighbours go together, so their pages are
    rewritten once (flash wear)."""
    s = await make(runs_per_task=limit)
    await s.task("a")
    conn = _check(home)
    counts = []
    for i in range(limit + 2 * (limit - low) + 5):
        await s.finished("a", T0 + i)
        counts.append(len(s.ids(conn)))
    assert max(counts) == limit and min(counts[limit:]) == low
    trims = [i for i, (a, b) in enumerate(zip(counts, counts[1:], strict=False)) if b < a]
    period = limit - low + 1  # finishes from one trim to the next
    assert trims == [limit - 1, limit - 1 + period, limit - 1 + 2 * period]
    assert s.ids(conn) == [f"run-{n:06d}" for n in range(len(counts) - counts[-1] + 1, len(counts) + 1)]
    assert s.log_files() == set(s.ids(conn))
    _total_is_consistent(conn)


async def test_each_write_removes_at_most_a_batch_and_the_table_converges(make, home):
    s = await make(runs_per_task=65)
    await s.task("a")
    for i in range(65 + 3 * BATCH + 10):  # a backlog, e.g. after lowering runs_per_task
        await s.finished("a", T0 + i, via=s.plain)
    conn = _check(home)
    counts = []
    for i in range(6):
        await s.finished("a", T0 + 10_000 + i)
        counts.append(len(s.ids(conn)))
    start = 65 + 3 * BATCH + 10
    assert counts == [start + 1 - 64, start + 2 - 128, start + 3 - 192, 65, 65, 65]
    assert len(s.log_files()) == 65
    _total_is_consistent(conn)


async def test_finished_runs_older_than_the_max_age_go(make, home):
    s = await make(max_age_ms=30 * DAY)
    await s.task("a")
    await s.task("b")
    old_active = await s.queued("b", T0)
    for i in range(5):
        await s.finished("b", T0 + i * DAY)  # days 0..4
    conn = _check(home)
    assert len(s.ids(conn)) == 6  # nothing is old yet
    # Just under 33 days later a run of another task finishes (the age rule is
    # project-wide): days 0..2 are past 30 days, day 3 is not quite.
    await s.finished("a", T0 + 33 * DAY - 10)
    survivors = set(s.ids(conn))
    assert old_active.id in survivors
    ages = {rid: at for rid, at in conn.execute("SELECT id, created_at_ms FROM runs")}
    assert all(at >= T0 + 3 * DAY for rid, at in ages.items() if rid != old_active.id)
    assert len(survivors) == 4  # days 3 and 4, the new run, the active one
    _total_is_consistent(conn)


async def test_log_quota_drops_the_oldest_logs_and_keeps_the_rows(make, home):
    s = await make(log_quota_bytes=10_000)
    await s.task("a")
    for i in range(12):
        await s.finished("a", T0 + i, log=3000)
        conn = _check(home)
        assert retention.log_total(SqliteTx(conn), RUNS, "default") <= 10_000
        _total_is_consistent(conn)
    rows = conn.execute("SELECT id, log_bytes, log_dropped_at_ms, event_seq FROM runs ORDER BY id").fetchall()
    assert len(rows) == 12 and all(r[1] == 3000 for r in rows)  # history stays, with the log's size
    assert [r[2] for r in rows] == [T0 + i + 1 for i in range(3, 12)] + [None] * 3
    assert all(r[3] == 4 for r in rows[:9]) and all(r[3] == 3 for r in rows[9:])
    assert s.log_files() == {r[0] for r in rows[9:]}
    dropped = conn.execute(RUNS.events, (rows[0][0], "default", 3, 10)).fetchall()
    assert [(seq, kind, actor, detail) for _, seq, kind, actor, _, detail in dropped] == [
        (4, "run.log_dropped", "system", "log quota")]


async def test_running_total_survives_task_delete_and_matches_after_migration(make, home):
    s = await make()
    await s.task("a")
    await s.task("b")
    for i in range(3):
        await s.finished("a", T0 + i, log=100)
        await s.finished("b", T0 + i, log=7)
    await s.tasks.delete("default", "a", None, True)
    conn = _check(home)
    assert retention.log_total(SqliteTx(conn), RUNS, "default") == 21
    _total_is_consistent(conn)
    # A store made before the running total existed gets it from its migration.
    old = apsw.Connection(os.path.join(home, "v1.db"))
    old.execute(MIGRATIONS[0])
    old.pragma("user_version", 1)
    old.execute("INSERT INTO tasks VALUES ('default', 't', 't', 1, 1, 0, 0)")
    for i, size in enumerate((5, 6, 0)):
        old.execute("INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq,"
                    " created_at_ms, log_bytes) VALUES (?, 'default', 't', 1, 'manual', 'succeeded', 3, 3, ?, ?)",
                    (f"o{i}", i, size))
    migrate(old)
    assert retention.log_total(SqliteTx(old), RUNS, "default") == 11


def test_the_running_total_follows_every_writer(home):
    """Kept by triggers in the schema: a row written by any code path (here plain SQL on a
    second connection) moves the total; nothing sums the runs table."""
    conn = apsw.Connection(os.path.join(home, "total.db"))
    migrate(conn)
    conn.execute("INSERT INTO tasks VALUES ('p', 't', 't', 1, 1, 0, 0)")
    insert = ("INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq,"
              " created_at_ms, log_bytes) VALUES (?, 'p', 't', 1, 'manual', 'succeeded', 3, 3, ?, ?)")
    conn.execute(insert, ("a", 1, 100))
    conn.execute(insert, ("b", 2, 0))
    assert retention.log_total(SqliteTx(conn), RUNS, "p") == 100
    conn.execute("UPDATE runs SET log_bytes = 40 WHERE id = 'b'")
    conn.execute("UPDATE runs SET status = 'failed' WHERE id = 'b'")  # not a log change
    assert retention.log_total(SqliteTx(conn), RUNS, "p") == 140
    conn.execute("UPDATE runs SET log_dropped_at_ms = 5 WHERE id = 'a'")
    assert retention.log_total(SqliteTx(conn), RUNS, "p") == 40
    conn.execute("DELETE FROM runs WHERE id = 'a'")  # its log was already dropped
    assert retention.log_total(SqliteTx(conn), RUNS, "p") == 40
    conn.execute("DELETE FROM runs WHERE id = 'b'")
    assert retention.log_total(SqliteTx(conn), RUNS, "p") == 0


@pytest.fixture
def plan_conn(home):
    c = apsw.Connection(os.path.join(home, "plan.db"))
    migrate(c)
    c.execute("ANALYZE")
    return c


def test_plan_excess_runs_of_a_task(plan_conn):
    assert_uses_index(plan_conn, RUNS.excess, ("default", "t", 64, 100), "runs_task_created_idx")


def test_plan_expired_runs(plan_conn):
    assert_uses_index(plan_conn, RUNS.expired, ("default", 1, 64), "runs_project_created_idx")


def test_plan_oldest_runs_with_a_log(plan_conn):
    assert_uses_index(plan_conn, RUNS.logged, ("default", 64), "runs_log_idx")


def test_plan_delete_and_drop_log_by_id(plan_conn):
    assert_uses_index(plan_conn, RUNS.delete, ("r",), "sqlite_autoindex_runs_1")
    assert_uses_index(plan_conn, RUNS.drop_log, (1, "r"), "sqlite_autoindex_runs_1")


def test_plan_transition_state_and_task_delete(plan_conn):
    assert_uses_index(plan_conn, RUNS.lock, ("r",), "sqlite_autoindex_runs_1")
    assert_uses_index(plan_conn, CATALOG.task_runs_delete, ("default", "t"), "runs_task_created_idx")
    assert_uses_index(plan_conn, CATALOG.task_active_run, ("default", "t"), "runs_active_idx")


def test_plan_active_processes(plan_conn):
    assert_uses_index(plan_conn, RUNS.active_processes, (), "runs_active_idx")


def test_plan_audit_prune(plan_conn):
    # Deletes by rowid. Allowed calls: the inner walk is in rowid order under LIMIT (no
    # sort), passing over only the rows of the small classes, so the one SCAN is that walk.
    plan = assert_uses_index(plan_conn, SECURITY.audit_prune_calls, (64, 0, 0), "INTEGER PRIMARY KEY", big_tables=())
    assert [d for d in plan if d.startswith("SCAN security_audit")] == ["SCAN security_audit"]
    # The small classes: counted and walked through their own partial indexes.
    for cls in ("change", "refused"):
        index = f"security_audit_{cls}_idx"
        assert_uses_index(plan_conn, SECURITY.audit_count.format(cls=cls), (), index, big_tables=("security_audit",))
        assert_uses_index(plan_conn, SECURITY.audit_prune.format(cls=cls), (64, 0, 0), index,
                          big_tables=("security_audit",))
    assert_uses_index(plan_conn, SECURITY.audit_add, (1, 1, 0, 0, "[]", 1), "INTEGER PRIMARY KEY")


async def test_audit_keeps_at_most_max_rows_and_max_age(home):
    db = await Database.open(os.path.join(home, "audit.db"))
    log = SqlAuditLog(db, SECURITY, AuditBounds(calls=100, max_age_days=30))

    def record(at: int) -> AuditRecord:
        return AuditRecord(at_ms=at, project_id="default", principal="uid:0", tool="qledge.status",
                           outcome="allowed", reasons=["tool_invocation_allowed"], transport="socket")

    count = lambda: db.run(lambda c: c.execute("SELECT count(*), min(at_ms) FROM security_audit").fetchone())  # noqa: E731
    trims = []
    for i in range(250):
        before, _ = await count()
        await log.append(record(T0 + i))
        rows, _ = await count()
        assert rows <= 100
        if rows < before:  # over the bound: down to 100 - 25 at once, not one row per call,
            trims.append((i, rows))  # less the 15 calls until the next check (every 16th call)
    assert trims == [(96, 60), (128, 60), (160, 60), (192, 60), (224, 60)]
    assert await count() == (85, T0 + 165)
    # 31 days later: each check (every 16th write) drops up to a batch of expired rows
    # until none is left.
    later = T0 + 31 * DAY
    seen = []
    for i in range(40):
        await log.append(record(later + i))
        seen.append(await count())
    assert seen[5:7] == [(91, T0 + 165), (91 + 1 - 64, T0 + 165 + 64)]  # the 256th write checks
    assert seen[21:23] == [(43, T0 + 229), (43 + 1 - 21, later)]  # the 272nd: the rest of them
    assert seen[-1] == (40, later)
    await db.close()
