"""The storage ports' contracts (edge.core.ports.stores), one suite run against every
adapter: SQLite (a real file) and PostgreSQL (a real server, tests/pg_support.py). Each
test is written once and parametrized over the backend by the `stores` fixture."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import msgspec
import pytest

from edge.app.config import ClusterConfig, Config, RetentionConfig
from edge.app.graph import Cluster, Stores, build_stores
from edge.core.auth import MINUTE_MS, AuditRecord, Credential
from edge.core.errors import ToolError
from edge.core.runs import Run, RunCursor, RunQuery, RunUpdate
from edge.core.ports.notify import NoticeOutcome
from edge.core.tasks import (
    ArgvCommand,
    ImportedTask,
    ImportRecord,
    ImportTask,
    ImportTrigger,
    NotifyRule,
    RetryPolicy,
    TaskSpec,
)
from edge.core.triggers import CronSpec, SkippedFires
from edge.storage.sqlite.db import Database

P = "default"
DAY = 86_400_000
T0 = 1_800_000_000_000  # a round time, in ms: 2027-01-15T08:00:00Z


@contextlib.asynccontextmanager
async def open_backend(request, home: str, config: Config) -> AsyncIterator[Stores]:
    """Every storage adapter of the backend the test is parametrized with, under `config`."""
    if request.param == "sqlite":
        db = await Database.open(os.path.join(home, "contract.db"))
        try:
            yield build_stores(db, config, home)
        finally:
            await db.close()
        return
    dsn = request.getfixturevalue("pg_dsn")
    cluster = Cluster(msgspec.structs.replace(config, cluster=ClusterConfig(dsn=dsn, node="contract")), home)
    await cluster.open()
    assert cluster.stores is not None
    try:
        yield cluster.stores
    finally:
        await cluster.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(request, home):
    async with open_backend(request, home, Config()) as s:
        yield s


@pytest.fixture(params=["sqlite", "postgres"])
async def bounded(request, home):
    """Stores whose audit keeps 100 rows of each class."""
    keep = RetentionConfig(audit_max_rows=100, audit_change_max_rows=100, audit_refused_max_rows=100)
    async with open_backend(request, home, Config(retention=keep)) as s:
        yield s


def spec(overlap: str = "forbid", file: str = "true") -> TaskSpec:
    return TaskSpec(command=ArgvCommand(file=file), overlap=overlap)  # type: ignore[arg-type]


def run_of(task_id: str, run_id: str, created: int, project: str = P, origin: str = "manual", **kw) -> Run:
    return Run(id=run_id, project_id=project, task_id=task_id, task_revision=1, origin=origin,  # type: ignore[arg-type]
               status="queued",
               version=1, event_seq=1, created_at_ms=created, queued_at_ms=created, **kw)


async def finished(s: Stores, run: Run, status: str = "succeeded", at: int | None = None) -> Run:
    created = await s.runs.create(run, "user")
    at = at or run.created_at_ms + 10
    running = await s.runs.transition(created.id, created.version, "running", at, "runner",
                                      RunUpdate(started_at_ms=at))
    return await s.runs.transition(running.id, running.version, status, at + 5, "runner",  # type: ignore[arg-type]
                                   RunUpdate(finished_at_ms=at + 5, exit_code=0 if status == "succeeded" else 1))


async def code_of(awaitable) -> str:
    with pytest.raises(ToolError) as caught:
        await awaitable
    return caught.value.code


# -- TaskStore ------------------------------------------------------------------------


async def test_tasks_create_get_page_and_project_scope(stores: Stores):
    s = stores
    first = await s.tasks.create(P, "b", "Bee", spec(), T0, privileged=False)
    assert (first.revision, first.enabled, first.name, first.created_at_ms) == (1, True, "Bee", T0)
    assert first.content_digest.startswith("sha256:")
    await s.tasks.create(P, "a", "A", spec(), T0, privileged=False)
    await s.tasks.create(P, "c", "C", spec(), T0, privileged=False)
    await s.tasks.create("other", "a0", "other's", spec(), T0, privileged=False)
    assert await code_of(s.tasks.create(P, "a", "again", spec(), T0, privileged=False)) == "conflict"
    assert [t.id for t in await s.tasks.page(P, None, 10)] == ["a", "b", "c"]
    assert [t.id for t in await s.tasks.page(P, "a", 1)] == ["b"]
    assert await s.tasks.get(P, "zz") is None
    assert await s.tasks.get("other", "b") is None
    assert (await s.tasks.get(P, "b")) == first


async def test_an_import_plan_is_written_in_one_transaction_or_not_at_all(stores: Stores):
    from edge.core.triggers import ImportPlan, PlannedTask, PlannedTrigger

    s = stores
    await s.tasks.create(P, "old", "Old", spec(file="one"), T0, privileged=False)
    await s.triggers.create(P, "g", "old", None, CronSpec(expression="0 1 * * *", timezone="UTC"), T0)
    new = PlannedTask(id="new", name="New", spec=spec(), enabled=False, privileged=False)
    moved = PlannedTask(id="old", name="Older", spec=spec(file="two"), enabled=True, privileged=False, expected=1)
    nightly = PlannedTrigger(id="n", task_id="new", spec=CronSpec(expression="0 3 * * *", timezone="UTC"),
                             enabled=True)
    # The last write fails: a head moved since the plan was made. Nothing of it stays.
    stale = PlannedTrigger(id="g", task_id="old", spec=CronSpec(expression="0 2 * * *", timezone="UTC"),
                           enabled=True, expected=7)
    plan = ImportPlan(tasks=[new, moved], triggers=[nightly, stale])
    assert await code_of(s.tasks.apply_import(P, plan, T0 + 1)) == "conflict"
    assert await s.tasks.get(P, "new") is None and (await s.tasks.get(P, "old")).revision == 1
    assert await s.triggers.get(P, "n") is None
    bad = PlannedTrigger(id="b", task_id="new", spec=CronSpec(expression="61 * * * *", timezone="UTC"), enabled=True)
    assert await code_of(s.tasks.apply_import(P, ImportPlan(tasks=[new], triggers=[bad]), T0 + 1)) == \
        "invalid_argument"
    assert await s.tasks.get(P, "new") is None
    # As planned: all of it.
    good = PlannedTrigger(id="g", task_id="old", spec=CronSpec(expression="0 2 * * *", timezone="UTC"),
                          enabled=False, expected=1)  # as planned (the task's new head moves it meanwhile)
    await s.tasks.apply_import(P, ImportPlan(tasks=[new, moved], triggers=[nightly, good]), T0 + 1)
    assert ((await s.tasks.get(P, "new")).enabled, (await s.tasks.get(P, "old")).name) == (False, "Older")
    g = await s.triggers.get(P, "g")
    assert (g.spec.expression, g.enabled, g.task_revision) == ("0 2 * * *", False, 2)
    assert (await s.triggers.get(P, "n")).task_id == "new"


async def test_task_uids_are_stable_never_shared_and_go_with_the_task(stores: Stores):
    s = stores
    for name in ("a", "b", "c", "d"):
        await s.tasks.create(P, name, name, spec(), T0, privileged=False)
    assert await s.tasks.task_uid(P, "a") is None
    a = await s.tasks.allocate_task_uid(P, "a", 100, 103, frozenset({101}), T0)
    assert a == 100 and await s.tasks.task_uid(P, "a") == 100
    assert await s.tasks.allocate_task_uid(P, "a", 100, 103, frozenset(), T0) == 100  # stable
    assert await s.tasks.allocate_task_uid(P, "b", 100, 103, frozenset({101}), T0) == 102  # 101: a system user's
    assert await s.tasks.allocate_task_uid(P, "c", 100, 103, frozenset({101}), T0) == 103
    assert await code_of(s.tasks.allocate_task_uid(P, "d", 100, 103, frozenset({101}), T0)) == "resource_exhausted"
    assert await code_of(s.tasks.allocate_task_uid(P, "gone", 100, 103, frozenset(), T0)) == "not_found"
    await s.tasks.delete(P, "a", None, False)
    assert await s.tasks.task_uid(P, "a") is None
    # The uid a deleted task had comes back only once the range has wrapped around.
    assert await s.tasks.allocate_task_uid(P, "d", 100, 103, frozenset({101}), T0) == 100
    await s.tasks.create(P, "a", "a", spec(), T0, privileged=False)
    assert await code_of(s.tasks.allocate_task_uid(P, "a", 100, 103, frozenset({101}), T0)) == "resource_exhausted"


async def test_tasks_update_is_compare_and_set_and_keeps_revisions(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(file="one"), T0, privileged=False)
    assert await code_of(s.tasks.update(P, "t", 7, spec(file="two"), None, T0 + 1, privileged=False)) == "conflict"
    assert await code_of(s.tasks.update(P, "nope", 1, spec(), None, T0 + 1, privileged=False)) == "not_found"
    second = await s.tasks.update(P, "t", 1, spec(file="two"), "Renamed", T0 + 1, privileged=False)
    assert (second.revision, second.name, second.updated_at_ms) == (2, "Renamed", T0 + 1)
    old = await s.tasks.get(P, "t", 1)
    assert old is not None and isinstance(old.spec.command, ArgvCommand)
    assert (old.revision, old.spec.command.file, old.name) == (1, "one", "Renamed")
    assert await s.tasks.get(P, "t", 9) is None


async def test_tasks_set_enabled_moves_following_triggers(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    trig = await s.triggers.create(P, "tr", "t", None, CronSpec(expression="0 * * * *", timezone="UTC"), T0)
    pinned = await s.triggers.create(P, "old", "t", 1, CronSpec(expression="0 * * * *", timezone="UTC"), T0)
    same = await s.tasks.set_enabled(P, "t", True, None, T0 + 1)
    assert same.revision == 1
    off = await s.tasks.set_enabled(P, "t", False, 1, T0 + 2)
    assert (off.revision, off.enabled) == (2, False)
    assert await code_of(s.tasks.set_enabled(P, "t", True, 1, T0 + 3)) == "conflict"
    moved = await s.triggers.get(P, "tr")
    assert moved is not None and (moved.task_revision, moved.revision) == (2, trig.revision + 1)
    await s.triggers.repin(P, "old", 1, None, T0 + 4)
    assert pinned.task_revision == 1


async def test_each_revision_records_whether_its_writer_held_task_privileged(stores: Stores):
    """Task.privileged: what the runner checks again before each run (a revision whose
    writer lacked task.privileged never runs privileged)."""
    s = stores
    made = await s.tasks.create(P, "p", "P", spec(), T0, privileged=True)
    plain = await s.tasks.create(P, "n", "N", spec(), T0, privileged=False)
    assert (made.privileged, plain.privileged) == (True, False)
    assert {t.id: t.privileged for t in await s.tasks.page(P, None, 10)} == {"n": False, "p": True}
    # A new spec gets its writer's standing; the revision before keeps its own.
    second = await s.tasks.update(P, "p", 1, spec(file="two"), None, T0 + 1, privileged=False)
    assert (second.revision, second.privileged) == (2, False)
    first = await s.tasks.get(P, "p", 1)
    assert first is not None and first.privileged is True
    third = await s.tasks.update(P, "p", 2, spec(file="three"), "renamed", T0 + 2, privileged=True)
    assert (third.revision, third.privileged) == (3, True)
    # Disabling and enabling keep the spec, and with it its writer's standing.
    off = await s.tasks.set_enabled(P, "p", False, None, T0 + 3)
    on = await s.tasks.set_enabled(P, "p", True, 4, T0 + 4)
    assert [(t.revision, t.enabled, t.privileged) for t in (off, on)] == [(4, False, True), (5, True, True)]
    assert (await s.tasks.set_enabled(P, "n", False, None, T0 + 3)).privileged is False
    head = await s.tasks.get(P, "p")
    assert head is not None and (head.revision, head.privileged) == (5, True)
    # An import records it too; one whose key is on record changes nothing, whoever asks.
    ours = ImportTask(key="crontab:root:p", task_id="imp", spec=spec())
    theirs = ImportTask(key="crontab:nobody:p", task_id="imp", spec=spec())
    await s.tasks.import_task(P, ours, [], T0 + 5, privileged=True)
    assert (await s.tasks.import_task(P, theirs, [], T0 + 6, privileged=False)).task_id == "imp-2"
    assert (await s.tasks.import_task(P, theirs, [], T0 + 7, privileged=True)).status == "exists"
    imported = {t.id: t.privileged for t in await s.tasks.page(P, "imp", 10) if t.id.startswith("imp")}
    assert imported == {"imp-2": False} and (await s.tasks.get(P, "imp")).privileged is True  # type: ignore[union-attr]


OLD_SPEC = '{"command":{"kind":"shell","command":"echo $K"},"env":{"QLEDGE_RUN_ID":"fake","K":"kept"}}'


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_revisions_written_before_task_users_run_as_they_did(backend, request, home):
    """The migration that records task.privileged, on each backend: a revision written
    before it ran as the daemon's user by design and still may (privileged); its QLEDGE_*
    variables, the runner's own, are gone (a spec with them would not even decode)."""
    if backend == "sqlite":
        import apsw

        from edge.storage.sqlite.schema import MIGRATIONS as SQLITE

        path = os.path.join(home, "old.db")
        conn = apsw.Connection(path)
        for number, sql in enumerate(SQLITE[:5], start=1):
            conn.execute(sql)
            conn.pragma("user_version", number)
        conn.execute("INSERT INTO tasks VALUES ('default', 'old', 'old', 1, 1, 1, 1)")
        conn.execute("INSERT INTO task_revisions VALUES ('default', 'old', 1, 'qinglong/command@v1', ?, 'sha256:0',"
                     " 1, 1)", (OLD_SPEC,))
        conn.close()
        db = await Database.open(path)
        s, close = build_stores(db, Config(), home), db.close
    else:
        import psycopg

        from edge.storage.postgres.schema import MIGRATIONS as PG
        from edge.storage.postgres.schema import SQL_VERSION_TABLE

        dsn = request.getfixturevalue("pg_dsn")
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(SQL_VERSION_TABLE)
            for number, sql in enumerate(PG[:2], start=1):
                pg.execute(sql)
                pg.execute("INSERT INTO qledge_schema VALUES (%s, now())", (number,))
            pg.execute("INSERT INTO tasks VALUES ('default', 'old', 'old', 1, true, 1, 1)")
            pg.execute("INSERT INTO task_revisions VALUES ('default', 'old', 1, 'qinglong/command@v1', %s,"
                       " 'sha256:0', true, 1)", (OLD_SPEC,))
        cluster = Cluster(Config(cluster=ClusterConfig(dsn=dsn, node="contract")), home)
        await cluster.open()
        assert cluster.stores is not None
        s, close = cluster.stores, cluster.close
    try:
        old = await s.tasks.get(P, "old")
        assert old is not None and (old.privileged, old.spec.user, old.spec.env) == (True, None, {"K": "kept"})
        newer = await s.tasks.update(P, "old", 1, old.spec, None, T0, privileged=False)
        assert newer.privileged is False
    finally:
        await close()


async def test_runs_recorded_before_fires_named_their_runs_read_and_guard_as_they_did(home):
    """SQLite's migration 18 (runs rebuilt: stored keys in a partial unique index, events
    stored compactly): a cron run admitted before it keeps its key and reads its events as
    they were, its fire is still never admitted again, and the log total stays right."""
    import apsw
    from rows import add_task, add_trigger

    from edge.storage.sqlite.schema import MIGRATIONS as SQLITE

    path = os.path.join(home, "old.db")
    conn = apsw.Connection(path)
    for number, sql in enumerate(SQLITE[:17], start=1):
        conn.execute(sql)
        conn.pragma("user_version", number)
    add_task(conn, P, "t")
    add_trigger(conn, P, "m", "t")  # every five minutes
    conn.execute("UPDATE triggers SET next_fire_at_ms = ?", (T0,))  # a stale cursor: at the fire admitted below
    conn.execute(
        "INSERT INTO runs (id, project_id, task_id, task_revision, trigger_id, trigger_revision, origin, status,"
        " version, event_seq, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, scheduled_for_ms,"
        " exit_code, log_bytes, idempotency_key, events) VALUES ('legacy', 'default', 't', 1, 'm', 1, 'scheduled',"
        " 'failed', 3, 3, ?1, ?1, ?1 + 4, ?1 + 9, ?2, 1, 7, ?3, json_array(json_array(1, 'run.queued', 'scheduler',"
        " ?1, NULL), json_array(2, 'run.running', 'runner', ?1 + 4, NULL), json_array(3, 'run.failed', 'runner',"
        " ?1 + 9, 'exit 1')))", (T0 + 2, T0, f"cron:m:1:{T0}"))
    conn.close()
    db = await Database.open(path)
    try:
        s = build_stores(db, Config(), home)
        legacy = await s.runs.get(P, "legacy")
        assert legacy is not None and legacy.idempotency_key == f"cron:m:1:{T0}"
        assert [(e.sequence, e.type, e.actor_type, e.created_at_ms, e.detail)
                for e in await s.runs.events(P, "legacy", 0, 5)] == [
            (1, "run.queued", "scheduler", T0 + 2, None), (2, "run.running", "runner", T0 + 6, None),
            (3, "run.failed", "runner", T0 + 11, "exit 1")]
        again = await s.admission.admit_fires(P, "m", T0 + 10, 30_000, _rng)
        assert again.runs == [] and again.cursor == T0 + 300_000
        later = await s.admission.admit_fires(P, "m", T0 + 300_010, 30_000, _rng)
        assert [r.idempotency_key for r in later.runs] == [f"cron:m:1:{T0 + 300_000}"]
        assert [r.id for r in await s.runs.page(P, "t", None, 5)] == [later.runs[0].id, "legacy"]
        assert await db.read(lambda tx: tx.one("SELECT value FROM meta WHERE key = 'run_log_bytes:default'")) == (7,)
    finally:
        await db.close()


OLD_AUDIT = [  # at_ms, tool, outcome
    (T0, "qledge.credential.create", "allowed"), (T0 + 1, "qledge.status", "allowed"),
    (T0 + 2, "qledge.status", "unauthenticated"), (T0 + 3, "qledge.import.secret", "allowed"),
    (T0 + 4, "qledge.secret.set", "denied"),
]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_audit_rows_written_before_the_classes_are_classified(backend, request, home):
    """The migration that gives the audit its classes, on each backend (SQLite's version 11,
    PostgreSQL's 6): allowed credential and secret changes, refused calls (a count of one)
    and the other allowed calls; later refused calls never push out the old changes."""
    if backend == "sqlite":
        import apsw

        from edge.storage.sqlite.schema import MIGRATIONS as SQLITE

        path = os.path.join(home, "old.db")
        conn = apsw.Connection(path)
        for number, sql in enumerate(SQLITE[:7], start=1):
            conn.execute(sql)
            conn.pragma("user_version", number)
        for at, tool, outcome in OLD_AUDIT:
            conn.execute("INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport)"
                         " VALUES (?, 'default', 'uid:0', ?, ?, '[\"x\"]', 'socket')", (at, tool, outcome))
        conn.close()
        db = await Database.open(path)
        keep = RetentionConfig(audit_refused_max_rows=100)
        s, close = build_stores(db, Config(retention=keep), home), db.close
    else:
        import psycopg

        from edge.storage.postgres.schema import MIGRATIONS as PG
        from edge.storage.postgres.schema import SQL_VERSION_TABLE

        dsn = request.getfixturevalue("pg_dsn")
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(SQL_VERSION_TABLE)
            for number, sql in enumerate(PG[:4], start=1):
                pg.execute(sql)
                pg.execute("INSERT INTO qledge_schema VALUES (%s, now())", (number,))
            for at, tool, outcome in OLD_AUDIT:
                pg.execute("INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons,"
                           " transport) VALUES (%s, 'default', 'uid:0', %s, %s, '[\"x\"]', 'socket')",
                           (at, tool, outcome))
        keep = RetentionConfig(audit_refused_max_rows=100)
        cluster = Cluster(Config(retention=keep, cluster=ClusterConfig(dsn=dsn, node="contract")), home)
        await cluster.open()
        assert cluster.stores is not None
        s, close = cluster.stores, cluster.close
    try:
        rows = (await s.audit_reader.page(P, None, None, 10)).entries
        assert [(e.tool, e.outcome, e.change, e.count, e.last_at_ms) for e in reversed(rows)] == [
            ("qledge.credential.create", "allowed", True, 1, None), ("qledge.status", "allowed", False, 1, None),
            ("qledge.status", "unauthenticated", False, 1, T0 + 2), ("qledge.import.secret", "allowed", True, 1, None),
            ("qledge.secret.set", "denied", False, 1, T0 + 4)]
        for i in range(150):  # refused rows of 150 minutes: the old refused ones go, the changes stay
            await s.audit.append(refused(T0 + (i + 1) * MINUTE_MS))
        await s.audit.close()
        tools: list[str] = []
        before = None
        while True:
            page = await s.audit_reader.page(P, None, before, 64)
            tools += [e.tool for e in page.entries if e.outcome == "allowed"]
            if page.next is None:
                break
            before = page.next
        assert tools == ["qledge.import.secret", "qledge.status", "qledge.credential.create"]
    finally:
        await close()


async def test_tasks_delete_refuses_active_runs_and_takes_finished_ones(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    await finished(s, run_of("t", "r-done", T0))
    await s.runs.create(run_of("t", "r-active", T0 + 100), "user")
    assert await code_of(s.tasks.delete(P, "t", None, False)) == "conflict"
    active = await s.runs.get(P, "r-active")
    assert active is not None
    await s.runs.transition("r-active", active.version, "cancelled", T0 + 200, "user", RunUpdate())
    assert await code_of(s.tasks.delete(P, "t", 5, False)) == "conflict"
    assert await s.tasks.delete(P, "t", 1, False) == 2
    assert await s.tasks.get(P, "t") is None and await s.runs.get(P, "r-done") is None
    assert await code_of(s.tasks.delete(P, "t", None, False)) == "not_found"


async def test_tasks_delete_refuses_a_task_with_triggers_unless_they_go_too(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    for n in range(7):
        await s.triggers.create(P, f"t-{n}", "t", None, HOURLY, T0)
    with pytest.raises(ToolError) as refused:
        await s.tasks.delete(P, "t", None, False)
    assert (refused.value.code, refused.value.message) == (
        "conflict", "task 't' has 7 triggers (t-0, t-1, t-2, t-3, t-4, …), which would be deleted with it")
    assert await s.tasks.get(P, "t") is not None and len(await s.triggers.page(P, None, 10)) == 7
    for n in range(1, 7):
        await s.triggers.delete(P, f"t-{n}", None)
    with pytest.raises(ToolError) as one:
        await s.tasks.delete(P, "t", None, False)
    assert one.value.message == "task 't' has 1 trigger (t-0), which would be deleted with it"
    assert await s.tasks.delete(P, "t", None, True) == 0
    assert await s.tasks.get(P, "t") is None and await s.triggers.get(P, "t-0") is None


# -- RunStore -------------------------------------------------------------------------


async def test_runs_transitions_are_compare_and_set_with_events(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    run = await s.runs.create(run_of("t", "r1", T0, idempotency_key="k1"), "user")
    assert (run.status, run.version, run.event_seq) == ("queued", 1, 1)
    assert await code_of(s.runs.create(run_of("t", "r1", T0), "user")) == "conflict"
    assert await code_of(s.runs.create(run_of("t", "r2", T0, idempotency_key="k1"), "user")) == "conflict"
    running = await s.runs.transition("r1", 1, "running", T0 + 1, "runner", RunUpdate(started_at_ms=T0 + 1, pid=42))
    assert (running.version, running.event_seq, running.started_at_ms) == (2, 2, T0 + 1)
    assert await code_of(s.runs.transition("r1", 1, "succeeded", T0 + 2, "runner", RunUpdate())) == "conflict"
    assert await code_of(s.runs.transition("r1", 2, "queued", T0 + 2, "runner", RunUpdate())) == "conflict"
    assert await code_of(s.runs.transition("nope", 1, "running", T0, "runner", RunUpdate())) == "not_found"
    done = await s.runs.transition("r1", 2, "failed", T0 + 3, "runner",
                                   RunUpdate(exit_code=3, finished_at_ms=T0 + 3, error_code="exit_nonzero",
                                             log_truncated=True), "detail")
    assert (done.status, done.version, done.exit_code, done.log_truncated, done.terminal) == (
        "failed", 3, 3, True, True)
    events = await s.runs.events(P, "r1", 0, 10)
    assert [(e.sequence, e.type, e.actor_type) for e in events] == [
        (1, "run.queued", "user"), (2, "run.running", "runner"), (3, "run.failed", "runner")]
    assert events[2].detail == "detail"
    assert [e.sequence for e in await s.runs.events(P, "r1", 1, 1)] == [2]
    assert await s.runs.events("other", "r1", 0, 10) == []
    assert await s.runs.get("other", "r1") is None


async def test_a_quick_run_records_its_start_with_its_end_in_one_transition(stores: Stores):
    """`started`: the runner had not recorded the start yet (a run that ended within its
    first second); `running` comes first, at its own time, in the same transaction."""
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    await s.runs.create(run_of("t", "quick", T0), "user")
    done = await s.runs.transition("quick", 1, "succeeded", T0 + 9, "runner",
                                   RunUpdate(finished_at_ms=T0 + 9, exit_code=0),
                                   started=RunUpdate(started_at_ms=T0 + 2, pid=42, pid_start_ticks=7))
    assert (done.status, done.version, done.event_seq, done.started_at_ms, done.finished_at_ms) == (
        "succeeded", 3, 3, T0 + 2, T0 + 9)
    assert [(e.sequence, e.type, e.actor_type, e.created_at_ms) for e in await s.runs.events(P, "quick", 0, 10)] == [
        (1, "run.queued", "user", T0), (2, "run.running", "runner", T0 + 2), (3, "run.succeeded", "runner", T0 + 9)]
    # A start that is on record already cannot be recorded again: nothing of the call applies.
    await s.runs.create(run_of("t", "slow", T0 + 1), "user")
    running = await s.runs.transition("slow", 1, "running", T0 + 2, "runner", RunUpdate(started_at_ms=T0 + 2))
    assert await code_of(s.runs.transition("slow", running.version, "failed", T0 + 3, "runner", RunUpdate(),
                                           started=RunUpdate(started_at_ms=T0 + 2))) == "conflict"
    assert await s.runs.get(P, "slow") == running


async def test_runs_pages_are_keysets_newest_first(stores: Stores):
    s = stores
    for task in ("a", "b"):
        await s.tasks.create(P, task, task, spec(overlap="allow"), T0, privileged=False)
    ids = []
    for i in range(6):
        rid = f"r{i}"
        ids.append(rid)
        await s.runs.create(run_of("a" if i % 2 else "b", rid, T0 + (i // 2) * 10), "user")
    await s.runs.create(run_of("a", "x-other", T0 + 5, project="other"), "user")
    everything = await s.runs.page(P, None, None, 10)
    assert [r.id for r in everything] == ["r5", "r4", "r3", "r2", "r1", "r0"]
    first = await s.runs.page(P, None, None, 2)
    after = RunCursor(first[-1].created_at_ms, first[-1].id)
    assert [r.id for r in await s.runs.page(P, None, after, 3)] == ["r3", "r2", "r1"]
    assert [r.id for r in await s.runs.page(P, "a", None, 10)] == ["r5", "r3", "r1"]
    assert [r.id for r in await s.runs.page(P, "a", RunCursor(T0 + 10, "r3"), 10)] == ["r1"]
    assert {r.id for r in await s.runs.active()} >= set(ids) | {"x-other"}


async def test_runs_of_one_millisecond_are_in_id_order_whatever_order_they_came_in(stores: Stores):
    """The time indexes need not hold the id (SQLite's do not): ties are still id order."""
    s = stores
    await s.tasks.create(P, "a", "a", spec(overlap="allow"), T0, privileged=False)
    came = ["m3", "m9", "m1", "m7", "m5"]  # stored in this order, all at T0 + 5
    for rid in came:
        await s.runs.create(run_of("a", rid, T0 + 5), "user")
    await s.runs.create(run_of("a", "m0-later", T0 + 6), "user")
    await s.runs.create(run_of("a", "m8-earlier", T0 + 4), "user")
    newest_first = ["m0-later", "m9", "m7", "m5", "m3", "m1", "m8-earlier"]
    for task in (None, "a"):
        assert [r.id for r in await s.runs.page(P, task, None, 10)] == newest_first
        assert [r.id for r in await s.runs.page(P, task, RunCursor(T0 + 5, "m7"), 3)] == ["m5", "m3", "m1"]
        for limit in (1, 2, 64):
            assert (await _search_all(s, RunQuery(task_id=task), limit))[0] == newest_first, (task, limit)


async def _search_all(s: Stores, query: RunQuery, limit: int) -> tuple[list[str], int]:
    seen: list[str] = []
    after: RunCursor | None = None
    pages = 0
    while True:
        page = await s.runs.search(P, query, after, limit)
        pages += 1
        assert len(page.runs) <= limit
        seen += [r.id for r in page.runs]
        if page.next is None:
            return seen, pages
        after = page.next


async def test_runs_search_filters_and_pages_newest_first(stores: Stores):
    s = stores
    for task in ("a", "b"):
        await s.tasks.create(P, task, task, spec(overlap="allow"), T0, privileged=False)
    made: list[tuple[str, str, str, str, int]] = []  # id, task, status, origin, created
    plan = ["succeeded", "failed", "succeeded", "timed_out", "cancelled", "succeeded", "lost", "queued"]
    for i, status in enumerate(plan * 2):
        task, origin = ("a" if i % 3 else "b"), ("scheduled" if i % 4 else "manual")
        rid, created = f"0190{i:04d}-run", T0 + (i // 2) * 10  # two runs share each millisecond
        run = run_of(task, rid, created, origin=origin)
        if status == "queued":
            await s.runs.create(run, "user")
        else:
            await finished(s, run, status)
        made.append((rid, task, status, origin, created))
    await s.runs.create(run_of("a", "0190zzzz-theirs", T0, project="other"), "user")

    def expected(q: RunQuery) -> list[str]:
        rows = [m for m in made if (q.task_id is None or m[1] == q.task_id) and (not q.statuses or m[2] in q.statuses)
                and (not q.origins or m[3] in q.origins) and (q.since_ms is None or m[4] >= q.since_ms)
                and (q.until_ms is None or m[4] < q.until_ms)]
        return [m[0] for m in sorted(rows, key=lambda m: (m[4], m[0]), reverse=True)]

    queries = [
        RunQuery(), RunQuery(task_id="a"), RunQuery(statuses=["failed", "timed_out", "lost"]),
        RunQuery(task_id="b", statuses=["cancelled"]), RunQuery(statuses=["queued", "running"]),
        RunQuery(task_id="a", statuses=["queued"]), RunQuery(origins=["manual"]),
        RunQuery(task_id="a", origins=["manual"]), RunQuery(statuses=["succeeded"], origins=["scheduled"]),
        RunQuery(since_ms=T0 + 20, until_ms=T0 + 60), RunQuery(statuses=["failed"], since_ms=T0 + 40),
        RunQuery(task_id="nope"),
    ]
    for q in queries:
        for limit in (1, 3, 64):
            assert (await _search_all(s, q, limit))[0] == expected(q), (q, limit)
    first = await s.runs.search(P, RunQuery(), None, 2)
    assert [r.id for r in first.runs] == expected(RunQuery())[:2]
    assert first.next == RunCursor(first.runs[-1].created_at_ms, first.runs[-1].id)
    assert first.runs[0] == await s.runs.get(P, first.runs[0].id)  # whole runs
    assert (await s.runs.search(P, RunQuery(), None, 64)).next is None
    # Id prefixes: a range of ids, this project's only, ascending, at most `limit`.
    assert await s.runs.with_prefix(P, "0190001", 10) == [f"0190{i:04d}-run" for i in range(10, 16)]
    assert await s.runs.with_prefix(P, "0190001", 2) == ["01900010-run", "01900011-run"]
    assert await s.runs.with_prefix(P, "0190zzzz", 3) == [] and await s.runs.with_prefix("other", "0190z", 3) == [
        "0190zzzz-theirs"]
    assert await s.runs.with_prefix(P, "", 3) == []


async def test_runs_retention_applies_when_a_run_finishes(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    await finished(s, run_of("t", "ancient", T0 - 40 * DAY))
    await s.runs.create(run_of("t", "waiting", T0 - 40 * DAY + 1), "user")  # active: never retention's
    await finished(s, run_of("t", "fresh", T0))
    assert await s.runs.get(P, "ancient") is None
    assert await s.runs.get(P, "waiting") is not None and await s.runs.get(P, "fresh") is not None


async def test_finished_logs_are_readable_through_the_log_reader(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    run = await s.runs.create(run_of("t", "logged", T0), "user")
    assert await s.log_reader.read("logged", 0, 100) is None and await s.log_reader.tail("logged", 10) is None
    running = await s.runs.transition(run.id, 1, "running", T0 + 1, "runner", RunUpdate(started_at_ms=T0 + 1))
    sink = s.logs.create("logged", 1 << 20, [b"hunter22"])
    sink.write(b"hello hunter22 world\n" * 3)
    size = sink.close()
    await s.runs.transition(running.id, running.version, "succeeded", T0 + 2, "runner",
                            RunUpdate(finished_at_ms=T0 + 2, exit_code=0, log_bytes=size))
    whole = await s.log_reader.read("logged", 0, 1000)
    assert whole is not None and whole.data == b"hello *** world\n" * 3 and whole.total == size
    part = await s.log_reader.read("logged", 6, 3)
    assert part is not None and (part.data, part.start) == (b"***", 6)
    tail = await s.log_reader.tail("logged", 12)
    assert tail is not None and (tail.data, tail.start, tail.total) == (b"o *** world\n", size - 12, size)


async def test_a_link_in_place_of_a_log_is_never_followed_and_the_run_is_still_recorded(stores: Stores, home):
    """A privileged task can replace its own log with a link (to the pepper, say): the run
    is recorded all the same (on a cluster, its log is then not copied), and the log tools
    answer unavailable rather than show what the link names."""
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=True)
    run = await s.runs.create(run_of("t", "linked", T0), "user")
    running = await s.runs.transition(run.id, 1, "running", T0 + 1, "runner", RunUpdate(started_at_ms=T0 + 1))
    sink = s.logs.create("linked", 1 << 20, [])
    sink.write(b"out\n")
    size = sink.close()
    target = os.path.join(home, "not-a-log")
    with open(target, "wb") as f:
        f.write(b"what the link names\n")
    path = os.path.join(s.logs.directory, "linked.log")
    os.unlink(path)
    os.symlink(target, path)
    done = await s.runs.transition(running.id, running.version, "succeeded", T0 + 2, "runner",
                                   RunUpdate(finished_at_ms=T0 + 2, exit_code=0, log_bytes=size))
    assert done.status == "succeeded"
    assert await code_of(s.log_reader.read("linked", 0, 100)) == "unavailable"
    assert await code_of(s.log_reader.tail("linked", 100)) == "unavailable"
    assert os.path.islink(path) and os.path.getsize(target) == 20


# -- TriggerStore ---------------------------------------------------------------------

HOURLY = CronSpec(expression="0 * * * *", timezone="UTC")


async def test_triggers_create_page_revise_and_delete(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(), T0, privileged=False)
    made = await s.triggers.create(P, None, "t", None, HOURLY, T0 + 1)
    assert (made.id, made.revision, made.task_revision, made.enabled, made.next_fire_at_ms) == (
        "t-1", 1, 1, True, T0 + 3_600_000)
    assert (await s.triggers.create(P, None, "t", None, HOURLY, T0)).id == "t-2"
    assert await code_of(s.triggers.create(P, "t-1", "t", None, HOURLY, T0)) == "conflict"
    assert await code_of(s.triggers.create(P, "x", "nope", None, HOURLY, T0)) == "not_found"
    assert await code_of(s.triggers.create(P, "x", "t", 5, HOURLY, T0)) == "not_found"
    bad = CronSpec(expression="61 * * * *", timezone="UTC")
    assert await code_of(s.triggers.create(P, "x", "t", None, bad, T0)) == "invalid_argument"
    off = await s.triggers.set_enabled(P, "t-1", False, 1, T0 + 2)
    assert (off.revision, off.enabled, off.next_fire_at_ms) == (2, False, None)
    assert (await s.triggers.set_enabled(P, "t-1", False, None, T0 + 3)).revision == 2
    on = await s.triggers.set_enabled(P, "t-1", True, 2, T0 + 2 * 3_600_000 + 5)
    assert on.next_fire_at_ms == T0 + 3 * 3_600_000  # re-armed from now: missed while off is not missed
    assert await code_of(s.triggers.set_enabled(P, "t-1", False, 1, T0)) == "conflict"
    assert [t.id for t in await s.triggers.page(P, None, 10)] == ["t-1", "t-2"]
    assert [t.id for t in await s.triggers.page(P, "t-1", 10)] == ["t-2"]
    assert await s.triggers.get("other", "t-1") is None
    await s.triggers.delete(P, "t-2", None)
    assert await s.triggers.get(P, "t-2") is None
    assert await code_of(s.triggers.delete(P, "t-2", None)) == "not_found"
    assert await code_of(s.triggers.repin(P, "t-1", 4, None, T0)) == "not_found"


async def test_triggers_update_is_a_new_revision_that_keeps_task_pin_flag_and_events(stores: Stores):
    s = stores
    await s.admission.save_time(T0 + 10 * 3_600_000)  # the newest time on record is ahead of `now`
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    made = await s.triggers.create(P, "g", "t", None, HOURLY, T0)
    await s.tasks.update(P, "t", 1, spec(file="two", overlap="allow"), None, T0, privileged=False)
    await s.triggers.repin(P, "g", 1, None, T0)  # pinned back to revision 1
    before = await s.triggers.get(P, "g")
    assert before is not None and before.task_revision == 1
    await s.admission.admit_fires(P, "g", T0 + 20 * 3_600_000, 30_000, _rng)  # missed fires: an event
    events = await s.triggers.events(P, "g", None, 10)
    assert events
    head = await s.triggers.get(P, "g")
    assert head is not None
    daily = CronSpec(expression="30 4 * * *", timezone="Europe/Berlin", misfire="fire_once", jitter_s=90)
    assert await code_of(s.triggers.update(P, "g", daily, head.revision + 1, T0)) == "conflict"
    assert await code_of(s.triggers.update(P, "nope", daily, None, T0)) == "not_found"
    bad = CronSpec(expression="61 * * * *", timezone="UTC")
    assert await code_of(s.triggers.update(P, "g", bad, None, T0)) == "invalid_argument"
    assert await code_of(s.triggers.update(P, "g", CronSpec(expression="0 * * * *", timezone="Mars/Base"), None,
                                           T0)) == "invalid_argument"
    now = T0 + 21 * 3_600_000
    new = await s.triggers.update(P, "g", daily, head.revision, now)
    assert (new.revision, new.spec, new.task_id, new.task_revision, new.enabled) == (
        head.revision + 1, daily, "t", 1, True)
    assert new.content_digest != head.content_digest and new.updated_at_ms == now
    # Re-armed for the new schedule from the newest time on record: the next 04:30 in Berlin.
    mark = max(now, T0 + 20 * 3_600_000)
    assert new.next_fire_at_ms == daily.schedule().next_after(mark)
    assert [e.id for e in await s.triggers.events(P, "g", None, 10)] == [e.id for e in events]
    same = await s.triggers.update(P, "g", daily, None, now + 1)
    assert same == new  # the same spec changes nothing
    # A disabled trigger takes a new schedule and stays disabled, unarmed.
    off = await s.triggers.set_enabled(P, "g", False, None, now + 2)
    later = await s.triggers.update(P, "g", HOURLY, off.revision, now + 3)
    assert (later.enabled, later.next_fire_at_ms, later.spec) == (False, None, HOURLY)
    assert made.created_at_ms == later.created_at_ms


async def test_a_reboot_trigger_given_a_new_schedule_waits_for_the_next_boot(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    await s.triggers.create(P, "r", "t", None, REBOOT, T0)
    assert await s.admission.arm_boot(P, "boot-1", T0 + 5) == 1
    hourly = await s.triggers.update(P, "r", HOURLY, None, T0 + 6)
    assert hourly.next_fire_at_ms == T0 + 3_600_000
    assert await s.admission.armed(P) == [(T0 + 3_600_000, "r")]  # the boot's fire went with the old schedule
    back = await s.triggers.update(P, "r", REBOOT, None, T0 + 7)
    assert back.next_fire_at_ms is None and await s.admission.armed(P) == []
    assert (await s.admission.admit_fires(P, "r", T0 + 8, 30_000, _rng)).runs == []


# -- RunAdmission ---------------------------------------------------------------------

EVERY_MINUTE = CronSpec(expression="* * * * *", timezone="UTC")


def _rng() -> float:
    return 0.5


async def test_admission_admits_a_due_fire_once(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    trig = await s.triggers.create(P, "m", "t", None, EVERY_MINUTE, T0)
    assert await s.admission.armed(P) == [(T0 + 60_000, "m")]
    early = await s.admission.admit_fires(P, "m", T0 + 59_000, 30_000, _rng)
    assert (early.runs, early.cursor) == ([], T0 + 60_000)
    due = await s.admission.admit_fires(P, "m", T0 + 60_010, 30_000, _rng)
    assert len(due.runs) == 1 and due.cursor == T0 + 120_000
    run = due.runs[0]
    assert (run.status, run.origin, run.scheduled_for_ms, run.trigger_id, run.trigger_revision) == (
        "queued", "scheduled", T0 + 60_000, "m", trig.revision)
    assert run.idempotency_key == f"cron:m:{trig.revision}:{T0 + 60_000}"
    again = await s.admission.admit_fires(P, "m", T0 + 60_020, 30_000, _rng)
    assert again.runs == [] and again.cursor == T0 + 120_000
    assert len(await s.runs.page(P, "t", None, 10)) == 1
    assert (await s.admission.admit_fires(P, "gone", T0, 30_000, _rng)).gone


async def test_a_fire_of_each_project_is_its_own_run(stores: Stores):
    """Two projects, each with a trigger `m` of the same revision and schedule: the same fire
    is a run in each (its run is named by the project and the fire), and once in each."""
    s = stores
    for project in (P, "other"):
        await s.tasks.create(project, "t", "T", spec(overlap="allow"), T0, privileged=False)
        await s.triggers.create(project, "m", "t", None, EVERY_MINUTE, T0)
    due = {project: await s.admission.admit_fires(project, "m", T0 + 60_010, 30_000, _rng) for project in (P, "other")}
    runs = {project: admitted.runs for project, admitted in due.items()}
    assert [len(r) for r in runs.values()] == [1, 1], runs
    mine, theirs = runs[P][0], runs["other"][0]
    assert mine.id != theirs.id and mine.idempotency_key == theirs.idempotency_key == f"cron:m:1:{T0 + 60_000}"
    assert (mine.project_id, theirs.project_id) == (P, "other")
    for project in (P, "other"):
        assert (await s.admission.admit_fires(project, "m", T0 + 60_020, 30_000, _rng)).runs == []
        kept = await s.runs.page(project, "t", None, 10)
        assert [r.idempotency_key for r in kept] == [f"cron:m:1:{T0 + 60_000}"]


async def test_admission_misfires_overlap_disabled_and_queue_bound(stores: Stores):
    s = stores
    await s.tasks.create(P, "f", "F", spec(), T0, privileged=False)
    await s.triggers.create(P, "late", "f", None, EVERY_MINUTE, T0)
    late = await s.admission.admit_fires(P, "late", T0 + 10 * 60_000 + 1000, 30_000, _rng)
    assert [r.scheduled_for_ms for r in late.runs] == [T0 + 10 * 60_000]  # within the grace; nine missed
    events = await s.triggers.events(P, "late", None, 10)
    assert [(e.type, e.reason, e.fires) for e in events] == [("skipped", "misfire", 9)]
    overlap = await s.admission.admit_fires(P, "late", T0 + 11 * 60_000 + 1000, 30_000, _rng)
    assert overlap.runs == []
    assert (await s.triggers.events(P, "late", None, 1))[0].reason == "overlap"
    blocking = late.runs[0]
    task = await s.tasks.get(P, "f")
    assert task is not None
    assert await code_of(s.admission.admit_manual(task, "user", T0 + 11 * 60_000)) == "conflict"
    await s.runs.transition(blocking.id, blocking.version, "cancelled", T0 + 11 * 60_000, "user", RunUpdate())
    manual = await s.admission.admit_manual(task, "user", T0 + 11 * 60_000 + 5)
    assert (manual.run.origin, manual.run.status, manual.replaces) == ("manual", "queued", [])
    await s.tasks.create(P, "q", "Q", spec(overlap="allow"), T0, privileged=False)
    qtask = await s.tasks.get(P, "q")
    assert qtask is not None
    s.admission.set_capacity(1)
    assert await code_of(s.admission.admit_manual(qtask, "user", T0 + 12 * 60_000)) == "resource_exhausted"
    s.admission.set_capacity(34)
    off = await s.tasks.set_enabled(P, "q", False, None, T0 + 12 * 60_000)
    assert await code_of(s.admission.admit_manual(off, "user", T0 + 12 * 60_000)) == "conflict"


async def test_admission_says_which_fires_it_skipped_or_refused(stores: Stores):
    """Admission.skipped: what the scheduler logs, as the trigger events record it."""
    s = stores
    await s.tasks.create(P, "f", "F", spec(), T0, privileged=False)
    await s.triggers.create(P, "late", "f", None, EVERY_MINUTE, T0)
    late = await s.admission.admit_fires(P, "late", T0 + 10 * 60_000 + 1000, 30_000, _rng)
    assert late.skipped == [SkippedFires("f", "skipped", "misfire", T0 + 60_000, T0 + 9 * 60_000, 9)]
    overlap = await s.admission.admit_fires(P, "late", T0 + 11 * 60_000 + 1000, 30_000, _rng)
    assert overlap.skipped == [SkippedFires("f", "skipped", "overlap", T0 + 11 * 60_000, T0 + 11 * 60_000, 1)]
    quiet = await s.admission.admit_fires(P, "late", T0 + 11 * 60_000 + 2000, 30_000, _rng)
    assert quiet.skipped == [] and quiet.runs == []
    await s.tasks.create(P, "once", "O", spec(), T0, privileged=False)
    await s.admission.save_time(T0 + 12 * 60_000)
    await s.triggers.create(P, "o", "once", None, ONCE, T0 + 12 * 60_000)
    await s.tasks.set_enabled(P, "once", False, None, T0 + 12 * 60_000)
    shot = await s.admission.admit_fires(P, "o", T0 + 12 * 60_000 + 5, 30_000, _rng)
    assert shot.skipped == [SkippedFires("once", "skipped", "task_disabled", T0 + 12 * 60_000 + 5,
                                         T0 + 12 * 60_000 + 5, 1)]
    assert [(e.type, e.reason) for e in await s.triggers.events(P, "o", None, 5)] == [("skipped", "task_disabled")]


async def test_restamp_moves_what_was_stamped_while_the_clock_was_behind(stores: Stores):
    """The clock jumped by DAY: the times in (after, upto] of runs, their events and the
    audit move by as much, before any later call; the clock mark follows."""
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    await finished(s, run_of("t", "before", T0))  # T0 .. T0 + 15: earlier than the hold
    await finished(s, run_of("t", "held", T0 + 200))  # T0 + 200 .. T0 + 215
    await s.runs.create(run_of("t", "waiting", T0 + 400), "user")  # never started: its start stays unset
    await finished(s, run_of("t", "across", T0 + 990))  # started at the clock's setting, ended after it
    for at in (T0 + 50, T0 + 300):
        await s.audit.append(AuditRecord(at_ms=at, project_id=P, principal="uid:0", tool="qledge.status",
                                         outcome="allowed", reasons=[], transport="socket"))
    s.admission.restamp(T0 + 100, T0 + 1000, DAY)
    held = await s.runs.get(P, "held")  # the very next call sees it
    assert held is not None and (held.created_at_ms, held.started_at_ms, held.finished_at_ms) == (
        T0 + 200 + DAY, T0 + 210 + DAY, T0 + 215 + DAY)
    assert [e.created_at_ms for e in await s.runs.events(P, "held", 0, 5)] == [
        T0 + 200 + DAY, T0 + 210 + DAY, T0 + 215 + DAY]
    waiting = await s.runs.get(P, "waiting")
    assert waiting is not None and (waiting.created_at_ms, waiting.started_at_ms) == (T0 + 400 + DAY, None)
    before = await s.runs.get(P, "before")
    assert before is not None and (before.created_at_ms, before.finished_at_ms) == (T0, T0 + 15)
    audited = (await s.audit_reader.page(P, None, None, 10)).entries
    assert [e.at_ms for e in audited] == [T0 + 300 + DAY, T0 + 50]
    assert await s.admission.newest_time(P) >= T0 + 1000 + DAY
    across = await s.runs.get(P, "across")
    assert across is not None and (across.created_at_ms, across.started_at_ms, across.finished_at_ms) == (
        T0 + 990 + DAY, T0 + 1000 + DAY, T0 + 1005)
    assert [e.created_at_ms for e in await s.runs.events(P, "across", 0, 5)] == [
        T0 + 990 + DAY, T0 + 1000 + DAY, T0 + 1005]
    assert [e.created_at_ms for e in await s.runs.events(P, "before", 0, 5)] == [T0, T0 + 10, T0 + 15]
    assert [r.id for r in await s.runs.page(P, "t", None, 5)] == ["across", "waiting", "held", "before"]


async def test_admission_replace_names_the_runs_it_replaces(stores: Stores):
    s = stores
    task = await s.tasks.create(P, "r", "R", spec(overlap="replace"), T0, privileged=False)
    first = await s.admission.admit_manual(task, "user", T0)
    second = await s.admission.admit_manual(task, "user", T0 + 1)
    assert second.replaces == [first.run.id]


async def test_clock_mark_is_the_newest_time_on_record(stores: Stores):
    s = stores
    await s.admission.save_time(T0)
    await s.admission.save_time(T0 - 5)  # never lowers it
    assert await s.admission.newest_time(P) == T0
    await s.audit.append(AuditRecord(at_ms=T0 + 77, project_id=P, principal="uid:0", tool="qledge.status",
                                     outcome="allowed", reasons=["tool_invocation_allowed"], transport="socket"))
    assert await s.admission.newest_time(P) == T0 + 77


REBOOT = CronSpec(expression="@reboot", timezone="UTC")
ONCE = CronSpec(expression="@once", timezone="UTC")


async def test_once_fires_once_then_disables_itself(stores: Stores):
    s = stores
    await s.admission.save_time(T0)
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    trig = await s.triggers.create(P, "o", "t", None, ONCE, T0 - 5)
    assert trig.next_fire_at_ms == T0  # due at once: at the newest time on record
    assert (T0, "o") in await s.admission.armed(P)
    early = await s.admission.admit_fires(P, "o", T0 - 1, 30_000, _rng)
    assert (early.runs, early.cursor) == ([], T0)
    fired = await s.admission.admit_fires(P, "o", T0 + 10, 30_000, _rng)
    [run] = fired.runs
    assert (run.idempotency_key, run.scheduled_for_ms, run.origin, fired.cursor) == (
        "once:o:1", T0 + 10, "scheduled", None)
    head = await s.triggers.get(P, "o")
    assert head is not None and (head.enabled, head.revision, head.next_fire_at_ms) == (False, 2, None)
    assert "o" not in [t for _, t in await s.admission.armed(P)]
    assert (await s.admission.admit_fires(P, "o", T0 + 20, 30_000, _rng)).runs == []
    on = await s.triggers.set_enabled(P, "o", True, None, T0 + 30)  # enabling it again: one more shot
    assert (on.revision, on.next_fire_at_ms) == (3, T0 + 30)
    [again] = (await s.admission.admit_fires(P, "o", T0 + 40, 30_000, _rng)).runs
    assert again.idempotency_key == "once:o:3"
    assert len(await s.runs.page(P, "t", None, 10)) == 2
    # A fire the task cannot take spends the shot too, and is recorded.
    await s.tasks.create(P, "off", "Off", spec(), T0, privileged=False)
    await s.tasks.set_enabled(P, "off", False, None, T0)
    await s.triggers.create(P, "o2", "off", None, ONCE, T0 + 50)
    assert (await s.admission.admit_fires(P, "o2", T0 + 60, 30_000, _rng)).runs == []
    [event] = await s.triggers.events(P, "o2", None, 10)
    assert (event.type, event.reason, event.scheduled_for_ms) == ("skipped", "task_disabled", T0 + 60)
    spent = await s.triggers.get(P, "o2")
    assert spent is not None and not spent.enabled


async def test_reboot_is_armed_once_per_boot_and_fires_once(stores: Stores):
    s = stores
    await s.tasks.create(P, "t", "T", spec(overlap="allow"), T0, privileged=False)
    await s.tasks.create(P, "f", "F", spec(), T0, privileged=False)
    trig = await s.triggers.create(P, "r", "t", None, REBOOT, T0)
    assert trig.next_fire_at_ms is None and await s.admission.armed(P) == []  # waits for the next boot
    assert (await s.triggers.set_enabled(P, "r", True, None, T0 + 1)).revision == 1  # enabled, armed or not
    await s.triggers.create(P, "off", "t", None, REBOOT, T0)
    await s.triggers.set_enabled(P, "off", False, None, T0)
    await s.triggers.create(P, "busy", "f", None, REBOOT, T0)
    await s.triggers.create(P, "h", "t", None, HOURLY, T0)
    assert await s.admission.arm_boot(P, "boot-1", T0 + 5) == 2  # r and busy; never a disabled one
    assert await s.admission.arm_boot(P, "boot-1", T0 + 6) == 0  # a daemon restart within the boot
    armed = await s.admission.armed(P)
    assert [a for a in armed if a[1] != "h"] == [(T0 + 5, "busy"), (T0 + 5, "r")]
    early = await s.admission.admit_fires(P, "r", T0 + 4, 30_000, _rng)
    assert (early.runs, early.cursor) == ([], T0 + 5)
    fired = await s.admission.admit_fires(P, "r", T0 + 7, 30_000, _rng)
    [run] = fired.runs
    assert (run.idempotency_key, run.scheduled_for_ms, run.trigger_id, fired.cursor) == (
        "boot:r:boot-1", T0 + 7, "r", None)
    assert (await s.admission.admit_fires(P, "r", T0 + 8, 30_000, _rng)).runs == []
    # Through the gates like any fire: a forbid task with a run active skips it.
    ftask = await s.tasks.get(P, "f")
    assert ftask is not None
    await s.admission.admit_manual(ftask, "user", T0 + 6)
    assert (await s.admission.admit_fires(P, "busy", T0 + 9, 30_000, _rng)).runs == []
    [event] = await s.triggers.events(P, "busy", None, 10)
    assert (event.type, event.reason) == ("skipped", "overlap")
    assert [t for _, t in await s.admission.armed(P)] == ["h"]
    # The next boot fires once more; a trigger disabled after its boot armed it does not.
    assert await s.admission.arm_boot(P, "boot-2", T0 + 100) == 2
    [second] = (await s.admission.admit_fires(P, "r", T0 + 100, 30_000, _rng)).runs
    assert second.idempotency_key == "boot:r:boot-2"
    assert await s.admission.arm_boot(P, "boot-3", T0 + 200) == 2
    await s.triggers.set_enabled(P, "r", False, None, T0 + 201)
    assert (await s.admission.admit_fires(P, "r", T0 + 202, 30_000, _rng)).runs == []
    assert "r" not in [t for _, t in await s.admission.armed(P)]
    await s.triggers.set_enabled(P, "r", True, None, T0 + 203)  # enabled during a boot: the next one
    assert (await s.admission.admit_fires(P, "r", T0 + 204, 30_000, _rng)).runs == []
    assert [r.idempotency_key for r in await s.runs.page(P, "t", None, 10)] == ["boot:r:boot-2", "boot:r:boot-1"]



async def test_a_one_shot_or_boot_fire_of_each_project_is_its_own_run(stores: Stores):
    """Two projects, each with an `@once` trigger `o` and an `@reboot` trigger `r` of the same
    ids and revisions: each shot is a run in each project (their keys are unique within a
    project, not across them), and once in each."""
    s = stores
    await s.admission.save_time(T0)
    for project in (P, "other"):
        await s.tasks.create(project, "t", "T", spec(overlap="allow"), T0, privileged=False)
        await s.triggers.create(project, "o", "t", None, ONCE, T0)
        await s.triggers.create(project, "r", "t", None, REBOOT, T0)
        assert await s.admission.arm_boot(project, "boot-1", T0 + 5) == 1
    for trig, key in (("o", "once:o:1"), ("r", "boot:r:boot-1")):
        for project in (P, "other"):
            [run] = (await s.admission.admit_fires(project, trig, T0 + 10, 30_000, _rng)).runs
            assert (run.project_id, run.idempotency_key) == (project, key)
    for project in (P, "other"):
        assert sorted(r.idempotency_key or "" for r in await s.runs.page(project, "t", None, 10)) == [
            "boot:r:boot-1", "once:o:1"]


# -- retries (RunStore.transition, RunAdmission) ----------------------------------------


async def test_a_failed_run_gets_its_retry_due_and_any_admission_admits_it_once(stores: Stores):
    s = stores
    heard: list[tuple[str, int]] = []
    s.followers.retry = lambda run_id, due: heard.append((run_id, due))
    retried = TaskSpec(command=ArgvCommand(file="false"), retry=RetryPolicy(count=1, delay_s=10))
    await s.tasks.create(P, "t", "T", retried, T0, privileged=False)
    failed = await finished(s, run_of("t", "r1", T0), "failed")
    due = T0 + 15 + 10_000  # finished at T0 + 15
    assert (failed.retry_due_at_ms, failed.attempt, heard) == (due, 1, [("r1", due)])
    assert (await s.runs.events(P, "r1", 0, 10))[-1].type == "run.retry_scheduled"
    assert await s.admission.armed_retries(P) == [(due, "r1")]
    early = await s.admission.admit_retry(P, "r1", due - 1)
    assert (early.runs, early.cursor, early.gone) == ([], due, False)
    admitted = await s.admission.admit_retry(P, "r1", due)
    (retry,) = admitted.runs
    assert (retry.origin, retry.retry_of, retry.attempt, retry.status, retry.idempotency_key) == (
        "retry", "r1", 2, "queued", "retry:r1")
    assert await s.admission.armed_retries(P) == []
    assert (await s.admission.admit_retry(P, "r1", due + 1)).gone  # once
    stored = await s.runs.get(P, retry.id)
    assert stored is not None and (stored.retry_of, stored.attempt) == ("r1", 2)
    running = await s.runs.transition(retry.id, retry.version, "running", due + 1, "runner", RunUpdate())
    spent = await s.runs.transition(retry.id, running.version, "timed_out", due + 2, "runner",
                                    RunUpdate(finished_at_ms=due + 2))
    assert spent.retry_due_at_ms is None  # its one retry is spent
    for status in ("cancelled", "lost", "succeeded"):
        assert (await finished(s, run_of("t", f"n-{status}", T0 + 50), status)).retry_due_at_ms is None


async def test_a_retry_the_gates_refuse_is_on_record_and_not_tried_again(stores: Stores):
    s = stores
    retried = TaskSpec(command=ArgvCommand(file="false"), retry=RetryPolicy(count=2, delay_s=1))
    await s.tasks.create(P, "t", "T", retried, T0, privileged=False)
    failed = await finished(s, run_of("t", "r1", T0), "failed")
    await s.runs.create(run_of("t", "blocker", T0 + 100), "user")  # forbid: an active run of the task
    assert failed.retry_due_at_ms is not None
    refused = await s.admission.admit_retry(P, "r1", failed.retry_due_at_ms + 5)
    assert (refused.runs, refused.cursor) == ([], None)
    last = (await s.runs.events(P, "r1", 0, 10))[-1]
    assert (last.type, last.detail) == ("run.retry_skipped", "overlap")
    assert await s.admission.armed_retries(P) == []
    assert (await s.admission.admit_retry(P, "r1", failed.retry_due_at_ms + 10)).gone


# -- notifications (RunStore.transition queues, NotifyStore delivers) ---------------------


def _notifying(on: list[str], channels: tuple[str, ...] = ("hook",), overlap: str = "forbid") -> TaskSpec:
    return TaskSpec(command=ArgvCommand(file="false"), overlap=overlap,  # type: ignore[arg-type]
                    notify=[NotifyRule(channels=list(channels), on=on)])  # type: ignore[arg-type]


async def test_a_finished_run_queues_one_message_per_channel_its_rules_name(stores: Stores):
    s = stores
    assert s.notify is not None
    n = s.notify()
    told: list[int] = []
    s.followers.notify = lambda: told.append(1)
    row, status = await n.set_channel(P, "hook", "webhook", '{"kind":"webhook","url":"http://127.0.0.1:9/"}', T0)
    assert (status, row.kind, row.created_at_ms) == ("created", "webhook", T0)
    assert (await n.set_channel(P, "hook", "webhook", row.spec, T0 + 1, create_only=True))[1] == "exists"
    assert (await n.set_channel(P, "hook", "webhook", row.spec, T0 + 2))[1] == "updated"
    await n.set_channel("other", "theirs", "webhook", row.spec, T0)
    assert [c.name for c in await n.channels(P)] == ["hook"]
    assert await s.runs.notices_waiting(P) is False
    await s.tasks.create(P, "t", "Backup", _notifying(["failure", "recovery"], ("hook", "nowhere"), "allow"), T0,
                         privileged=False)
    await finished(s, run_of("t", "ok0", T0), "succeeded")  # no failure before: no recovery
    await finished(s, run_of("t", "f1", T0 + 100), "failed")
    await finished(s, run_of("t", "f2", T0 + 200), "failed")  # joins the untried message
    assert told and await s.runs.notices_waiting(P) is True
    (pending,) = await n.due(P, T0 + 1000, 10, 60_000)
    assert (pending.channel, pending.event, pending.task_name, pending.run_id, pending.count, pending.status,
            pending.exit_code, pending.kind) == ("hook", "failure", "Backup", "f2", 2, "failed", 1, "webhook")
    assert pending.first_at_ms == T0 + 115 and pending.duration_ms == 5
    dropped = [r for r in await n.log(P, None, 10) if r.channel == "nowhere"]
    assert [(r.state, r.last_error) for r in dropped] == [("dropped", "no channel named 'nowhere'")] * 2
    # Claimed: no other caller gets it, nothing joins it; a new failure is a message of its own.
    assert await n.due(P, T0 + 1000, 10, 60_000) == []
    await finished(s, run_of("t", "f3", T0 + 300), "failed")
    (third,) = await n.due(P, T0 + 1000, 10, 60_000)
    assert (third.run_id, third.count) == ("f3", 1)
    await n.release(P, [third.id], T0 + 1000)
    assert [x.id for x in await n.due(P, T0 + 1000, 10, 60_000)] == [third.id]
    await n.record(P, [NoticeOutcome(id=pending.id, ok=True, detail=None, elapsed_ms=40),
                       NoticeOutcome(id=third.id, ok=False, detail="HTTP 502", elapsed_ms=7, retry_at_ms=T0 + 5000)],
                   T0 + 1001)
    assert await n.next_due(P, T0 + 1001) == T0 + 5000
    log = {r.id: r for r in await n.log(P, None, 10)}
    assert (log[pending.id].state, log[pending.id].attempts, log[pending.id].tries[0].ok) == ("sent", 1, True)
    assert (log[third.id].state, log[third.id].last_error) == ("pending", "HTTP 502")
    (health,) = await n.health(P)
    assert (health.channel, health.failures, health.last_error, health.last_ok_at_ms) == ("hook", 1, "HTTP 502",
                                                                                           T0 + 1001)
    assert await n.recent_attempts(P, T0) == [("hook", T0 + 1001), ("hook", T0 + 1001)]
    # The first success after the final failures: a recovery.
    await finished(s, run_of("t", "ok1", T0 + 400), "succeeded")
    events = [r.event for r in await n.log(P, None, 20) if r.channel == "hook"]
    assert events.count("recovery") == 1


async def test_summaries_claims_of_an_earlier_life_tests_and_rules(stores: Stores):
    s = stores
    assert s.notify is not None
    n = s.notify()
    spec_json = '{"kind":"webhook","url":"http://127.0.0.1:9/"}'
    await n.set_channel(P, "hook", "webhook", spec_json, T0)
    assert await n.rules(P) is None
    await n.set_rules(P, [NotifyRule(channels=["hook"], on=["lost", "skipped"])], T0)
    assert await n.rules(P) == [NotifyRule(channels=["hook"], on=["lost", "skipped"])]
    await s.tasks.create(P, "a", "A", spec(overlap="allow"), T0, privileged=False)
    await s.tasks.create(P, "b", "B", spec(overlap="allow"), T0, privileged=False)
    await finished(s, run_of("a", "la", T0), "lost")
    await finished(s, run_of("b", "lb", T0), "lost")
    await finished(s, run_of("b", "fb", T0 + 10), "failed")  # not a rule's event
    claimed = await n.due(P, T0 + 100, 10, 60_000)
    assert sorted((x.task_id, x.event) for x in claimed) == [("a", "lost"), ("b", "lost")]
    summary = await n.merge(P, [x.id for x in claimed], "hook", "a: lost\nb: lost", 2, T0 + 100, 60_000)
    assert await n.due(P, T0 + 100, 10, 60_000) == []  # the summary is the caller's, claimed
    assert await n.recover(P, T0 + 200) == 1  # a daemon that stopped while delivering: due again
    (again,) = await n.due(P, T0 + 200, 10, 60_000)
    assert (again.id, again.event, again.count, again.detail) == (summary, "summary", 2, "a: lost\nb: lost")
    states = {r.id: (r.state, r.merged_into) for r in await n.log(P, None, 10)}
    assert sorted(v for k, v in states.items() if k != summary) == [("merged", summary), ("merged", summary)]
    test_id = await n.enqueue_test(P, "hook", T0 + 300)
    assert [x.id for x in await n.due(P, T0 + 300, 10, 60_000)] == [test_id]
    assert await code_of(n.enqueue_test(P, "nope", T0)) == "not_found"
    await n.set_rules(P, None, T0 + 400)
    assert await n.rules(P) is None
    assert await n.delete_channel(P, "hook") and not await n.delete_channel(P, "hook")


async def test_a_skipped_fire_queues_a_skipped_message(stores: Stores):
    s = stores
    assert s.notify is not None
    n = s.notify()
    await n.set_channel(P, "hook", "webhook", '{"kind":"webhook","url":"http://127.0.0.1:9/"}', T0)
    await s.tasks.create(P, "f", "F", _notifying(["skipped"]), T0, privileged=False)
    await s.triggers.create(P, "m", "f", None, EVERY_MINUTE, T0)
    first = await s.admission.admit_fires(P, "m", T0 + 60_010, 30_000, _rng)
    assert len(first.runs) == 1 and first.notified == 0
    blocked = await s.admission.admit_fires(P, "m", T0 + 120_010, 30_000, _rng)  # forbid: the first is active
    assert blocked.runs == [] and blocked.notified == 1
    again = await s.admission.admit_fires(P, "m", T0 + 180_010, 30_000, _rng)  # the same event, merged: no news
    assert again.notified == 0
    (message,) = await n.due(P, T0 + 200_000, 10, 60_000)
    assert (message.event, message.task_id, message.detail, message.run_id) == ("skipped", "f", "overlap", None)


async def test_repeated_failures_are_damped_until_a_recovery(stores: Stores):
    """NotifyStore.due with damping: a task's first failure on a channel goes; the next
    waits, unclaimed, for the streak's reminder (later failures join it) and then goes with
    the streak; a message handed out before goes as it was; a recovery carries the streak,
    folds in what still waits, and ends it; a new spell starts afresh."""
    from edge.core.ports.notify import Damping

    s = stores
    assert s.notify is not None
    n = s.notify()
    damping = Damping(first_ms=600_000, factor=2.0, max_ms=3_600_000)
    assert [damping.interval(k) for k in range(4)] == [600_000, 1_200_000, 2_400_000, 3_600_000]
    await n.set_channel(P, "hook", "webhook", '{"kind":"webhook","url":"http://127.0.0.1:9/"}', T0)
    await s.tasks.create(P, "t", "T", _notifying(["failure", "recovery"], overlap="allow"), T0, privileged=False)
    await finished(s, run_of("t", "f1", T0), "failed")
    (first,) = await n.due(P, T0 + 100, 10, 60_000, damping)
    assert (first.event, first.streak) == ("failure", None)
    await n.record(P, [NoticeOutcome(id=first.id, ok=True, detail=None, elapsed_ms=1)], T0 + 110)
    await finished(s, run_of("t", "f2", T0 + 1000), "failed")
    await finished(s, run_of("t", "f3", T0 + 2000), "failed")  # joins the one waiting
    assert await n.due(P, T0 + 3000, 10, 60_000, damping) == []  # a repeat: it waits
    assert await n.next_due(P, T0 + 3000) == T0 + 100 + 600_000
    (reminder,) = await n.due(P, T0 + 100 + 600_000, 10, 60_000, damping)
    assert reminder.count == 2 and reminder.streak is not None
    assert (reminder.streak.failures, reminder.streak.since_ms) == (3, first.first_at_ms)
    assert reminder.streak.next_at_ms == T0 + 100 + 600_000 + 1_200_000
    await n.release(P, [reminder.id], T0 + 700_000)  # not tried: handed out again as it was
    (again,) = await n.due(P, T0 + 700_000, 10, 60_000, damping)
    assert (again.id, again.streak) == (reminder.id, reminder.streak)
    await n.record(P, [NoticeOutcome(id=again.id, ok=True, detail=None, elapsed_ms=1)], T0 + 700_010)
    await finished(s, run_of("t", "f4", T0 + 800_000), "failed")  # waits for the next reminder
    await finished(s, run_of("t", "ok", T0 + 900_000), "succeeded")
    (recovery,) = await n.due(P, T0 + 900_100, 10, 60_000, damping)
    assert recovery.event == "recovery" and recovery.streak is not None
    assert (recovery.streak.failures, recovery.streak.next_at_ms) == (4, None)
    states = {r.run_id: r.state for r in await n.log(P, None, 20) if r.channel == "hook"}
    assert states["f4"] == "merged"
    assert await n.next_due(P, T0 + 900_100) == T0 + 900_100 + 60_000  # only the recovery's claim: no reminder
    await n.record(P, [NoticeOutcome(id=recovery.id, ok=True, detail=None, elapsed_ms=1)], T0 + 900_200)
    await finished(s, run_of("t", "f5", T0 + 1_000_000), "failed")  # a new spell: it goes at once
    (fresh,) = await n.due(P, T0 + 1_000_100, 10, 60_000, damping)
    assert (fresh.run_id, fresh.streak) == ("f5", None)
    # Without damping, the same store hands every failure out.
    await n.record(P, [NoticeOutcome(id=fresh.id, ok=True, detail=None, elapsed_ms=1)], T0 + 1_000_200)
    await finished(s, run_of("t", "f6", T0 + 1_100_000), "failed")
    assert [x.run_id for x in await n.due(P, T0 + 1_100_100, 10, 60_000)] == ["f6"]


# -- imports --------------------------------------------------------------------------


def imported(key: str, task_id: str, *triggers: ImportTrigger, enabled: bool = True, file: str = "true",
             name: str | None = None) -> ImportTask:
    return ImportTask(key=key, task_id=task_id, spec=spec(file=file), name=name, enabled=enabled,
                      triggers=list(triggers))


def crons(item: ImportTask) -> list[CronSpec]:
    return [CronSpec(expression=t.expression, timezone=t.timezone or "UTC", misfire=t.misfire) for t in item.triggers]


async def test_import_task_creates_once_per_key_at_a_free_id(stores: Stores):
    s = stores
    await s.tasks.create(P, "backup", "mine", spec(), T0, privileged=False)
    item = imported("crontab:root:3", "backup", ImportTrigger(expression="0 3 * * *"),
                    ImportTrigger(expression="@once", enabled=False), file="backup.sh", name="Backup")
    made = await s.tasks.import_task(P, item, crons(item), T0 + 1, privileged=False)
    assert made == ImportedTask(key="crontab:root:3", status="created", task_id="backup-2",
                                trigger_ids=["backup-2-1", "backup-2-2"])
    task = await s.tasks.get(P, "backup-2")
    assert task is not None and isinstance(task.spec.command, ArgvCommand)
    assert (task.name, task.enabled, task.revision, task.spec.command.file) == ("Backup", True, 1, "backup.sh")
    daily, once = [await s.triggers.get(P, t) for t in made.trigger_ids]
    assert daily is not None and (daily.enabled, daily.next_fire_at_ms) == (True, T0 + 19 * 3_600_000)
    assert once is not None and (once.enabled, once.next_fire_at_ms, once.spec.expression) == (False, None, "@once")
    # The same key again creates nothing, whatever it now says.
    changed = imported("crontab:root:3", "other", file="changed.sh")
    assert await s.tasks.import_task(P, changed, [], T0 + 2, privileged=False) == ImportedTask(
        key="crontab:root:3", status="exists", task_id="backup-2", trigger_ids=["backup-2-1", "backup-2-2"])
    assert [t.id for t in await s.tasks.page(P, None, 10)] == ["backup", "backup-2"]
    off = imported("ql:cron:7", "off", enabled=False)
    assert (await s.tasks.import_task(P, off, [], T0 + 3, privileged=False)).trigger_ids == []
    assert (await s.tasks.get(P, "off")).enabled is False  # type: ignore[union-attr]
    # A spec that cannot be scheduled: nothing at all, record included.
    bad = imported("ql:cron:8", "bad", ImportTrigger(expression="61 * * * *"))
    assert await code_of(s.tasks.import_task(P, bad, crons(bad), T0 + 4, privileged=False)) == "invalid_argument"
    assert await s.tasks.get(P, "bad") is None
    assert await s.tasks.imports(P, None, 10) == [
        ImportRecord(key="crontab:root:3", kind="task", target="backup-2", created_at_ms=T0 + 1),
        ImportRecord(key="ql:cron:7", kind="task", target="off", created_at_ms=T0 + 3)]
    assert [r.key for r in await s.tasks.imports(P, "crontab:root:3", 10)] == ["ql:cron:7"]
    assert [r.key for r in await s.tasks.imports(P, None, 1)] == ["crontab:root:3"]
    assert await s.tasks.imports("other", None, 10) == []
    # The record goes with its task: importing again creates it again.
    await s.tasks.delete(P, "backup-2", None, True)
    assert [r.key for r in await s.tasks.imports(P, None, 10)] == ["ql:cron:7"]
    assert await s.triggers.get(P, "backup-2-1") is None
    again = await s.tasks.import_task(P, item, crons(item), T0 + 5, privileged=False)
    assert (again.status, again.task_id) == ("created", "backup-2")
    other = await s.tasks.import_task("other", item, crons(item), T0 + 6, privileged=False)
    assert (other.status, other.task_id) == ("created", "backup")  # per project


async def test_import_secret_never_replaces_a_value(stores: Stores):
    s = stores
    await s.secrets.set(P, "TOKEN", "mine", T0)
    assert await s.secrets.import_secret(P, "ql:env:TOKEN", "TOKEN", "theirs", T0 + 1) == "taken"
    assert await s.secrets.resolve(P, ["TOKEN"]) == {"TOKEN": "mine"}
    assert await s.tasks.imports(P, None, 10) == []  # taken: no record, so a later import may try again
    assert await s.secrets.import_secret(P, "ql:env:A", "A", "one", T0 + 2) == "created"
    assert await s.secrets.import_secret(P, "ql:env:A", "A", "two", T0 + 3) == "exists"
    assert await s.secrets.resolve(P, ["A"]) == {"A": "one"}
    [info] = [i for i in await s.secrets.for_project(P) if i.name == "A"]
    assert (info.created_at_ms, info.updated_at_ms) == (T0 + 2, T0 + 2)
    assert await s.tasks.imports(P, None, 10) == [
        ImportRecord(key="ql:env:A", kind="secret", target="A", created_at_ms=T0 + 2)]
    assert await s.secrets.import_secret("other", "ql:env:A", "A", "theirs", T0) == "created"
    assert await s.secrets.delete(P, "A")
    assert await s.tasks.imports(P, None, 10) == []  # the record goes with its secret
    assert await s.secrets.import_secret(P, "ql:env:A", "A", "three", T0 + 4) == "created"
    assert await s.secrets.resolve(P, ["A"]) == {"A": "three"}


# -- credentials, secrets -------------------------------------------------------------


async def test_credentials_store_digests_and_revoke_once(stores: Stores):
    s = stores
    cred = Credential(id="c1", project_id=P, name="ci", role="viewer", permissions=["run.read"], created_at_ms=T0)
    await s.credentials.create(cred, b"\x01" * 32)
    await s.credentials.create(Credential(id="c0", project_id=P, name="x", role="owner", permissions=None,
                                          created_at_ms=T0 - 1), b"\x02" * 32)
    assert await code_of(s.credentials.create(cred, b"\x03" * 32)) == "conflict"
    found = await s.credentials.lookup("c1")
    assert found == (cred, b"\x01" * 32)
    assert [c.id for c in await s.credentials.for_project(P)] == ["c0", "c1"]
    assert await s.credentials.for_project("other") == []
    revoked = await s.credentials.revoke(P, "c1", T0 + 5)
    assert revoked is not None and revoked.revoked_at_ms == T0 + 5
    again = await s.credentials.revoke(P, "c1", T0 + 9)
    assert again is not None and again.revoked_at_ms == T0 + 5
    assert await s.credentials.revoke("other", "c1", T0) is None
    assert await s.credentials.lookup("missing") is None


async def test_audit_reader_pages_the_project_newest_first(stores: Stores):
    s = stores
    for i in range(5):
        await s.audit.append(AuditRecord(at_ms=T0 + i, project_id=P, principal="uid:0", tool=f"tool.{i}",
                                         outcome="denied" if i == 3 else "allowed", reasons=["r"] if i == 3 else [],
                                         transport="socket", request_id=f"q{i}"))
    await s.audit.append(AuditRecord(at_ms=T0 + 9, project_id="other", principal="uid:0", tool="theirs",
                                     outcome="allowed", reasons=[], transport="socket"))
    first = await s.audit_reader.page(P, None, None, 2)
    assert [e.tool for e in first.entries] == ["tool.4", "tool.3"] and first.next == first.entries[-1].id
    denied = first.entries[1]
    assert (denied.outcome, denied.reasons, denied.request_id, denied.at_ms) == ("denied", ["r"], "q3", T0 + 3)
    rest = await s.audit_reader.page(P, None, first.next, 10)
    assert [e.tool for e in rest.entries] == ["tool.2", "tool.1", "tool.0"] and rest.next is None
    ids = [e.id for e in first.entries + rest.entries]
    assert ids == sorted(ids, reverse=True)
    since = await s.audit_reader.page(P, T0 + 2, None, 10)
    assert [e.tool for e in since.entries] == ["tool.4", "tool.3", "tool.2"] and since.next is None
    assert (await s.audit_reader.page("nobody's", None, None, 10)).entries == []


def refused(at: int, tool: str = "qledge.status", who: str = "uid:7", cause: str = "credential_unknown",
            request: str | None = "r") -> AuditRecord:
    return AuditRecord(at_ms=at, project_id=P, principal=who, tool=tool, outcome="unauthenticated",
                       reasons=[cause, "tool_" + tool.replace(".", "_")], transport="socket", request_id=request)


async def test_refused_calls_are_aggregated_per_principal_cause_and_minute(stores: Stores):
    """The first refused call of a row is written at once; the rest are counted and added by
    `flush` (the row then names no tool or request once they differ); the reader shows the
    count and the first and last time, and `since` looks at the last."""
    s = stores
    minute = T0 // MINUTE_MS * MINUTE_MS
    await s.audit.append(refused(minute + 1))
    first = (await s.audit_reader.page(P, None, None, 10)).entries
    assert [(e.tool, e.count, e.at_ms, e.last_at_ms, e.request_id) for e in first] == [
        ("qledge.status", 1, minute + 1, minute + 1, "r")]
    for i in range(2, 40):
        await s.audit.append(refused(minute + i))
    await s.audit.append(refused(minute + 50, cause="credential_malformed"))  # another cause: its own row
    await s.audit.append(refused(minute + 60, who="uid:8"))  # another peer: its own row
    assert [e.count for e in (await s.audit_reader.page(P, None, None, 10)).entries] == [1, 1, 1]
    await s.audit.flush()
    rows = (await s.audit_reader.page(P, None, None, 10)).entries
    assert [(e.principal, e.reasons[0], e.count) for e in rows] == [
        ("uid:8", "credential_unknown", 1), ("uid:7", "credential_malformed", 1), ("uid:7", "credential_unknown", 39)]
    agg = rows[-1]
    assert (agg.tool, agg.at_ms, agg.last_at_ms, agg.request_id, agg.outcome) == (
        "qledge.status", minute + 1, minute + 39, None, "unauthenticated")
    await s.audit.append(refused(minute + 70, tool="qledge.run.start"))  # another tool, same row
    await s.audit.append(refused(minute + MINUTE_MS + 5))  # the next minute: a row of its own
    await s.audit.append(AuditRecord(at_ms=minute + MINUTE_MS + 6, project_id=P, principal="uid:0",
                                     tool="qledge.status", outcome="allowed", reasons=["tool_invocation_allowed"],
                                     transport="socket"))
    await s.audit.close()  # what is still counted is written
    rows = (await s.audit_reader.page(P, None, None, 10)).entries
    assert [(e.outcome, e.count) for e in rows[:2]] == [("allowed", 1), ("unauthenticated", 1)]
    agg = rows[-1]
    assert (agg.tool, agg.reasons, agg.count, agg.last_at_ms) == ("*", ["credential_unknown"], 40, minute + 70)
    # `since` after the aggregate's first call but before its last: still shown.
    since = (await s.audit_reader.page(P, minute + 65, None, 10)).entries
    assert agg.id in [e.id for e in since] and len(since) == 3
    # The newest time on record counts an aggregate's last call.
    assert await s.admission.newest_time(P) >= minute + MINUTE_MS + 6


async def test_each_audit_class_is_trimmed_to_its_own_bound(bounded: Stores):
    """No volume of refused calls, or of allowed calls, pushes out credential and secret
    changes (or each other)."""
    s = bounded

    def allowed(at: int, change: bool = False) -> AuditRecord:
        return AuditRecord(at_ms=at, project_id=P, principal="uid:0", tool="qledge.secret.set" if change else "t",
                           outcome="allowed", reasons=["tool_invocation_allowed"], transport="socket", change=change)

    for i in range(3):
        await s.audit.append(allowed(T0 + i, change=True))
    for i in range(50):
        await s.audit.append(allowed(T0 + 10 + i))
    for i in range(160):  # refused calls of 160 minutes (and 3 peers): 160 rows, the newest 100 stay
        await s.audit.append(refused(T0 + i * MINUTE_MS, who=f"uid:{i % 3}"))
    await s.audit.close()

    async def classes() -> dict[str, int]:
        found: dict[str, int] = {}
        before = None
        while True:
            page = await s.audit_reader.page(P, None, before, 64)
            for e in page.entries:
                cls = "refused" if e.outcome != "allowed" else "change" if e.change else "call"
                found[cls] = found.get(cls, 0) + 1
            if page.next is None:
                return found
            before = page.next

    # At most each bound (SQLite trims in batches below it, to spare flash: AUDIT_TRIM).
    first = await classes()
    assert first["change"] == 3 and first["call"] == 50 and 75 <= first["refused"] <= 100, first
    for i in range(150):  # allowed calls past their own bound never touch the changes
        await s.audit.append(allowed(T0 + 1000 + i))
    then = await classes()
    assert then["change"] == 3 and 75 <= then["call"] <= 100 and then["refused"] == first["refused"], then


async def test_secrets_are_write_only_outside_the_runner(stores: Stores):
    s = stores
    info = await s.secrets.set(P, "b", "one", T0)
    assert (info.name, info.created_at_ms, info.updated_at_ms) == ("b", T0, T0)
    replaced = await s.secrets.set(P, "b", "two", T0 + 5)
    assert (replaced.created_at_ms, replaced.updated_at_ms) == (T0, T0 + 5)
    await s.secrets.set(P, "a", "three", T0)
    await s.secrets.set("other", "a", "theirs", T0)
    assert [i.name for i in await s.secrets.for_project(P)] == ["a", "b"]
    assert await s.secrets.resolve(P, ["b", "zz"]) == {"b": "two"}
    assert sorted(await s.secrets.values(P)) == ["three", "two"]
    assert await s.secrets.delete(P, "b") is True and await s.secrets.delete(P, "b") is False


# -- narrow readers -------------------------------------------------------------------


async def test_readers_are_narrow_ordered_and_scoped(stores: Stores):
    s = stores
    for tid in ("t2", "t1"):
        await s.tasks.create(P, tid, f"name {tid}", spec(overlap="allow"), T0, privileged=False)
    await s.tasks.create("other", "t0", "theirs", spec(), T0, privileged=False)
    await s.triggers.create(P, "g2", "t1", None, HOURLY, T0)
    await s.triggers.create(P, "g1", "t1", None, HOURLY, T0)
    await s.triggers.set_enabled(P, "g2", False, None, T0 + 1)
    r = s.readers
    heads = await r.tasks.page_heads(P, None, 10)
    assert [(h.task_id, h.kind, h.spec_schema, h.enabled) for h in heads] == [
        ("t1", "argv", "qinglong/command@v1", True), ("t2", "argv", "qinglong/command@v1", True)]
    detail = await r.tasks.get_head(P, "t1")
    assert detail is not None and detail.content_digest.startswith("sha256:") and detail.created_at_ms == T0
    assert await r.tasks.get_head("other", "t1") is None
    assert [(h.trigger_id, h.enabled) for h in await r.triggers.page_heads(P, None, 10)] == [
        ("g1", True), ("g2", False)]
    assert [h.trigger_id for h in await r.triggers.page_heads(P, "g1", 10)] == ["g2"]
    statuses = ["succeeded", "failed", "succeeded"]
    for i, status in enumerate(statuses):
        await finished(s, run_of("t1", f"r{i}", T0 + i * 100), status)
    await s.runs.create(run_of("t2", "r9", T0 + 50), "user")
    page = await r.runs.page(P, None, 3)
    assert [x.id for x in page] == ["r2", "r1", "r9"]
    assert [x.id for x in await r.runs.page(P, RunCursor(page[-1].created_at_ms, page[-1].id), 10)] == ["r0"]
    one = await r.runs.get(P, "r1")
    assert one is not None and (one.status, one.exit_code, one.origin) == ("failed", 1, "manual")
    assert await r.runs.get("other", "r1") is None
    assert [e.type for e in await r.runs.events(P, "r1", 1, 5)] == ["run.running", "run.failed"]
    window = await r.outcome_window.window(P, "t1", 65)
    assert [(w.id, w.status) for w in window] == [("r2", "succeeded"), ("r1", "failed"), ("r0", "succeeded")]
    assert [w.id for w in await r.outcome_window.window(P, "t1", 2)] == ["r2", "r1"]
    counts = await s.counts.counts(P)
    assert (counts.tasks, counts.triggers, counts.runs, counts.active_runs, counts.credentials) == (2, 2, 4, 1, 0)


# -- AgentEvidenceStore (edge.core.ports.agent) -------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def evidence(request, home):
    """The evidence history's store on either backend, and a count of its rows."""
    if request.param == "sqlite":
        from edge.storage.sqlite.evidence import SqliteEvidenceStore

        db = await Database.open(os.path.join(home, "contract.db"))
        store = SqliteEvidenceStore(db)

        async def rows() -> int:
            return await db.run(lambda conn: conn.execute("SELECT count(*) FROM agent_evidence").fetchone()[0])

        yield store, rows
        await db.close()
        return
    dsn = request.getfixturevalue("pg_dsn")
    cluster = Cluster(Config(cluster=ClusterConfig(dsn=dsn, node="contract")), home)
    await cluster.open()
    store = cluster.evidence()

    async def pg_rows() -> int:
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SELECT count(*) FROM agent_evidence")
            found = await cur.fetchone()
            assert found is not None
            return int(found[0])

    yield store, pg_rows
    await cluster.close()


def opened(n: int, cost_known: bool = True, project: str = P):
    from edge.core.agent import EvidenceOpen

    return EvidenceOpen(project_id=project, run_id=f"run-{n:05d}", task_id="ask", task_revision=1,
                        instruction=f"question {n}", provider="api.example.com", model="m", cost_known=cost_known)


def round_meta(n: int, estimated: bool = False):
    from edge.core.agent import RoundMeta

    return RoundMeta(round=n, model="m", input_tokens=100 * n, output_tokens=10 * n, usage_estimated=estimated,
                     response_chars=42, tools=["qinglong.run.list"], plan=f"plan {n}")


async def finish(store, n: int, now: int, project: str = P, **fields):
    """Write run n's whole record, as the daemon does once its run has ended."""
    from edge.core.agent import EvidenceRecord

    fields.setdefault("state", "succeeded")
    await store.finish(EvidenceRecord(started=opened(n, project=project), created_at_ms=now, **fields), now)


async def test_evidence_the_501st_record_prunes_the_oldest(evidence):
    from edge.storage.sqlite.evidence import MAX_RECORDS

    store, rows = evidence
    for n in range(MAX_RECORDS):
        await finish(store, n, T0 + n)
    assert await rows() == MAX_RECORDS
    await finish(store, MAX_RECORDS, T0 + MAX_RECORDS)
    assert await rows() == MAX_RECORDS
    assert await store.get(P, "run-00000") is None
    assert await store.get(P, "run-00001") is not None


async def test_evidence_a_91_day_old_record_is_pruned_by_the_next_insert(evidence):
    store, rows = evidence
    await finish(store, 1, T0)
    await finish(store, 2, T0 + 89 * DAY)
    await finish(store, 3, T0 + 90 * DAY)  # exactly 90 days: kept
    assert await rows() == 3
    await finish(store, 4, T0 + 91 * DAY)  # the inserting write's clock says 91 days later
    assert await store.get(P, "run-00001") is None
    assert [r.run_id for r in await store.page(P, None, 10)] == ["run-00004", "run-00003", "run-00002"]


async def test_evidence_each_insert_deletes_a_bounded_number_of_rows(evidence):
    from edge.storage.sqlite.evidence import PRUNE_BATCH

    store, rows = evidence
    for n in range(40):
        await finish(store, n, T0 + n)
    await finish(store, 99, T0 + 200 * DAY)  # all 40 are too old, only the oldest few go at once
    assert await rows() == 41 - PRUNE_BATCH
    for n in range(100, 104):
        await finish(store, n, T0 + 200 * DAY)
    assert await rows() == 5  # converged over the next writes


async def test_evidence_the_whole_record_is_written_once_with_its_rounds_and_totals(evidence):
    store, _ = evidence
    before = await store.start(opened(1), T0)
    rounds = [round_meta(1), round_meta(2, estimated=True)]
    await finish(store, 1, T0, rounds=rounds, input_tokens=300, output_tokens=30, usage_estimated=True,
                 cost_usd=None, position_before=before, answer_summary="all fine")
    await finish(store, 1, T0 + 6, state="lost")  # a record that was written is left as it is
    record = await store.get(P, "run-00001")
    assert record is not None and record.created_at_ms == T0
    assert (record.state, record.answer_summary, record.rounds, record.input_tokens, record.output_tokens) == (
        "succeeded", "all fine", 2, 300, 30)
    assert record.usage_estimated and record.cost_usd is None  # unknown, never zero
    assert [r.plan for r in record.round_meta] == ["plan 1", "plan 2"]
    assert [r.tools for r in record.round_meta] == [["qinglong.run.list"]] * 2
    assert record.position_before == before and record.position_after is not None
    assert record.position_after >= record.position_before
    await finish(store, 2, T0 + 7, state="budget_exhausted", budget="rounds", error_code="budget_exhausted",
                 error="the rounds budget ran out", cost_usd=0.75)
    record = await store.get(P, "run-00002")
    assert record is not None
    assert (record.state, record.budget, record.error, record.instruction, record.rounds, record.cost_usd) == (
        "budget_exhausted", "rounds", "the rounds budget ran out", "question 2", 0, 0.75)
    assert record.position_before >= 0 and await store.get("other-project", "run-00002") is None


async def test_evidence_pages_are_newest_first_keysets_and_positions_grow(evidence):
    from edge.core.agent import EvidenceCursor

    store, _ = evidence
    for n in range(5):
        before = await store.start(opened(n), T0 + n // 2)
        await finish(store, n, T0 + n // 2, position_before=before)  # equal times: the run id breaks the tie
    await finish(store, 7, T0, project="other-project")
    first = await store.page(P, None, 3)
    assert [r.run_id for r in first] == ["run-00004", "run-00003", "run-00002"]
    after = EvidenceCursor(created_at_ms=first[-1].created_at_ms, run_id=first[-1].run_id)
    assert [r.run_id for r in await store.page(P, after, 3)] == ["run-00001", "run-00000"]
    assert [r.run_id for r in await store.page("other-project", None, 3)] == ["run-00007"]
    records = [await store.get(P, f"run-{n:05d}") for n in range(5)]
    positions = [p for r in records if r is not None for p in (r.position_before, r.position_after)]
    assert positions == sorted(positions) and positions[0] < positions[-1]  # each write moves it on
