"""One function per CLI verb: call tools, print results, return an exit code."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import msgspec

from edge.cli import render
from edge.cli.client import Client

if TYPE_CHECKING:
    import argparse

OK, TOOL_ERROR = 0, 1


class UsageError(Exception):
    pass


def _env(pairs: list[str], secret_pairs: list[str]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    for pair in secret_pairs:
        key, sep, name = pair.partition("=")
        if not sep or not key or not name:
            raise UsageError(f"--secret-env expects KEY=SECRET_NAME, got {pair!r}")
        env[key] = {"secret": name}
    return env


def task_spec(a: argparse.Namespace) -> dict[str, Any]:
    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    if a.shell:
        command = {"kind": "shell", "command": " ".join(a.command)}
    else:
        command = {"kind": "argv", "file": a.command[0], "args": a.command[1:]}
    spec: dict[str, Any] = {"command": command, "env": _env(a.env, a.secret_env), "overlap": a.overlap}
    if a.timeout is not None:
        spec["timeoutMs"] = int(a.timeout * 1000)
    if a.cwd:
        spec["workingDir"] = a.cwd
    if a.log_cap is not None:
        spec["logCapBytes"] = a.log_cap
    return spec


def show(a: argparse.Namespace, value: Any, human) -> int:
    if a.json:
        render.json_out(value)
    else:
        human(value)
    return OK


def all_pages(c: Client, tool: str, key: str) -> list[dict]:
    """Every item of a keyset-paged list tool (`after` in, `next` out)."""
    items: list[dict] = []
    after = None
    while True:
        page = c.call(tool, {"after": after} if after else {})
        items += page[key]
        after = page.get("next")
        if not after:
            return items


def show_list(a: argparse.Namespace, items: list[dict], empty: str, row, headers: list[str]) -> int:
    if a.json:
        render.json_out(items)
    elif not items:
        print(empty)
    else:
        render.table([row(item) for item in items], headers)
    return OK


def _task_fields(t: dict) -> None:
    spec = t["spec"]
    render.fields([
        ("task", t["id"]), ("name", t["name"]), ("revision", t["revision"]),
        ("enabled", "yes" if t["enabled"] else "no"), ("command", render.command_text(spec)),
        ("kind", spec["command"]["kind"]), ("timeout", f"{spec.get('timeoutMs', 3_600_000) / 1000:g}s"),
        ("overlap", spec.get("overlap", "forbid")), ("working dir", spec.get("workingDir")),
        ("env", ", ".join(sorted(spec.get("env", {}))) or None), ("digest", t["contentDigest"]),
        ("updated", render.when(t["updatedAtMs"])),
    ])


def task_add(c: Client, a: argparse.Namespace) -> int:
    args = {"taskId": a.name, "spec": task_spec(a)}
    task = c.call("qledge.task.create", args)
    return show(a, task, lambda t: print(f"task {t['id']} created (revision {t['revision']})"))


def task_list(c: Client, a: argparse.Namespace) -> int:
    return show_list(
        a, all_pages(c, "qledge.task.list", "tasks"), "no tasks yet: qledge task add NAME -- COMMAND",
        lambda t: [t["id"], str(t["revision"]), "yes" if t["enabled"] else "no", render.command_text(t["spec"])],
        ["TASK", "REV", "ENABLED", "COMMAND"],
    )


def task_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.call("qledge.task.get", {"taskId": a.name}), _task_fields)


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    task = c.call(tool, {"taskId": a.name})
    return show(a, task, lambda t: print(f"task {t['id']} {a.action}d (revision {t['revision']})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.call("qledge.task.delete", {"taskId": a.name})
    return show(a, done, lambda d: print(f"task {d['taskId']} deleted with {d['runsDeleted']} runs"))


def run_start(c: Client, a: argparse.Namespace) -> int:
    run = c.call("qledge.run.start", {"taskId": a.task})
    if not a.wait:
        return show(a, run, lambda r: print(f"run {r['id']} {r['status']}"))
    if not a.json:
        print(f"run {run['id']} {run['status']}", flush=True)
    while True:
        waited = c.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})
        if waited["done"]:
            break
    final = waited["run"]
    show(a, final, lambda r: print(render.run_line(r)))
    return OK if final["status"] == "succeeded" else TOOL_ERROR


def run_list(c: Client, a: argparse.Namespace) -> int:
    args: dict[str, Any] = {"limit": a.limit}
    if a.task:
        args["taskId"] = a.task
    runs = c.call("qledge.run.list", args)["runs"]
    if a.json:
        render.json_out(runs)
    elif not runs:
        print("no runs")
    else:
        render.table(
            [[r["id"], r["taskId"], r["status"], r["origin"], render.when(r["createdAtMs"]),
              render.duration(r.get("startedAtMs"), r.get("finishedAtMs")),
              "-" if r.get("exitCode") is None else str(r["exitCode"])] for r in runs],
            ["RUN", "TASK", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
        )
    return OK


def run_get(c: Client, a: argparse.Namespace) -> int:
    def human(r: dict) -> None:
        render.fields([
            ("run", r["id"]), ("task", f"{r['taskId']} (revision {r['taskRevision']})"), ("status", r["status"]),
            ("origin", r["origin"]), ("trigger", r.get("triggerId")), ("created", render.when(r["createdAtMs"])),
            ("started", render.when(r.get("startedAtMs"))), ("finished", render.when(r.get("finishedAtMs"))),
            ("took", render.duration(r.get("startedAtMs"), r.get("finishedAtMs"))), ("exit code", r.get("exitCode")),
            ("error", r.get("errorCode")), ("summary", r.get("errorSummary")),
            ("log", f"{r['logBytes']} bytes" + (" (truncated)" if r["logTruncated"] else "")
             + (f", dropped {render.when(r['logDroppedAtMs'])} (log quota)" if r.get("logDroppedAtMs") else "")),
        ])

    return show(a, c.call("qledge.run.get", {"runId": a.run}), human)


def run_log(c: Client, a: argparse.Namespace) -> int:
    offset = 0
    out = sys.stdout.buffer
    while True:
        chunk = c.call("qledge.run.log.read", {"runId": a.run, "offset": offset})
        out.write(chunk["data"])
        offset += len(chunk["data"])
        if chunk["eof"]:
            break
    out.flush()
    return OK


def run_cancel(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.call("qledge.run.cancel", {"runId": a.run}), lambda r: print(render.run_line(r)))


def token_create(c: Client, a: argparse.Namespace) -> int:
    args: dict[str, Any] = {"role": a.role}
    if a.name:
        args["name"] = a.name
    if a.permission:
        args["permissions"] = a.permission
    created = c.call("qledge.credential.create", args)

    def human(v: dict) -> None:
        print(v["token"])
        print(f"credential {v['credential']['id']} ({v['credential']['role']}): store this token now;"
              " it cannot be shown again", file=sys.stderr)

    return show(a, created, human)


def token_list(c: Client, a: argparse.Namespace) -> int:
    creds = c.call("qledge.credential.list", {})["credentials"]
    if a.json:
        render.json_out(creds)
    elif not creds:
        print("no credentials")
    else:
        render.table(
            [[x["id"], x["name"], x["role"], render.when(x["createdAtMs"]),
              "revoked " + render.when(x["revokedAtMs"]) if x.get("revokedAtMs") else "active"] for x in creds],
            ["ID", "NAME", "ROLE", "CREATED", "STATE"],
        )
    return OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.call("qledge.credential.revoke", {"id": a.id}), lambda x: print(f"credential {x['id']} revoked"))


def _read_secret(name: str) -> str:
    """From a prompt on a terminal, else all of stdin minus one trailing newline."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value for secret {name}: ")
        if value != getpass.getpass("again: "):
            raise UsageError("the two values differ; nothing was stored")
    else:
        value = sys.stdin.read()
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise UsageError("empty value; nothing was stored")
    return value


def secret_set(c: Client, a: argparse.Namespace) -> int:
    info = c.call("qledge.secret.set", {"name": a.name, "value": _read_secret(a.name)})
    return show(a, info, lambda s: print(f"secret {s['name']} stored"))


def secret_list(c: Client, a: argparse.Namespace) -> int:
    found = c.call("qledge.secret.list", {})["secrets"]
    if a.json:
        render.json_out(found)
    elif not found:
        print("no secrets")
    else:
        render.table([[s["name"], render.when(s["createdAtMs"]), render.when(s["updatedAtMs"])] for s in found],
                     ["NAME", "CREATED", "UPDATED"])
    return OK


def secret_rm(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.call("qledge.secret.delete", {"name": a.name}), lambda d: print(f"secret {d['name']} deleted"))


def status(c: Client, a: argparse.Namespace) -> int:
    def human(s: dict) -> None:
        mib = lambda n: f"{n / 1048576:.1f} MiB"  # noqa: E731
        counts = s["counts"]
        render.fields([
            ("qledge", f"{s['version']} (pid {s['pid']}, up {s['uptimeS']:.0f}s)"),
            ("loop", s["loop"] + (" (ssl loaded)" if s["sslLoaded"] else " (ssl not loaded)")),
            ("memory", f"{mib(s['rssBytes'])} RSS, {mib(s['hwmBytes'])} peak, {mib(s['rssAnonBytes'])} anon"),
            ("modules", s["moduleCount"]), ("database", f"{s['dbPath']} ({mib(s['dbBytes'])})"),
            ("project", s["project"]),
            ("tasks", f"{counts['tasks']} tasks, {counts['triggers']} triggers, {counts['credentials']} credentials"),
            ("runs", f"{counts['runs']} stored, {counts['activeRuns']} active"),
            *sorted(s.get("extra", {}).items()),
        ])

    return show(a, c.call("qledge.status", {}), human)


def call(c: Client, a: argparse.Namespace) -> int:
    try:
        args = msgspec.json.decode(a.args) if a.args else {}
    except msgspec.DecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    render.json_out(c.call(a.tool, args))
    return OK
