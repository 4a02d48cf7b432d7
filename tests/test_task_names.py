"""Names people use: a task imported with a name (`每日签到`) is listed with it and can be given
by it wherever the CLI takes a task, against a real daemon."""

from __future__ import annotations

import json


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def _task(d, task_id: str, name: str | None = None) -> None:
    args = {"taskId": task_id, "spec": {"command": {"kind": "argv", "file": "true"}}}
    d.call("qledge.task.create", args | ({"name": name} if name else {}))


def test_tasks_are_listed_with_their_names_only_when_one_differs_from_its_id(daemon):
    _task(daemon, "plain")
    assert _ok(daemon.cli("task", "list")).stdout.splitlines()[0].split() == ["TASK", "REV", "ENABLED", "COMMAND"]
    _task(daemon, "ql-1", "每日签到")
    lines = _ok(daemon.cli("task", "list")).stdout.splitlines()
    assert lines[0].split() == ["TASK", "NAME", "REV", "ENABLED", "COMMAND"]
    assert [line.split()[:2] for line in lines[1:]] == [["plain", "plain"], ["ql-1", "每日签到"]]
    _, viewer = daemon.token("viewer")
    seen = _ok(daemon.cli("task", "list", token=viewer)).stdout.splitlines()
    assert seen[0].split()[:2] == ["TASK", "NAME"] and seen[2].split()[:2] == ["ql-1", "每日签到"]


def test_runs_triggers_and_next_fires_are_listed_with_task_names_when_one_differs(daemon):
    _task(daemon, "plain")
    _ok(daemon.cli("trigger", "add", "plain", "--cron", "0 3 * * *"))
    _ok(daemon.cli("run", "start", "plain", "--wait"))

    def heads() -> list[list[str]]:
        return [_ok(daemon.cli(*argv)).stdout.splitlines()[0].split()
                for argv in (("run", "list"), ("trigger", "list"), ("next",))]

    assert ["NAME" in head for head in heads()] == [False, False, False]
    _task(daemon, "ql-1", "每日签到")
    _ok(daemon.cli("trigger", "add", "ql-1", "--cron", "0 4 * * *"))
    _ok(daemon.cli("run", "start", "ql-1", "--wait"))
    assert heads() == [["RUN", "TASK", "NAME", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
                       ["TRIGGER", "TASK@REV", "NAME", "ENABLED", "CRON", "TIMEZONE", "NEXT", "FIRE"],
                       ["WHEN", "TRIGGER", "TASK", "NAME", "TIMEZONE", "JITTER"]]
    runs = _ok(daemon.cli("run", "list")).stdout.splitlines()[1:]
    assert sorted(line.split()[1:3] for line in runs) == [["plain", "plain"], ["ql-1", "每日签到"]]
    assert "每日签到" in _ok(daemon.cli("trigger", "list")).stdout
    assert "每日签到" in _ok(daemon.cli("next")).stdout
    _, viewer = daemon.token("viewer")
    seen = _ok(daemon.cli("trigger", "list", token=viewer)).stdout.splitlines()
    assert seen[0].split()[:3] == ["TRIGGER", "TASK@REV", "NAME"] and "每日签到" in seen[2]
    assert "NAME" not in _ok(daemon.cli("run", "list", "--json")).stdout  # JSON keeps its shape


def test_a_task_name_is_taken_wherever_a_task_id_is(daemon):
    _task(daemon, "ql-1", "每日签到")
    _task(daemon, "other")
    run = json.loads(_ok(daemon.cli("run", "start", "每日签到", "--wait", "--json")).stdout)
    assert run["taskId"] == "ql-1" and run["status"] == "succeeded"
    assert "task:        ql-1" in _ok(daemon.cli("task", "get", "每日签到")).stdout
    listed = json.loads(_ok(daemon.cli("run", "list", "--task", "每日签到", "--json")).stdout)
    assert [r["id"] for r in listed] == [run["id"]]
    assert json.loads(_ok(daemon.cli("run", "get", "每日签到:latest", "--json")).stdout)["id"] == run["id"]
    assert _ok(daemon.cli("run", "log", "每日签到:latest")).stdout == ""
    added = _ok(daemon.cli("trigger", "add", "每日签到", "--cron", "0 3 * * *")).stdout
    assert added.startswith("trigger ql-1-1 created for task ql-1 ")
    assert _ok(daemon.cli("task", "disable", "每日签到")).stdout == "task ql-1 disabled (revision 2)\n"
    _ok(daemon.cli("task", "update", "每日签到", "--timeout", "5m"))
    assert daemon.call("qledge.task.get", {"taskId": "ql-1"})["spec"]["timeoutMs"] == 300_000
    _, viewer = daemon.token("viewer")
    assert "task:     ql-1" in _ok(daemon.cli("task", "get", "每日签到", token=viewer)).stdout
    # An id wins over a name: a task named after another task's id is reached by its own id.
    _task(daemon, "ql-2", "other")
    assert "task:        other" in _ok(daemon.cli("task", "get", "other")).stdout
    assert "ql-1 deleted" in _ok(daemon.cli("task", "rm", "每日签到", "--with-triggers")).stdout


def test_a_name_that_names_two_tasks_or_none_is_one_clear_line(daemon):
    _task(daemon, "ql-3", "签到")
    _task(daemon, "ql-4", "签到")
    shared = daemon.cli("run", "start", "签到")
    assert shared.returncode == 2
    assert shared.stderr == ("qledge: invalid_argument: task name '签到' is shared by tasks ql-3, ql-4:"
                             " give one of their ids\n")
    unknown = daemon.cli("run", "start", "每日签到")
    assert unknown.returncode == 1
    assert unknown.stderr == "qledge: not_found: task '每日签到' not found: no task has that id or name\n"
    assert daemon.cli("task", "get", "nope").stderr == "qledge: not_found: task 'nope' not found\n"
    assert daemon.call("qledge.run.list", {})["runs"] == []
