"""`qledge import crontab` and `qledge import qinglong`: the real CLI against a real daemon,
on a crontab with env lines and nicknames and on qinglong installs built from the
reference schema (2.21, and an older one missing columns)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest

import qinglong_fixture as ql
from support import IS_ROOT, interrupt_once_written, short_tmpdir


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def as_json(result: subprocess.CompletedProcess):
    return json.loads(ok(result))


def task_ids(daemon) -> list[str]:
    return [t["id"] for t in as_json(daemon.cli("task", "list", "--json"))]


def data_dir(daemon, task: str) -> str:
    """A task's own data directory: `<state dir>-tasks/<project>/<task>`."""
    return os.path.join(os.path.realpath(daemon.home) + "-tasks", "default", task)


def secret_names(daemon) -> list[str]:
    return [s["name"] for s in as_json(daemon.cli("secret", "list", "--json"))]


@pytest.fixture
def workdir():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scripts(daemon):
    """Where `qledge import qinglong` copies scripts by default: beside the daemon's state
    directory (`<home>-scripts/qinglong`), never inside it."""
    beside = daemon.home + "-scripts"
    yield os.path.join(beside, "qinglong")
    shutil.rmtree(beside, ignore_errors=True)


needs_root = pytest.mark.skipif(not IS_ROOT, reason="tasks run as other users only under a root daemon")


CRONTAB = """\
# OpenWrt: /etc/crontabs/root
MAILTO=admin@example.org
BACKUP_DIR="/mnt/usb/backup"
OUT={out}

0 3 * * * echo "$BACKUP_DIR $USER" > "$OUT"
@reboot sleep 30 && /usr/bin/wifi-up
@daily /usr/bin/rotate-logs
CRON_TZ=Asia/Shanghai
*/10 * * * * /usr/bin/check-wan
61 * * * * /bin/true
"""


def test_crontab_import_dry_run_idempotent_disable_source(daemon, workdir):
    out = os.path.join(workdir, "out.txt")
    path = os.path.join(workdir, "root")  # busybox names a crontab after its user
    text = CRONTAB.format(out=out)
    with open(path, "w") as f:
        f.write(text)

    dry = ok(daemon.cli("import", "crontab", path, "--dry-run"))
    assert "line 6: would create task echo: 0 3 * * *" in dry
    assert "line 2: not imported: MAILTO: qledge does not mail a job's output" in dry
    assert "line 11: not imported: invalid cron expression '61 * * * *'" in dry
    assert dry.rstrip().endswith("dry run, nothing changed: 4 tasks with 4 triggers to create, 0 already imported,"
                                 " 2 not imported (1 MAILTO, 1 invalid schedule)")
    assert task_ids(daemon) == []

    done = ok(daemon.cli("import", "crontab", path))
    assert "line 7: created task wifi-up: @reboot  sleep 30 && /usr/bin/wifi-up" in done
    assert done.rstrip().endswith("summary: 4 tasks with 4 triggers created, 0 already imported, 2 not imported"
                                  " (1 MAILTO, 1 invalid schedule)")
    assert sorted(task_ids(daemon)) == ["check-wan", "echo", "rotate-logs", "wifi-up"]
    triggers = {t["taskId"]: t for t in as_json(daemon.cli("trigger", "list", "--json"))}
    assert triggers["wifi-up"]["spec"]["expression"] == "@reboot" and triggers["wifi-up"].get("nextFireAtMs") is None
    assert triggers["rotate-logs"]["spec"]["expression"] == "0 0 * * *"
    assert triggers["check-wan"]["spec"]["timezone"] == "Asia/Shanghai"
    assert "at the next boot" in ok(daemon.cli("trigger", "get", triggers["wifi-up"]["id"]))
    task = as_json(daemon.cli("task", "get", "echo", "--json"))
    assert task["spec"]["command"] == {"kind": "shell", "command": 'echo "$BACKUP_DIR $USER" > "$OUT"',
                                       "shell": "/bin/sh"}
    assert task["spec"]["env"]["BACKUP_DIR"] == "/mnt/usb/backup" and task["spec"]["env"]["USER"] == "root"
    # busybox runs /etc/crontabs/root as root: so do its tasks, written by an owner.
    assert (task["spec"]["user"], task["spec"]["workingDir"], task["privileged"]) == ("root", "/root", True)
    # The imported task runs with the crontab's environment.
    ok(daemon.cli("run", "start", "echo", "--wait"))
    assert read(out) == "/mnt/usb/backup root\n"

    # Again, from the file and from stdin: nothing new.
    again = ok(daemon.cli("import", "crontab", path))
    assert "line 6: already imported as task echo" in again
    assert "summary: 0 tasks with 0 triggers created, 4 already imported" in again
    assert "0 tasks with 0 triggers created, 4 already imported" in ok(daemon.cli("import", "crontab", "-", input=text))
    assert len(task_ids(daemon)) == 4

    # A deleted task is no longer "imported": importing again brings it back.
    ok(daemon.cli("task", "rm", "rotate-logs", "--with-triggers"))
    assert "line 8: created task rotate-logs" in ok(daemon.cli("import", "crontab", path))

    # --disable-source: the imported lines are commented out, after a backup.
    disabled = ok(daemon.cli("import", "crontab", path, "--disable-source"))
    assert "4 imported lines commented out (backup " in disabled
    [backup] = glob.glob(path + ".qledge-*.bak")
    assert read(backup) == text
    now = read(path).splitlines()
    assert now[5] == '# qledge imported: 0 3 * * * echo "$BACKUP_DIR $USER" > "$OUT"'
    assert now[10] == "61 * * * * /bin/true" and now[1] == "MAILTO=admin@example.org"
    assert "0 tasks with 0 triggers created, 0 already imported" in ok(daemon.cli("import", "crontab", path))

    report = as_json(daemon.cli("import", "crontab", backup, "--dry-run", "--json"))
    assert [t["status"] for t in report["tasks"]] == ["exists"] * 4 and report["dryRun"] is True
    assert [p["where"] for p in report["notImported"]] == ["line 2", "line 11"]


def test_crontab_import_errors_are_one_line(daemon, workdir):
    missing = daemon.cli("import", "crontab", os.path.join(workdir, "nope"))
    assert missing.returncode == 2 and missing.stderr.startswith("qledge: invalid_argument: cannot read ") and \
        missing.stderr.count("\n") == 1
    stdin = daemon.cli("import", "crontab", "-", "--disable-source", input="")
    assert stdin.returncode == 2
    assert stdin.stderr == "qledge: invalid_argument: --disable-source needs a crontab file, not standard input\n"


SECRET_VALUES = ("SECRETDEVICEKEY", "TELEGRAMSECRET", "PANELPASSWORD", "APPSECRET", "SCT123456789", "BEGIN KEY",
                 "pt_key=", "tok-123456")


@pytest.mark.parametrize("old", [False, True], ids=["qinglong-2.21", "older-install"])
def test_qinglong_import(daemon, workdir, scripts, old):
    data = ql.make_data_dir(workdir, old=old)
    dry = daemon.cli("import", "qinglong", data, "--dry-run")
    text = ok(dry)
    for value in SECRET_VALUES:
        assert value not in text + dry.stderr
    assert "would create task jd_bean_change" in text
    assert "env JD_COOKIE: would store secret JD_COOKIE" in text
    assert task_ids(daemon) == [] and secret_names(daemon) == []

    done = ok(daemon.cli("import", "qinglong", data))
    for value in SECRET_VALUES:
        assert value not in done
    assert sorted(task_ids(daemon)) == ["backup", "boot_notify", "jd_bean_change", "ql_checkin"]
    assert secret_names(daemon) == ["JD_COOKIE", "ql_PRIVATE_TOKEN"]  # BARK_PUSH: a notification key, held back
    for where, reason in [("cron 3", "qinglong's own system task"), ("cron 4", "`ql repo` is qinglong's own command"),
                          ("cron 7", "`task … conc`"), ("cron 8", "invalid cron expression '61 * * * *'")]:
        assert f"{where}: not imported: {reason}" in done
    assert "notification keys in qinglong's environment, not imported: BARK_PUSH" in done
    assert "config.sh notification keys, not imported (--with-notifications imports them): PUSH_KEY" in done
    assert ("qinglong's own failure notification (telegramBot: telegramBotToken, telegramBotUserId): not imported"
            in done)
    assert "config/auth.json (qinglong's panel login): not imported" in done
    assert "1 qinglong open-API apps (client ids and secrets): not imported" in done
    assert "1 subscriptions (repository pulls): not imported; 1 of them carry credentials" in done
    assert "summary: 4 tasks with " in done and "2 secrets stored (0 already imported, 0 taken)" in done
    assert "4 not imported (2 command not representable, 1 invalid schedule, 1 qinglong system task)" in done

    triggers = {}
    for t in as_json(daemon.cli("trigger", "list", "--json")):
        triggers.setdefault(t["taskId"], []).append(t)
    bean = [t["spec"]["expression"] for t in triggers["jd_bean_change"]]
    assert bean == (["0 8,20 * * *"] if old else ["0 8,20 * * *", "30 12 * * *"])  # extra_schedules: 2.21 only
    assert {t["spec"]["timezone"] for ts in triggers.values() for t in ts} == {"Asia/Shanghai"}
    [once] = triggers["backup"]
    assert (once["spec"]["expression"], once["enabled"]) == ("@once", False)
    assert triggers["boot_notify"][0]["spec"]["expression"] == "@reboot"
    tasks = {t["id"]: t for t in as_json(daemon.cli("task", "list", "--json"))}
    assert tasks["backup"]["enabled"] is False
    assert tasks["boot_notify"]["spec"].get("overlap", "forbid") == ("forbid" if old else "allow")
    assert tasks["ql_checkin"]["name"] == "每日签到" and tasks["ql_checkin"]["spec"]["timeoutMs"] == 600_000
    assert scripts == os.path.join(os.path.realpath(daemon.home) + "-scripts", "qinglong")
    assert tasks["jd_bean_change"]["spec"]["command"] == {
        "kind": "argv", "file": "node", "args": [os.path.join(scripts, "jd_bean_change.js")]}
    assert tasks["jd_bean_change"]["spec"]["env"] == {"JD_COOKIE": {"secret": "JD_COOKIE"},
                                                       "_PRIVATE_TOKEN": {"secret": "ql_PRIVATE_TOKEN"}}
    assert sorted(os.listdir(scripts)) == ["backup.sh", "boot_notify.sh", "jd_bean_change.js", "lib", "ql_checkin.py"]
    assert {t["spec"]["user"] for t in tasks.values()} == {"root"}  # qinglong ran every script as root
    assert tasks["ql_checkin"]["spec"]["workingDir"] == "@data"  # the scripts are code: it writes in its own

    # The script runs the copy, in its own data directory, with qinglong's environment.
    ok(daemon.cli("run", "start", "ql_checkin", "--wait"))
    seen = read(os.path.join(data_dir(daemon, "ql_checkin"), "seen.txt")).splitlines()
    cookies = ["pt_key=BBB;pt_pin=bob;", "pt_key=AAA;pt_pin=alice;", "pt_key=PIN;pt_pin=carol;"]
    if not old:  # 2.21 pins come first; older installs have no pins
        cookies = [cookies[2], *cookies[:2]]
    assert seen == ["&".join(cookies), "-" if old else "before", "-", "tok-123456"]

    # Again: nothing new, and the copied scripts are left as they are.
    again = ok(daemon.cli("import", "qinglong", data))
    assert "summary: 0 tasks with 0 triggers created, 4 already imported, 0 secrets stored (2 already imported" in again
    assert "scripts: 0 files (0 bytes) copied" in again
    assert len(task_ids(daemon)) == 4


def test_qinglong_backup_with_notifications_and_scripts_in_place(daemon, workdir, scripts):
    data = ql.make_data_dir(workdir)
    backup = ql.make_backup(workdir, data)
    refused = daemon.cli("import", "qinglong", backup, "--scripts-in-place")
    assert refused.returncode == 2 and "--scripts-in-place needs a qinglong data directory" in refused.stderr
    report = as_json(daemon.cli("import", "qinglong", backup, "--with-notifications", "--json"))
    assert {s["env"]: s["status"] for s in report["secrets"]} == {
        "BARK_PUSH": "created", "JD_COOKIE": "created", "PUSH_KEY": "created", "_PRIVATE_TOKEN": "created",
        "panel telegramBotToken": "created"}
    assert not any("notification keys in qinglong's environment" in n for n in report["notices"])
    assert any(n.startswith("config.sh notification keys, imported as secrets: PUSH_KEY") for n in report["notices"])
    assert sorted(secret_names(daemon)) == ["BARK_PUSH", "JD_COOKIE", "PUSH_KEY", "ql_PRIVATE_TOKEN",
                                            "ql_panel_telegramBotToken"]
    # The settings qinglong notified through became channels, referencing those secrets, and the default rule.
    assert {c["name"]: (c["kind"], c["status"]) for c in report["channels"]} == {
        "ql-bark": ("bark", "created"), "ql-serverchan": ("serverchan", "created"),
        "ql-panel-telegrambot": ("telegram", "created")}
    channels = {c["name"]: c["spec"] for c in daemon.call("qledge.notify.channel.list")["channels"]}
    assert channels["ql-bark"] == {"kind": "bark", "deviceKey": {"secret": "BARK_PUSH"}}
    assert channels["ql-serverchan"] == {"kind": "serverchan", "sendKey": {"secret": "PUSH_KEY"}}
    assert channels["ql-panel-telegrambot"] == {"kind": "telegram", "token": {"secret": "ql_panel_telegramBotToken"},
                                                "chatId": "42"}
    assert daemon.call("qledge.notify.rules.get")["rules"] == [
        {"channels": ["ql-bark", "ql-serverchan", "ql-panel-telegrambot"], "on": ["failure", "recovery"]}]
    assert any("failures and recoveries of every task now go to" in n for n in report["notices"])
    assert "TELEGRAMSECRET" not in json.dumps(report) and "SECRETDEVICEKEY" not in json.dumps(report)

    # The database file alone, with the scripts where they are: the same entries are already imported.
    again = as_json(daemon.cli("import", "qinglong", os.path.join(data, "db", "database.sqlite"), "--json"))
    assert {t["status"] for t in again["tasks"]} == {"exists"}

    in_place = ql.make_data_dir(os.path.join(workdir, "other"))
    with open(os.path.join(in_place, "scripts", "extra.py"), "w") as f:
        f.write("print('x')\n")
    import apsw

    conn = apsw.Connection(os.path.join(in_place, "db", "database.sqlite"))
    conn.execute("INSERT INTO Crontabs (name, command, schedule, isDisabled, isSystem, createdAt, updatedAt)"
                 " VALUES ('extra', 'task extra.py', '0 5 * * *', 0, 0, ?, ?)", (ql.STAMP, ql.STAMP))
    conn.close()
    placed = as_json(daemon.cli("import", "qinglong", in_place, "--scripts-in-place", "--json"))
    [extra] = [t for t in placed["tasks"] if t["status"] == "created"]
    assert extra["taskId"] == "extra" and extra["command"] == f"python3 {os.path.join(in_place, 'scripts', 'extra.py')}"
    assert as_json(daemon.cli("task", "get", "extra", "--json"))["spec"]["workingDir"] == os.path.join(
        in_place, "scripts")


def test_qinglong_import_needs_secret_write_and_creates_nothing_without_it(daemon, workdir):
    data = ql.make_data_dir(workdir)
    _, operator = daemon.token("operator")
    refused = daemon.cli("import", "qinglong", data, token=operator)
    assert refused.returncode == 1
    assert refused.stderr.startswith("qledge: permission_denied: ") and "import as an owner" in refused.stderr
    assert task_ids(daemon) == []


@needs_root
def test_an_operator_imports_a_root_crontab_only_for_a_task_user(daemon, workdir):
    """/etc/crontabs/root runs as root: writing such a task needs task.privileged, which an
    operator lacks. The refusal is one line saying what to do, and nothing is created;
    `--user` with one of the task users imports it for that user."""
    out = os.path.join(daemon.scratch, "out.txt")
    path = os.path.join(workdir, "root")
    with open(path, "w") as f:
        f.write(f"0 3 * * * id -un > {out}\n@daily /usr/bin/rotate-logs\n")
    _, operator = daemon.token("operator")
    refused = daemon.cli("import", "crontab", path, token=operator)
    assert refused.returncode == 1 and refused.stderr == (
        "qledge: permission_denied: nothing was imported: 2 entries would be refused (line 1, line 2): task id:"
        " runs as root; that requires permission task.privileged (the entries run as root, the crontab's user:"
        " import as an owner, or name one of the daemon's [runner] task_users with --user)\n")
    assert task_ids(daemon) == [] and daemon.call("qledge.import.list")["imports"] == []
    missing = daemon.cli("import", "crontab", path, "--user", "no-such-user-here", token=operator)
    assert missing.returncode == 2 and missing.stderr == (
        "qledge: invalid_argument: --user no-such-user-here: there is no such user on this system\n")

    done = ok(daemon.cli("import", "crontab", path, "--user", "nobody", token=operator))
    assert "summary: 2 tasks with 2 triggers created" in done
    task = as_json(daemon.cli("task", "get", "id", "--json"))
    assert (task["spec"]["user"], task["spec"]["env"]["USER"], task["privileged"]) == ("nobody", "nobody", False)
    run = as_json(daemon.cli("run", "start", "id", "--wait", "--json", token=operator))
    assert run["status"] == "succeeded" and read(out) == "nobody\n"


@needs_root
def test_qinglong_scripts_go_where_their_task_user_reads_them(daemon, workdir):

    data = ql.make_data_dir(workdir)
    home = os.path.realpath(daemon.home)
    inside = daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(home, "scripts"))
    assert inside.returncode == 2 and inside.stderr == (
        f"qledge: invalid_argument: --scripts-dir {home}/scripts is inside the daemon's state directory {home},"
        " which task users cannot read and where no run starts: choose a directory outside it\n")
    assert task_ids(daemon) == [] and secret_names(daemon) == []

    import apsw

    conn = apsw.Connection(os.path.join(data, "db", "database.sqlite"))  # a work_dir nobody may not enter
    conn.execute("INSERT INTO Crontabs (name, command, schedule, isDisabled, isSystem, work_dir, createdAt,"
                 " updatedAt) VALUES ('closed', 'task backup.sh', '0 5 * * *', 0, 0, ?, ?, ?)",
                 (workdir, ql.STAMP, ql.STAMP))
    conn.close()
    dest = os.path.join(daemon.scratch, "ql", "scripts")
    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest))
    assert f"copied to {dest}" in done
    # A working directory the daemon refuses concerns its cron alone: reported, the rest imported.
    assert f"not imported: the daemon refuses it: working directory {workdir}: user nobody may not enter" \
        f" {workdir}" in done
    assert "summary: 4 tasks with " in done and "1 working directory refused" in done
    task = as_json(daemon.cli("task", "get", "ql_checkin", "--json"))
    assert (task["spec"]["user"], task["spec"]["workingDir"]) == ("nobody", "@data")
    # The copy is the importing user's (the daemon's, root), readable by the task user and
    # writable by no one else: code is read-only to tasks. What was there before is not touched.
    for made in ("ql", "ql/scripts", "ql/scripts/ql_checkin.py", "ql/scripts/lib", "ql/scripts/lib/sendNotify.js"):
        st = os.stat(os.path.join(daemon.scratch, made))
        assert (st.st_uid, st.st_mode & 0o022) == (os.geteuid(), 0) and st.st_mode & 0o004, made
    assert os.stat(daemon.scratch).st_uid == os.geteuid()
    run = as_json(daemon.cli("run", "start", "ql_checkin", "--wait", "--json"))
    assert run["status"] == "succeeded", run
    # It wrote beside itself as under qinglong: in its own data directory, as the task's own
    # uid (it uses secrets), not in the scripts.
    seen = os.stat(os.path.join(data_dir(daemon, "ql_checkin"), "seen.txt"))
    assert 61184 <= seen.st_uid <= 65519 and not os.path.exists(os.path.join(dest, "seen.txt"))
    assert os.stat(data_dir(daemon, "ql_checkin")).st_mode & 0o777 == 0o700


def _as_nobody(*argv: str) -> None:
    subprocess.run(argv, check=True, user="nobody", group="nogroup" if _has_group("nogroup") else None,
                   extra_groups=[])


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def _tree(root: str) -> list[tuple[str, int, int]]:
    """Every entry under `root`: (path, owner, mode), links not followed."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found.append((os.path.relpath(path, root), st.st_uid, st.st_mode))
    return sorted(found)


@needs_root
def test_a_link_planted_in_the_scripts_copy_is_never_followed(daemon, workdir, scripts):
    import stat

    data = ql.make_data_dir(workdir)
    ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
    # What an earlier version left (the copy was the task user's), and what a task running
    # as that user then plants: a directory link into a root-owned directory, a dangling file
    # link into another.
    beside = os.path.dirname(scripts)
    profile_d = os.path.join(workdir, "profile.d")
    rootonly = os.path.join(workdir, "rootonly")
    for victim in (profile_d, rootonly):
        os.mkdir(victim, 0o755)
    shutil.rmtree(os.path.join(scripts, "lib"))
    os.unlink(os.path.join(scripts, "jd_bean_change.js"))
    for link, to in (("lib", profile_d), ("jd_bean_change.js", os.path.join(rootonly, "evil.sh"))):
        os.symlink(to, os.path.join(scripts, link))
        os.lchown(os.path.join(scripts, link), 65534, 65534)
    with open(os.path.join(data, "scripts", "lib", "new.js"), "w") as f:
        f.write("module.exports = 1;\n")

    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
    assert os.listdir(profile_d) == [] and os.listdir(rootonly) == []  # nothing written through a link
    assert "replaced (a link or special file in the copy's place): jd_bean_change.js, lib" in done
    for path, owner, mode in [("", *(lambda s: (s.st_uid, s.st_mode))(os.lstat(beside))), *_tree(beside)]:
        assert not stat.S_ISLNK(mode) and owner == os.geteuid() and not mode & 0o022, (path, owner, oct(mode))
    assert sorted(os.listdir(os.path.join(scripts, "lib"))) == ["new.js", "sendNotify.js"]
    with open(os.path.join(scripts, "jd_bean_change.js")) as f:
        assert f.read() == ql.SCRIPTS["jd_bean_change.js"]

    # A destination under a directory another user could change is refused, before anything is written.
    other = os.path.join(daemon.scratch, "theirs")
    os.mkdir(other)
    os.chown(other, 65534, 65534)
    refused = daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(other, "s"))
    assert refused.returncode == 2 and refused.stderr == (
        f"qledge: invalid_argument: {other} can be changed by other users (uid 65534, mode 0755): not a place for"
        " scripts; choose another --scripts-dir\n")
    assert os.listdir(other) == []


@needs_root
def test_a_file_another_user_could_change_is_replaced_and_only_the_importers_edits_are_kept(daemon, workdir,
                                                                                             scripts):
    """Upgrading from a copy an earlier version left to the task user: what that user edited
    is not "kept as changed" for root's tasks to run; it is replaced by the source's copy and
    named. Only the importer's own edits are kept, and named."""
    data = ql.make_data_dir(workdir)
    ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
    # The earlier layout: what is in the copy is the task user's.
    subprocess.run(["chown", "-R", "nobody", *glob.glob(os.path.join(scripts, "*"))], check=True)
    notify = os.path.join(scripts, "lib", "sendNotify.js")
    _as_nobody("sh", "-c", f"echo 'require(\"child_process\").exec(\"id > /tmp/owned\")' > {notify}")
    os.makedirs(os.path.join(scripts, "node_modules", "requests"))  # what a script's require() would find first
    subprocess.run(["chown", "-R", "nobody", os.path.join(scripts, "node_modules")], check=True)
    mine, shared = os.path.join(scripts, "jd_bean_change.js"), os.path.join(scripts, "backup.sh")
    with open(mine, "w") as f:
        f.write("console.log('edited by root');\n")
    os.chown(mine, 0, 0)  # the importer's own edit
    os.chown(shared, 0, 0)
    os.chmod(shared, 0o664)  # root's, but its group may change it
    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
    assert ("replaced with the source's copy, because another user could change them: backup.sh,"
            " boot_notify.sh, lib/sendNotify.js, ql_checkin.py") in done, done
    assert "changed here by the importer, kept as they are: jd_bean_change.js" in done, done
    assert "removed, not from the source and another user could change them (a script of the copy may load" \
           " them): node_modules" in done, done
    assert not os.path.lexists(os.path.join(scripts, "node_modules"))
    for rel, text in ql.SCRIPTS.items():
        st = os.lstat(os.path.join(scripts, rel))
        assert st.st_uid == 0 and not st.st_mode & 0o022, rel
        if rel != "jd_bean_change.js":
            assert read(os.path.join(scripts, rel)) == text, rel
    assert read(mine) == "console.log('edited by root');\n"
    # Nothing is left to replace or keep: the second import names nothing.
    again = ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
    assert "another user could change them: backup.sh" not in again and "kept as they are: jd_bean" in again


@needs_root
def test_links_fifos_devices_and_hard_links_in_the_source_are_skipped_and_named(daemon, workdir):
    data = ql.make_data_dir(workdir)
    scripts = os.path.join(data, "scripts")
    shadow = os.path.join(workdir, "shadow")  # stands in for /etc/shadow (root's, 0640)
    with open(shadow, "w") as f:
        f.write("root:$6$hash:19000:0:99999:7:::\n")
    os.chmod(shadow, 0o640)
    os.link(shadow, os.path.join(scripts, "hard.js"))
    os.symlink("/etc/passwd", os.path.join(scripts, "soft.js"))
    os.mkfifo(os.path.join(scripts, "pipe.js"))
    names = ["hard.js", "pipe.js", "soft.js"]
    try:
        os.mknod(os.path.join(scripts, "null.js"), 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 3))
        names.insert(1, "null.js")
    except PermissionError:
        pass  # a container without CAP_MKNOD: the others still tell
    dest = os.path.join(daemon.scratch, "copy")
    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest))
    assert f"not copied (links, FIFOs, devices, files with several hard links): {', '.join(names)}" in done
    for name in names:
        assert not os.path.lexists(os.path.join(dest, name)), name
    assert os.stat(shadow).st_uid == 0 and os.stat(shadow).st_mode & 0o777 == 0o640


@needs_root
def test_disable_source_never_writes_through_a_planted_link(daemon, workdir):
    import time

    crontabs = os.path.join(workdir, "crontabs")
    os.mkdir(crontabs, 0o755)
    path = os.path.join(crontabs, "root")
    with open(path, "w") as f:
        f.write("0 1 * * * /usr/bin/true\n")
    victim = os.path.join(workdir, "victim")
    with open(victim, "w") as f:
        f.write("untouched\n")
    # Links at every backup name the next minutes could use.
    now = time.time()
    for second in range(180):
        stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now + second))
        os.symlink(victim, f"{path}.qledge-{stamp}.bak")
    done = ok(daemon.cli("import", "crontab", path, "--user", "nobody", "--disable-source"))
    assert read(victim) == "untouched\n"
    assert read(path) == "# qledge imported: 0 1 * * * /usr/bin/true\n"
    backups = [n for n in os.listdir(crontabs) if n.endswith(".bak.1")]
    assert len(backups) == 1 and read(os.path.join(crontabs, backups[0])) == "0 1 * * * /usr/bin/true\n"
    assert f"backup {os.path.join(crontabs, backups[0])}" in done

    # A crontab that is itself a link is not replaced (nor what it points to changed).
    target = os.path.join(workdir, "real-crontab")
    with open(target, "w") as f:
        f.write("0 2 * * * /usr/bin/false\n")
    linked = os.path.join(crontabs, "nobody")
    os.symlink(target, linked)
    refused = daemon.cli("import", "crontab", linked, "--user", "nobody", "--disable-source")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is a symbolic link: --disable-source changes only a regular file" in refused.stderr
    assert os.path.islink(linked) and read(target) == "0 2 * * * /usr/bin/false\n"


def test_disable_source_refuses_a_link_in_place_of_the_crontabs_directory(daemon, workdir):
    crontabs = os.path.join(workdir, "crontabs")
    os.mkdir(crontabs, 0o755)
    with open(os.path.join(crontabs, "root"), "w") as f:
        f.write("0 1 * * * /usr/bin/true\n")
    planted = os.path.join(workdir, "spool")
    os.symlink(crontabs, planted)  # a directory link where the crontab's directory belongs
    refused = daemon.cli("import", "crontab", os.path.join(planted, "root"), "--user", "nobody", "--disable-source")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"{planted} is a symbolic link or not a directory" in refused.stderr
    assert os.listdir(crontabs) == ["root"] and read(os.path.join(crontabs, "root")) == "0 1 * * * /usr/bin/true\n"


def test_a_qinglong_script_outside_the_scripts_directory_is_reported_by_row(daemon, workdir):
    import apsw

    data = ql.make_data_dir(workdir)
    conn = apsw.Connection(os.path.join(data, "db", "database.sqlite"))
    for name, command in (("up", "task ../../etc/passwd.sh"), ("abs", "task /etc/init.d/x.sh")):
        conn.execute("INSERT INTO Crontabs (name, command, schedule, isDisabled, isSystem, createdAt, updatedAt)"
                     " VALUES (?, ?, '0 5 * * *', 0, 0, ?, ?)", (name, command, ql.STAMP, ql.STAMP))
    rows = [r[0] for r in conn.execute("SELECT id FROM Crontabs WHERE name IN ('up', 'abs') ORDER BY id")]
    conn.close()
    done = ok(daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(daemon.scratch, "s")))
    for row, script in zip(rows, ("../../etc/passwd.sh", "/etc/init.d/x.sh"), strict=True):
        assert f"cron {row}: not imported: the script {script} is outside the imported scripts directory" in done
    assert "2 script outside the scripts directory" in done
    assert not {"passwd", "x"} & set(task_ids(daemon))


def test_qinglong_bad_paths_are_one_line(daemon, workdir):
    cases = [(workdir, "is not a qinglong data directory"), (os.path.join(workdir, "x"), "does not exist")]
    for path, message in cases:
        result = daemon.cli("import", "qinglong", path)
        assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1
    junk = os.path.join(workdir, "junk.tgz")
    with open(junk, "wb") as f:
        f.write(b"\x1f\x8b not really")
    result = daemon.cli("import", "qinglong", junk)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_reboot_trigger_does_not_fire_on_a_daemon_restart(daemon):
    ok(daemon.cli("task", "add", "boot", "--", "true"))
    ok(daemon.cli("trigger", "add", "boot", "--cron", "@reboot"))
    daemon.stop()
    daemon.start()  # same kernel boot id: no fire
    assert as_json(daemon.cli("run", "list", "--json")) == []
    assert "at the next boot" in ok(daemon.cli("trigger", "get", "boot-1"))
    note = daemon.cli("cron", "next", "@reboot")
    assert note.returncode == 0 and note.stdout == "" and "once per boot of the device" in note.stderr


def test_crontab_lines_the_daemon_would_refuse_are_reported_and_the_rest_imported(daemon, workdir):
    path = os.path.join(workdir, "root")
    with open(path, "wb") as f:
        f.write(b"0 1 * * * echo caf\xe9\n0 2 * * * echo " + b"x" * 17000 + b"\n0 3 * * * /usr/bin/fine\n")
    result = daemon.cli("import", "crontab", path, "--disable-source")
    assert result.returncode == 0, result.stderr
    assert "line 1: not imported: the line is not valid UTF-8" in result.stdout
    assert "line 2: not imported: qledge cannot store it" in result.stdout
    assert task_ids(daemon) == ["fine"]
    with open(path, "rb") as f:
        assert f.read().startswith(b"0 1 * * * echo caf\xe9\n0 2 * * * echo xxx")  # untouched bytes stay


@pytest.mark.e2e
def test_once_trigger_runs_once_and_disables_itself(daemon):
    import time

    ok(daemon.cli("task", "add", "shot", "--", "true"))
    ok(daemon.cli("trigger", "add", "shot", "--cron", "@once"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        runs = as_json(daemon.cli("run", "list", "--json"))
        if runs and runs[0]["status"] == "succeeded":
            break
        time.sleep(0.1)
    assert [(r["origin"], r["status"]) for r in runs] == [("scheduled", "succeeded")]
    trigger = as_json(daemon.cli("trigger", "get", "shot-1", "--json"))
    assert (trigger["enabled"], trigger["revision"], trigger.get("nextFireAtMs")) == (False, 2, None)
    time.sleep(1)
    assert len(as_json(daemon.cli("run", "list", "--json"))) == 1


# -- bounded input, linear time -------------------------------------------------------


def test_a_line_no_shell_would_take_is_refused_by_its_number(daemon, workdir):
    path = os.path.join(workdir, "root")
    long = "0 2 * * * echo " + "x  " * ((10 << 20) // 3)  # 10 MB, with room to backtrack over
    with open(path, "w") as f:
        f.write(f"0 1 * * * /usr/bin/one\n{long}\n0 3 * * * /usr/bin/three\n")
    done = ok(daemon.cli("import", "crontab", path, "--user", "nobody", timeout=60))
    assert f"line 2: not imported: the line is {len(long)} characters long; a crontab line qledge imports has at" \
        " most 17408 (a command at most 16384)" in done
    assert "summary: 2 tasks with 2 triggers created" in done and len(done) < 16384
    assert sorted(task_ids(daemon)) == ["one", "three"]


def test_a_qinglong_command_of_a_megabyte_is_refused_by_its_row(daemon, workdir):
    import apsw

    data = ql.make_data_dir(workdir)
    conn = apsw.Connection(os.path.join(data, "db", "database.sqlite"))
    command = "task a.js" + " 'x'" * (1 << 18)  # 1 MB of quoted words: what shlex reads slowest
    conn.execute("INSERT INTO Crontabs (name, command, schedule, isDisabled, isSystem, createdAt, updatedAt)"
                 " VALUES ('big', ?, '0 5 * * *', 0, 0, ?, ?)", (command, ql.STAMP, ql.STAMP))
    (row,) = conn.execute("SELECT id FROM Crontabs WHERE name = 'big'").fetchone()
    conn.close()
    done = ok(daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(daemon.scratch, "s"), timeout=60))
    assert f"cron {row}: not imported: the command is {len(command)} characters long; a task's command has at" \
        " most 16384" in done
    assert "summary: 4 tasks with " in done


def test_many_entries_named_after_one_program_get_every_name_once():
    from edge.core.imports import CrontabUser, assign_ids, parse_crontab

    text = "".join(f"* * * * * /usr/bin/sync --part {n}\n" for n in range(20_000))
    plan = parse_crontab(text, CrontabUser(name="nobody"))
    assign_ids(plan.entries, ["sync", "sync-3"])
    ids = [e.task.task_id for e in plan.entries]
    assert ids[:3] == ["sync-2", "sync-4", "sync-5"] and ids[-1] == "sync-20002"
    assert len(set(ids)) == len(ids) == 20_000


def test_crontab_dry_run_notes_days_that_either_match(daemon, workdir):
    path = os.path.join(workdir, "root")
    with open(path, "w") as f:
        f.write("0 9 1 * 1 /bin/true first-or-monday\n0 9 1 * * /bin/true first\n0 9 * * 1 /bin/true monday\n")
    dry = ok(daemon.cli("import", "crontab", path, "--dry-run"))
    note = ("  note: day-of-month and day-of-week are both restricted: a day matching either fires"
            " (as busybox crond and qinglong do)")
    lines = dry.splitlines()
    first = lines.index(next(x for x in lines if x.startswith("line 1: would create task")))
    assert lines[first + 1] == note, dry
    assert dry.count(note) == 1, dry  # only the line that restricts both
    planned = as_json(daemon.cli("import", "crontab", path, "--dry-run", "--json"))["tasks"]
    assert [len(t.get("notes", [])) for t in planned] == [1, 0, 0]


@needs_root
def test_a_source_scripts_or_data_directory_that_is_a_link_is_refused(daemon, workdir):
    data = ql.make_data_dir(workdir)
    rootonly = os.path.join(workdir, "rootonly")
    os.mkdir(rootonly, 0o700)
    with open(os.path.join(rootonly, "shadow"), "w") as f:
        f.write("root:$6$hash:19000:0:99999:7:::\n")
    os.chmod(os.path.join(rootonly, "shadow"), 0o600)
    os.rename(os.path.join(data, "scripts"), os.path.join(data, "scripts.real"))
    os.symlink(rootonly, os.path.join(data, "scripts"))
    dest = os.path.join(daemon.scratch, "copy")
    for dry in ([], ["--dry-run"]):
        refused = daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest, *dry)
        assert refused.returncode == 2 and refused.stderr == (
            f"qledge: invalid_argument: {data}/scripts is a symbolic link or not a directory: not followed; give"
            " the directory itself\n"), refused
    assert not os.path.lexists(os.path.join(dest, "shadow")) and task_ids(daemon) == []
    # The data directory itself a link (PATH/data): refused too, naming it.
    outer = os.path.join(workdir, "outer")
    os.mkdir(outer)
    os.symlink(data, os.path.join(outer, "data"))
    refused = daemon.cli("import", "qinglong", outer, "--scripts-dir", dest)
    assert refused.returncode == 2 and refused.stderr == (
        f"qledge: invalid_argument: {outer}/data is a symbolic link: not followed; give the directory it points"
        " to\n"), refused
    assert task_ids(daemon) == []


@needs_root
def test_a_link_or_another_users_directory_above_the_scripts_dir_is_refused(daemon, workdir):
    data = ql.make_data_dir(workdir)
    victim = os.path.join(daemon.scratch, "victim")
    home = os.path.join(daemon.scratch, "nobhome")
    os.mkdir(victim, 0o755)
    os.mkdir(home, 0o755)
    os.chown(home, 65534, 65534)
    _as_nobody("ln", "-s", victim, os.path.join(home, "link"))
    refused = daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(home, "link", "ql"))
    assert refused.returncode == 2 and refused.stderr == (
        f"qledge: invalid_argument: {home} can be changed by other users (uid 65534, mode 0755): not a place for"
        " scripts; choose another --scripts-dir\n"), refused
    # A link anywhere in the path, even root's in root's directory: the tasks would name the link.
    os.symlink(victim, os.path.join(daemon.scratch, "rootlink"))
    refused = daemon.cli("import", "qinglong", data, "--scripts-dir", os.path.join(daemon.scratch, "rootlink", "ql"))
    assert refused.returncode == 2 and refused.stderr == (
        f"qledge: invalid_argument: {daemon.scratch}/rootlink is a symbolic link or not a directory: give the path"
        " without links, or choose another --scripts-dir\n"), refused
    assert os.listdir(victim) == [] and task_ids(daemon) == []


@needs_root
def test_a_scripts_dir_another_user_made_beforehand_is_refused(daemon, workdir):
    data = ql.make_data_dir(workdir)
    planted = os.path.join(daemon.scratch, "qlnew")
    os.mkdir(planted)
    os.chmod(planted, 0o777)
    os.chown(planted, 65534, 65534)
    _as_nobody("sh", "-c", f"echo 'import os' > {planted}/requests.py; mkdir {planted}/node_modules")
    refused = daemon.cli("import", "qinglong", data, "--scripts-dir", planted)
    assert refused.returncode == 2 and refused.stderr == (
        f"qledge: invalid_argument: {planted} is not a new directory nor the importer's own (uid 65534, mode 0777):"
        " what is in it is another user's to choose; give a new directory or one of your own as --scripts-dir\n")
    assert os.stat(planted).st_uid == 65534 and task_ids(daemon) == []
    # The importer's own directory that its group may write: refused the same way.
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o775)
    refused = daemon.cli("import", "qinglong", data, "--scripts-dir", planted)
    assert refused.returncode == 2 and "is not a new directory nor the importer's own (uid 0, mode 0775)" \
        in refused.stderr


@needs_root
def test_a_directory_where_a_script_belongs_is_replaced_by_the_script(daemon, workdir):
    data = ql.make_data_dir(workdir)
    dest = os.path.join(daemon.scratch, "copy")
    ok(daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest))
    notify = os.path.join(dest, "lib", "sendNotify.js")
    os.unlink(notify)
    os.mkdir(notify)
    with open(os.path.join(notify, "index.js"), "w") as f:
        f.write("require('child_process').exec('id > /tmp/owned');\n")
    subprocess.run(["chown", "-R", "nobody", notify], check=True)
    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest))
    assert "kept as they are" not in done, done
    assert "replaced (a link or special file in the copy's place): lib/sendNotify.js/" in done, done
    st = os.lstat(notify)
    assert __import__("stat").S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022
    assert read(notify) == ql.SCRIPTS["lib/sendNotify.js"]


@needs_root
def test_a_file_only_its_owner_reads_in_the_source_is_not_widened_in_the_copy(daemon, workdir):
    data = ql.make_data_dir(workdir)
    private = os.path.join(data, "scripts", "cookies.txt")
    with open(private, "w") as f:
        f.write("pt_key=secret\n")
    os.chmod(private, 0o600)
    dest = os.path.join(daemon.scratch, "copy")
    done = ok(daemon.cli("import", "qinglong", data, "--user", "nobody", "--scripts-dir", dest))
    assert "readable only by the importer, as only their owner could read them in the source (a task running as" \
        " another user cannot read them): cookies.txt" in done, done
    st = os.stat(os.path.join(dest, "cookies.txt"))
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert os.stat(os.path.join(dest, "ql_checkin.py")).st_mode & 0o004  # the others stay readable


def test_a_task_named_after_a_credential_gets_a_neutral_id(daemon, workdir):
    token = "ghp_R8sTuVwXyZ0123456789abcdefABCDEF01"
    path = os.path.join(workdir, "root")
    with open(path, "w") as f:
        f.write(f"0 3 * * * /usr/bin/{token} --sync\n0 4 * * * /usr/bin/{token}\n0 5 * * * /usr/bin/fine\n")
    done = ok(daemon.cli("import", "crontab", path))
    assert "line 1: created task task: " in done
    assert "named after a word that looks like a credential: given a neutral id" in done
    assert sorted(task_ids(daemon)) == ["fine", "task", "task-2"]
    for task in as_json(daemon.cli("task", "list", "--json")):
        assert token not in task["id"]


@pytest.mark.skipif(not IS_ROOT or shutil.which("chattr") is None, reason="chattr +i needs root")
def test_a_qinglong_import_failing_at_the_scripts_takes_back_the_secrets_it_stored(daemon, workdir, scripts):
    """The scripts cannot be copied (a directory of the destination is immutable: only a
    write finds that out) after the secrets were stored: the secrets and the scripts copied
    so far are taken back, no task is written, and the one line says what was undone."""
    data = ql.make_data_dir(workdir)
    lib = os.path.join(scripts, "lib")
    os.makedirs(lib, 0o755)
    subprocess.run(["chattr", "+i", lib], check=True)
    try:
        failed = daemon.cli("import", "qinglong", data, "--user", "nobody")
        assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
        line = failed.stderr
        assert f"cannot copy the scripts to {scripts}: Operation not permitted (importing the scripts);" \
               " the import stopped there, undone: secret " in line, line
        assert "JD_COOKIE" in line and "the scripts copied to" in line, line
        assert secret_names(daemon) == [] and task_ids(daemon) == []
        assert os.listdir(os.path.dirname(scripts)) == ["qinglong"] and os.listdir(scripts) == ["lib"]
        assert daemon.db().execute("SELECT count(*) FROM imports").fetchone()[0] == 0
        # Nothing left behind stands in the way of the next import.
        subprocess.run(["chattr", "-i", lib], check=True)
        ok(daemon.cli("import", "qinglong", data, "--user", "nobody"))
        assert "JD_COOKIE" in secret_names(daemon) and task_ids(daemon)
    finally:
        subprocess.run(["chattr", "-i", lib], check=False)


def test_a_stop_signal_during_a_crontab_import_deletes_the_tasks_of_the_batches_before(daemon, workdir):
    """SIGTERM once the first batch of tasks is written: the import deletes every task it
    created, exits 143 with one line. When a fast machine finished first, more lines."""
    import signal
    import sys

    lines = 2000
    for _ in range(4):
        path = os.path.join(workdir, f"crontab{lines}")
        with open(path, "w") as f:
            f.writelines(f"*/5 * * * * /bin/echo entry {n}\n" for n in range(lines))
        db = daemon.db()
        done = interrupt_once_written([sys.executable, "-m", "edge", "import", "crontab", path], daemon.env,
                                      lambda db=db: db.execute("SELECT count(*) FROM tasks").fetchone()[0] > 0)
        if done is None:  # it finished before the signal: more lines, the tasks deleted first
            for task in task_ids(daemon):
                daemon.call("qledge.task.delete", {"taskId": task, "withTriggers": True})
            lines *= 2
            continue
        err = done.stderr
        assert done.returncode == 128 + signal.SIGTERM, err
        assert err.count("\n") == 1 and err.startswith("qledge: cancelled: stopped by SIGTERM (importing the"
                                                       " tasks); undone: task "), err
        assert task_ids(daemon) == []
        assert db.execute("SELECT count(*) FROM triggers").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM imports").fetchone()[0] == 0
        return
    pytest.fail(f"every import of up to {lines // 2} lines finished before a signal could reach it")


@needs_root
def test_a_source_without_scripts_still_makes_the_scripts_dir_its_tasks_name(daemon, workdir):
    # The tasks name their scripts in --scripts-dir: left unmade, any local user could make it
    # (here in a sticky, world-writable directory, as /tmp is) and put code there for root to run.
    data = ql.make_data_dir(workdir)
    shutil.rmtree(os.path.join(data, "scripts"))
    shared = os.path.join(daemon.scratch, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    dest = os.path.join(shared, "ql")
    planned = ok(daemon.cli("import", "qinglong", data, "--scripts-dir", dest, "--dry-run"))
    assert f"the tasks expect their scripts in {dest}, which would be made empty" in planned
    assert not os.path.lexists(dest)
    done = ok(daemon.cli("import", "qinglong", data, "--scripts-dir", dest))
    assert f"the tasks expect their scripts in {dest}, made empty (the importer's): copy them there" in done
    st = os.lstat(dest)
    assert os.path.isdir(dest) and not os.path.islink(dest) and st.st_uid == 0 and not st.st_mode & 0o022
    assert any(dest in t["spec"]["command"].get("command", "") for t in
               (daemon.call("qledge.task.get", {"taskId": i}) for i in task_ids(daemon)))
