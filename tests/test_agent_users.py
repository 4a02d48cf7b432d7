"""The AI operator under task users and the permission model, on real daemons (the suite
runs as root, so the user switch is real): the child becomes `[agent] user`, cannot read
the state directory and is not dumpable; it calls tools on a connection of its own that
trusts its token only; who may write AI tasks and ask follows the permission model; the
provider's key is read by the child alone. Every test that sends a request runs against each
provider family's conformance fake: a refusal fails it, naming the family."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys

import pytest

from agent_support import (
    EVERY_FAMILY,
    agent_config,
    ai_task,
    log,
    served,
    record,
    start_and_wait,
    until,
    wait,
)
from fake_provider import Step, answer, tool_call

pytestmark = pytest.mark.e2e

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root daemon")


@pytest.fixture
def provider(request):
    yield from served(request)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _running_pid(d) -> int:
    """The pid of the running run; a run is recorded running once it has lasted a second."""
    def pid() -> int | None:
        conn = d.db()
        try:
            row = conn.execute("SELECT pid FROM runs WHERE status = 'running'").fetchone()
        finally:
            conn.close()
        return None if row is None else int(row[0])

    until(lambda: pid() is not None, what="the running run's pid on record")
    found = pid()
    assert found is not None
    return found


def _can_read_as(uid: int, gid: int, path: str) -> bool:
    """Whether a process of that user (as the child is once it has switched) can open `path`."""
    code = ("import os, sys; os.setgroups([]); os.setresgid(*[int(sys.argv[2])] * 3);"
            " os.setresuid(*[int(sys.argv[1])] * 3)\n"
            "try:\n    open(sys.argv[3], 'rb').close()\nexcept PermissionError:\n    sys.exit(3)")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(uid), str(gid), path], capture_output=True,
                          timeout=30)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


@root_only
@EVERY_FAMILY
def test_the_child_becomes_the_agent_user_before_it_talks_to_the_provider(provider, daemon_factory):
    d = daemon_factory(config=agent_config(provider)).start()
    nobody = pwd.getpwnam("nobody")
    seen: dict[str, object] = {}

    def inspect(request):  # in the provider's thread, while the child waits for this very reply
        pid = _running_pid(d)
        status = _status(pid)
        seen["uid"], seen["gid"], seen["groups"] = status["Uid"].split(), status["Gid"].split(), status["Groups"]
        seen["proc_owner"] = os.stat(f"/proc/{pid}/environ").st_uid  # root's when the process is not dumpable
        seen["peer_reads"] = _can_read_as(nobody.pw_uid, nobody.pw_gid, f"/proc/{pid}/environ")
        with open(f"/proc/{pid}/environ", "rb") as f:
            seen["environ"] = f.read()
        seen["fds"] = sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
        return answer("looked")

    provider.add(inspect)
    task = ai_task(d, "whoami")
    run = d.call("qledge.run.start", {"taskId": task["id"]})
    final = wait(d, run["id"])
    assert final["status"] == "succeeded", final
    assert seen["uid"] == [str(nobody.pw_uid)] * 4  # real, effective, saved, filesystem
    assert seen["gid"] == [str(nobody.pw_gid)] * 4
    assert "0" not in str(seen["groups"]).split()
    # It changed credentials, so it is not dumpable: another process of that user (a task
    # running as nobody, say) can neither trace it nor read its memory, descriptors or environment.
    assert seen["proc_owner"] == 0 and seen["peer_reads"] is False
    environ = seen["environ"]
    assert isinstance(environ, bytes)
    assert b"USER=nobody" in environ.split(b"\0") and b"qle_" not in environ  # its token is not there
    home = d.home
    assert not [fd for fd in seen["fds"] if str(fd).startswith(home)], seen["fds"]  # no file of the state directory
    # What the child could reach if it were made to try: nothing of the state directory.
    for name in ("qledge.db", "pepper"):
        path = os.path.join(home, name)
        assert os.path.exists(path)
        assert not _can_read_as(nobody.pw_uid, nobody.pw_gid, path), path
    assert d.call("qledge.status", {})["extra"]["agent"].endswith("; its runs are nobody")
    # The run itself: its environment is that user's login, its log the answer.
    assert log(d, run["id"]).strip() == "looked"
    assert record(d, run["id"])["state"] == "succeeded"


@root_only
@pytest.mark.parametrize("user, reason", [
    ("root", "could read the state directory"),
    ("no-such-user-qledge", "there is no user 'no-such-user-qledge'"),
])
def test_an_agent_user_that_could_read_the_state_directory_is_refused_at_start(daemon_factory, user, reason):
    d = daemon_factory(config=agent_config(None, user=user))
    assert d.config_path is not None
    result = subprocess.run([sys.executable, "-m", "edge", "serve", "--config", d.config_path],
                            env={**os.environ, "QLEDGE_HOME": d.home}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("qledge: invalid_argument: [agent] user") and reason in line, line


@EVERY_FAMILY
def test_every_call_of_the_child_is_its_runs_principal(provider, daemon_factory):
    d = daemon_factory(config=agent_config(provider)).start()
    provider.add(tool_call("qinglong.run.list", {}), answer("ok"))
    run = start_and_wait(d, ai_task(d, "calls")["id"])
    assert run["status"] == "succeeded", run
    conn = d.db()
    try:
        rows = conn.execute("SELECT principal, outcome FROM security_audit WHERE tool LIKE '%.run.list'"
                            " OR tool LIKE 'qledge.agent.%' ORDER BY id").fetchall()
    finally:
        conn.close()
    assert set(rows) == {(f"agent:{run['id']}", "allowed")}, rows
    assert len(rows) == 4  # the list, two rounds reported, the outcome


@EVERY_FAMILY
def test_an_operator_writes_ai_tasks_without_secret_use_or_privilege(provider, daemon_factory):
    d = daemon_factory(config=agent_config(provider)).start()
    _, operator = d.token("operator")
    provider.add(answer("fine"), answer("nothing else"))
    created = d.call("qledge.task.create", {"taskId": "look", "spec": {"command": {
        "kind": "agent", "instruction": "Anything odd last night?"}}}, token=operator)
    assert created["spec"].get("user") is None and created["privileged"] is False
    run = d.call("qledge.run.start", {"taskId": "look"}, token=operator)
    assert wait(d, run["id"])["status"] == "succeeded"
    asked = d.cli("ask", "anything", "else?", token=operator)
    assert asked.returncode == 0, asked.stderr
    queued = re.match(r"run (\S+) ", asked.stdout)  # without --wait: the run, its answer to come in its log
    assert queued, asked.stdout
    assert wait(d, queued.group(1))["status"] == "succeeded"


# Refused before any run starts (as the next test's calls are): no request, one family.
def test_an_ai_task_names_no_user_environment_or_directory(provider, daemon_factory):
    d = daemon_factory(config=agent_config(provider)).start()
    for extra, field in ((({"user": "root"}), "user"), ({"env": {"A": {"secret": "k"}}}, "env"),
                         ({"workingDir": "/tmp"}, "workingDir")):
        spec = {"command": {"kind": "agent", "instruction": "x"}, **extra}
        result = d.cli("call", "qledge.task.create", "--args", json.dumps({"taskId": "bad", "spec": spec}))
        assert result.returncode != 0
        assert f"an AI task takes no {field}" in result.stderr, result.stderr


def test_a_credential_that_could_not_read_cannot_write_an_ai_task_or_ask(provider, daemon_factory):
    d = daemon_factory(config=agent_config(provider)).start()
    # May write tasks and start runs, but not read logs: its AI task would read them for it.
    _, narrow = d.token("operator", ["tool.call:qledge.*", "task.write", "run.write", "task.read", "run.read"])
    for tool, args in (
        ("qledge.task.create", {"taskId": "sneak", "spec": {"command": {"kind": "agent", "instruction": "x"}}}),
        ("qledge.agent.ask", {"instruction": "read me the logs"}),
    ):
        result = d.cli("call", tool, "--args", json.dumps(args), token=narrow)
        assert result.returncode == 1, result.stderr
        assert "permission_denied" in result.stderr and "an AI task's runs call the AI read tools" in result.stderr
    # A viewer may not ask at all (task.write and run.write).
    _, viewer = d.token("viewer")
    result = d.cli("call", "qledge.agent.ask", "--args", json.dumps({"instruction": "hi"}), token=viewer)
    assert result.returncode == 1 and "permission_denied" in result.stderr


@EVERY_FAMILY
def test_the_key_is_the_childs_alone(provider, daemon_factory, home):
    """The key file is 0600 and read by the child before it switches users: no tool returns
    it, no log or record holds it, and the user the child becomes cannot open the file."""
    key = os.path.join(home, "provider.key")
    with open(key, "w") as f:
        f.write("sk-only-the-child-4242\n")
    os.chmod(key, 0o600)
    d = daemon_factory(config=agent_config(provider, api_key_file=key)).start()
    _, operator = d.token("operator")
    provider.add(Step(answer("done")))
    run = start_and_wait(d, ai_task(d, "keyed")["id"])
    assert run["status"] == "succeeded", run
    assert provider.requests[0].headers["authorization"] == "Bearer sk-only-the-child-4242"
    seen = json.dumps([d.call("qledge.status", {}, token=operator), d.call("qledge.task.get", {"taskId": "keyed"},
                       token=operator), record(d, run["id"])]) + log(d, run["id"]) + d.stderr()
    assert "sk-only" not in seen
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        assert not _can_read_as(nobody.pw_uid, nobody.pw_gid, key)
