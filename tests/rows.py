"""Plain-SQL rows for read-tool tests and benchmarks: tasks, triggers, runs and events of any
project, written through a second real connection to the daemon's database file."""

from __future__ import annotations

import json

import apsw

from edge.storage.sqlite.sql import RUNS

CRON_SPEC = json.dumps({"expression": "*/5 * * * *", "timezone": "Asia/Shanghai", "misfire": "fire_once"})
CRON_SCHEMA = "qinglong/cron@v1"


def add_task(conn: apsw.Connection, project: str, task_id: str, *, revision: int = 1, enabled: bool = True,
             kind: str = "argv", now: int = 1000) -> None:
    command = {"kind": "argv", "file": "/bin/true"} if kind == "argv" else {"kind": "shell", "command": "exit 0"}
    spec = json.dumps({"command": command, "env": {"API_TOKEN": "plain-env-value"}})
    conn.execute(
        "INSERT INTO tasks (project_id, id, name, revision, enabled, created_at_ms, updated_at_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (project, task_id, f"name of {task_id}", revision, int(enabled), now, now + revision),
    )
    for rev in range(1, revision + 1):
        conn.execute(
            "INSERT INTO task_revisions (project_id, task_id, revision, spec_schema, spec, content_digest, enabled,"
            " created_at_ms) VALUES (?, ?, ?, 'qinglong/command@v1', ?, ?, ?, ?)",
            (project, task_id, rev, spec, f"sha256:{rev:064x}", int(enabled), now + rev),
        )


def add_trigger(conn: apsw.Connection, project: str, trigger_id: str, task_id: str, *, revision: int = 1,
                task_revision: int = 1, enabled: bool = True, now: int = 2000) -> None:
    conn.execute(
        "INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
        " updated_at_ms, next_fire_at_ms, last_scheduled_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (project, trigger_id, revision, task_id, task_revision, int(enabled), now, now + revision, now + 300_000,
         now),
    )
    for rev in range(1, revision + 1):
        conn.execute(
            "INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision, enabled,"
            " spec_schema, spec, content_digest, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (project, trigger_id, rev, task_id, task_revision, int(enabled), CRON_SCHEMA, CRON_SPEC,
             f"sha256:{rev:064x}", now + rev),
        )


RUN_SQL = (
    "INSERT INTO runs (id, project_id, task_id, task_revision, trigger_id, origin, status, version, event_seq,"
    " created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, exit_code, error_summary, log_bytes,"
    " idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, 3, 3, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def run_row(project: str, task_id: str, run_id: str, status: str, created: int, *, revision: int = 1,
            origin: str = "manual", exit_code: int | None = None, log_bytes: int = 0,
            timed: bool = True) -> tuple:
    started = created + 10 if timed and status != "queued" else None
    finished = created + 110 if timed and status not in ("queued", "running") else None
    if exit_code is None and status in ("succeeded", "failed"):
        exit_code = 0 if status == "succeeded" else 1
    return (run_id, project, task_id, revision, "trig-secret-id", origin, status, created, created, started,
            finished, exit_code, "error text /home/me/.netrc", log_bytes, f"idem:{run_id}")


def add_run(conn: apsw.Connection, project: str, task_id: str, run_id: str, status: str, created: int,
            *, events: bool = False, **kw) -> None:
    conn.execute(RUN_SQL, run_row(project, task_id, run_id, status, created, **kw))
    if events:
        for seq, kind in enumerate(("run.queued", "run.running", f"run.{status}"), start=1):
            # In the store's own format (its statement: the events live in the run's row).
            actor = "user" if seq == 1 else "runner"
            conn.execute(RUNS.event_insert, (run_id, seq, kind, actor, created + seq, "payload: password=hunter2"))
