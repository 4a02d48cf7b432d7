"""The CLI end to end against a real daemon process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import msgspec
import pytest

from support import short_tmpdir


def _json(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_add_start_wait_and_read_log(daemon):
    assert daemon.cli("task", "add", "hello", "--", "echo", "hi").returncode == 0
    started = daemon.cli("run", "start", "hello", "--wait")
    assert started.returncode == 0, started.stderr
    assert "succeeded" in started.stdout
    run_id = started.stdout.split()[1]
    log = daemon.cli("run", "log", run_id)
    assert log.returncode == 0
    assert log.stdout == "hi\n"
    run = _json(daemon.cli("run", "get", run_id, "--json"))
    assert run["status"] == "succeeded" and run["exitCode"] == 0 and run["logBytes"] == 3
    events = daemon.call("qledge.run.events", {"runId": run_id})["events"]
    assert [e["type"] for e in events] == ["run.queued", "run.running", "run.succeeded"]
    assert [e["sequence"] for e in events] == [1, 2, 3]


def test_failing_command_is_failed_with_exit_code(daemon):
    daemon.cli("task", "add", "bad", "--shell", "--", "echo oops >&2; exit 3")
    result = daemon.cli("run", "start", "bad", "--wait", "--json")
    assert result.returncode == 1
    run = json.loads(result.stdout)
    assert run["status"] == "failed" and run["exitCode"] == 3 and run["errorCode"] == "exit_nonzero"
    assert daemon.cli("run", "log", run["id"]).stdout == "oops\n"


@pytest.mark.e2e
def test_timeout_kills_the_process_group(daemon, scratch):
    # The child shell spawns a grandchild; both must die when the run times out.
    daemon.cli("task", "add", "slow", "--timeout", "1", "--cwd", scratch, "--shell", "--",
               "sleep 60 & echo $! > pidfile; wait")
    result = daemon.cli("run", "start", "slow", "--wait", "--json")
    run = json.loads(result.stdout)
    assert run["status"] == "timed_out" and run["errorCode"] == "timeout"
    with open(os.path.join(scratch, "pidfile")) as f:
        grandchild = int(f.read())
    assert not _alive(grandchild)


def test_cancel_a_running_run(daemon):
    daemon.cli("task", "add", "long", "--", "sleep", "60")
    run = _json(daemon.cli("run", "start", "long", "--json"))
    waited = daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 0})
    cancelled = _json(daemon.cli("run", "cancel", run["id"], "--json"))
    assert cancelled["status"] == "cancelled"
    assert waited["done"] is False
    events = daemon.call("qledge.run.events", {"runId": run["id"]})["events"]
    assert events[-1]["type"] == "run.cancelled"


def test_cancel_a_queued_run(daemon_factory):
    d = daemon_factory(config="[runner]\nconcurrency = 1\n").start()
    d.cli("task", "add", "long", "--overlap", "allow", "--", "sleep", "60")
    first = _json(d.cli("run", "start", "long", "--json"))
    second = _json(d.cli("run", "start", "long", "--json"))
    cancelled = _json(d.cli("run", "cancel", second["id"], "--json"))
    assert cancelled["status"] == "cancelled" and cancelled["startedAtMs"] is None
    # The first one's start is recorded once it has run for a second.
    deadline = time.monotonic() + 10
    while _json(d.cli("run", "get", first["id"], "--json"))["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_task_lifecycle_and_listing(daemon):
    for i in range(70):  # more than one page of the list tool
        daemon.call("qledge.task.create",
                    {"taskId": f"t{i:03d}", "spec": {"command": {"kind": "argv", "file": "true"}}})
    listed = _json(daemon.cli("task", "list", "--json"))
    assert [t["id"] for t in listed] == [f"t{i:03d}" for i in range(70)]
    assert "disabled" in daemon.cli("task", "disable", "t001").stdout
    refused = daemon.cli("run", "start", "t001")
    assert refused.returncode == 1 and "disabled" in refused.stderr
    got = _json(daemon.cli("task", "get", "t001", "--json"))
    assert got["enabled"] is False and got["revision"] == 2
    assert daemon.cli("task", "rm", "t001").returncode == 0
    missing = daemon.cli("task", "get", "t001")
    assert missing.returncode == 1 and missing.stderr.strip() == "qledge: not_found: task 't001' not found"


def test_update_is_compare_and_set(daemon):
    spec = {"command": {"kind": "argv", "file": "true"}}
    daemon.call("qledge.task.create", {"taskId": "t", "spec": spec})
    updated = daemon.call("qledge.task.update", {"taskId": "t", "expectedRevision": 1, "spec": spec})
    assert updated["revision"] == 2
    stale = daemon.cli("call", "qledge.task.update",
                       "--args", json.dumps({"taskId": "t", "expectedRevision": 1, "spec": spec}))
    assert stale.returncode == 1 and stale.stderr.startswith("qledge: conflict:")


def test_daemon_not_running_is_one_clear_line(home):
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "status"], env=env, capture_output=True, text=True)
    assert result.returncode == 3
    assert result.stderr == f"qledge: unavailable: daemon not running at {home}/qledge.sock\n"


def test_usage_errors_exit_2(home):
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "task", "frobnicate"], env=env, capture_output=True,
                            text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_call_prints_json_and_fails_nonzero(daemon):
    ok = daemon.cli("call", "qledge.status")
    assert ok.returncode == 0 and json.loads(ok.stdout)["pid"] == daemon.pid
    bad = daemon.cli("call", "qledge.nope")
    # Invalid input is exit 2 whoever finds it: the daemon here, the CLI below.
    assert bad.returncode == 2 and bad.stderr == "qledge: invalid_argument: unknown tool 'qledge.nope'\n"
    garbled = daemon.cli("call", "qledge.status", "--args", "{nope")
    assert garbled.returncode == 2 and garbled.stderr.startswith("qledge: invalid_argument: --args is not valid JSON")


def test_status_reports_lean_default(daemon):
    status = daemon.call("qledge.status", {"includeModules": True})
    assert status["loop"] in ("asyncio", "uvloop")
    if status["loop"] == "asyncio":
        assert status["sslLoaded"] is False and "ssl" not in status["modules"]
    assert "edge.mcp" not in status["modules"] and "_hashlib" not in status["modules"]
    # msgspec's submodules that only describe types wait for a first use (edge.app.lean).
    assert not {"msgspec.inspect", "msgspec._json_schema", "msgspec.toml", "msgspec.yaml"} & set(status["modules"])
    assert status["hwmBytes"] > 0 and status["dbPath"].endswith("qledge.db")


def test_sigterm_cancels_runs_and_exits_zero(daemon):
    daemon.cli("task", "add", "long", "--", "sleep", "60")
    run = _json(daemon.cli("run", "start", "long", "--json"))
    daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 200})
    db = daemon.db()
    assert daemon.stop() == 0
    status, summary = db.execute("SELECT status, error_summary FROM runs WHERE id = ?", (run["id"],)).fetchone()
    assert status == "cancelled" and summary == "cancelled: shutdown"
    assert not os.path.exists(daemon.socket)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


# -- typed replies -------------------------------------------------------------------------


class OneReplyPeer:
    """A real Unix-socket peer speaking the frame protocol (4-byte big-endian length, msgpack
    body) that answers every request `{id, ok: true, result}`: a daemon of another shape."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.requests: list[dict] = []
        self.dir = short_tmpdir()
        self.path = os.path.join(self.dir, "peer.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                while (header := self._exactly(conn, 4)) is not None:
                    body = self._exactly(conn, int.from_bytes(header, "big"))
                    if body is None:
                        break
                    request = msgspec.msgpack.decode(body)
                    self.requests.append(request)
                    reply = msgspec.msgpack.encode({"id": request["id"], "ok": True, "result": self.result})
                    conn.sendall(len(reply).to_bytes(4, "big") + reply)

    @staticmethod
    def _exactly(conn: socket.socket, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("QLEDGE_TOKEN", "QLEDGE_SOCKET")}
        env["QLEDGE_HOME"] = self.dir
        return subprocess.run([sys.executable, "-m", "edge", "--socket", self.path, *args], env=env,
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() the thread is blocked in
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)
        assert not self.thread.is_alive()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def peer():
    made: list[OneReplyPeer] = []

    def make(result: Any) -> OneReplyPeer:
        made.append(OneReplyPeer(result))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_one_decoder_per_result_type():
    from edge.cli.client import decoder
    from edge.core.tasks import Task

    assert decoder(Task) is decoder(Task)


def test_peer_speaks_the_protocol(peer):
    # The control for the test below: a reply of the right shape is decoded and printed, and the
    # CLI sent the tool's argument Struct.
    p = peer({"taskId": "hello", "runsDeleted": 2})
    done = p.cli("task", "rm", "hello")
    assert (done.returncode, done.stdout, done.stderr) == (0, "task hello deleted with its 2 finished runs\n", "")
    assert [(r["tool"], r["args"]) for r in p.requests] == [
        ("qledge.task.get", {"taskId": "hello"}),  # TASK: an id, or else a task's name
        ("qledge.task.delete", {"taskId": "hello", "expectedRevision": None, "withTriggers": False})]


@pytest.mark.parametrize("args,result,tool,expected", [
    (["task", "get", "hello"], {"id": "hello", "spec": 42}, "qledge.task.get",
     "Task (is the daemon another version?): Expected `object`, got `int` - at `$.spec`"),
    (["task", "get", "hello", "--json"], {"id": "hello", "spec": 42}, "qledge.task.get",
     "Task (is the daemon another version?): Expected `object`, got `int` - at `$.spec`"),
    (["task", "rm", "hello", "--json"], {"taskId": "hello", "runs_deleted": 2}, "qledge.task.delete",
     "Deleted (is the daemon another version?): Object missing required field `runsDeleted`"),
    (["run", "list", "--json"], {"runs": [{"id": 7}]}, "qledge.run.list",
     "RunPage (is the daemon another version?): Expected `str`, got `int` - at `$.runs[0].id`"),
    (["status"], "ok", "qledge.status", "Status (is the daemon another version?): Expected `object`, got `str`"),
    (["trigger", "list"], {"triggers": None}, "qledge.trigger.list",
     "TriggerPage (is the daemon another version?): Expected `array`, got `None` - at `$.triggers`"),
    (["run", "log", "r1"], None, "qledge.run.log.read",
     "LogChunk (is the daemon another version?): Expected `object`, got `None`"),
])
def test_a_reply_of_the_wrong_shape_is_one_clear_line(peer, args, result, tool, expected):
    # Version skew: the peer answers, but not with what the tool declares. Untyped, the CLI
    # would print the wrong JSON (exit 0) or die in a KeyError/TypeError traceback.
    got = peer(result).cli(*args)
    assert (got.returncode, got.stdout) == (1, ""), got
    assert "Traceback" not in got.stderr
    message = f"{tool}: the daemon's reply is not a {expected}"
    if "--json" in args:  # the error, too, in the form asked for
        assert json.loads(got.stderr) == {"error": {"code": "internal", "message": message}}
    else:
        assert got.stderr == f"qledge: internal: {message}\n"


def test_json_output_is_what_the_tool_returned(daemon):
    # --json re-encodes the decoded Structs; it must print exactly the tool's JSON (camelCase
    # names, omitted defaults), as `qledge call` does.
    daemon.cli("task", "add", "hello", "--shell", "--env", "A=1", "--cwd", "/tmp", "--", "echo $A")
    run = _json(daemon.cli("run", "start", "hello", "--wait", "--json"))
    daemon.cli("trigger", "add", "hello", "--cron", "0 3 * * *", "--tz", "UTC", "--misfire", "fire_once")
    daemon.cli("token", "create", "--role", "viewer")
    daemon.cli("secret", "set", "s", input="v\n")
    pairs = [
        (["task", "get", "hello"], "qledge.task.get", {"taskId": "hello"}, None),
        (["task", "list"], "qledge.task.list", {}, "tasks"),
        (["run", "get", run["id"]], "qledge.run.get", {"runId": run["id"]}, None),
        (["run", "list"], "qledge.run.list", {"limit": 20}, "runs"),
        (["trigger", "get", "hello-1"], "qledge.trigger.get", {"triggerId": "hello-1"}, None),
        (["trigger", "list"], "qledge.trigger.list", {}, "triggers"),
        (["token", "list"], "qledge.credential.list", {}, "credentials"),
        (["secret", "list"], "qledge.secret.list", {}, "secrets"),
    ]
    for argv, tool, args, key in pairs:
        typed = daemon.cli(*argv, "--json")
        untyped = daemon.cli("call", tool, "--args", json.dumps(args))
        assert typed.returncode == untyped.returncode == 0, (typed.stderr, untyped.stderr)
        expected = json.loads(untyped.stdout)
        assert typed.stdout == json.dumps(expected[key] if key else expected, separators=(",", ":")) + "\n", argv
