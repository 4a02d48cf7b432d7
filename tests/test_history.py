"""History people can browse: filtered run pages on their own indexes (real query plans,
bounded walks), run references, following a log through the daemon, `qledge next` and
`qledge audit` — real SQLite files, real daemons, the real CLI."""

from __future__ import annotations

import json
import os
import random
import re
import time

import apsw
import pytest

from edge.core.reads import SEARCH_BUDGET
from edge.core.runs import ORIGINS, STATUSES, RunQuery
from edge.storage import security as audit_sql
from edge.storage.sqlite.db import SqliteTx
from edge.storage.sqlite.sql import RUNS, SECURITY
from edge.storage import runs as run_sql
from edge.storage.sqlite.schema import migrate
from support import RUN_TIME_INDEXES, TIE_SORT, query_plan


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def _json(result):
    return json.loads(_ok(result).stdout)


# -- the store: plans and bounded walks, on a real file -------------------------------------


def _fill(conn: apsw.Connection, n: int, seed: int = 7) -> list[tuple]:
    """n runs of three tasks, mostly scheduled successes (a router's history), created in
    bursts that share milliseconds."""
    rng = random.Random(seed)
    rows = []
    conn.execute("BEGIN")
    for task in ("a", "b", "c"):
        conn.execute("INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
                     " VALUES ('p', ?, ?, 1, 1, 0, 0)", (task, task))
    for i in range(n):
        status = rng.choices(STATUSES, weights=(1, 1, 90, 4, 2, 1, 1))[0]
        origin = rng.choices(ORIGINS, weights=(90, 8, 1, 1, 1))[0]
        row = (f"r{i:05d}", "p", rng.choice("abc"), status, origin, 1_000_000 + i // 3)
        conn.execute("INSERT INTO runs (id, project_id, task_id, task_revision, status, origin, version, event_seq,"
                     " created_at_ms) VALUES (?, ?, ?, 1, ?, ?, 1, 1, ?)", row)
        rows.append(row)
    conn.execute("COMMIT")
    return rows


@pytest.fixture
def filled(home):
    conn = apsw.Connection(os.path.join(home, "history.db"))
    migrate(conn)
    rows = _fill(conn, 3000)
    conn.execute("ANALYZE")  # the plans must hold with real statistics
    yield conn, rows
    conn.close()


PLANS = [
    (RunQuery(), "runs_project_created_idx"),
    (RunQuery(task_id="a"), "runs_task_created_idx"),
    (RunQuery(statuses=["failed"]), "runs_unsuccessful_idx"),
    (RunQuery(statuses=["failed", "timed_out", "lost", "cancelled"], since_ms=5), "runs_unsuccessful_idx"),
    (RunQuery(task_id="a", statuses=["failed", "timed_out", "lost"]), "runs_task_unsuccessful_idx"),
    (RunQuery(statuses=["running"]), "runs_active_idx"),
    (RunQuery(task_id="a", statuses=["queued", "running"]), "runs_active_idx"),
    (RunQuery(origins=["manual"]), "runs_unscheduled_idx"),
    (RunQuery(origins=["manual", "agent"], until_ms=1_000_500), "runs_unscheduled_idx"),
    (RunQuery(task_id="a", origins=["manual"]), "runs_task_created_idx"),
    (RunQuery(statuses=["succeeded"]), "runs_project_created_idx"),
    (RunQuery(origins=["scheduled"], since_ms=1_000_100), "runs_project_created_idx"),
    (RunQuery(statuses=["failed"], origins=["manual"]), "runs_unsuccessful_idx"),
]


@pytest.mark.parametrize("query,index", PLANS)
def test_every_filter_is_served_by_its_index(filled, query, index):
    conn, _ = filled
    plan = query_plan(conn, run_sql.scan_sql(RUNS, query), run_sql.scan_params("p", query, None, SEARCH_BUDGET))
    assert any(f"INDEX {index} " in d + " " for d in plan), plan
    for detail in plan:
        assert not (detail.startswith("SCAN runs") and "INDEX" not in detail), plan
        # The active runs (few, by the admission bound) are the one set sorted rather than walked;
        # elsewhere only the runs of one millisecond are put in id order (schema 20).
        assert "TEMP B-TREE" not in detail or index == "runs_active_idx" or (
            detail == TIE_SORT and index in RUN_TIME_INDEXES), plan


def test_prefix_and_audit_reads_are_key_ranges(filled):
    conn, _ = filled
    plan = query_plan(conn, RUNS.prefix, ("r0001", "r0002", "p", 3))
    assert plan == ["SEARCH runs USING INDEX sqlite_autoindex_runs_1 (id>? AND id<?)"], plan
    plan = query_plan(conn, SECURITY.audit_page, (10, "p", 64))
    assert plan == ["SEARCH security_audit USING INTEGER PRIMARY KEY (rowid<?)"], plan


def _expected(rows: list[tuple], q: RunQuery) -> list[str]:
    found = [r for r in rows if (q.task_id is None or r[2] == q.task_id) and (not q.statuses or r[3] in q.statuses)
             and (not q.origins or r[4] in q.origins) and (q.since_ms is None or r[5] >= q.since_ms)
             and (q.until_ms is None or r[5] < q.until_ms)]
    return [r[0] for r in sorted(found, key=lambda r: (r[5], r[0]), reverse=True)]


def _walk(conn, q: RunQuery, limit: int, budget: int) -> tuple[list[str], int]:
    seen, after, pages = [], None, 0
    while True:
        page = run_sql.search(SqliteTx(conn), RUNS, "p", q, after, limit, budget)
        pages += 1
        assert len(page.runs) <= limit
        seen += [r.id for r in page.runs]
        if page.next is None:
            return seen, pages
        after = page.next


def test_pages_find_exactly_the_matching_runs_whatever_the_budget(filled):
    conn, rows = filled
    rng = random.Random(3)
    for _ in range(40):
        q = RunQuery(
            task_id=rng.choice([None, "a", "b"]),
            statuses=rng.sample(STATUSES, rng.choice([0, 1, 1, 2])),  # type: ignore[arg-type]
            origins=rng.sample(ORIGINS, rng.choice([0, 0, 1])),  # type: ignore[arg-type]
            since_ms=rng.choice([None, 1_000_300]), until_ms=rng.choice([None, 1_000_800]),
        )
        for limit, budget in ((7, 11), (64, SEARCH_BUDGET)):
            seen, _ = _walk(conn, q, limit, budget)
            assert seen == _expected(rows, q), q


def test_a_rare_match_costs_a_bounded_walk_per_page(filled):
    conn, rows = filled
    q = RunQuery(task_id="a", origins=["fire_once"])  # served by the task's index, checked per entry
    page = run_sql.search(SqliteTx(conn), RUNS, "p", q, None, 5, budget=50)
    # A page looks at no more than its budget of entries: it may hold fewer runs, with `next`
    # saying where the walk goes on.
    assert len(page.runs) <= 5 and page.next is not None
    matches_within = [r for r in sorted((r for r in rows if r[2] == "a"), key=lambda r: (r[5], r[0]),
                                        reverse=True)[:50] if r[4] == "fire_once"]
    assert [r.id for r in page.runs] == [r[0] for r in matches_within][:5]
    seen, pages = _walk(conn, q, 5, 50)
    assert seen == _expected(rows, q) and pages >= len([r for r in rows if r[2] == "a"]) // 50


# -- the CLI against a daemon ---------------------------------------------------------------


def _runs(d, n_ok: int, n_bad: int) -> tuple[list[str], list[str]]:
    _ok(d.cli("task", "add", "ok", "--overlap", "allow", "--", "true"))
    _ok(d.cli("task", "add", "bad", "--overlap", "allow", "--", "false"))
    good = [_json(d.cli("run", "start", "ok", "--wait", "--json"))["id"] for _ in range(n_ok)]
    bad = []
    for _ in range(n_bad):
        result = d.cli("run", "start", "bad", "--wait", "--json")
        assert result.returncode == 1
        bad.append(json.loads(result.stdout)["id"])
    return good, bad


def test_run_list_filters_and_pages(daemon):
    good, bad = _runs(daemon, 5, 3)
    newest_first = list(reversed(good + bad))
    assert [r["id"] for r in _json(daemon.cli("run", "list", "--all", "--json"))] == newest_first
    assert [r["id"] for r in _json(daemon.cli("run", "list", "--status", "failed", "--json"))] == bad[::-1]
    both = _json(daemon.cli("run", "list", "--status", "failed,succeeded", "--task", "ok", "--json"))
    assert [r["id"] for r in both] == good[::-1]
    assert _json(daemon.cli("run", "list", "--origin", "scheduled", "--json")) == []
    assert len(_json(daemon.cli("run", "list", "--origin", "manual", "--json"))) == 8
    assert len(_json(daemon.cli("run", "list", "--since", "1h", "--json"))) == 8
    assert _json(daemon.cli("run", "list", "--until", "1h", "--json")) == []
    assert _json(daemon.cli("run", "list", "--since", "2999-01-01", "--json")) == []
    # A page at a time: the last line says how to go on, and going on loses nothing.
    first = _ok(daemon.cli("run", "list", "--limit", "3")).stdout.splitlines()
    assert first[0].split() == ["RUN", "TASK", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"]
    assert [line.split()[0] for line in first[1:4]] == newest_first[:3]
    more = first[-1]
    assert re.fullmatch(r"more: qledge run list --limit 3 --after [0-9]+\.[0-9a-f-]{36}", more), more
    # The filters as they were typed, quoted for a shell, and the page size kept.
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() - 3600))
    typed = _ok(daemon.cli("run", "list", "--since", since, "--until", "0m", "--status", "succeeded",
                           "--limit", "1")).stdout.splitlines()[-1]
    assert re.fullmatch(rf"more: qledge run list --status succeeded --since '{since}' --until 0m --limit 1"
                        r" --after [0-9]+\.[0-9a-f-]{36}", typed), typed
    rest = _json(daemon.cli("run", "list", "--all", "--json", "--after", more.split()[-1]))
    assert [r["id"] for r in rest] == newest_first[3:]
    after_run = _json(daemon.cli("run", "list", "--all", "--json", "--after", bad[0][:13]))
    assert [r["id"] for r in after_run] == newest_first[newest_first.index(bad[0]) + 1:]
    assert _ok(daemon.cli("run", "list", "--all")).stdout.count("\n") == 9  # no "more" line
    # Errors: a task that does not exist is not "no runs"; filters are checked in their terms.
    for argv, code, message in (
        (["--task", "nope"], 1, "qledge: not_found: task 'nope' not found\n"),
        (["--status", "broken"], 2, "qledge: invalid_argument: --status 'broken' is not one of queued, running,"
                                    " succeeded, failed, cancelled, timed_out, lost\n"),
        (["--since", "soon"], 2, "qledge: invalid_argument: --since 'soon' is neither a duration (30m, 12h, 7d, 2w)"
                                 " nor a date or time (2026-11-30, 2026-11-30 08:00)\n"),
        (["--limit", "0"], 2, "qledge: invalid_argument: --limit must be from 1 to 1000\n"),
        (["--since", "1h", "--until", "2h"], 2, "qledge: invalid_argument: since must be earlier than until\n"),
    ):
        got = daemon.cli("run", "list", *argv)
        assert (got.returncode, got.stderr) == (code, message), argv


def test_runs_are_named_by_prefix_or_by_task(daemon):
    good, bad = _runs(daemon, 2, 2)
    latest = _json(daemon.cli("run", "get", "ok:latest", "--json"))
    assert latest["id"] == good[-1]
    assert _json(daemon.cli("run", "get", "bad:latest-failed", "--json"))["id"] == bad[-1]
    assert _json(daemon.cli("run", "get", good[0][:18], "--json"))["id"] == good[0]  # a unique prefix
    assert _json(daemon.cli("run", "get", good[0].upper(), "--json"))["id"] == good[0]
    assert _ok(daemon.cli("run", "log", "ok:latest")).stdout == ""
    waited = _json(daemon.cli("call", "qledge.run.wait", "--args", json.dumps({"runId": "bad:latest"})))
    assert waited["run"]["id"] == bad[-1] and waited["done"] is True
    events = _json(daemon.cli("call", "qledge.run.events", "--args", json.dumps({"runId": good[1][:23]})))
    assert [e["type"] for e in events["events"]] == ["run.queued", "run.running", "run.succeeded"]
    shared = os.path.commonprefix(good + bad)
    for ref, code, message in (
        (good[0][:5], 2, f"qledge: invalid_argument: run id prefix '{good[0][:5]}' is too short: give at least 8"
                         " characters (or TASK:latest)\n"),
        ("ok:latest-failed", 1, "qledge: not_found: task 'ok' has no failed runs\n"),
        ("nope:latest", 1, "qledge: not_found: task 'nope' not found\n"),
        ("ok:first", 2, "qledge: invalid_argument: 'ok:first' names no run: use a run id, its first 8 or more"
                        " characters, TASK:latest or TASK:latest-failed\n"),
        ("ffffffff-ffff", 1, "qledge: not_found: no run id starts with ffffffff-ffff\n"),
    ):
        got = daemon.cli("run", "get", ref)
        assert (got.returncode, got.stderr) == (code, message), ref
    if len(shared) >= 8:  # runs made within about a minute share their first 8 characters
        got = daemon.cli("run", "get", shared)
        assert got.returncode == 2 and f"run id prefix {shared} is ambiguous" in got.stderr


def test_run_get_shows_schedule_jitter_and_signals(daemon):
    _ok(daemon.cli("task", "add", "t", "--shell", "--", "kill -TERM $$"))
    got = daemon.cli("run", "start", "t", "--wait")
    assert got.returncode == 1
    assert re.fullmatch(r"run [0-9a-f-]{36} queued\nrun [0-9a-f-]{36} failed \(killed by SIGTERM, [0-9.]+s\)\n",
                        got.stdout), got.stdout
    shown = _ok(daemon.cli("run", "get", "t:latest")).stdout
    assert re.search(r"^exit: +SIGTERM$", shown, re.M) and re.search(r"^summary: +killed by SIGTERM$", shown, re.M)
    assert "SIGTERM" in _ok(daemon.cli("run", "list")).stdout.splitlines()[1].split()[-1]
    # A scheduled run's row, as the scheduler writes it, shows when it was due and its jitter.
    with daemon.db() as db:
        db.execute("UPDATE runs SET origin = 'scheduled', trigger_id = 't-1', trigger_revision = 1,"
                   " scheduled_for_ms = created_at_ms - 1000, jitter_ms = 2500")
    shown = _ok(daemon.cli("run", "get", "t:latest")).stdout
    assert re.search(r"^scheduled for: +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$", shown, re.M), shown
    assert re.search(r"^jitter: +2.5s$", shown, re.M) and re.search(r"^trigger: +t-1 \(revision 1\)$", shown, re.M)


def test_following_a_finished_run_prints_its_log_once(daemon):
    _ok(daemon.cli("task", "add", "t", "--shell", "--", "echo one; echo two"))
    _ok(daemon.cli("run", "start", "t", "--wait"))
    assert _ok(daemon.cli("run", "log", "t:latest", "--follow")).stdout == "one\ntwo\n"


@pytest.mark.e2e
def test_follow_streams_a_running_run_until_it_ends(daemon):
    _ok(daemon.cli("task", "add", "t", "--shell", "--", "echo a; sleep 1; echo b; sleep 1; echo c"))
    started = time.monotonic()
    got = _ok(daemon.cli("run", "start", "t", "--wait", "--follow"))
    assert got.stdout == "a\nb\nc\n" and time.monotonic() - started >= 2
    assert re.fullmatch(r"run \S+ queued\nrun \S+ succeeded \(exit 0, [0-9.]+s\)\n", got.stderr), got.stderr
    # The daemon held each read until output came: a handful of calls, not a poll loop.
    with daemon.db() as db:
        reads = db.execute("SELECT count(*) FROM security_audit WHERE tool = 'qledge.run.log.read'").fetchone()[0]
    assert reads <= 6, reads
    # `run log --follow` of another run, started while it runs.
    run = _json(daemon.cli("run", "start", "t", "--json"))
    assert _ok(daemon.cli("run", "log", run["id"][:13], "--follow")).stdout == "a\nb\nc\n"


@pytest.mark.e2e
def test_follow_past_the_log_cap_ends_with_the_marker_and_tail(daemon):
    script = "i=0; while [ $i -lt 400 ]; do echo line$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; sleep 1;" \
             " echo end"
    _ok(daemon.cli("task", "add", "t", "--log-cap", "4K", "--shell", "--", script))
    got = _ok(daemon.cli("run", "start", "t", "--wait", "--follow")).stdout
    final = _ok(daemon.cli("run", "log", "t:latest")).stdout
    marker = re.search(r"\n\[qledge: log cap reached; \d+ bytes dropped here\]\n", final)
    assert marker and got.count("[qledge: log cap reached;") == 1
    assert got.startswith("line0-") and got.endswith(final[marker.start():]) and got.endswith("end\n")


def test_next_lists_the_coming_fires_in_time_order(daemon):
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _ok(daemon.cli("trigger", "add", "t", "--cron", "*/20 * * * *", "--tz", "UTC", "--id", "often"))
    _ok(daemon.cli("trigger", "add", "t", "--cron", "*/30 * * * *", "--tz", "Asia/Tokyo", "--id", "half",
                   "--jitter", "60"))
    _ok(daemon.cli("trigger", "add", "t", "--cron", "0 * * * *", "--tz", "UTC", "--id", "off"))
    _ok(daemon.cli("trigger", "disable", "off"))
    fires = _json(daemon.cli("next", "--count", "6", "--json"))
    times = [f["atMs"] for f in fires]
    assert len(fires) == 6 and times == sorted(times) and times[0] > time.time() * 1000 - 60_000
    assert {f["triggerId"] for f in fires} == {"often", "half"}
    assert all(f["atMs"] % (20 * 60_000 if f["triggerId"] == "often" else 30 * 60_000) == 0 for f in fires)
    table = _ok(daemon.cli("next", "--count", "2")).stdout.splitlines()
    assert table[0].split() == ["WHEN", "TRIGGER", "TASK", "TIMEZONE", "JITTER"]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:00 \S+ +in ", table[1]), table
    _ok(daemon.cli("trigger", "disable", "often"))
    _ok(daemon.cli("trigger", "disable", "half"))
    assert _ok(daemon.cli("next")).stdout.startswith("nothing is scheduled")
    bad = daemon.cli("next", "--count", "101")
    assert (bad.returncode, bad.stderr) == (2, "qledge: invalid_argument: --count must be from 1 to 100\n")


def test_audit_is_for_owners(daemon):
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _, operator = daemon.token("operator")
    denied = daemon.cli("audit", token=operator)
    assert denied.returncode == 1 and denied.stderr == (
        "qledge: permission_denied: qledge.audit.list requires permission audit.read (the audit is for owners)\n")
    rows = _json(daemon.cli("audit", "--limit", "100", "--json"))
    tools = [r["tool"] for r in rows]
    assert "qledge.task.create" in tools and "qledge.credential.create" in tools
    denial = next(r for r in rows if r["outcome"] == "denied")
    assert denial["tool"] == "qledge.audit.list" and "domain_permission_denied" in denial["reasons"]
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    assert len(_json(daemon.cli("audit", "--limit", "2", "--json"))) == 2
    assert _json(daemon.cli("audit", "--since", "2999-01-01", "--json")) == []
    assert _ok(daemon.cli("audit", "--since", "2999-01-01")).stdout == "no audit rows since then\n"
    table = _ok(daemon.cli("audit", "--limit", "3")).stdout.splitlines()
    assert table[0].split() == ["TIME", "WHO", "TOOL", "OUTCOME", "WHY", "VIA", "CALLS"] and len(table) == 4


def test_audit_pages_walk_a_bounded_number_of_rows(home):
    conn = apsw.Connection(os.path.join(home, "audit.db"))
    migrate(conn)
    conn.execute("BEGIN")
    for i in range(1500):
        conn.execute("INSERT INTO security_audit (at_ms, project_id, principal, tool, outcome, reasons, transport)"
                     " VALUES (?, 'p', 'uid:0', 't', 'allowed', '[]', 'socket')", (i if i < 5 else 10_000 + i,))
    conn.execute("COMMIT")
    page = audit_sql.audit_page(SqliteTx(conn), SECURITY, "p", 0, None, 10, 100)
    assert [e.id for e in page.entries] == list(range(1500, 1490, -1)) and page.next == 1491
    old = audit_sql.audit_page(SqliteTx(conn), SECURITY, "p", None, 10, 64, 100)
    assert [e.at_ms for e in old.entries] == [10_008, 10_007, 10_006, 10_005, 4, 3, 2, 1, 0] and old.next is None
    # Rows before `since` are skipped, within the budget: an empty page still says where to go on.
    none = audit_sql.audit_page(SqliteTx(conn), SECURITY, "p", 20_000, None, 10, 100)
    assert none.entries == [] and none.next == 1401


def test_origin_filters_are_the_ways_a_run_starts_and_the_help_says_each(daemon):
    from edge.core.runs import STARTED

    helped = _ok(daemon.cli("run", "list", "--help")).stdout
    flat = " ".join(helped.split())  # argparse wraps an option's help to the terminal's width
    assert "scheduled, manual, fire_once, retry" in flat and "agent" not in helped.split("ORIGIN, how")[0]
    for origin, meaning in STARTED.items():
        assert re.search(rf"^  {origin} +{re.escape(meaning[:20])}", helped, re.M), (origin, helped)
    _ok(daemon.cli("task", "add", "ok", "--", "true"))
    _ok(daemon.cli("run", "start", "ok", "--wait"))
    # No run is created with origin agent: the filter is refused with where AI runs are, not "no runs".
    for given in ("agent", "manual,agent"):
        refused = daemon.cli("run", "list", "--origin", given)
        assert refused.returncode == 2 and refused.stderr.startswith(
            "qledge: invalid_argument: --origin agent matches no run: an AI task's runs are scheduled,"), refused
        assert "qledge agent list" in refused.stderr and refused.stderr.count("\n") == 1
    assert len(_json(daemon.cli("run", "list", "--origin", "manual", "--json"))) == 1
