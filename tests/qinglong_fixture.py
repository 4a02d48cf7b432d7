"""A qinglong 2.21 install on disk, built from the reference schema with realistic rows:
its data directory (db/database.sqlite, config/, scripts/), optionally as an older
install whose tables lack the columns later versions added."""

from __future__ import annotations

import json
import os
import re
import tarfile

import apsw

SCHEMA = os.path.join(os.path.dirname(__file__), "data", "qinglong-2.21-schema.sql")
# Columns 2.21 has and older installs lack (qinglong added them by ALTER TABLE).
NEWER_COLUMNS = {
    "Crontabs": ("sub_id", "extra_schedules", "task_before", "task_after", "log_name", "allow_multiple_instances",
                 "work_dir"),
    "Envs": ("isPinned", "labels"),
}
STAMP = "2024-05-01 10:00:00.000 +00:00"

CRONS = [
    # id, name, command, schedule, extra columns (only where 2.21 has them)
    (1, "京东资产变动", "task jd_bean_change.js", "0 8,20 * * *",
     {"extra_schedules": json.dumps([{"schedule": "30 12 * * *"}])}),
    (2, "每日签到", "task ql_checkin.py now -m 10m", "0 0 9 * * *",
     {"task_before": "export STAGE=before", "task_after": "echo after-ran"}),
    (3, "删除日志", "ql rmlog 7", "30 7 */7 * *", {"isSystem": 1}),
    (4, "拉取仓库", "ql repo https://example.invalid/scripts.git \"jd_|ql_\" \"backup\"", "0 6 * * *", {}),
    (5, "备份", "task backup.sh", "@once", {"isDisabled": 1}),
    (6, "开机通知", "task boot_notify.sh", "@boot", {"allow_multiple_instances": 1}),
    (7, "多账号并发", "task jd_multi.js conc JD_COOKIE", "0 1 * * *", {}),
    (8, "坏定时", "task jd_bad.js", "61 * * * *", {}),
]
ENVS = [
    # name, value, status (0 enabled, 1 disabled), position, isPinned, createdAt
    ("JD_COOKIE", "pt_key=AAA;pt_pin=alice;", 0, 100, 0, "2024-01-01 00:00:00.000 +00:00"),
    ("JD_COOKIE", "pt_key=BBB;pt_pin=bob;", 0, 200, 0, "2024-01-02 00:00:00.000 +00:00"),
    ("JD_COOKIE", "pt_key=OLD;pt_pin=gone;", 1, 300, 0, "2023-01-01 00:00:00.000 +00:00"),
    ("JD_COOKIE", "pt_key=PIN;pt_pin=carol;", 0, 50, 1, "2024-01-03 00:00:00.000 +00:00"),
    ("BARK_PUSH", "https://api.day.app/SECRETDEVICEKEY", 0, 10, 0, "2024-01-01 00:00:00.000 +00:00"),
    ("_PRIVATE_TOKEN", "tok-123456", 0, 5, 0, "2024-01-01 00:00:00.000 +00:00"),
]
CONFIG_SH = """## qinglong config.sh
export RandomDelay="300"
export PUSH_KEY="SCT123456789"
export TG_BOT_TOKEN=""
export CronConcurrency=4
"""
SCRIPTS = {
    "jd_bean_change.js": "console.log('bean');\n",
    "ql_checkin.py": (
        "import os\n"
        "with open('seen.txt', 'w') as f:\n"
        "    f.write(os.environ.get('JD_COOKIE', '-') + '\\n' + os.environ.get('STAGE', '-') + '\\n'\n"
        "            + os.environ.get('BARK_PUSH', '-') + '\\n' + os.environ.get('_PRIVATE_TOKEN', '-') + '\\n')\n"
        "print('checked in')\n"
    ),
    "backup.sh": "echo backup\n",
    "boot_notify.sh": "echo booted\n",
    "lib/sendNotify.js": "module.exports = {};\n",
}


def schema(old: bool) -> str:
    with open(SCHEMA, encoding="utf-8") as f:
        text = f.read()
    text = text.replace("CREATE TABLE sqlite_sequence(name,seq);", "")  # SQLite makes it itself
    if old:
        for table, columns in NEWER_COLUMNS.items():
            start = text.index(f"CREATE TABLE `{table}`")
            end = text.index(";", start)
            statement = text[start:end]
            for column in columns:
                statement = re.sub(rf", `{column}` [A-Z]+(\(\d+\))?", "", statement)
            text = text[:start] + statement + text[end:]
    return text


def columns(conn: apsw.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info(`{table}`)")}


def make_data_dir(root: str, old: bool = False) -> str:
    """`<root>/data` as qinglong leaves it; returns its path."""
    data = os.path.join(root, "data")
    for sub in ("db", "config", "scripts/lib", "log"):
        os.makedirs(os.path.join(data, sub), exist_ok=True)
    conn = apsw.Connection(os.path.join(data, "db", "database.sqlite"))
    conn.execute(schema(old))
    have = columns(conn, "Crontabs")
    for cid, name, command, schedule, extra in CRONS:
        row = {"id": cid, "name": name, "command": command, "schedule": schedule, "saved": 1, "status": 1,
               "isSystem": 0, "isDisabled": 0, "isPinned": 0, "labels": "[]", "createdAt": STAMP, "updatedAt": STAMP,
               **{k: v for k, v in extra.items() if k in have}}
        names = ", ".join(f"`{k}`" for k in row)
        conn.execute(f"INSERT INTO Crontabs ({names}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    env_columns = columns(conn, "Envs")
    for name, value, status, position, pinned, created in ENVS:
        row = {"name": name, "value": value, "status": status, "position": position, "createdAt": created,
               "updatedAt": created, "remarks": ""}
        if "isPinned" in env_columns:
            row["isPinned"] = pinned
        names = ", ".join(f"`{k}`" for k in row)
        conn.execute(f"INSERT INTO Envs ({names}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    auths = [
        ("notification", {"type": "telegramBot", "telegramBotToken": "123456:TELEGRAMSECRET",
                          "telegramBotUserId": "42"}),
        ("systemConfig", {"timezone": "Asia/Shanghai", "cronConcurrency": 5}),
        ("authConfig", {"username": "admin", "password": "PANELPASSWORD"}),
    ]
    for kind, info in auths:
        conn.execute("INSERT INTO Auths (ip, type, info, createdAt, updatedAt) VALUES ('', ?, ?, ?, ?)",
                     (kind, json.dumps(info), STAMP, STAMP))
    conn.execute("INSERT INTO Apps (name, scopes, client_id, client_secret, tokens, createdAt, updatedAt)"
                 " VALUES ('bot', '[\"crons\"]', 'cid', 'APPSECRET', '[]', ?, ?)", (STAMP, STAMP))
    conn.execute("INSERT INTO Subscriptions (name, url, schedule, type, pull_type, pull_option, alias, createdAt,"
                 " updatedAt) VALUES ('faker', 'git@example.invalid:x.git', '0 0 * * *', 'private-repo', 'ssh-key',"
                 " ?, 'faker', ?, ?)", (json.dumps({"private_key": "-----BEGIN KEY-----"}), STAMP, STAMP))
    conn.close()
    with open(os.path.join(data, "config", "config.sh"), "w") as f:
        f.write(CONFIG_SH)
    with open(os.path.join(data, "config", "auth.json"), "w") as f:
        f.write(json.dumps({"username": "admin", "password": "PANELPASSWORD"}))
    for rel, text in SCRIPTS.items():
        with open(os.path.join(data, "scripts", rel), "w") as f:
            f.write(text)
    return data


def make_backup(root: str, data: str) -> str:
    """qinglong's data.tgz of a data directory."""
    path = os.path.join(root, "data.tgz")
    with tarfile.open(path, "w:gz") as tar:
        tar.add(data, arcname="data")
    return path
