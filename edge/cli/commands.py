"""One function per CLI verb: call tools, print results, return an exit code.

Arguments and results are the tools' own Structs (edge.tools.builtin, edge.core), the
same types the daemon decodes and encodes, so every field read here is checked by mypy.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeVar

import msgspec

from edge.cli import render
from edge.cli.client import CallFailed, Client
from edge.core.auth import Credential, SecretInfo
from edge.core.runs import Run
from edge.core.tasks import DEFAULT_TIMEOUT_MS, ArgvCommand, Command, SecretRef, ShellCommand, Task, TaskSpec
from edge.tools.builtin import backup as backup_tools
from edge.tools.builtin import credentials as credential_tools
from edge.tools.builtin import runs as run_tools
from edge.tools.builtin import secrets as secret_tools
from edge.tools.builtin import status as status_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.definition import Empty

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

OK, TOOL_ERROR = 0, 1

T = TypeVar("T")


class UsageError(Exception):
    pass


def _env(pairs: list[str], secret_pairs: list[str]) -> dict[str, str | SecretRef]:
    env: dict[str, str | SecretRef] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    for pair in secret_pairs:
        key, sep, name = pair.partition("=")
        if not sep or not key or not name:
            raise UsageError(f"--secret-env expects KEY=SECRET_NAME, got {pair!r}")
        env[key] = SecretRef(secret=name)
    return env


def task_spec(a: argparse.Namespace) -> TaskSpec:
    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    command: Command
    if a.shell:
        command = ShellCommand(command=" ".join(a.command))
    else:
        command = ArgvCommand(file=a.command[0], args=a.command[1:])
    return TaskSpec(
        command=command, env=_env(a.env, a.secret_env), overlap=a.overlap, working_dir=a.cwd or None,
        timeout_ms=DEFAULT_TIMEOUT_MS if a.timeout is None else int(a.timeout * 1000), log_cap_bytes=a.log_cap,
    )


def show(a: argparse.Namespace, value: T, human: Callable[[T], None]) -> int:
    if a.json:
        render.json_out(value)
    else:
        human(value)
    return OK


def all_pages(page: Callable[[str | None], tuple[list[T], str | None]]) -> list[T]:
    """Every item of a keyset-paged list tool: `page(after)` is one page's items and its `next`."""
    items: list[T] = []
    after: str | None = None
    while True:
        found, after = page(after)
        items += found
        if not after:
            return items


def show_list(a: argparse.Namespace, items: list[T], empty: str, row: Callable[[T], list[str]],
              headers: list[str]) -> int:
    if a.json:
        render.json_out(items)
    elif not items:
        print(empty)
    else:
        render.table([row(item) for item in items], headers)
    return OK


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _task_fields(t: Task) -> None:
    spec = t.spec
    render.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision),
        ("enabled", _yes(t.enabled)), ("command", render.command_text(spec)),
        ("kind", t.kind), ("timeout", f"{spec.timeout_ms / 1000:g}s"),
        ("overlap", spec.overlap), ("working dir", spec.working_dir),
        ("env", ", ".join(sorted(spec.env)) or None), ("digest", t.content_digest),
        ("updated", render.when(t.updated_at_ms)),
    ])


def task_add(c: Client, a: argparse.Namespace) -> int:
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=task_spec(a)), Task)
    return show(a, task, lambda t: print(f"task {t.id} created (revision {t.revision})"))


def _task_page(c: Client, after: str | None) -> tuple[list[Task], str | None]:
    page = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
    return page.tasks, page.next


def task_list(c: Client, a: argparse.Namespace) -> int:
    return show_list(
        a, all_pages(lambda after: _task_page(c, after)), "no tasks yet: qledge task add NAME -- COMMAND",
        lambda t: [t.id, str(t.revision), _yes(t.enabled), render.command_text(t.spec)],
        ["TASK", "REV", "ENABLED", "COMMAND"],
    )


def task_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task), _task_fields)


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    task = c.typed(tool, task_tools.TaskRef(task_id=a.name), Task)
    return show(a, task, lambda t: print(f"task {t.id} {a.action}d (revision {t.revision})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.typed("qledge.task.delete", task_tools.TaskRef(task_id=a.name), task_tools.Deleted)
    return show(a, done, lambda d: print(f"task {d.task_id} deleted with {d.runs_deleted} runs"))


def run_start(c: Client, a: argparse.Namespace) -> int:
    run = c.typed("qledge.run.start", run_tools.StartArgs(task_id=a.task), Run)
    if not a.wait:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}"))
    if not a.json:
        print(f"run {run.id} {run.status}", flush=True)
    while True:
        waited = c.typed("qledge.run.wait", run_tools.WaitArgs(run_id=run.id, timeout_ms=30_000), run_tools.WaitResult)
        if waited.done:
            break
    final = waited.run
    show(a, final, lambda r: print(render.run_line(r)))
    return OK if final.status == "succeeded" else TOOL_ERROR


def run_list(c: Client, a: argparse.Namespace) -> int:
    page = c.typed("qledge.run.list", run_tools.ListArgs(task_id=a.task or None, limit=a.limit), run_tools.RunPage)
    runs = page.runs
    if a.json:
        render.json_out(runs)
    elif not runs:
        print("no runs")
    else:
        render.table(
            [[r.id, r.task_id, r.status, r.origin, render.when(r.created_at_ms),
              render.duration(r.started_at_ms, r.finished_at_ms),
              "-" if r.exit_code is None else str(r.exit_code)] for r in runs],
            ["RUN", "TASK", "STATUS", "ORIGIN", "CREATED", "TOOK", "EXIT"],
        )
    return OK


def _run_fields(r: Run) -> None:
    render.fields([
        ("run", r.id), ("task", f"{r.task_id} (revision {r.task_revision})"), ("status", r.status),
        ("origin", r.origin), ("trigger", r.trigger_id), ("created", render.when(r.created_at_ms)),
        ("started", render.when(r.started_at_ms)), ("finished", render.when(r.finished_at_ms)),
        ("took", render.duration(r.started_at_ms, r.finished_at_ms)), ("exit code", r.exit_code),
        ("error", r.error_code), ("summary", r.error_summary),
        ("log", f"{r.log_bytes} bytes" + (" (truncated)" if r.log_truncated else "")
         + (f", dropped {render.when(r.log_dropped_at_ms)} (log quota)" if r.log_dropped_at_ms else "")),
    ])


def run_get(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.run.get", run_tools.RunId(run_id=a.run), Run), _run_fields)


def run_log(c: Client, a: argparse.Namespace) -> int:
    offset = 0
    out = sys.stdout.buffer
    while True:
        chunk = c.typed("qledge.run.log.read", run_tools.LogArgs(run_id=a.run, offset=offset), run_tools.LogChunk)
        out.write(chunk.data)
        offset += len(chunk.data)
        if chunk.eof:
            break
    out.flush()
    return OK


def run_cancel(c: Client, a: argparse.Namespace) -> int:
    cancelled = c.typed("qledge.run.cancel", run_tools.RunId(run_id=a.run), Run)
    return show(a, cancelled, lambda r: print(render.run_line(r)))


def token_create(c: Client, a: argparse.Namespace) -> int:
    args = credential_tools.CreateArgs(role=a.role, name=a.name or None, permissions=a.permission or None)
    created = c.typed("qledge.credential.create", args, credential_tools.Created)

    def human(v: credential_tools.Created) -> None:
        print(v.token)
        print(f"credential {v.credential.id} ({v.credential.role}): store this token now;"
              " it cannot be shown again", file=sys.stderr)

    return show(a, created, human)


def _credential_state(x: Credential) -> str:
    return "revoked " + render.when(x.revoked_at_ms) if x.revoked_at_ms else "active"


def token_list(c: Client, a: argparse.Namespace) -> int:
    creds = c.typed("qledge.credential.list", Empty(), credential_tools.CredentialList).credentials
    if a.json:
        render.json_out(creds)
    elif not creds:
        print("no credentials")
    else:
        render.table(
            [[x.id, x.name, x.role, render.when(x.created_at_ms), _credential_state(x)] for x in creds],
            ["ID", "NAME", "ROLE", "CREATED", "STATE"],
        )
    return OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    revoked = c.typed("qledge.credential.revoke", credential_tools.RevokeArgs(id=a.id), Credential)
    return show(a, revoked, lambda x: print(f"credential {x.id} revoked"))


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
    info = c.typed("qledge.secret.set", secret_tools.SetArgs(name=a.name, value=_read_secret(a.name)), SecretInfo)
    return show(a, info, lambda s: print(f"secret {s.name} stored"))


def secret_list(c: Client, a: argparse.Namespace) -> int:
    found = c.typed("qledge.secret.list", Empty(), secret_tools.SecretList).secrets
    if a.json:
        render.json_out(found)
    elif not found:
        print("no secrets")
    else:
        render.table([[s.name, render.when(s.created_at_ms), render.when(s.updated_at_ms)] for s in found],
                     ["NAME", "CREATED", "UPDATED"])
    return OK


def secret_rm(c: Client, a: argparse.Namespace) -> int:
    done = c.typed("qledge.secret.delete", secret_tools.NameArgs(name=a.name), secret_tools.Deleted)
    return show(a, done, lambda d: print(f"secret {d.name} deleted"))


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _status_fields(s: status_tools.Status) -> None:
    counts = s.counts
    render.fields([
        ("qledge", f"{s.version} (pid {s.pid}, up {s.uptime_s:.0f}s)"),
        ("loop", s.loop + (" (ssl loaded)" if s.ssl_loaded else " (ssl not loaded)")),
        ("memory", f"{_mib(s.rss_bytes)} RSS, {_mib(s.hwm_bytes)} peak, {_mib(s.rss_anon_bytes)} anon"),
        ("modules", s.module_count), ("database", f"{s.db_path} ({_mib(s.db_bytes)})"),
        ("project", s.project),
        ("tasks", f"{counts.tasks} tasks, {counts.triggers} triggers, {counts.credentials} credentials"),
        ("runs", f"{counts.runs} stored, {counts.active_runs} active"),
        ("written", f"{_mib(s.written_bytes)} since start, about {_mib(s.written_bytes_per_day)} a day at this rate"),
        *sorted(s.extra.items()),
    ])


def status(c: Client, a: argparse.Namespace) -> int:
    return show(a, c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status), _status_fields)


def call(c: Client, a: argparse.Namespace) -> int:
    """Untyped on purpose: any tool, any JSON args, whatever JSON the tool returned."""
    try:
        args = msgspec.json.decode(a.args) if a.args else {}
    except msgspec.DecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    render.json_out(c.call(a.tool, args))
    return OK


# -- export and import ------------------------------------------------------------------

_document = msgspec.json.Decoder(backup_tools.Document)
MAX_EXPORT_FILE = 64 << 20  # far beyond any router's tasks; a bound on what import reads
_BATCH_BYTES = 128 << 10  # each import call stays well inside the 256 KiB frame cap


class Exported(msgspec.Struct, rename="camel"):
    file: str
    tasks: int
    triggers: int
    secrets: int | None = None


def _export_pages(c: Client) -> tuple[list[backup_tools.ExportedTask], list[backup_tools.ExportedTrigger]]:
    tasks: list[backup_tools.ExportedTask] = []
    triggers: list[backup_tools.ExportedTrigger] = []
    cursor: backup_tools.ExportCursor | None = None
    while True:
        page = c.typed("qledge.export", backup_tools.ExportArgs(cursor=cursor), backup_tools.ExportPage)
        tasks += page.tasks
        triggers += page.triggers
        if page.next is None:
            return tasks, triggers
        cursor = page.next


def _secret_page(c: Client, after: str | None) -> tuple[list[backup_tools.SecretValue], str | None]:
    page = c.typed("qledge.secret.export", backup_tools.SecretExportArgs(after=after), backup_tools.SecretPage)
    return page.secrets, page.next


def _write_private(path: str, data: bytes) -> None:
    """Replace `path` with a new 0600 file holding `data`, all or nothing."""
    import contextlib
    import os

    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def export_state(c: Client, a: argparse.Namespace) -> int:
    import time

    import edge

    tasks, triggers = _export_pages(c)
    secrets = all_pages(lambda after: _secret_page(c, after)) if a.with_secrets else None
    doc = backup_tools.Document(
        format=backup_tools.FORMAT, version=backup_tools.FORMAT_VERSION, qledge_version=edge.__version__,
        exported_at_ms=int(time.time() * 1000), tasks=tasks, triggers=triggers, secrets=secrets,
    )
    _write_private(a.file, msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    done = Exported(file=a.file, tasks=len(tasks), triggers=len(triggers),
                    secrets=None if secrets is None else len(secrets))

    def human(e: Exported) -> None:
        what = f"{e.tasks} tasks, {e.triggers} triggers" + ("" if e.secrets is None else f", {e.secrets} secrets")
        print(f"exported {what} to {e.file} (mode 0600)")

    return show(a, done, human)


def read_document(path: str) -> backup_tools.Document:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_EXPORT_FILE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_EXPORT_FILE:
        raise UsageError(f"{path} is larger than {MAX_EXPORT_FILE} bytes; not a qledge export")
    try:
        return _document.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise UsageError(f"{path} is not a qledge export file (format {backup_tools.FORMAT!r}, version"
                         f" {backup_tools.FORMAT_VERSION}): {' '.join(str(exc).split())}") from None


def batches(items: list[T]) -> list[list[T]]:
    """Consecutive runs of at most BATCH items and about _BATCH_BYTES each."""
    out: list[list[T]] = []
    size = 0
    for item in items:
        n = len(msgspec.msgpack.encode(item))
        if not out or len(out[-1]) >= backup_tools.BATCH or size + n > _BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def _import_calls(doc: backup_tools.Document, replace: bool, dry: bool) -> list[tuple[str, msgspec.Struct]]:
    """Tasks first, then the triggers that name them, then secrets."""
    calls: list[tuple[str, msgspec.Struct]] = [
        ("qledge.import", backup_tools.ImportArgs(tasks=b, replace=replace, dry_run=dry)) for b in batches(doc.tasks)]
    calls += [("qledge.import", backup_tools.ImportArgs(triggers=b, replace=replace, dry_run=dry))
              for b in batches(doc.triggers)]
    calls += [("qledge.secret.import", backup_tools.SecretImportArgs(secrets=b, replace=replace, dry_run=dry))
              for b in batches(doc.secrets or [])]
    return calls


def import_state(c: Client, a: argparse.Namespace) -> int:
    doc = read_document(a.file)
    # A dry pass over everything first: a conflict anywhere (or a missing permission) is
    # found before anything is written.
    report = backup_tools.ImportReport()
    for tool_name, args in _import_calls(doc, a.replace, dry=True):
        report.add(c.typed(tool_name, args, backup_tools.ImportReport))
    if report.conflicts:
        if a.json:
            render.json_out(report)
        raise CallFailed("conflict", backup_tools.refusal(report.conflicts) + " (qledge import --replace overwrites)")
    if not a.dry_run:
        report = backup_tools.ImportReport()
        for tool_name, args in _import_calls(doc, a.replace, dry=False):
            report.add(c.typed(tool_name, args, backup_tools.ImportReport))

    def human(r: backup_tools.ImportReport) -> None:
        would = "would be " if a.dry_run else ""
        for verb, items in (("created", r.created), ("updated", r.updated), ("skipped (identical)", r.skipped)):
            if items:
                print(f"{would}{verb}: {', '.join(items)}")
        for note in r.notes:
            print(f"note: {note}")
        print(f"{a.file}: {len(r.created)} {would}created, {len(r.updated)} {would}updated,"
              f" {len(r.skipped)} skipped")

    return show(a, report, human)
