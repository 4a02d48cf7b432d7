"""Malformed input at the command line and in task specs: one clear line, never a
traceback, never a request the daemon must cut off — against a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import apsw
import pytest

from edge.cli.client import CallFailed, Client
from edge.storage.sqlite.schema import MIGRATIONS
from support import OWN_USER, DaemonProcess

LIMIT = 262144


def _qledge(d: DaemonProcess, *args: str | bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge", *args], env=d.env, input=stdin, capture_output=True,
                          timeout=60)


def _line(done: subprocess.CompletedProcess) -> str:
    err = done.stderr.decode()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def test_a_request_over_the_frame_cap_is_refused_before_it_is_sent(daemon):
    big = b"x" * 533_000
    done = _qledge(daemon, "secret", "set", "big", stdin=big)
    assert done.returncode == 1
    size = int(_line(done).split("request of ")[1].split()[0])
    assert _line(done) == f"qledge: resource_exhausted: request of {size} bytes exceeds the {LIMIT}-byte limit"
    assert size > 533_000 and daemon.call("qledge.secret.list")["secrets"] == []  # up, nothing stored
    # A client that does not know the cap still gets the daemon's answer, not a broken pipe.
    with Client(daemon.socket, max_frame_bytes=1 << 30) as c, pytest.raises(CallFailed) as err:
        c.call("qledge.secret.set", {"name": "big", "value": big.decode()})
    assert err.value.code == "resource_exhausted" and f"exceeds the {LIMIT}-byte limit" in err.value.message


def test_shell_takes_exactly_one_argument(daemon):
    words = ["printf", "%s\\n", "a b", "c;echo injected"]
    done = _qledge(daemon, "task", "add", "sq", "--shell", "--", *words)
    assert done.returncode == 2
    assert _line(done) == ("qledge: invalid_argument: --shell takes exactly one argument after `--`, the shell"
                           " command, but got 4: quote it as one, e.g. --shell -- 'echo a; echo b'")
    assert daemon.call("qledge.task.list", {})["tasks"] == []
    one = "printf '%s\\n' 'a b' 'c;echo injected'"
    assert _qledge(daemon, "task", "add", "sq", "--user", OWN_USER, "--shell", "--", one).returncode == 0
    spec = daemon.call("qledge.task.get", {"taskId": "sq"})["spec"]
    assert spec["command"]["command"] == one  # stored as given, not re-joined
    run = json.loads(_qledge(daemon, "run", "start", "sq", "--wait", "--json").stdout)
    assert _qledge(daemon, "run", "log", run["id"]).stdout == b"a b\nc;echo injected\n"


def test_qledge_variables_are_refused_on_every_path(daemon):
    done = _qledge(daemon, "task", "add", "t", "--env", "QLEDGE_RUN_ID=fake", "--", "true")
    assert done.returncode == 2 and _line(done) == (
        "qledge: invalid_argument: environment variable QLEDGE_RUN_ID: names starting with QLEDGE_ are set by qledge"
        " and cannot be given")
    spec = {"command": {"kind": "argv", "file": "true"}, "env": {"QLEDGE_TASK_ID": "x"}}
    with pytest.raises(CallFailed) as err:  # the tool socket, whatever the client
        daemon.call("qledge.task.create", {"taskId": "t", "spec": spec})
    assert err.value.code == "invalid_argument" and "QLEDGE_TASK_ID" in err.value.message
    daemon.call("qledge.task.create", {"taskId": "t", "spec": {"command": {"kind": "argv", "file": "true"}}})
    spec["env"] = {"OK": "1", "QLEDGE_RUN_ID": "fake"}
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.task.update", {"taskId": "t", "expectedRevision": 1, "spec": spec})
    assert err.value.code == "invalid_argument"


def test_a_stored_qledge_variable_is_dropped_by_the_migration(home):
    """Revisions written before the refusal existed lose their QLEDGE_* keys (and the runner
    sets its own last, so none could override the recovery marker anyway)."""
    conn = apsw.Connection(os.path.join(home, "qledge.db"))
    for number, sql in enumerate(MIGRATIONS[:4], start=1):
        conn.execute(sql)
        conn.pragma("user_version", number)
    spec = {"command": {"kind": "shell", "command": 'echo "$QLEDGE_RUN_ID $K"'},
            "env": {"QLEDGE_RUN_ID": "fake", "K": "kept", "S": {"secret": "api"}}}
    conn.execute("INSERT INTO tasks VALUES ('default', 'old', 'old', 1, 1, 1, 1)")
    conn.execute("INSERT INTO task_revisions VALUES ('default', 'old', 1, 'qinglong/command@v1', ?, 'sha256:0', 1, 1)",
                 (json.dumps(spec),))
    conn.close()
    d = DaemonProcess(home=home).start()
    try:
        task = d.call("qledge.task.get", {"taskId": "old"})
        assert task["spec"]["env"] == {"K": "kept", "S": {"secret": "api"}}
        assert task["privileged"] is True and task["spec"].get("user") is None  # ran as the daemon's user: still does
        spec["env"] = {"K": "kept"}
        d.call("qledge.task.update", {"taskId": "old", "expectedRevision": 1,
                                      "spec": {**spec, "user": OWN_USER}})
        run = json.loads(d.cli("run", "start", "old", "--wait", "--json").stdout)
        assert d.cli("run", "log", run["id"]).stdout == f"{run['id']} kept\n"
    finally:
        d.cleanup()


@pytest.mark.parametrize("value,says", [
    ("nan", "is not a duration"), ("inf", "is not a duration"), ("-inf", "is not a duration"),
    ("1e309", "is not a duration"), ("-5", "is not a duration"), ("0", "must be at least 1 second"),
    ("604801", "must be at most 7 days (604800 seconds)"),
])
def test_a_timeout_out_of_range_is_one_line(daemon, value, says):
    done = _qledge(daemon, "task", "add", "t", f"--timeout={value}", "--", "true")
    line = _line(done)
    assert done.returncode == 2 and line.startswith("qledge: invalid_argument: --timeout ") and says in line, line


def test_bytes_that_are_not_utf8_are_one_line(daemon):
    done = _qledge(daemon, "secret", "set", "bin", stdin=b"\xff\xfe binary")
    assert done.returncode == 2 and _line(done) == (
        "qledge: invalid_argument: the value on stdin is not UTF-8 text (byte 0); nothing was stored"
        " (encode binary values, e.g. base64)")
    for argv in (["secret", "set", b"\xffname"], ["task", "add", b"t\xc3", "--", "true"],
                 ["task", "add", "t", "--", "echo", b"\xfe"]):
        done = _qledge(daemon, *argv, stdin=b"v")
        line = _line(done)
        assert done.returncode == 2 and line.startswith("qledge: invalid_argument: argument '")
        assert line.endswith("is not valid UTF-8")
    assert daemon.call("qledge.secret.list")["secrets"] == [] and daemon.call("qledge.task.list", {})["tasks"] == []


@pytest.mark.parametrize("after", ["9999-06-01T00:00", "9999-12-31T23:30", "9999-12-31T15:00:00+00:00"])
def test_cron_next_at_the_end_of_the_calendar_is_one_line(after):
    done = subprocess.run([sys.executable, "-m", "edge", "cron", "next", "0 */7 * * *", "--after", after,
                           "--count", "1000", "--tz", "Asia/Shanghai"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    fires = done.stdout.splitlines()
    assert len(fires) < 1000 and all(line.startswith("9999-") for line in fires)
    assert done.stderr in ("note: no more fire times before the year 10000\n",
                           "note: no fire times before the year 10000\n")
    for beyond in ("0001-01-01T00:00", "9999-12-31T23:59:59+00:00"):  # in Tokyo: year 0 and year 10000
        out = subprocess.run([sys.executable, "-m", "edge", "cron", "next", "@daily", "--after", beyond,
                              "--tz", "Asia/Tokyo"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr == (
            f"qledge: invalid_argument: --after '{beyond}' is outside the calendar this system can compute with\n")
