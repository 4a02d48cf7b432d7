"""The least a crontab import can cost on this stack: `python import_floor.py CRONTAB DB`.

Per line: split off the five schedule fields and the command, compute the next fire with
cronsim, encode the task's spec with msgspec, and insert a task, its revision, a trigger and
its revision into one SQLite file (WAL, 500 lines a transaction, a unique index on the task's
name). No socket, no validation beyond cronsim's, no audit, no import record: the work any
importer on apsw + msgspec + cronsim must do. Prints the process's CPU seconds.

The import budget is a ratio to this floor, measured in the same run, so a slower machine
moves both sides.
"""

from __future__ import annotations

import resource
import sys
from datetime import UTC, datetime

import apsw
import msgspec
from cronsim import CronSim

SCHEMA = """
CREATE TABLE tasks (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, revision INTEGER NOT NULL);
CREATE TABLE task_revisions (task_id INTEGER NOT NULL, revision INTEGER NOT NULL, spec BLOB NOT NULL,
                             PRIMARY KEY (task_id, revision));
CREATE TABLE triggers (id INTEGER PRIMARY KEY, task_id INTEGER NOT NULL, next_fire_at_ms INTEGER);
CREATE TABLE trigger_revisions (trigger_id INTEGER NOT NULL, revision INTEGER NOT NULL, cron TEXT NOT NULL,
                                PRIMARY KEY (trigger_id, revision));
"""


class Spec(msgspec.Struct):
    command: str
    user: str


def main(crontab: str, db: str) -> None:
    conn = apsw.Connection(db)
    conn.pragma("journal_mode", "wal")
    conn.pragma("synchronous", "normal")
    conn.execute(SCHEMA)
    encode = msgspec.msgpack.Encoder().encode
    now = datetime.now(UTC)
    with open(crontab) as f:
        lines = f.read().splitlines()
    for start in range(0, len(lines), 500):
        with conn:
            for n, line in enumerate(lines[start:start + 500], start):
                fields = line.split(None, 5)
                expression, command = " ".join(fields[:5]), fields[5]
                fire = int(next(CronSim(expression, now)).timestamp() * 1000)
                task = conn.execute("INSERT INTO tasks (name, revision) VALUES (?, 1) RETURNING id",
                                    (f"backup-{n}",)).get
                conn.execute("INSERT INTO task_revisions VALUES (?, 1, ?)",
                             (task, encode(Spec(command, "nobody"))))
                trigger = conn.execute("INSERT INTO triggers (task_id, next_fire_at_ms) VALUES (?, ?) RETURNING id",
                                       (task, fire)).get
                conn.execute("INSERT INTO trigger_revisions VALUES (?, 1, ?)", (trigger, expression))
    conn.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{usage.ru_utime + usage.ru_stime:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
