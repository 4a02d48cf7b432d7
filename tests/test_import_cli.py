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
from support import IS_ROOT, short_tmpdir


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
    assert tasks["ql_checkin"]["spec"]["workingDir"] == scripts

    # The script runs from the copied scripts directory with qinglong's environment.
    ok(daemon.cli("run", "start", "ql_checkin", "--wait"))
    seen = read(os.path.join(scripts, "seen.txt")).splitlines()
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
        "qledge: permission_denied: task id: runs as root; that requires permission task.privileged (the entries"
        " run as root, the crontab's user: import as an owner, or name one of the daemon's [runner] task_users"
        " with --user)\n")
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
    import pwd

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
    assert (task["spec"]["user"], task["spec"]["workingDir"]) == ("nobody", dest)
    nobody = pwd.getpwnam("nobody").pw_uid
    # What was made for the scripts is the task user's (so they write beside themselves as
    # under qinglong); what was there before is not touched.
    for made in ("ql", "ql/scripts", "ql/scripts/ql_checkin.py", "ql/scripts/lib"):
        assert os.stat(os.path.join(daemon.scratch, made)).st_uid == nobody, made
    assert os.stat(daemon.scratch).st_uid == os.geteuid()
    run = as_json(daemon.cli("run", "start", "ql_checkin", "--wait", "--json"))
    assert run["status"] == "succeeded", run
    assert os.stat(os.path.join(dest, "seen.txt")).st_uid == nobody


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
