"""Imports from busybox crond and qinglong: the pure mapping, table-driven."""

from __future__ import annotations

import pytest

from edge.core.imports import (
    CrontabUser,
    QlCommand,
    QlCron,
    QlEnv,
    QlPlace,
    assign_ids,
    Entry,
    disable_lines,
    free_name,
    is_notification_key,
    join_envs,
    name_from_command,
    parse_crontab,
    parse_ql_command,
    parse_shell_exports,
    parse_timeout,
    ql_cron,
    ql_entry,
    unrepresentable,
)
from edge.core.tasks import ArgvCommand, SecretRef, ShellCommand

ROOT = CrontabUser(name="root", home="/root", work_dir="/root")

CRONTAB = """\
# m h dom mon dow command
SHELL=/bin/ash
PATH=/usr/sbin:/usr/bin:/sbin:/bin
BACKUP_DIR="/mnt/usb/backup"
MAILTO=root

30 2 * * * /usr/bin/backup.sh --full
*/5 * * * * cd /tmp && ping -c1 192.0.2.1 >/dev/null || /etc/init.d/network restart
@reboot sleep 30 && /usr/bin/wifi-up
@HOURLY python3 /root/scripts/ddns.py
30 2 * * * /usr/bin/backup.sh --full
CRON_TZ=Asia/Shanghai
0 4 * * MON date +%Y-%m-%d >> /tmp/weekly.log
61 * * * * /bin/true
@every 5m echo hi
  0 15 */10 * 1   /usr/bin/report\t
not a line at all
0 0 * * *
"""


def test_crontab_entries_env_and_nicknames():
    plan = parse_crontab(CRONTAB, ROOT, timeout_ms=7_200_000)
    got = [(e.where, e.task.task_id, e.task.triggers[0].expression, e.task.triggers[0].timezone,
            e.task.spec.command.command) for e in plan.entries]
    assert got == [
        ("line 7", "backup", "30 2 * * *", None, "/usr/bin/backup.sh --full"),
        ("line 8", "ping", "*/5 * * * *", None,
         "cd /tmp && ping -c1 192.0.2.1 >/dev/null || /etc/init.d/network restart"),
        ("line 9", "wifi-up", "@reboot", None, "sleep 30 && /usr/bin/wifi-up"),
        ("line 10", "ddns", "0 * * * *", None, "python3 /root/scripts/ddns.py"),
        ("line 13", "date", "0 4 * * MON", "Asia/Shanghai", "date +%Y-%m-%d >> /tmp/weekly.log"),
        ("line 16", "report", "0 15 */10 * 1", "Asia/Shanghai", "/usr/bin/report"),
    ]
    backup = plan.entries[0]
    assert backup.task.spec.env == {"SHELL": "/bin/ash", "USER": "root", "LOGNAME": "root", "HOME": "/root",
                                    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "BACKUP_DIR": "/mnt/usb/backup"}
    assert isinstance(backup.task.spec.command, ShellCommand) and backup.task.spec.command.shell == "/bin/ash"
    assert (backup.task.spec.working_dir, backup.task.spec.timeout_ms, backup.task.spec.overlap) == (
        "/root", 7_200_000, "forbid")
    assert {e.task.spec.user for e in plan.entries} == {"root"}  # the crontab's user
    assert backup.task.name is None  # named after its program (the id), never its arguments
    assert plan.entries[4].notes == ["`%` is kept as it is, as busybox crond does (Vixie cron would make it a newline)"]
    problems = [(p.where, p.kind) for p in plan.problems]
    assert problems == [("line 5", "MAILTO"), ("line 14", "invalid schedule"), ("line 15", "unknown nickname"),
                        ("line 17", "not an entry"), ("line 18", "not an entry")]
    assert plan.problems[1].reason == "invalid cron expression '61 * * * *': minute field: 61 is out of range 0-59"
    assert plan.duplicates == [(11, 7)]


def test_crontab_keys_are_stable_and_follow_what_runs():
    first = parse_crontab(CRONTAB, ROOT).entries
    again = parse_crontab("# moved down\n\n" + CRONTAB, ROOT).entries
    assert [e.task.key for e in first] == [e.task.key for e in again]
    changed_env = parse_crontab(CRONTAB.replace("/mnt/usb/backup", "/mnt/sd"), ROOT).entries
    assert changed_env[0].task.key != first[0].task.key
    other_user = parse_crontab(CRONTAB, CrontabUser(name="nobody")).entries
    assert other_user[0].task.key != first[0].task.key
    assert other_user[0].task.spec.working_dir is None and "HOME" not in other_user[0].task.spec.env
    assert other_user[0].task.spec.user == "nobody"


@pytest.mark.parametrize("command,name", [
    ("/usr/bin/backup.sh --full", "backup"),
    ("python3 -u /root/scripts/ddns.py --ip", "ddns"),
    ("FOO=1 BAR=2 nice -n 10 /opt/bin/sync-photos", "sync-photos"),
    ("cd /srv && ./deploy.sh", "deploy"),
    ("sleep 30; /usr/bin/wifi-up", "wifi-up"),
    ("sh -c 'echo hi'", "sh"),
    ("/etc/init.d/network restart", "network"),
    ("echo 'unterminated", "echo"),
    ("'/tmp/签到.py'", "job"),
    ("", "job"),
])
def test_names_come_from_the_command(command, name):
    assert name_from_command(command) == name


def test_ids_are_deterministic_and_collision_safe():
    plan = parse_crontab("0 1 * * * /x/backup.sh a\n0 2 * * * /x/backup.sh b\n0 3 * * * /y/backup.sh c\n", ROOT)
    assign_ids(plan.entries, {"backup", "backup-3"})
    assert [e.task.task_id for e in plan.entries] == ["backup-2", "backup-4", "backup-5"]
    assert free_name("x", set()) == "x"


def test_disable_lines_comments_exactly_those_lines():
    text = "A=1\n0 1 * * * a\n0 2 * * * b\n"
    assert disable_lines(text, [2]) == "A=1\n# qledge imported: 0 1 * * * a\n0 2 * * * b\n"
    assert parse_crontab(disable_lines(text, [2, 3]), ROOT).entries == []


# -- qinglong -----------------------------------------------------------------------

PLACE = QlPlace(scripts_dir="/state/scripts/qinglong", data_dir="/ql/data", zone="Asia/Shanghai", user="root")
SECRETS = {"JD_COOKIE": "JD_COOKIE"}


@pytest.mark.parametrize("command,expected", [
    ("task jd_bean.js", QlCommand(script="jd_bean.js", args=[], timeout_ms=None)),
    ("task repo_x/ql_checkin.py now -m 10m", QlCommand(script="repo_x/ql_checkin.py", args=[], timeout_ms=600_000)),
    ("task /ql/data/scripts/a.sh -l -m 90 --fast", QlCommand(script="/ql/data/scripts/a.sh", args=["--fast"],
                                                            timeout_ms=90_000)),
    ("jd_bean.js", QlCommand(script="jd_bean.js", args=[], timeout_ms=None)),
    ("echo hi > /tmp/x", QlCommand(script="", args=[], timeout_ms=None, shell="echo hi > /tmp/x")),
    ("ql repo https://example.invalid/x.git", "`ql repo` is qinglong's own command (repository or file pulls)"),
    ("task jd_x.js conc JD_COOKIE", "`task … conc` (qinglong's per-account split of an environment variable) has no"
                                    " qledge equivalent"),
    ("task jd_x.js desi JD_COOKIE 1-3", "`task … desi` (qinglong's per-account split of an environment variable) has"
                                        " no qledge equivalent"),
    ("task x.js -m forever", "`-m forever` is not a timeout (e.g. 300, 30m, 2h)"),
    ("task", "`task` without a script"),
    ("task 'x.js", "the command is not valid shell quoting"),
])
def test_qinglong_commands(command, expected):
    assert parse_ql_command(command) == expected


@pytest.mark.parametrize("text,ms", [("90", 90_000), ("90s", 90_000), ("10m", 600_000), ("2h", 7_200_000),
                                     ("1d", 86_400_000), ("0.5", 1000), ("30d", 7 * 86_400_000), ("x", None)])
def test_qinglong_timeouts(text, ms):
    assert parse_timeout(text) == ms


def test_a_qinglong_cron_with_everything():
    row = {"id": 2, "name": "每日签到", "command": "task ql_checkin.py now -m 10m", "schedule": "0 0 9 * * *",
           "extra_schedules": '[{"schedule": "0 30 21 * * *"}, {"schedule": "0 0 9 * * *"}]',
           "task_before": "export STAGE=before", "task_after": "echo after-ran", "allow_multiple_instances": 1,
           "isDisabled": 0, "isSystem": 0, "work_dir": "/ql/data/scripts/repo"}
    entry = ql_entry(ql_cron(row), PLACE, SECRETS)
    assert not isinstance(entry, type(None)) and hasattr(entry, "task")
    task = entry.task
    assert (task.task_id, task.name, task.enabled) == ("ql_checkin", "每日签到", True)
    assert [(t.expression, t.timezone, t.enabled) for t in task.triggers] == [
        ("0 0 9 * * *", "Asia/Shanghai", True), ("0 30 21 * * *", "Asia/Shanghai", True)]
    assert task.spec.command == ShellCommand(command=(
        "export STAGE=before\npython3 /state/scripts/qinglong/ql_checkin.py\nstatus=$?\necho after-ran\nexit $status"))
    assert (task.spec.timeout_ms, task.spec.overlap, task.spec.working_dir, task.spec.user) == (
        600_000, "allow", "/state/scripts/qinglong/repo", "root")  # in the imported copy
    assert task.spec.env == {"JD_COOKIE": SecretRef(secret="JD_COOKIE")}


@pytest.mark.parametrize("row,command,triggers,enabled", [
    ({"command": "task jd_bean_change.js", "schedule": "0 8,20 * * *"},
     ArgvCommand(file="node", args=["/state/scripts/qinglong/jd_bean_change.js"]), [("0 8,20 * * *", True)], True),
    ({"command": "task sub/run.sh", "schedule": "@boot"},
     ArgvCommand(file="bash", args=["/state/scripts/qinglong/sub/run.sh"]), [("@reboot", True)], True),
    ({"command": "task backup.sh", "schedule": "@once", "isDisabled": 1},
     ArgvCommand(file="bash", args=["/state/scripts/qinglong/backup.sh"]), [("@once", False)], False),
    ({"command": "task x.ts", "schedule": "@once"},
     ArgvCommand(file="node", args=["/state/scripts/qinglong/x.ts"]), [("@once", True)], True),
    ({"command": "task /ql/scripts/old.py", "schedule": "*/30 * * * *", "isDisabled": 1},
     ArgvCommand(file="python3", args=["/state/scripts/qinglong/old.py"]), [("*/30 * * * *", True)], False),
])
def test_qinglong_crons_map_to_tasks(row, command, triggers, enabled):
    entry = ql_entry(ql_cron({"id": 9, "name": "n", **row}), PLACE, {})
    assert entry.task.spec.command == command
    assert [(t.expression, t.enabled) for t in entry.task.triggers] == triggers
    assert entry.task.enabled is enabled
    # The scripts are read-only to the task: it starts in its own data directory, where it may write.
    assert entry.task.spec.working_dir == "@data"


@pytest.mark.parametrize("row,kind,reason", [
    ({"command": "ql rmlog 7", "schedule": "0 0 * * *", "isSystem": 1}, "qinglong system task",
     "qinglong's own system task"),
    ({"command": "ql repo https://example.invalid/x.git", "schedule": "0 0 * * *"}, "command not representable",
     "`ql repo` is qinglong's own command (repository or file pulls)"),
    ({"command": "task a.js", "schedule": "61 * * * *"}, "invalid schedule",
     "invalid cron expression '61 * * * *': minute field: 61 is out of range 0-59"),
    ({"command": "task ../../etc/passwd.sh", "schedule": "0 0 * * *"}, "script outside the scripts directory",
     "the script ../../etc/passwd.sh is outside the imported scripts directory /state/scripts/qinglong"),
    ({"command": "task /etc/rc.local.sh", "schedule": "0 0 * * *"}, "script outside the scripts directory",
     "the script /etc/rc.local.sh is outside the imported scripts directory /state/scripts/qinglong"),
    ({"command": "/root/../etc/x.py now", "schedule": "0 0 * * *"}, "script outside the scripts directory",
     "the script /root/../etc/x.py is outside the imported scripts directory /state/scripts/qinglong"),
])
def test_qinglong_crons_that_are_not_imported(row, kind, reason):
    problem = ql_entry(ql_cron({"id": 3, "name": "x", **row}), PLACE, {})
    assert (problem.where, problem.kind, problem.reason) == ("cron 3", kind, reason)


def test_an_old_install_row_lacks_columns_and_gets_defaults():
    cron = ql_cron({"id": 1, "name": "a", "command": "task a.js", "schedule": "0 1 * * *", "isDisabled": None})
    assert cron == QlCron(id=1, name="a", command="task a.js", schedule="0 1 * * *")
    entry = ql_entry(cron, PLACE, {})
    assert entry.task.spec.overlap == "forbid" and len(entry.task.triggers) == 1


def test_envs_join_in_qinglongs_order():
    envs = [QlEnv("A", "1", position=100, created_at="2024-01-01"), QlEnv("A", "2", position=200),
            QlEnv("A", "off", enabled=False, position=999), QlEnv("A", "pinned", pinned=True, position=1),
            QlEnv("A", "3", position=100, created_at="2023-01-01"), QlEnv("B", "b")]
    assert join_envs(envs) == {"A": "pinned&2&3&1", "B": "b"}


@pytest.mark.parametrize("name,notify", [("BARK_PUSH", True), ("TG_BOT_TOKEN", True), ("PUSH_KEY", True),
                                         ("QYWX_AM", True), ("FSKEY", True), ("DD_BOT_SECRET", True),
                                         ("JD_COOKIE", False), ("PATH", False), ("TGX", False)])
def test_notification_keys(name, notify):
    assert is_notification_key(name) is notify


def test_config_sh_exports():
    text = 'export A="1"\nexport B=\'two words\'\nC=3 # comment\nexport D=""\nexport E="$HOME/x"\nif true; then\n'
    assert parse_shell_exports(text) == [(1, "A", "1"), (2, "B", "two words"), (3, "C", "3")]


def test_crontab_lines_qledge_cannot_hold_are_reported_not_fatal():
    text = ("0 1 * * * echo caf\udce9\n"  # a byte that is not UTF-8, as surrogateescape reads it
            "CRON_TZ=Mars/Olympus\n0 2 * * * /usr/bin/a\nCRON_TZ=UTC\n0 3 * * * /usr/bin/b\n"
            f"0 4 * * * echo {'x' * 17000}\n")
    plan = parse_crontab(text, ROOT)
    assert [(p.where, p.kind) for p in plan.problems] == [
        ("line 1", "not UTF-8"), ("line 2", "unknown zone"), ("line 3", "unknown zone")]
    assert plan.problems[2].reason == "CRON_TZ on line 2 is not a zone qledge knows"
    assert [(e.where, e.task.triggers[0].timezone) for e in plan.entries] == [("line 5", "UTC"), ("line 6", "UTC")]
    assert unrepresentable(plan.entries[0]) is None
    too_big = unrepresentable(plan.entries[1])
    assert too_big is not None and too_big.kind == "too large or invalid characters"
    assert too_big.reason.startswith("qledge cannot store it: Expected `str` of length <= 16384")


def test_labels_lose_control_characters():
    entry = ql_entry(ql_cron({"id": 1, "name": "a\x1b[31mred\x07", "command": "task a.js", "schedule": "@daily"}),
                     PLACE, {})
    assert entry.task.name == "a [31mred" and unrepresentable(entry) is None


def test_an_imported_one_shot_is_noted_to_run_right_after_the_import():
    enabled = ql_entry(ql_cron({"id": 9, "name": "n", "command": "task a.js", "schedule": "@once"}), PLACE, {})
    assert isinstance(enabled, Entry)
    assert "@once: runs once, as soon as it is imported (not at a time of day)" in enabled.notes
    # A one-shot of a disabled task waits, disabled, with the task: nothing runs after the import.
    held = ql_entry(ql_cron({"id": 9, "name": "n", "command": "task a.js", "schedule": "@once", "isDisabled": 1}),
                    PLACE, {})
    assert isinstance(held, Entry) and not any("@once" in n for n in held.notes)
    either = ql_entry(ql_cron({"id": 9, "name": "n", "command": "task a.js", "schedule": "0 9 1 * 1"}), PLACE, {})
    assert isinstance(either, Entry) and any("a day matching either fires" in n for n in either.notes)
