"""Cluster mode with real daemons on a real PostgreSQL: what is shared and what stays
local, the logs of any run from any node, and what the default daemon never loads."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from cluster_support import node_config, rows, start_nodes, task, wait_for
from support import IS_ROOT


def _modules(d) -> list[str]:
    return d.call("qledge.status", {"includeModules": True})["modules"]


def test_the_default_daemon_never_loads_postgresql(daemon):
    loaded = _modules(daemon)
    assert not [m for m in loaded if m.startswith(("psycopg", "edge.storage.postgres", "edge.core.ports.cluster"))]


def test_two_nodes_share_everything_but_their_sockets(daemon_factory, pg_dsn):
    a, b = start_nodes(daemon_factory, pg_dsn, 2)
    assert "psycopg" in _modules(a) and not os.path.exists(os.path.join(a.home, "qledge.db"))
    assert a.socket != b.socket
    a.call("qledge.task.create", task("hello", ["sh", "-c", "echo hello from $QLEDGE_RUN_ID; echo bye >&2"]))
    b.call("qledge.trigger.create", {"taskId": "hello", "expression": "0 3 1 1 *", "timezone": "UTC"})
    assert [t["id"] for t in a.call("qledge.trigger.list")["triggers"]] == ["hello-1"]
    run = b.call("qledge.run.start", {"taskId": "hello"})
    done = a.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})
    assert done["done"] and done["run"]["status"] == "succeeded"
    expected = f"hello from {run['id']}\nbye\n"
    (ran_on,) = [e["detail"] for e in a.call("qledge.run.events", {"runId": run["id"]})["events"]
                 if e["type"] == "run.claimed"]
    for node in (a, b):  # the log of a run is readable from every node, whichever ran it
        shown = node.cli("run", "log", run["id"])
        assert shown.returncode == 0 and shown.stdout == expected, (shown.stdout, shown.stderr)
        excerpt = node.call("qinglong.run.log.excerpt", {"runId": run["id"]})
        assert excerpt["status"] == "available" and excerpt["content"] == expected
    # Finished logs live in PostgreSQL; the node that ran it kept no file behind.
    assert rows(pg_dsn, "SELECT octet_length(data) FROM run_logs WHERE run_id = %s", (run["id"],)) == [
        (len(expected),)]
    assert ran_on in ("node n1", "node n2")
    for node in (a, b):
        assert not os.listdir(os.path.join(node.home, "logs"))
    nodes = {n for (n,) in rows(pg_dsn, "SELECT DISTINCT node_id FROM security_audit")}
    assert nodes == {"n1", "n2"}  # audit rows carry the node that answered
    status = b.call("qledge.status")
    assert "node n2" in status["extra"]["cluster"] and "2 nodes alive" in status["extra"]["cluster"]
    assert status["dbPath"].startswith("postgresql socket ")


def test_reboot_fires_once_per_boot_of_each_node_on_that_node(daemon_factory, pg_dsn):
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        pytest.skip("no kernel boot id here: every daemon start would count as a boot")
    a, b = start_nodes(daemon_factory, pg_dsn, 2)
    a.call("qledge.task.create", task("boot", ["sh", "-c", "echo up"]))
    a.call("qledge.trigger.create", {"taskId": "boot", "expression": "@reboot", "timezone": "UTC"})
    for d in (a, b):  # restarts within the boot of this machine fire nothing
        d.stop()
        d.start()
    # A new node's first start is a boot of that node: one fire, run by that node alone.
    c = daemon_factory(config=node_config(pg_dsn, "n3")).start()
    (run,) = wait_for(lambda: a.call("qledge.run.list")["runs"])
    done = b.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})
    assert done["run"]["status"] == "succeeded"
    assert done["run"]["idempotencyKey"] == f"boot:boot-1:{boot_id}"
    claimed = [e["detail"] for e in a.call("qledge.run.events", {"runId": run["id"]})["events"]
               if e["type"] == "run.claimed"]
    assert claimed == ["node n3"]
    c.stop()
    c.start()
    time.sleep(1.5)  # its scheduler ticked at start: a restart within the boot stays quiet
    assert len(a.call("qledge.run.list")["runs"]) == 1
    assert rows(pg_dsn, "SELECT node_id, boot_id FROM node_boots ORDER BY node_id") == [
        ("n1", boot_id), ("n2", boot_id), ("n3", boot_id)]


def test_cancel_and_wait_reach_a_run_held_by_another_node(daemon_factory, pg_dsn):
    a, b = start_nodes(daemon_factory, pg_dsn, 2, concurrency=1)
    a.call("qledge.task.create", task("long", ["sleep", "30"]))
    started = [a.call("qledge.run.start", {"taskId": "long"}) for _ in range(2)]
    wait_for(lambda: all(a.call("qledge.run.get", {"runId": r["id"]})["status"] == "running" for r in started))
    for run in started:  # one runs on each node; cancel both from b
        cancelled = b.call("qledge.run.cancel", {"runId": run["id"]})
        assert cancelled["status"] == "cancelled", cancelled
    assert {r["status"] for r in a.call("qledge.run.list")["runs"]} == {"cancelled"}


@pytest.mark.skipif(not IS_ROOT, reason="switching users needs a root daemon")
def test_task_users_and_task_privileged_hold_on_every_node(daemon_factory, pg_dsn):
    """Each revision's writer standing is shared (PostgreSQL records it), checked when it is
    written on any node and again by whichever node runs it; a start asked of a node short
    of disk is refused there."""
    import pwd

    from edge.cli.client import CallFailed

    nobody = pwd.getpwnam("nobody")
    a = start_nodes(daemon_factory, pg_dsn, 1, concurrency=1)[0]
    b = daemon_factory(config=node_config(pg_dsn, "n2", concurrency=1))
    shutil.copy2(os.path.join(a.home, "pepper"), os.path.join(b.home, "pepper"))  # tokens work on both
    b.start()
    _, op = a.token("operator")
    a.call("qledge.task.create", task("mine", ["id", "-u"]), token=op)  # names no user: the default, nobody
    rooted = task("rooted", ["id", "-u"])
    rooted["spec"]["user"] = "root"
    a.call("qledge.task.create", rooted)  # the owner (root's uid)
    with pytest.raises(CallFailed) as refused:
        b.call("qledge.task.update", {"taskId": "rooted", "expectedRevision": 1, "spec": rooted["spec"]}, token=op)
    assert refused.value.code == "permission_denied" and "runs as root" in refused.value.message
    for node in (a, b):
        seen = {t["id"]: (t["spec"]["user"], t["privileged"]) for t in node.call("qledge.task.list")["tasks"]}
        assert seen == {"mine": ("nobody", False), "rooted": ("root", True)}
    for name, uid in (("rooted", 0), ("mine", nobody.pw_uid)):
        run = b.call("qledge.run.start", {"taskId": name})
        done = b.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})["run"]
        assert done["status"] == "succeeded" and b.cli("run", "log", run["id"]).stdout == f"{uid}\n"
    # nobody is no longer a task user on the node left: the operator's revision is refused
    # before it runs, the owner's still runs as root.
    a.stop()
    b.stop()
    assert b.config_path is not None
    with open(b.config_path, "w") as f:
        f.write(node_config(pg_dsn, "n2", concurrency=1, runner="task_users = []\n"))
    b.start()
    run = b.call("qledge.run.start", {"taskId": "mine"})
    done = b.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})["run"]
    assert (done["status"], done["errorCode"], done.get("startedAtMs")) == ("failed", "permission_denied", None)
    assert "not in [runner] task_users" in done["errorSummary"] and "task.privileged" in done["errorSummary"]
    assert a.config_path is not None
    with open(a.config_path, "w") as f:
        f.write(node_config(pg_dsn, "n1", runner=f"disk_reserve_bytes = {1 << 60}\n"))
    a.start()
    short = a.cli("run", "start", "rooted")
    assert short.returncode == 1 and short.stderr.startswith("qledge: resource_exhausted: disk_space_low: only ")


def test_a_dsn_password_is_never_shown(daemon_factory, pg_server, home):
    secret = "s3cr3t-Pa55word"
    missing = os.path.join(home, "nowhere")
    os.mkdir(missing)
    dsn = f"host={missing} port=5999 user=postgres dbname=x password={secret} connect_timeout=2"
    d = daemon_factory(config=node_config(dsn, "n9"))
    with pytest.raises(RuntimeError) as failed:
        d.start()
    text = str(failed.value) + d.stderr()
    assert "cannot use PostgreSQL socket" in text and secret not in text
    assert "Traceback" not in d.stderr()


def test_cluster_keys_are_checked(home):
    from edge.app.config import ConfigError, load

    path = os.path.join(home, "c.toml")
    with open(path, "w") as f:
        f.write('[cluster]\ndsn = "host=/tmp"\nleader = true\n')
    with pytest.raises(ConfigError, match="unknown key `cluster.leader`"):
        load(path)


def test_retries_and_notifications_across_two_nodes(daemon_factory, pg_dsn):
    """A failing task with retries and a failure rule on two nodes: every retry is admitted
    once (whichever node's scheduler gets there), and its one final failure is one request
    at a real loopback webhook, delivered by one node."""
    from notify_support import Loopback

    server = Loopback()
    try:
        a, b = start_nodes(daemon_factory, pg_dsn, 2)
        a.call("qledge.notify.channel.set", {"name": "hook", "spec": {"kind": "webhook", "url": server.url + "/h"}})
        spec = task("flaky", ["sh", "-c", "echo boom; exit 3"], overlap="forbid")
        spec["spec"]["retry"] = {"count": 2, "delayS": 0.2}
        spec["spec"]["notify"] = [{"channels": ["hook"], "on": ["failure"]}]
        b.call("qledge.task.create", spec)
        first = a.call("qledge.run.start", {"taskId": "flaky"})

        def chain() -> list[dict] | None:
            runs = a.call("qledge.run.list", {"taskId": "flaky"})["runs"]
            return runs if len(runs) == 3 and all(r["status"] == "failed" for r in runs) else None

        runs = list(reversed(wait_for(chain)))
        assert [(r["origin"], r.get("attempt", 1)) for r in runs] == [("manual", 1), ("retry", 2), ("retry", 3)]
        assert [r.get("retryOf") for r in runs] == [None, first["id"], runs[1]["id"]]
        got = wait_for(lambda: server.requests)
        time.sleep(1.5)  # nothing more comes, from either node
        (request,) = got
        body = request.json()
        assert (body["task"], body["event"], body["exitCode"], body["runId"]) == (
            "flaky", "failure", 3, runs[2]["id"][:13])
        assert rows(pg_dsn, "SELECT state, attempts, claimed_by IS NULL FROM notifications") == [("sent", 1, True)]
        assert b.call("qledge.notify.log")["records"][0]["state"] == "sent"
    finally:
        server.close()


def _json_out(result) -> object:
    import json

    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_history_and_edits_work_from_any_node(daemon_factory, pg_dsn):
    """What `qledge run list`, run references, `task update`, `trigger update`, `task rm`,
    `qledge next` and `qledge audit` read and write is the cluster's, from either node."""
    a, b = start_nodes(daemon_factory, pg_dsn, 2)
    a.call("qledge.task.create", task("ok", ["true"]))
    a.call("qledge.task.create", task("bad", ["false"]))
    ids = {}
    for name in ("ok", "bad", "ok"):
        run = b.call("qledge.run.start", {"taskId": name})
        a.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 20_000})
        ids.setdefault(name, []).append(run["id"])
    failed = _json_out(a.cli("run", "list", "--status", "failed", "--json"))
    assert [r["id"] for r in failed] == ids["bad"]
    assert [r["id"] for r in _json_out(b.cli("run", "list", "--task", "ok", "--json"))] == ids["ok"][::-1]
    assert _json_out(b.cli("run", "get", "bad:latest-failed", "--json"))["id"] == ids["bad"][0]
    assert _json_out(a.cli("run", "get", ids["ok"][1][:13], "--json"))["id"] == ids["ok"][1]
    gone = a.cli("run", "list", "--task", "nope")
    assert gone.returncode == 1 and gone.stderr == "qledge: not_found: task 'nope' not found\n"
    # Edits are compare-and-set on rows every node locks: a change made on one node is the
    # head the other reads.
    assert a.cli("task", "update", "ok", "--timeout", "90s").returncode == 0
    assert _json_out(b.cli("task", "get", "ok", "--json"))["spec"]["timeoutMs"] == 90_000
    assert b.cli("trigger", "add", "ok", "--cron", "0 3 * * *", "--tz", "UTC").returncode == 0
    moved = a.cli("trigger", "update", "ok-1", "--cron", "30 4 * * *")
    assert moved.returncode == 0 and "(revision 2): 30 4 * * * in UTC" in moved.stdout, moved.stderr
    assert "ok-1" in b.cli("next").stdout
    refused = b.cli("task", "rm", "ok")
    assert refused.returncode == 1 and "has 1 trigger (ok-1)" in refused.stderr
    assert a.cli("task", "rm", "ok", "--with-triggers").returncode == 0
    assert b.call("qledge.trigger.list")["triggers"] == []
    # The audit of every node, newest first.
    rows_seen = _json_out(b.cli("audit", "--limit", "200", "--json"))
    tools = [r["tool"] for r in rows_seen]
    assert "qledge.task.delete" in tools and "qledge.trigger.update" in tools
    assert [r["id"] for r in rows_seen] == sorted((r["id"] for r in rows_seen), reverse=True)


@pytest.mark.e2e
def test_following_a_log_from_either_node(daemon_factory, pg_dsn):
    """Asked of the node that runs it, `run log --follow` streams; asked of the other, it
    prints the log once the run has finished there. Both end with the whole log."""
    import subprocess
    import sys

    a, b = start_nodes(daemon_factory, pg_dsn, 2)
    a.call("qledge.task.create", task("slow", ["sh", "-c", "echo one; sleep 1; echo two; sleep 1; echo three"]))
    run = a.call("qledge.run.start", {"taskId": "slow"})
    followers = [subprocess.Popen([sys.executable, "-m", "edge", "run", "log", run["id"], "--follow"], env=node.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (a, b)]
    outputs = [f.communicate(timeout=60) for f in followers]
    for out, err in outputs:
        assert (out, err) == ("one\ntwo\nthree\n", "")
    assert [f.returncode for f in followers] == [0, 0]


def _garbage_calls(path: str, calls: int) -> int:
    """Calls with tokens nobody issued, pipelined on one connection; how many were refused."""
    import socket

    import msgspec

    from edge.transports import tool_protocol as frames

    refused = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        stream = sock.makefile("rb")
        for start in range(0, calls, 250):
            sock.sendall(b"".join(frames.frame(msgspec.msgpack.encode(
                {"id": i, "tool": f"qledge.tool{i % 5}", "token": f"qle_{i:012x}_garbage"}))
                for i in range(start, start + 250)))
            for _ in range(250):
                size = int.from_bytes(stream.read(4), "big")
                refused += msgspec.msgpack.decode(stream.read(size))["error"]["code"] == "unauthenticated"
    return refused


def test_a_flood_of_refused_calls_is_a_few_aggregate_rows_on_postgresql(daemon_factory, pg_dsn):
    """As on SQLite: refused calls on a cluster node are counted on a row per peer, cause and
    minute in PostgreSQL, which `qledge audit` on any node shows with its count; the
    credential change before the flood is still there."""
    a, b = start_nodes(daemon_factory, pg_dsn, 2)
    a.call("qledge.credential.create", {"role": "viewer"})
    assert _garbage_calls(a.socket, 2000) == 2000

    def counted() -> list[tuple]:
        return rows(pg_dsn, "SELECT principal, tool, count, class, node_id FROM security_audit WHERE class = 'refused'")

    found = wait_for(lambda: (r := counted()) and sum(x[2] for x in r) == 2000 and r, timeout=10)
    assert 1 <= len(found) <= 2, found  # the flood's minute, or two
    assert all(principal == f"uid:{os.getuid()}" and tool == "*" and node == "n1"
               for principal, tool, _, _, node in found)
    shown = _json_out(b.cli("audit", "--limit", "200", "--json"))
    aggregates = [r for r in shown if r["outcome"] == "unauthenticated"]
    assert sum(r["count"] for r in aggregates) == 2000 and all(r["lastAtMs"] >= r["atMs"] for r in aggregates)
    assert [r["tool"] for r in shown if r.get("change")] == ["qledge.credential.create"]
    table = b.cli("audit", "--limit", "200").stdout.splitlines()
    assert table[0].split()[-1] == "CALLS" and any(" until " in line for line in table[1:]), table


async def test_refused_calls_spooled_while_postgresql_is_unreachable_are_aggregated(pg_dsn, home):
    """With PostgreSQL down, the first refused call of a row goes to the spool; the calls
    counted after it become one more spooled row when its minute is over (or at close), not
    one line each, so a flood cannot fill the spool; moving the spool keeps every count."""
    from edge.core.auth import MINUTE_MS, AuditRecord
    from edge.storage.postgres.db import PgDatabase
    from edge.storage.postgres.schema import migrate
    from edge.storage.postgres.security import PgAuditLog
    from edge.storage.postgres.sql import SECURITY
    from edge.storage.security import SqlAuditReader

    spool = os.path.join(home, "audit-spool.jsonl")
    minute = 1_800_000_000_000 // MINUTE_MS * MINUTE_MS

    def refused(at: int, tool: str = "qledge.status") -> AuditRecord:
        return AuditRecord(at_ms=at, project_id="default", principal="uid:7", tool=tool, outcome="unauthenticated",
                           reasons=["credential_unknown", "tool_x"], transport="socket", request_id="r")

    nowhere = PgDatabase(f"host={home} port=1 dbname=none user=none", connect_timeout_s=1)
    down = PgAuditLog(nowhere, "n1", spool=spool)
    for i in range(500):
        await down.append(refused(minute + i, tool="qledge.status" if i % 2 else "qledge.run.start"))
    await down.flush()  # its minute is not over: still counted in memory
    with open(spool) as f:
        assert len(f.read().splitlines()) == 1
    await down.append(refused(minute + MINUTE_MS + 1))  # the next minute: its own row
    await down.flush()  # the first minute is over: its counts are one spooled row
    with open(spool) as f:
        assert len(f.read().splitlines()) == 3
    await down.close()
    await nowhere.close()

    db = PgDatabase(pg_dsn)
    await migrate(db)
    up = PgAuditLog(db, "n1", spool=spool)
    assert await up.move_spool() == 3 and not os.path.exists(spool)
    entries = (await SqlAuditReader(db, SECURITY).page("default", None, None, 10)).entries
    assert [(e.tool, e.count, e.at_ms, e.last_at_ms) for e in reversed(entries)] == [
        ("qledge.run.start", 1, minute, minute), ("qledge.status", 1, minute + MINUTE_MS + 1, minute + MINUTE_MS + 1),
        ("*", 499, minute + 1, minute + 499)]
    await db.close()


async def test_counts_of_a_row_in_postgresql_are_spooled_at_stop_when_it_is_gone(pg_server, home):
    """The first refused call of a row reached PostgreSQL; then it went away (its database
    dropped under the node): at stop, the calls counted since become a spooled row of their
    own rather than being lost."""
    import msgspec
    import psycopg

    from edge.core.auth import MINUTE_MS, AuditRecord
    from edge.storage.postgres.db import PgDatabase
    from edge.storage.postgres.schema import migrate
    from edge.storage.postgres.security import PgAuditLog

    dsn = pg_server.create_database()
    spool = os.path.join(home, "audit-spool.jsonl")
    db = PgDatabase(dsn, connect_timeout_s=2)
    await migrate(db)
    audit = PgAuditLog(db, "n1", spool=spool)
    minute = 1_800_000_000_000 // MINUTE_MS * MINUTE_MS
    for i in range(30):
        await audit.append(AuditRecord(at_ms=minute + i, project_id="default", principal="uid:7", tool="qledge.status",
                                       outcome="denied", reasons=["tool_policy_denied"], transport="socket"))
    assert not os.path.exists(spool)  # the first call is in PostgreSQL, the rest counted
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await audit.close()
    await db.close()
    with open(spool, "rb") as f:
        (line,) = f.read().splitlines()
    row = msgspec.json.decode(line)
    assert (row["count"], row["atMs"], row["lastAtMs"], row["outcome"]) == (29, minute + 1, minute + 29, "denied")


async def test_a_run_start_audit_row_rides_in_the_calls_first_transaction(pg_dsn, home):
    """An allowed call's row sent ahead (`AuditLog.ahead`) commits in the call's first storage
    transaction (the same PostgreSQL transaction id), not one of its own; when that
    transaction rolls back, or the call makes none, the row is written by then or by
    `committed()`, once, and while PostgreSQL is unreachable it goes to the spool."""
    from edge.core.auth import AuditRecord
    from edge.core.errors import ToolError, conflict
    from edge.storage.postgres.db import PgDatabase
    from edge.storage.postgres.schema import migrate
    from edge.storage.postgres.security import PgAuditLog

    def allowed(request: str, tool: str = "qledge.run.start") -> AuditRecord:
        return AuditRecord(at_ms=1_800_000_000_000, project_id="default", principal="uid:7", tool=tool,
                           outcome="allowed", reasons=["tool_invocation_allowed"], transport="socket",
                           request_id=request)

    def xid(tx) -> int:
        return int(tx.one("SELECT pg_current_xact_id()::text::bigint")[0])

    def refuse(tx) -> None:
        tx.execute("SELECT 1")
        raise conflict("no")

    def row_xid(request: str) -> list[tuple]:
        return rows(pg_dsn, "SELECT xmin::text::bigint FROM security_audit WHERE request_id = %s", (request,))

    db = PgDatabase(pg_dsn)
    await migrate(db)
    audit = PgAuditLog(db, "n1")
    ticket = await audit.ahead(allowed("ride"))
    assert row_xid("ride") == []  # not yet: it waits for the call's first transaction
    read_in = await db.read(xid)
    assert row_xid("ride") == [(read_in,)]
    await ticket.committed()
    assert row_xid("ride") == [(read_in,)]  # once

    await audit.append(allowed("other", tool="qledge.task.delete"))  # append: written at once
    assert len(row_xid("other")) == 1

    ticket = await audit.ahead(allowed("rolled-back"))
    with pytest.raises(ToolError):
        await db.write(refuse)
    assert len(row_xid("rolled-back")) == 1
    await ticket.committed()
    assert len(row_xid("rolled-back")) == 1

    ticket = await audit.ahead(allowed("no-read"))  # refused before any read (its arguments)
    await asyncio.sleep(0)
    assert row_xid("no-read") == []
    await ticket.committed()  # before the refusal is answered
    assert len(row_xid("no-read")) == 1
    await audit.close()
    await db.close()

    spool = os.path.join(home, "audit-spool.jsonl")
    nowhere = PgDatabase(f"host={home} port=1 dbname=none user=none", connect_timeout_s=1)
    down = PgAuditLog(nowhere, "n1", spool=spool)
    await down.ahead(allowed("spooled"))
    with pytest.raises(ToolError):
        await nowhere.read(xid)
    with open(spool) as f:
        assert '"spooled"' in f.read()
    await down.close()
    await nowhere.close()


def test_a_run_start_refused_on_its_arguments_is_audited_on_a_node(daemon_factory, pg_dsn):
    from edge.cli.client import CallFailed

    (node,) = start_nodes(daemon_factory, pg_dsn, 1)
    with pytest.raises(CallFailed, match="invalid arguments"):
        node.call("qledge.run.start", {"taskId": 7})
    # Durable before the refusal was answered: no wait.
    assert rows(pg_dsn, "SELECT count(*) FROM security_audit WHERE tool = 'qledge.run.start'"
                        " AND outcome = 'allowed'")[0][0] == 1
