"""A spec schema this qledge does not know fails closed (seed 002, decision 5): refused when
written, `unavailable` when read, never passed through as if it were valid — against a real
daemon whose database file another writer changed underneath it."""

from __future__ import annotations

import apsw
import pytest

from edge.cli.client import CallFailed
from support import OWN_USER

EVIL = "evil/other@v9"


def _seed(d) -> None:
    d.cli("task", "add", "t", "--user", OWN_USER, "--", "true")
    d.cli("trigger", "add", "t", "--id", "g", "--cron", "0 3 * * *")


def _code(d, tool: str, args: dict) -> str:
    with pytest.raises(CallFailed) as err:
        d.call(tool, args)
    return err.value.code


def test_an_unknown_schema_is_refused_when_written(daemon):
    _seed(daemon)
    conn = daemon.db()
    for sql in ("UPDATE task_revisions SET spec_schema = ?", "UPDATE trigger_revisions SET spec_schema = ?",
                "INSERT INTO task_revisions SELECT project_id, task_id, revision + 1, ?, spec, content_digest, enabled,"
                " created_at_ms, privileged FROM task_revisions",
                "INSERT INTO trigger_revisions SELECT project_id, trigger_id, revision + 1, task_id, task_revision,"
                " enabled, ?, spec, content_digest, created_at_ms FROM trigger_revisions"):
        with pytest.raises(apsw.ConstraintError):
            conn.execute(sql, (EVIL,))
    conn.close()
    assert daemon.call("qinglong.task.get", {"taskId": "t"})["task"]["specSchema"] == "qinglong/command@v1"


def test_an_unknown_schema_on_record_is_unavailable_to_every_reader(daemon):
    _seed(daemon)
    conn = daemon.db()
    # What another writer (one that does not hold these rules) left behind.
    for name in ("task_revisions_known_schema", "task_revisions_schema_kept", "trigger_revisions_known_schema",
                 "trigger_revisions_schema_kept"):
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    conn.execute("UPDATE task_revisions SET spec_schema = ?", (EVIL,))
    conn.execute("UPDATE trigger_revisions SET spec_schema = ?", (EVIL,))
    conn.close()
    for tool, args in (("qinglong.task.list", {}), ("qinglong.task.get", {"taskId": "t"}),
                       ("qinglong.trigger.list", {}), ("qledge.task.get", {"taskId": "t"}),
                       ("qledge.task.list", {}), ("qledge.trigger.list", {}),
                       ("qledge.trigger.get", {"triggerId": "g"})):
        assert _code(daemon, tool, args) == "unavailable", tool
    # The run of such a revision does not start: it fails, and says why.
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.run.start", {"taskId": "t"})
    assert err.value.code == "unavailable"
    out = daemon.cli("task", "get", "t")
    assert out.returncode != 0 and "Traceback" not in out.stderr and EVIL in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_command_under_the_agent_schema_is_unavailable(daemon):
    _seed(daemon)
    conn = daemon.db()
    conn.execute("DROP TRIGGER task_revisions_schema_kept")
    conn.execute("UPDATE task_revisions SET spec_schema = 'qinglong/agent@v1'")
    conn.close()
    for tool, args in (("qinglong.task.list", {}), ("qinglong.task.get", {"taskId": "t"}),
                       ("qledge.task.get", {"taskId": "t"})):
        assert _code(daemon, tool, args) == "unavailable", tool
