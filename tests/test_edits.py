"""Tasks and triggers people can change: `task update`, `trigger update` (compare-and-set,
one retry, who won), `task rm` and triggers, and what a viewer's reads show — real daemons,
the real CLI."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import msgspec
import pytest

from edge.cli.client import CallFailed, Client
from edge.cli.main import build_parser
from edge.cli.task import task_update
from edge.cli.trigger import trigger_update
from support import OWN_USER


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def _json(result):
    return json.loads(_ok(result).stdout)


def test_task_update_changes_what_it_names_and_keeps_history_and_triggers(daemon):
    _ok(daemon.cli("task", "add", "hello", "--env", "A=1", "--env", "B=2", "--timeout", "30", "--", "echo", "hi"))
    first = _json(daemon.cli("run", "start", "hello", "--wait", "--json"))
    _ok(daemon.cli("trigger", "add", "hello", "--cron", "0 3 * * *", "--tz", "UTC"))
    done = _ok(daemon.cli("task", "update", "hello", "--env", "B=3", "--unset-env", "A", "--", "echo", "bye"))
    assert done.stdout.startswith("task hello updated to revision 2")
    task = _json(daemon.cli("task", "get", "hello", "--json"))
    assert task["revision"] == 2
    task["spec"].pop("user")  # the default task user, given at `task add` and kept
    assert task["spec"] == {"command": {"kind": "argv", "file": "echo", "args": ["bye"]}, "env": {"B": "3"},
                            "timeoutMs": 30_000}  # the timeout was not named: it stays
    # History and triggers are kept: the old run is there, the trigger follows the new revision.
    runs = _json(daemon.cli("run", "list", "--task", "hello", "--json"))
    assert [r["id"] for r in runs] == [first["id"]] and runs[0]["taskRevision"] == 1
    assert _json(daemon.cli("trigger", "get", "hello-1", "--json"))["taskRevision"] == 2
    assert _json(daemon.cli("run", "start", "hello", "--wait", "--json"))["taskRevision"] == 2
    assert _ok(daemon.cli("run", "log", "hello:latest")).stdout == "bye\n"
    # --reset returns a field to its default; the same values again change nothing.
    where = daemon.scratch  # a directory the task's user may enter (the update is checked as `task add` is)
    _ok(daemon.cli("task", "update", "hello", "--reset", "timeout", "--cwd", where))
    spec = _json(daemon.cli("task", "get", "hello", "--json"))["spec"]
    assert "timeoutMs" not in spec and spec["workingDir"] == where
    same = _ok(daemon.cli("task", "update", "hello", "--cwd", where))
    assert same.stdout == "task hello unchanged (revision 3)\n"
    # Errors are one line in the flags' terms.
    missing = daemon.cli("task", "update", "hello", "--unset-env", "NOPE")
    assert (missing.returncode, missing.stderr) == (
        2, "qledge: invalid_argument: --unset-env NOPE: the task has no such variable\n")
    shell = daemon.cli("task", "update", "hello", "--shell")
    assert shell.returncode == 2 and "--shell applies to a new command" in shell.stderr
    gone = daemon.cli("task", "update", "nope", "--timeout", "5")
    assert (gone.returncode, gone.stderr) == (1, "qledge: not_found: task 'nope' not found\n")


def _update_args(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    args.json = False
    return args


class RacingClient(Client):
    """A real client whose every read of the head is followed, before it writes, by another
    writer's change through a second real connection: a concurrent update, deterministic."""

    def __init__(self, path: str, race: list, races: int) -> None:
        super().__init__(path)
        self._race, self._races = race, races

    def typed(self, tool, args, result):
        answer = super().typed(tool, args, result)
        if tool in ("qledge.task.get", "qledge.trigger.get") and self._races > 0:
            self._races -= 1
            with Client(self.path) as other:
                for step in self._race:
                    other.call(*step(answer))
        return answer


def test_task_update_retries_once_on_a_concurrent_change(daemon, capsys):
    _ok(daemon.cli("task", "add", "t", "--timeout", "30", "--", "echo", "one"))

    def bump(head):  # the other writer changes the timeout only, on the head this update read
        return ("qledge.task.update", {"taskId": "t", "expectedRevision": head.revision,
                                       "spec": {**msgspec.to_builtins(head.spec), "timeoutMs": 45_000}})

    with RacingClient(daemon.socket, [bump], races=1) as c:
        assert task_update(c, _update_args("task", "update", "t", "--", "echo", "two")) == 0
    task = daemon.call("qledge.task.get", {"taskId": "t"})
    # Both changes hold: the other writer's timeout and this update's command.
    assert task["revision"] == 3 and task["spec"]["timeoutMs"] == 45_000
    assert task["spec"]["command"]["args"] == ["two"]
    assert "updated to revision 3" in capsys.readouterr().out

    with RacingClient(daemon.socket, [bump], races=2) as c, pytest.raises(CallFailed) as lost:
        task_update(c, _update_args("task", "update", "t", "--", "echo", "three"))
    assert lost.value.code == "conflict"
    assert "changed by another writer while this update was made, twice: it is now at revision 5" in (
        lost.value.message)
    assert daemon.call("qledge.task.get", {"taskId": "t"})["spec"]["command"]["args"] == ["two"]


def test_trigger_update_is_a_new_revision_that_keeps_events(daemon):
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    made = _json(daemon.cli("trigger", "add", "t", "--cron", "0 3 * * *", "--tz", "UTC", "--json"))
    with daemon.db() as db:  # a fire that did not run, on record before the update
        db.execute("INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms, fires,"
                   " created_at_ms) VALUES ('default', 't-1', 'skipped', 'overlap', 1000, 1, 1000)")
    done = _ok(daemon.cli("trigger", "update", "t-1", "--cron", "30 4 * * *", "--tz", "Europe/Berlin",
                          "--jitter", "90s"))
    assert done.stdout.startswith("trigger t-1 updated (revision 2): 30 4 * * * in Europe/Berlin; next fire ")
    assert done.stdout.rstrip().endswith((" 04:30:00 CET", " 04:30:00 CEST"))
    now = _json(daemon.cli("trigger", "get", "t-1", "--json"))
    assert now["revision"] == 2 and now["createdAtMs"] == made["createdAtMs"]
    assert now["spec"] == {"expression": "30 4 * * *", "timezone": "Europe/Berlin", "jitterS": 90}
    assert now["nextFireAtMs"] != made["nextFireAtMs"]  # re-armed for the new schedule
    assert [e["reason"] for e in _json(daemon.cli("trigger", "events", "t-1", "--json"))] == ["overlap"]
    # Only --misfire: everything else stays.
    _ok(daemon.cli("trigger", "update", "t-1", "--misfire", "fire_once"))
    spec = _json(daemon.cli("trigger", "get", "t-1", "--json"))["spec"]
    assert spec == {"expression": "30 4 * * *", "timezone": "Europe/Berlin", "misfire": "fire_once", "jitterS": 90}
    for argv, code, message in (
        ([], 2, "qledge: invalid_argument: nothing to change: give --cron, --tz, --misfire or --jitter\n"),
        (["--cron", "61 * * * *"], 2, "qledge: invalid_argument: invalid cron expression '61 * * * *': minute field:"
                                      " 61 is out of range 0-59\n"),
        (["--tz", ""], 2, "qledge: invalid_argument: --tz must name a time zone (e.g. Europe/Berlin or UTC),"
                          " not be empty\n"),
        (["--jitter", "3601"], 2, "qledge: invalid_argument: --jitter must be a whole number of seconds from 0 to"
                                  " 3600 (1 hour)\n"),
    ):
        bad = daemon.cli("trigger", "update", "t-1", *argv)
        assert (bad.returncode, bad.stderr) == (code, message)
    assert _json(daemon.cli("trigger", "get", "t-1", "--json"))["revision"] == 3


def test_trigger_update_retries_once_then_says_who_won(daemon, capsys):
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _ok(daemon.cli("trigger", "add", "t", "--cron", "0 3 * * *", "--tz", "UTC"))

    def toggle(head):  # the other writer disables or enables it: a new revision each time
        return ("qledge.trigger.disable" if head.enabled else "qledge.trigger.enable", {"triggerId": "t-1"})

    with RacingClient(daemon.socket, [toggle], races=1) as c:
        assert trigger_update(c, _update_args("trigger", "update", "t-1", "--cron", "0 4 * * *")) == 0
    trigger = daemon.call("qledge.trigger.get", {"triggerId": "t-1"})
    assert trigger["revision"] == 3 and trigger["enabled"] is False and trigger["spec"]["expression"] == "0 4 * * *"
    capsys.readouterr()
    with RacingClient(daemon.socket, [toggle], races=2) as c, pytest.raises(CallFailed) as lost:
        trigger_update(c, _update_args("trigger", "update", "t-1", "--cron", "0 5 * * *"))
    assert lost.value.code == "conflict" and "it is now at revision 5" in lost.value.message
    assert daemon.call("qledge.trigger.get", {"triggerId": "t-1"})["spec"]["expression"] == "0 4 * * *"


def test_task_rm_refuses_a_task_with_triggers_unless_asked(daemon):
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _ok(daemon.cli("run", "start", "t", "--wait"))
    for _ in range(2):
        _ok(daemon.cli("trigger", "add", "t", "--cron", "0 3 * * *", "--tz", "UTC"))
    refused = daemon.cli("task", "rm", "t")
    assert (refused.returncode, refused.stderr) == (1, (
        "qledge: conflict: task 't' has 2 triggers (t-1, t-2), which would be deleted with it: delete them first,"
        " or run `qledge task rm t --with-triggers`\n"))
    assert len(daemon.call("qledge.trigger.list", {})["triggers"]) == 2  # nothing went
    done = _ok(daemon.cli("task", "rm", "t", "--with-triggers"))
    assert done.stdout == "task t deleted with its 1 finished runs and its triggers\n"
    assert daemon.call("qledge.trigger.list", {})["triggers"] == []
    # A task without triggers needs no flag.
    _ok(daemon.cli("task", "add", "u", "--", "true"))
    assert _ok(daemon.cli("task", "rm", "u")).stdout == "task u deleted with its 0 finished runs\n"


def test_a_viewer_reads_tasks_and_triggers_through_what_it_holds(daemon):
    _ok(daemon.cli("task", "add", "hello", "--env", "KEY=hunter2", "--", "echo", "hi"))
    _ok(daemon.cli("trigger", "add", "hello", "--cron", "0 3 * * *", "--tz", "UTC"))
    with daemon.db() as db:
        db.execute("INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms, fires,"
                   " created_at_ms) VALUES ('default', 'hello-1', 'skipped', 'misfire', 1000, 3, 1000)")
        before = db.execute("SELECT count(*) FROM security_audit WHERE outcome != 'allowed'").fetchone()[0]
    _, viewer = daemon.token("viewer")
    listed = _ok(daemon.cli("task", "list", token=viewer)).stdout
    assert listed.splitlines()[0].split() == ["TASK", "REV", "ENABLED", "KIND", "UPDATED"]
    assert "hello" in listed and "echo" not in listed
    got = _ok(daemon.cli("task", "get", "hello", token=viewer)).stdout
    assert re.search(r"^kind: +argv$", got, re.M) and "hunter2" not in got and "it needs task.inspect" in got
    assert _json(daemon.cli("task", "get", "hello", "--json", token=viewer))["taskId"] == "hello"
    missing = daemon.cli("task", "get", "nope", token=viewer)
    assert (missing.returncode, missing.stderr) == (1, "qledge: not_found: task 'nope' not found\n")
    triggers = _ok(daemon.cli("trigger", "list", token=viewer)).stdout
    assert "hello-1" in triggers and "0 3 * * *" not in triggers
    one = _ok(daemon.cli("trigger", "get", "hello-1", token=viewer)).stdout
    assert re.search(r"^trigger: +hello-1$", one, re.M) and "0 3" not in one
    assert daemon.cli("trigger", "get", "hello-", token=viewer).returncode == 1
    events = _ok(daemon.cli("trigger", "events", token=viewer)).stdout
    assert "misfire" in events and "hello-1" in events
    assert "hello-1" in _ok(daemon.cli("next", token=viewer)).stdout
    # Nothing was refused on the way: the CLI asked for what a viewer may call.
    with daemon.db() as db:
        assert db.execute("SELECT count(*) FROM security_audit WHERE outcome != 'allowed'").fetchone()[0] == before
    # An operator still gets the full specs.
    _, operator = daemon.token("operator")
    assert "echo hi" in _ok(daemon.cli("task", "list", token=operator)).stdout


def test_relative_paths_are_resolved_where_the_command_is_typed(daemon, tmp_path):
    script = tmp_path / "bin" / "job.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    # (as the daemon's own user: the default task user could not enter this 0700 test directory)
    done = subprocess.run([sys.executable, "-m", "edge", "task", "add", "job", "--user", OWN_USER, "--cwd", ".", "--",
                           "bin/job.sh"],
                          env=daemon.env, cwd=str(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    spec = daemon.call("qledge.task.get", {"taskId": "job"})["spec"]
    assert spec["workingDir"] == str(tmp_path) and spec["command"]["file"] == str(script)
    run = _json(daemon.cli("run", "start", "job", "--wait", "--json"))
    assert _ok(daemon.cli("run", "log", run["id"])).stdout == f"{tmp_path}\n"
    # The daemon refuses relative paths from any client: never its own directory.
    for spec in ({"command": {"kind": "argv", "file": "bin/job.sh"}},
                 {"command": {"kind": "argv", "file": "true"}, "workingDir": "rel"}):
        bad = daemon.cli("call", "qledge.task.create", "--args", json.dumps({"taskId": "x", "spec": spec}))
        assert bad.returncode == 2 and "relative" in bad.stderr and bad.stderr.count("\n") == 1
