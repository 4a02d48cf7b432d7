"""A role's limits hold through the tasks it can write: task users (the runner switches to
the task's user before exec), `task.privileged`, `secret.use`, the state directory out of
every task user's reach, and permission patterns — all against real daemons running real
processes as real users (a root daemon switches to `nobody`, as CI runs)."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import sys

import pytest

from edge.cli.client import CallFailed
from edge.core.auth import Grant, allows, matches, role_permissions, valid_permission
from edge.runner.process import SystemUsers
from support import IS_ROOT, OWN_USER


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


needs_root = pytest.mark.skipif(not IS_ROOT or not _exists("nobody"),
                                reason="switching users needs a root daemon and a `nobody` user")
NOBODY = pwd.getpwnam("nobody") if _exists("nobody") else None
ARGV = {"kind": "argv", "file": "id"}


def _spec(**kw) -> dict:
    return {"command": kw.pop("command", ARGV), **kw}


def _denied(call, *args, **kw) -> str:
    with pytest.raises(CallFailed) as err:
        call(*args, **kw)
    assert err.value.code == "permission_denied", err.value
    return err.value.message


def _wait(d, run_id: str, token: str | None = None) -> dict:
    while True:
        waited = d.call("qledge.run.wait", {"runId": run_id, "timeoutMs": 30_000}, token=token)
        if waited["done"]:
            return waited["run"]


def _run(d, task: str, token: str | None = None) -> tuple[dict, str]:
    run = _wait(d, d.call("qledge.run.start", {"taskId": task}, token=token)["id"], token)
    log = d.cli("run", "log", run["id"], token=token).stdout
    return run, log


# -- the permission rule -----------------------------------------------------------


def test_patterns_and_families_cover_exactly_what_they_name():
    assert matches(frozenset({"tool.call:qinglong.*"}), "tool.call:qinglong.run.list")
    assert not matches(frozenset({"tool.call:qinglong.*"}), "tool.call:qledge.run.log.read")
    assert matches(frozenset({"secret.use"}), "secret.use:api")
    assert matches(frozenset({"secret.use:a*"}), "secret.use:api")
    assert not matches(frozenset({"secret.use:api"}), "secret.use:apis")
    assert not matches(frozenset({"task.write"}), "task.write:x")  # only secret.use is a family
    # A credential's list narrows its role: never more than both allow.
    grant = Grant(frozenset({"tool.call:*", "run.read"}), frozenset({"tool.call:qinglong.*", "run.read", "*"}))
    assert allows(grant, "tool.call:qinglong.run.list") and not allows(grant, "artifact.read")
    # An operator gets task.privileged or secret.use only by name, never through `*`.
    for listed, privileged, api in ((["*"], False, False), (["*", "task.privileged"], True, False),
                                    (["*", "secret.use:api"], False, True), (["secret.use"], False, True)):
        grant = Grant(role_permissions("operator", [], listed), frozenset(listed))
        assert (allows(grant, "task.privileged"), allows(grant, "secret.use:api")) == (privileged, api), listed
    assert not allows(Grant(role_permissions("viewer", [], ["task.privileged"]), frozenset({"task.privileged"})),
                      "task.privileged")
    for ok in ("*", "task.privileged", "secret.use", "secret.use:api", "secret.use:API_2", "tool.call:qinglong.*",
               "tool.call:*"):
        assert valid_permission(ok), ok
    for bad in ("task.*", "secret.use:", "tool.call:", "tool.call:a*b", "bogus", "secret.write:x"):
        assert not valid_permission(bad), bad


def test_a_daemon_that_is_not_root_runs_every_task_as_itself(tmp_path):
    users = SystemUsers(["nobody"], None, str(tmp_path))
    if IS_ROOT:
        assert users.default_user == "nobody" and "task.privileged" in users.describe()
        assert users.resolve("nobody", None).privileged is None
        return
    # As any other user: no switching, so every task is privileged, naming another user is refused.
    assert users.default_user == OWN_USER and "only owners" in users.describe()
    assert users.resolve(OWN_USER, None).privileged.startswith("runs as the daemon's user")
    with pytest.raises(Exception, match="cannot switch users"):
        users.resolve("nobody", None)


# -- the attacks: an operator becoming owner ----------------------------------------


@needs_root
def test_a_task_as_nobody_cannot_read_the_database_the_pepper_or_another_runs_log(daemon):
    daemon.cli("task", "add", "owner-job", "--user", OWN_USER, "--", "echo", "only-the-daemon-may-read-this")
    first, _ = _run(daemon, "owner-job")
    _, operator = daemon.token("operator")
    other_log = os.path.join(daemon.home, "logs", f"{first['id']}.log")
    probe = (f"cat {daemon.home}/pepper; od -An -tx1 {daemon.home}/pepper; cat {daemon.home}/qledge.db | head -c 16;"
             f" cat {other_log}; ls {daemon.home}; cd {daemon.home} && echo entered; id -u")
    assert daemon.cli("task", "add", "probe", "--shell", "--", probe, token=operator).returncode == 0
    run, log = _run(daemon, "probe", operator)
    with open(os.path.join(daemon.home, "pepper"), "rb") as f:
        pepper = f.read()
    assert log.splitlines()[-1] == str(NOBODY.pw_uid)
    assert log.count("Permission denied") >= 5 and "entered" not in log, log
    assert "SQLite format" not in log and "only-the-daemon" not in log
    assert pepper.hex() not in log.replace(" ", "").replace("\n", "")
    assert run["status"] == "succeeded"
    # Everything in the home is the daemon's alone.
    assert os.stat(daemon.home).st_mode & 0o777 == 0o700
    for name in ("pepper", "qledge.db", "logs", f"logs/{first['id']}.log"):
        assert os.stat(os.path.join(daemon.home, name)).st_mode & 0o077 == 0, name


@needs_root
def test_the_runner_switches_user_and_groups_before_exec(daemon):
    daemon.cli("task", "add", "who", "--shell", "--", "id -u; id -g; id -G; grep ^Cap /proc/self/status")
    run, log = _run(daemon, "who")
    uid, gid, groups, *caps = log.splitlines()
    assert (int(uid), int(gid)) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert set(map(int, groups.split())) == set(os.getgrouplist("nobody", NOBODY.pw_gid))  # not root's
    assert all(line.split()[1] == "0000000000000000" for line in caps if line.startswith(("CapPrm", "CapEff")))
    task = daemon.call("qledge.task.get", {"taskId": "who"})
    assert task["spec"]["user"] == "nobody" and task["privileged"] is True  # the owner wrote it
    group = grp.getgrgid(NOBODY.pw_gid).gr_name
    daemon.cli("task", "add", "grouped", "--user", "nobody", "--group", group, "--", "id", "-g")
    assert _run(daemon, "grouped")[1] == f"{NOBODY.pw_gid}\n"


@needs_root
def test_an_operator_writes_tasks_only_for_task_users(daemon):
    _, operator = daemon.token("operator")
    create = daemon.call
    assert "runs as root" in _denied(create, "qledge.task.create", {"taskId": "r", "spec": _spec(user="root")},
                                     token=operator)
    with contextlib.closing(daemon.db()) as db:  # the refusal is in the audit log, after the allowed entry
        rows = db.execute("SELECT outcome, reasons FROM security_audit ORDER BY id DESC LIMIT 2").fetchall()
    assert [(o, json.loads(r)[0]) for o, r in rows] == [("denied", "domain_permission_denied"),
                                                        ("allowed", "tool_invocation_allowed")]
    message = _denied(create, "qledge.task.create",
                      {"taskId": "g", "spec": _spec(user="nobody", group="root")}, token=operator)
    assert "runs with group root" in message and "task.privileged" in message
    if _exists("daemon"):  # a real user, but not one of [runner] task_users
        message = _denied(create, "qledge.task.create", {"taskId": "d", "spec": _spec(user="daemon")}, token=operator)
        assert "not in [runner] task_users" in message
    bad = daemon.cli("task", "add", "ghost", "--user", "no-such-user-here", "--", "true", token=operator)
    assert bad.returncode == 2 and "there is no user 'no-such-user-here'" in bad.stderr
    made = create("qledge.task.create", {"taskId": "ok", "spec": _spec()}, token=operator)
    assert made["spec"]["user"] == "nobody" and made["privileged"] is False
    # The owner may run anything as anyone.
    assert create("qledge.task.create", {"taskId": "rooted", "spec": _spec(user="root")})["privileged"] is True
    assert _run(daemon, "rooted")[1].startswith("uid=0(")


@needs_root
def test_every_way_to_make_a_privileged_revision_runnable_needs_task_privileged(daemon):
    """Update, enable, trigger create (also pinned to an older revision), repin, trigger
    enable and a new schedule for an enabled trigger all check what the revision would run;
    disable, delete and a manual start of what an owner wrote do not."""
    _, op = daemon.token("operator")
    root_spec = _spec(user="root")
    daemon.call("qledge.task.create", {"taskId": "p", "spec": root_spec})  # revision 1, the owner's
    # Update keeping root, or to a root shell: refused; to nobody: allowed (revision 2).
    _denied(daemon.call, "qledge.task.update", {"taskId": "p", "expectedRevision": 1, "spec": root_spec}, token=op)
    updated = daemon.call("qledge.task.update", {"taskId": "p", "expectedRevision": 1, "spec": _spec()}, token=op)
    assert (updated["revision"], updated["privileged"]) == (2, False)
    # A trigger pinned to the owner's root revision 1: refused, by create and by repin.
    _denied(daemon.call, "qledge.trigger.create",
            {"taskId": "p", "expression": "0 3 * * *", "timezone": "UTC", "taskRevision": 1}, token=op)
    trig = daemon.call("qledge.trigger.create", {"taskId": "p", "expression": "0 3 * * *", "timezone": "UTC"},
                       token=op)
    assert trig["taskRevision"] == 2
    _denied(daemon.call, "qledge.trigger.repin", {"triggerId": trig["id"], "taskRevision": 1}, token=op)
    # The owner makes it root again (the trigger follows to 3) and disables it; the
    # operator can disable and delete, but neither re-enable it nor its trigger.
    daemon.call("qledge.task.update", {"taskId": "p", "expectedRevision": 2, "spec": root_spec})
    # A new schedule re-arms the enabled trigger of a root revision: refused; the CLI says so
    # in one line. The same schedule changes nothing and needs nothing.
    new_time = {"triggerId": trig["id"], "expression": "*/5 * * * *"}
    message = _denied(daemon.call, "qledge.trigger.update", new_time, token=op)
    assert "runs as root" in message and "task.privileged" in message
    cli = daemon.cli("trigger", "update", trig["id"], "--cron", "*/5 * * * *", token=op)
    assert cli.returncode == 1 and cli.stderr.startswith("qledge: permission_denied: a trigger of task p revision 3")
    assert daemon.call("qledge.trigger.update", {"triggerId": trig["id"], "expression": "0 3 * * *"},
                       token=op)["revision"] == daemon.call("qledge.trigger.get", {"triggerId": trig["id"]})["revision"]
    daemon.call("qledge.trigger.disable", {"triggerId": trig["id"]}, token=op)
    # Disabled, it runs nothing: a new schedule is the operator's to give; enabling it is not.
    assert daemon.call("qledge.trigger.update", new_time, token=op)["spec"]["expression"] == "*/5 * * * *"
    _denied(daemon.call, "qledge.trigger.enable", {"triggerId": trig["id"]}, token=op)
    daemon.call("qledge.task.disable", {"taskId": "p"}, token=op)
    _denied(daemon.call, "qledge.task.enable", {"taskId": "p"}, token=op)
    # Disabling kept the owner's standing: the owner re-enables, and a manual start of
    # what the owner wrote is the operator's to make (it runs as root, by the owner's choice).
    enabled = daemon.call("qledge.task.enable", {"taskId": "p"})
    assert enabled["privileged"] is True and enabled["spec"]["user"] == "root"
    run, _ = _run(daemon, "p", op)
    assert run["status"] == "succeeded"
    assert daemon.call("qledge.task.delete", {"taskId": "p", "withTriggers": True}, token=op)["taskId"] == "p"


@needs_root
def test_task_update_is_checked_as_task_add(daemon):
    """`qledge task update` writes a new revision through the same checks as `task add`:
    who it runs as (task.privileged), where (a directory its user may enter), the secrets it
    names (secret.use) and the --shell one-argument rule; what it keeps stays the writer's."""
    _, op = daemon.token("operator")
    assert daemon.cli("task", "add", "t", "--", "true", token=op).returncode == 0
    root = daemon.cli("task", "update", "t", "--user", "root", token=op)
    assert root.returncode == 1 and root.stderr == (
        "qledge: permission_denied: task t: runs as root; that requires permission task.privileged\n")
    shell = daemon.cli("task", "update", "t", "--shell", "--", "echo", "a;", "echo", "b", token=op)
    assert shell.returncode == 2 and shell.stderr.startswith(
        "qledge: invalid_argument: --shell takes exactly one argument after `--`, the shell command, but got 4")
    daemon.call("qledge.secret.set", {"name": "api", "value": "s3cret-value"})
    secret = daemon.cli("task", "update", "t", "--secret-env", "K=api", token=op)
    assert secret.returncode == 1 and "requires permission secret.use:api" in secret.stderr
    private = daemon.cli("task", "update", "t", "--cwd", daemon.home, token=op)
    assert private.returncode == 2 and "inside the state directory" in private.stderr
    task = daemon.call("qledge.task.get", {"taskId": "t"})
    assert (task["revision"], task["spec"]["user"], task["privileged"]) == (1, "nobody", False)
    # What passes is a new revision, still the operator's, still as nobody.
    ok = daemon.cli("task", "update", "t", "--shell", "--", "id -un", token=op)
    assert ok.returncode == 0, ok.stderr
    task = daemon.call("qledge.task.get", {"taskId": "t"})
    assert (task["revision"], task["spec"]["user"], task["privileged"]) == (2, "nobody", False)
    assert _run(daemon, "t", op)[1] == "nobody\n"
    # The owner may make it root; the operator may then change it only back to a task user.
    assert daemon.cli("task", "update", "t", "--user", "root").returncode == 0
    assert _run(daemon, "t")[1] == "root\n"
    keep = daemon.cli("task", "update", "t", "--timeout", "5m", token=op)  # still root: refused
    assert keep.returncode == 1 and "task.privileged" in keep.stderr
    back = daemon.cli("task", "update", "t", "--reset", "user", "--timeout", "5m", token=op)
    assert back.returncode == 0, back.stderr
    assert daemon.call("qledge.task.get", {"taskId": "t"})["spec"]["user"] == "nobody"


@needs_root
def test_a_revision_never_runs_privileged_unless_its_writer_could_make_it_so(daemon_factory):
    """Checked again before each run: the operator's nobody task, after a restart where
    nobody is no longer a task user, is refused rather than run."""
    d = daemon_factory().start()
    _, op = d.token("operator")
    d.call("qledge.task.create", {"taskId": "t", "spec": _spec()}, token=op)
    assert _run(d, "t", op)[0]["status"] == "succeeded"
    d.stop()
    with open(os.path.join(d.home, "qledge.toml"), "w") as f:
        f.write("[runner]\ntask_users = []\n")
    d.config_path = os.path.join(d.home, "qledge.toml")
    d.start()
    run, _ = _run(d, "t")
    assert (run["status"], run["errorCode"], run["startedAtMs"]) == ("failed", "permission_denied", None)
    assert "user nobody is not in [runner] task_users" in run["errorSummary"]
    assert "task.privileged" in run["errorSummary"]
    assert "task users: tasks run as their own users: none (default root)" in d.cli("status").stdout


@needs_root
def test_task_users_that_own_the_state_directory_are_refused_at_start(daemon_factory):
    d = daemon_factory(config="[runner]\ntask_users = [\"nobody\", \"root\"]\n")
    with pytest.raises(RuntimeError, match="did not become ready"):
        d.start()
    assert "qledge: invalid_argument: [runner] task_users lists root, which owns the state directory" in d.stderr()


@needs_root
def test_a_task_user_never_starts_where_it_could_not_go_itself(daemon, home):
    """The child enters its working directory before it switches users: a directory the
    user could not reach (an open one inside a closed one) would let it read what is there."""
    closed = os.path.join(home + "-closed")
    os.makedirs(os.path.join(closed, "open"), mode=0o755)
    os.chmod(closed, 0o700)
    try:
        with open(os.path.join(closed, "open", "notes"), "w") as f:
            f.write("for root's eyes")
        bad = daemon.cli("task", "add", "t", "--cwd", os.path.join(closed, "open"), "--", "cat", "notes")
        assert bad.returncode == 2 and bad.stderr == (
            f"qledge: invalid_argument: working directory {closed}/open: user nobody may not enter {closed}\n")
        # Closed after the task was written: refused before the run, nothing read.
        os.chmod(closed, 0o755)
        assert daemon.cli("task", "add", "t", "--cwd", os.path.join(closed, "open"), "--", "cat", "notes"
                          ).returncode == 0
        os.chmod(closed, 0o700)
        run, log = _run(daemon, "t")
        assert (run["status"], run["errorCode"]) == ("failed", "spawn_failed") and log == ""
        assert "user nobody may not enter" in run["errorSummary"]
    finally:
        shutil.rmtree(closed)


def test_a_default_working_directory_inside_the_state_directory_is_refused_at_start(daemon_factory, home):
    d = daemon_factory(home=home, config=f"[runner]\nwork_dir = \"{home}/logs\"\n")
    with pytest.raises(RuntimeError, match="did not become ready"):
        d.start()
    assert (f"qledge: invalid_argument: [runner] work_dir: working directory {home}/logs is inside the state"
            " directory") in d.stderr()


def test_the_working_directory_is_never_inside_the_state_directory(daemon, scratch):
    for inside in (daemon.home, os.path.join(daemon.home, "logs"), os.path.join(scratch, "link")):
        if inside.endswith("link"):
            os.symlink(daemon.home, inside)
        bad = daemon.cli("task", "add", "t", "--user", OWN_USER, "--cwd", inside, "--", "pwd")
        assert bad.returncode == 2 and "is inside the state directory" in bad.stderr, bad.stderr
    # A link made to point inside after the task was written is caught before the run.
    target = os.path.join(scratch, "later")
    os.mkdir(target)
    assert daemon.cli("task", "add", "t", "--user", OWN_USER, "--cwd", target, "--", "pwd").returncode == 0
    os.rmdir(target)
    os.symlink(daemon.home, target)
    run, _ = _run(daemon, "t")
    assert (run["status"], run["errorCode"]) == ("failed", "spawn_failed")
    assert "inside the state directory" in run["errorSummary"]
    # By default a run starts in / (not in the home, as it once did).
    daemon.cli("task", "add", "where", "--user", OWN_USER, "--", "pwd")
    assert _run(daemon, "where")[1] == "/\n"
    refused = daemon.call  # relative paths are refused too
    with pytest.raises(CallFailed) as err:
        refused("qledge.task.create", {"taskId": "rel", "spec": _spec(workingDir="work", user=OWN_USER)})
    assert err.value.code == "invalid_argument" and "not an absolute path" in err.value.message


# -- secrets ------------------------------------------------------------------------


def test_referencing_a_secret_needs_secret_use(daemon):
    daemon.cli("secret", "set", "api", input="hunter2hunter2")
    daemon.cli("secret", "set", "other", input="other-secret-value")
    _, operator = daemon.token("operator")
    leak = ["task", "add", "leak", "--secret-env", "K=api", "--shell", "--", 'printf %s "$K" | od -An -tx1']
    refused = daemon.cli(*leak, token=operator)
    assert refused.returncode == 1
    assert refused.stderr == ("qledge: permission_denied: task leak: it uses secret 'api'; that requires"
                              " permission secret.use:api\n")
    # An owner grants the use of one secret (within what an operator may hold).
    perms = ["tool.call:*", "task.write", "task.inspect", "run.write", "run.read", "artifact.read", "secret.use:api"]
    if not IS_ROOT:
        perms.append("task.privileged")  # a daemon that is not root: every task is privileged
    _, scoped = daemon.token("operator", perms)
    assert daemon.cli(*leak, token=scoped).returncode == 0
    other = daemon.cli("task", "add", "o", "--secret-env", "K=other", "--", "true", token=scoped)
    assert "requires permission secret.use:other" in other.stderr
    # Updating a task that already names a secret needs it as well: no keeping the
    # reference and changing the command.
    daemon.cli("task", "add", "uses", "--secret-env", "K=other", "--", "true")
    spec = daemon.call("qledge.task.get", {"taskId": "uses"})["spec"]
    spec["command"] = {"kind": "shell", "command": 'echo "$K"'}
    _denied(daemon.call, "qledge.task.update", {"taskId": "uses", "expectedRevision": 1, "spec": spec}, token=scoped)
    # What the granted task prints is still masked.
    run, log = _run(daemon, "leak", scoped)
    assert run["status"] == "succeeded" and "hunter2" not in log


# -- a task's secrets are its own: a uid of its own ------------------------------------

DYNAMIC = range(61184, 65520)


def _until_running(d, run_id: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while d.call("qledge.run.get", {"runId": run_id})["status"] != "running":
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)


@needs_root
def test_no_other_task_reads_the_environment_of_a_task_that_uses_a_secret(daemon, scratch):
    value = "owner-only-secret-Zq81x"
    daemon.cli("secret", "set", "S", input=value)
    # The owner's task names no user: the default one, which every task writer may use too.
    assert daemon.cli("task", "add", "holder", "--secret-env", "TOKEN=S", "--", "sleep", "6").returncode == 0
    _, operator = daemon.token("operator")
    out = os.path.join(scratch, "environ")
    spy = f'for f in /proc/[0-9]*/environ; do cat "$f"; echo; done > {out} 2>/dev/null; true'
    assert daemon.cli("task", "add", "spy", "--shell", "--", spy, token=operator).returncode == 0
    holder = daemon.call("qledge.run.start", {"taskId": "holder"})
    _until_running(daemon, holder["id"])
    run, _ = _run(daemon, "spy", operator)
    assert run["status"] == "succeeded", run
    with open(out, "rb") as f:
        seen = f.read()
    assert b"QLEDGE_TASK_ID=spy" in seen  # it could read what its own uid may
    assert value.encode() not in seen and b"QLEDGE_TASK_ID=holder" not in seen
    daemon.call("qledge.run.cancel", {"runId": holder["id"]})


@needs_root
def test_a_file_a_secret_task_writes_is_its_own_alone(daemon, scratch):
    # A secret written to a shared place (/tmp) must not be readable by another task's user:
    # a run under a uid of its own starts with umask 0077; other runs keep the daemon's.
    daemon.cli("secret", "set", "S", input="umask-secret-Qw3")
    mine, theirs = os.path.join(scratch, "secret-out"), os.path.join(scratch, "plain-out")
    daemon.cli("task", "add", "writes", "--secret-env", "K=S", "--shell", "--", f'echo "$K" > {mine}; umask')
    daemon.cli("task", "add", "plain", "--shell", "--", f"echo hi > {theirs}; umask")
    usual = os.umask(0o022)
    os.umask(usual)  # the daemon was started with the test's umask
    run, log = _run(daemon, "writes")
    assert run["status"] == "succeeded" and log.split() == ["0077"], log
    assert os.stat(mine).st_mode & 0o777 == 0o600
    run, log = _run(daemon, "plain")
    assert run["status"] == "succeeded" and log.split() == [f"{usual:04o}"], log
    assert os.stat(theirs).st_mode & 0o777 == 0o666 & ~usual


@needs_root
def test_the_own_uid_is_stable_recorded_never_shared_and_goes_with_the_task(daemon):
    daemon.cli("secret", "set", "S", input="a-secret-value-123")
    probe = 'id -u; id -g; echo "$HOME"; echo "$QLEDGE_DATA_DIR"; stat -c %a:%u "$HOME"; touch "$HOME/x"'
    for task in ("a", "b"):
        daemon.cli("task", "add", task, "--secret-env", "K=S", "--shell", "--", probe)
    daemon.cli("task", "add", "plain", "--shell", "--", 'id -u; echo "$QLEDGE_DATA_DIR"; touch "$QLEDGE_DATA_DIR/x"')
    daemon.cli("task", "add", "rooted", "--user", "root", "--secret-env", "K=S", "--shell", "--", "id -u")
    seen = {}
    for task in ("a", "b", "a", "plain"):
        run, log = _run(daemon, task)
        assert run["status"] == "succeeded", (task, log)
        seen.setdefault(task, []).append(log.splitlines())
    (a1, a2), (b,), (plain,) = seen["a"], seen["b"], seen["plain"]
    assert a1 == a2  # stable per task
    uid_a, uid_b = int(a1[0]), int(b[0])
    assert uid_a in DYNAMIC and uid_b in DYNAMIC and uid_a != uid_b and a1[1] == a1[0]
    home = os.path.join(os.path.realpath(daemon.home) + "-tasks", "default", "a")
    assert a1[2:5] == [home, home, f"700:{uid_a}"]
    assert int(plain[0]) == NOBODY.pw_uid  # no secret: the shared task user, with its own data directory
    assert plain[1] == os.path.join(os.path.dirname(home), "plain")
    # An owner who names a user keeps it.
    assert _run(daemon, "rooted")[1] == "0\n"
    with contextlib.closing(daemon.db()) as db:
        recorded = dict(db.execute("SELECT task_id, uid FROM task_uids").fetchall())
    assert recorded == {"a": uid_a, "b": uid_b}
    assert {p.pw_uid for p in pwd.getpwall()}.isdisjoint(recorded.values())
    # It goes with the task: its record, its HOME and what is in it.
    assert daemon.cli("task", "rm", "a").returncode == 0
    assert not os.path.lexists(home)
    with contextlib.closing(daemon.db()) as db:
        assert db.execute("SELECT task_id FROM task_uids").fetchall() == [("b",)]
    # A new task of the same name is another identity: another uid, a new, empty HOME.
    daemon.cli("task", "add", "a", "--secret-env", "K=S", "--shell", "--", "id -u; ls -A $HOME")
    assert int(_run(daemon, "a")[1].split()[0]) not in (uid_a, uid_b)


# -- the AI guide's credential ---------------------------------------------------------


def test_the_readme_ai_credential_reaches_exactly_the_qinglong_tools(daemon):
    cid, ai = daemon.token("operator", ["tool.call:qinglong.*", "task.read", "trigger.read", "run.read",
                                        "artifact.read"])
    daemon.cli("task", "add", "t", "--user", OWN_USER, "--", "echo", "hello")
    run, _ = _run(daemon, "t")
    assert daemon.call("qinglong.run.list", {"limit": 5}, token=ai)["runs"][0]["id"] == run["id"]
    assert daemon.call("qinglong.run.log.excerpt", {"runId": run["id"]}, token=ai)["status"] == "available"
    for tool, args in (("qledge.run.log.read", {"runId": run["id"]}), ("qledge.task.list", {}),
                       ("qledge.run.start", {"taskId": "t"}), ("qledge.status", {})):
        assert f"tool.call:{tool}" in _denied(daemon.call, tool, args, token=ai)
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "ai.md")) as f:
        readme = f.read()
    assert "--permission 'tool.call:qinglong.*'" in readme and "--permission 'tool.call:*'" not in readme
    assert json.dumps(cid)  # the credential exists and is listed
    assert cid in daemon.cli("token", "list").stdout


def _interpreter_for(user: str) -> tuple[list[str], dict[str, str]] | None:
    """A Python this user may run with our packages (the test's own may live where it
    cannot go, e.g. under /root), and the PYTHONPATH that gives it them."""
    import site
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": os.pathsep.join([*site.getsitepackages(), root])}
    minor = f"python3.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        try:
            ok = subprocess.run([python, "-c", "import msgspec, apsw.aio, cronsim, edge"], user=user,
                                env=env, capture_output=True, timeout=30, cwd="/").returncode == 0
        except OSError:
            ok = False
        if ok:
            return [python, "-m", "edge"], env
    return None


@needs_root
def test_a_daemon_that_is_not_root_says_so_and_only_owners_write_tasks(daemon_factory):
    found = _interpreter_for("nobody")
    if found is None:
        pytest.skip("no Python with qledge's packages that nobody may run")
    argv, env = found
    d = daemon_factory(user="nobody", argv=argv, env=env).start()
    status = d.cli("status").stdout  # root is an owner of every daemon by default
    assert ("task users: tasks run as the daemon's user nobody (the daemon is not root and cannot switch"
            " users); only owners (task.privileged) may write them") in status
    _, op = d.token("operator")
    message = _denied(d.call, "qledge.task.create", {"taskId": "t", "spec": _spec()}, token=op)
    assert "runs as the daemon's user nobody; that requires permission task.privileged" in message
    made = d.call("qledge.task.create", {"taskId": "t", "spec": _spec()})
    assert made["spec"]["user"] == "nobody"
    assert _run(d, "t")[1].startswith(f"uid={NOBODY.pw_uid}(")
    bad = d.cli("task", "add", "r", "--user", "root", "--", "id")
    assert bad.returncode == 2 and "this daemon runs as nobody (not root) and cannot switch users" in bad.stderr


@needs_root
def test_a_program_the_task_user_cannot_execute_is_refused_naming_the_user(daemon, home):
    closed = home + "-prog"
    os.makedirs(closed, mode=0o755)
    program = os.path.join(closed, "job.sh")
    with open(program, "w") as f:
        f.write("#!/bin/sh\necho ran\n")
    try:
        os.chmod(program, 0o700)  # root's alone: nobody may not execute it
        bad = daemon.cli("task", "add", "t", "--", program)
        assert (bad.returncode, bad.stderr) == (2, f"qledge: invalid_argument: program {program}: user nobody may"
                                                   " not execute it (mode -rwx------, owner uid 0)\n"), bad
        os.chmod(program, 0o755)
        os.chmod(closed, 0o700)
        bad = daemon.cli("task", "add", "t", "--", program)
        assert (bad.returncode, bad.stderr) == (
            2, f"qledge: invalid_argument: program {program}: user nobody may not enter {closed}\n"), bad
        # A bare name is looked up in PATH by the run: nothing to check here.
        assert daemon.cli("task", "add", "bare", "--", "true").returncode == 0
        os.chmod(closed, 0o755)
        assert daemon.cli("task", "add", "t", "--", program).returncode == 0
        # Closed after the task was written: the run fails before it starts, naming the user.
        os.chmod(program, 0o700)
        run, log = _run(daemon, "t")
        assert (run["status"], run["errorCode"], log) == ("failed", "spawn_failed", "")
        assert run["errorSummary"].startswith(f"program {program}: user nobody may not execute it"), run
        waited = daemon.cli("run", "start", "t", "--wait")
        assert waited.returncode == 1 and "user nobody may not execute it" in waited.stdout, waited.stdout
    finally:
        shutil.rmtree(closed, ignore_errors=True)


@needs_root
def test_a_program_that_fails_to_start_says_as_which_user(daemon, home):
    missing = home + "-gone/job.sh"  # not there yet when the task is written: the run says
    assert daemon.cli("task", "add", "t", "--", missing).returncode == 0
    run, _ = _run(daemon, "t")
    assert (run["status"], run["errorCode"]) == ("failed", "spawn_failed"), run
    assert run["errorSummary"].startswith("could not start as nobody: [Errno 2] No such file or directory"), run


# -- the root drop-in of the systemd unit ------------------------------------------------


def _drop_in_capabilities() -> list[str]:
    """The capabilities the root drop-in of docs/install-systemd.md (tasks as other users) leaves."""
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "install-systemd.md")) as f:
        (block,) = [b for b in re.findall(r"```ini\n(.*?)```", f.read(), re.S) if "User=root" in b]
    (line,) = [x for x in block.splitlines() if x.startswith("CapabilityBoundingSet=")]
    return [cap.lower().removeprefix("cap_") for cap in line.split("=", 1)[1].split()]


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_a_root_daemon_with_the_drop_ins_capabilities_runs_tasks_beside_an_unwritable_parent(daemon_factory):
    """As under the unit with the root drop-in: the daemon is root with only the drop-in's
    capabilities (no CAP_DAC_OVERRIDE, no CAP_FOWNER), its home's parent is read-only to it
    (ProtectSystem=strict), and `<home>-tasks` is made beforehand, as systemd makes every
    StateDirectory=. Tasks run as a task user and as a uid of their own, and their data
    directories change hands when a task changes identity."""
    import tempfile

    parent = tempfile.mkdtemp(prefix="qle", dir="/tmp")
    home, tasks = os.path.join(parent, "h"), os.path.join(parent, "h-tasks")
    for path in (home, tasks):
        os.mkdir(path, 0o700)
    os.chmod(parent, 0o555)  # without CAP_DAC_OVERRIDE, not even root makes anything here
    bounding = "-all," + ",".join(f"+{cap}" for cap in _drop_in_capabilities())
    argv = ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", sys.executable, "-m", "edge"]
    try:
        d = daemon_factory(home=home, argv=argv).start()
        d.cli("secret", "set", "S", input="a-secret-value-123")
        probe = ('id -u; stat -c %a:%u "$QLEDGE_DATA_DIR"; cd "$QLEDGE_DATA_DIR";'
                 ' { mkdir -p d; echo x > d/x; mkdir -p "deep/$(printf "a/%.0s" $(seq 1100))"; } 2>/dev/null;'
                 ' chmod 0 d; chmod 755 .; grep ^CapEff /proc/self/status')
        assert d.cli("task", "add", "t", "--shell", "--", probe).returncode == 0
        for _ in range(2):  # the second run finds its directory as the first left it: 0755, and 0700 again
            run, log = _run(d, "t")
            assert run["status"] == "succeeded", (json.dumps(run), log, d.stderr())
            uid, mode, caps = log.splitlines()
            assert int(uid) == NOBODY.pw_uid and mode == f"700:{NOBODY.pw_uid}"
            assert caps.split()[1] == "0000000000000000"
        assert os.path.isdir(os.path.join(tasks, "default", "t", "deep", *["a"] * 1100))
        # The task takes a secret: a uid of its own, and its directory made anew for it.
        assert d.cli("task", "update", "t", "--secret-env", "K=S").returncode == 0, d.stderr()
        run, log = _run(d, "t")
        assert run["status"] == "succeeded", (json.dumps(run), log, d.stderr())
        uid, mode, _ = log.splitlines()  # made anew: what nobody left (a 0000 directory, 1100 deep ones) is gone
        assert int(uid) in DYNAMIC and mode == f"700:{uid}"
        assert stat_mode(tasks) == 0o711 and stat_mode(os.path.join(tasks, "default")) == 0o711
        # It goes with the task.
        assert d.cli("task", "rm", "t").returncode == 0
        assert not os.path.lexists(os.path.join(tasks, "default", "t"))
    finally:
        os.chmod(parent, 0o755)
        shutil.rmtree(parent, ignore_errors=True)


def stat_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o7777
