"""One function per CLI verb: call tools, print results, return an exit code; and the
parser of the whole command line (`build_parser`).

Arguments and results are the tools' own Structs (edge.tools.builtin, edge.core), the
same types the daemon decodes and encodes, so every field read here is checked by mypy.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeVar

import msgspec

from edge.cli import edit, render
from edge.cli.client import CallFailed, Client, UsageError
from edge.core.auth import Credential, SecretInfo
from edge.core.runs import Run, RunDefaults
from edge.core.tasks import DEFAULT_TIMEOUT_MS, ArgvCommand, Command, SecretRef, ShellCommand, Task, TaskSpec
from edge.tools.builtin import backup as backup_tools
from edge.tools.builtin import credentials as credential_tools
from edge.tools.builtin import runs as run_tools
from edge.tools.builtin import credentials as secret_tools
from edge.tools.builtin import status as status_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.definition import Empty

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import NoReturn

    from edge.cli.main import Handler, Subcommands, Verb

    from edge.tools.ai.projections import TaskView

OK, TOOL_ERROR = 0, 1

T = TypeVar("T")


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


env_pairs = _env  # the --env and --secret-env pairs, for `task update` too


def shell_command(a: argparse.Namespace) -> Command:
    """The command after `--`: argv words, or with --shell the one shell command."""
    if a.shell:
        # Joining words would re-split them in the shell: `a b` and `c;echo x` must not become
        # `a b c;echo x`. The shell command is one argument, quoted as the shell reads it.
        if len(a.command) != 1:
            raise UsageError(f"--shell takes exactly one argument after `--`, the shell command, but got"
                             f" {len(a.command)}: quote it as one, e.g. --shell -- 'echo a; echo b'")
        return ShellCommand(command=a.command[0])
    return ArgvCommand(file=a.command[0], args=a.command[1:])


def task_spec(a: argparse.Namespace) -> TaskSpec:
    """A new task's spec from the flags of `task add` (`task update` takes its command from
    here too, so both follow the same rules)."""
    if not a.command:
        raise UsageError("give the command after `--`, e.g. qledge task add hello -- echo hi")
    edit.check_task_flags(a)
    command = shell_command(a)
    try:
        return TaskSpec(
            command=command, env=_env(a.env, a.secret_env), overlap=a.overlap or "forbid", working_dir=a.cwd or None,
            timeout_ms=DEFAULT_TIMEOUT_MS if a.timeout is None else int(a.timeout * 1000), log_cap_bytes=a.log_cap,
            user=a.user or None, group=a.group or None,
        )
    except ValueError as exc:  # TaskSpec's own checks (e.g. a QLEDGE_ variable)
        raise UsageError(str(exc)) from None


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


def _task_fields(t: Task, defaults: RunDefaults | None) -> None:
    spec = t.spec
    cap = spec.log_cap_bytes
    cwd = spec.working_dir
    render.fields([
        ("task", t.id), ("name", t.name), ("revision", t.revision),
        ("enabled", _yes(t.enabled)), ("command", render.command_text(spec)),
        ("kind", t.kind), ("timeout", render.span(spec.timeout_ms / 1000)),
        ("overlap", spec.overlap), ("user", _user(t)),
        ("working dir", cwd if cwd else f"{defaults.work_dir} (the default)" if defaults else "the daemon's default"),
        ("log cap", render.size(cap) if cap else f"{render.size(defaults.log_cap_bytes)} (the default)"
         if defaults else "the daemon's default"),
        ("env", ", ".join(sorted(spec.env)) or None), ("digest", t.content_digest),
        ("created", render.when(t.created_at_ms)), ("updated", render.when(t.updated_at_ms)),
    ])


def _user(t: Task) -> str:
    spec = t.spec
    who = spec.user or "the daemon's user"
    who += f" (group {spec.group})" if spec.group else ""
    return who + (", written with task.privileged" if t.privileged else "")


def task_add(c: Client, a: argparse.Namespace) -> int:
    task = c.typed("qledge.task.create", task_tools.CreateArgs(task_id=a.name, spec=task_spec(a)), Task)
    return show(a, task, lambda t: print(f"task {t.id} created (revision {t.revision})"))


def _task_page(c: Client, after: str | None) -> tuple[list[Task], str | None]:
    page = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
    return page.tasks, page.next


# A viewer holds task.read and trigger.read, not .inspect: it is shown the low-sensitivity
# projections (no command, environment, cron expression), through the tools it may call.

def _head_page(c: Client, after: str | None) -> tuple[list[TaskView], str | None]:
    from edge.tools.ai.projections import TaskCursor, TaskListArgs, TaskPage

    page = c.typed("qinglong.task.list", TaskListArgs(after=TaskCursor(task_id=after) if after else None, limit=64),
                   TaskPage)
    return page.tasks, page.next.task_id if isinstance(page.next, TaskCursor) else None


def task_list(c: Client, a: argparse.Namespace) -> int:
    empty = "no tasks yet: qledge task add NAME -- COMMAND"
    if not c.may_call("qledge.task.list"):
        return show_list(
            a, all_pages(lambda after: _head_page(c, after)), empty,
            lambda t: [t.task_id, str(t.revision), _yes(t.enabled), t.kind, render.when(t.updated_at_ms)],
            ["TASK", "REV", "ENABLED", "KIND", "UPDATED"],
        )
    return show_list(
        a, all_pages(lambda after: _task_page(c, after)), empty,
        lambda t: [t.id, str(t.revision), _yes(t.enabled), render.command_text(t.spec)],
        ["TASK", "REV", "ENABLED", "COMMAND"],
    )


def _defaults(c: Client) -> RunDefaults | None:
    return c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status).defaults


def task_get(c: Client, a: argparse.Namespace) -> int:
    if not c.may_call("qledge.task.get"):
        from edge.tools.ai.projections import TaskDetailView, TaskGetArgs, TaskGetResult

        found = c.typed("qinglong.task.get", TaskGetArgs(task_id=a.name), TaskGetResult)
        if not isinstance(found.task, TaskDetailView):
            raise CallFailed("not_found", f"task {a.name!r} not found")
        return show(a, found.task, lambda t: render.fields([
            ("task", t.task_id), ("name", t.name), ("revision", t.revision), ("enabled", _yes(t.enabled)),
            ("kind", t.kind), ("digest", t.content_digest), ("created", render.when(t.created_at_ms)),
            ("updated", render.when(t.updated_at_ms)),
            ("command", "not shown: it needs task.inspect"),
        ]))
    task = c.typed("qledge.task.get", task_tools.TaskId(task_id=a.name), Task)
    if a.json:
        return show(a, task, lambda t: None)
    defaults = _defaults(c)
    return show(a, task, lambda t: _task_fields(t, defaults))


def task_toggle(c: Client, a: argparse.Namespace) -> int:
    tool = "qledge.task.enable" if a.action == "enable" else "qledge.task.disable"
    task = c.typed(tool, task_tools.TaskRef(task_id=a.name), Task)
    return show(a, task, lambda t: print(f"task {t.id} {a.action}d (revision {t.revision})"))


def task_rm(c: Client, a: argparse.Namespace) -> int:
    args = task_tools.DeleteArgs(task_id=a.name, with_triggers=a.with_triggers)
    try:
        done = c.typed("qledge.task.delete", args, task_tools.Deleted)
    except CallFailed as exc:
        if exc.code == "conflict" and "would be deleted with it" in exc.message:
            raise CallFailed(exc.code, f"{exc.message}: delete them first, or run"
                                       f" `qledge task rm {a.name} --with-triggers`") from None
        raise
    return show(a, done, lambda d: print(f"task {d.task_id} deleted with its {d.runs_deleted} finished runs"
                                         + (" and its triggers" if a.with_triggers else "")))


def run_start(c: Client, a: argparse.Namespace) -> int:
    run = c.typed("qledge.run.start", run_tools.StartArgs(task_id=a.task), Run)
    if not a.wait and not a.follow:
        return show(a, run, lambda r: print(f"run {r.id} {r.status}"))
    # Following: the output goes to stdout, the run's own lines to stderr.
    status_out = sys.stderr if a.follow else sys.stdout
    if not a.json:
        print(f"run {run.id} {run.status}", file=status_out, flush=True)
    if a.follow:
        from edge.cli.history import follow

        follow(c, run.id)
    while True:
        waited = c.typed("qledge.run.wait", run_tools.WaitArgs(run_id=run.id, timeout_ms=30_000), run_tools.WaitResult)
        if waited.done:
            break
    final = waited.run
    if a.json:
        render.json_out(final)
    else:
        print(render.run_line(final), file=status_out)
    return OK if final.status == "succeeded" else TOOL_ERROR


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
    hidden = 0 if a.all else sum(1 for x in creds if x.revoked_at_ms)
    if not a.all:
        creds = [x for x in creds if not x.revoked_at_ms]
    if a.json:
        render.json_out(creds)
        return OK
    if creds:
        render.table(
            [[x.id, x.name, x.role, ",".join(x.permissions) if x.permissions else "-", render.when(x.created_at_ms),
              _credential_state(x)] for x in creds],
            ["ID", "NAME", "ROLE", "PERMISSIONS", "CREATED", "STATE"],
        )
    elif not hidden:
        print("no credentials")
    if hidden:
        print(f"({hidden} revoked not shown: qledge token list --all)")
    return OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    # The daemon takes a whole token for its id and never says it back; neither does this.
    revoked = c.typed("qledge.credential.revoke", credential_tools.RevokeArgs(id=a.id), Credential)
    return show(a, revoked, lambda x: print(f"credential {x.id} ({x.name}) revoked"))


def _read_secret(name: str) -> str:
    """From a prompt on a terminal, else all of stdin minus one trailing newline."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value for secret {name}: ")
        if value != getpass.getpass("again: "):
            raise UsageError("the two values differ; nothing was stored")
    else:
        raw = sys.stdin.buffer.read()
        try:
            value = raw.decode()
        except UnicodeDecodeError as exc:
            raise UsageError(f"the value on stdin is not UTF-8 text (byte {exc.start}); nothing was stored"
                             " (encode binary values, e.g. base64)") from None
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


def _status_fields(s: status_tools.Status) -> None:
    counts = s.counts
    render.fields([
        ("qledge", f"{s.version} (pid {s.pid}, up {render.duration(0, int(s.uptime_s * 1000))})"),
        ("loop", s.loop + (" (ssl loaded)" if s.ssl_loaded else " (ssl not loaded)")),
        ("memory", f"{render.size(s.rss_bytes)} RSS, {render.size(s.hwm_bytes)} peak,"
                   f" {render.size(s.rss_anon_bytes)} anon"),
        ("modules", s.module_count), ("database", f"{s.db_path} ({render.size(s.db_bytes)})"),
        ("project", s.project),
        ("tasks", f"{counts.tasks} tasks, {counts.triggers} triggers, {counts.credentials} credentials"),
        ("runs", f"{counts.runs} stored, {counts.active_runs} active"),
        ("written", f"{render.size(s.written_bytes)} since start, about {render.size(s.written_bytes_per_day)} a day"
                    " at this rate"),
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


# -- the command line ---------------------------------------------------------------------
# Here rather than in edge.cli.main, which `qledge serve` loads: the daemon never pays for it.


def _parser_class() -> type[argparse.ArgumentParser]:
    import argparse

    from edge.cli.client import UsageError

    class Parser(argparse.ArgumentParser):
        """argparse whose usage errors take the one error format (and exit 2) like any other."""

        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{message} (see: {self.prog} --help)")

    return Parser


def _common() -> argparse.ArgumentParser:
    import argparse

    # SUPPRESS lets these flags appear before or after the verb without clobbering.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--home", default=argparse.SUPPRESS, help="state directory ($QLEDGE_HOME)")
    p.add_argument("--socket", default=argparse.SUPPRESS, help="tool socket path ($QLEDGE_SOCKET)")
    p.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE",
                   help="the daemon's TOML configuration, for its home and socket ($QLEDGE_CONFIG)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="machine-readable output (errors too, as JSON on stderr)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """Every verb and its options (edge.cli.main.build_parser), for every command but `serve`."""
    import argparse

    import edge

    common = _common()
    parser = _parser_class()(
        prog="qledge", parents=[common],
        description="A minimal-footprint task runtime for routers and small boards.",
    )
    parser.add_argument("--version", action="version", version=f"qledge {edge.__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    def verb(sub: Subcommands, name: str, handler: Handler | None, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(handler=handler)
        return p

    verb(verbs, "serve", None, "run the daemon in the foreground (--config FILE, or $QLEDGE_CONFIG)")

    from edge.cli import commands as c
    from edge.cli import edit

    task = verbs.add_parser("task", help="manage tasks").add_subparsers(dest="action", metavar="ACTION", required=True)
    add = verb(task, "add", c.task_add, "add a task: qledge task add NAME [options] -- COMMAND [ARGS...]")
    edit.task_options(add, update=False)
    _task_update_verb(task, verb)
    verb(task, "list", c.task_list, "list tasks")
    for action in ("get", "enable", "disable", "rm"):
        handler = {"get": c.task_get, "rm": c.task_rm}.get(action, c.task_toggle)
        p = verb(task, action, handler, f"{action} a task")
        p.add_argument("name", metavar="TASK")
    task.choices["rm"].description = (
        "delete a task: its revisions, its finished runs and their logs; refused while a run is"
        " queued or running, and while the task has triggers unless --with-triggers")
    task.choices["rm"].add_argument("--with-triggers", action="store_true",
                                    help="delete the task's triggers (and their events) too")

    run = verbs.add_parser("run", help="start and inspect runs").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    start = verb(run, "start", c.run_start, "start a run of a task now")
    start.add_argument("task", metavar="TASK")
    start.add_argument("--wait", action="store_true", help="wait until it finishes; exit 1 unless it succeeded")
    _history_verbs(verbs, run, start, verb)

    _schedule_verbs(verbs, verb)
    _backup_verbs(verbs, verb)

    token = verbs.add_parser("token", help="API credentials").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    create = verb(token, "create", c.token_create, "create a credential; prints its token once")
    create.add_argument("--role", required=True, choices=("owner", "operator", "viewer"))
    create.add_argument("--name")
    create.add_argument("--permission", action="append", metavar="P",
                        help="restrict to this permission (repeatable; an unknown one is refused with the list)")
    verb(token, "list", c.token_list, "list credentials").add_argument(
        "--all", action="store_true", help="revoked ones too")
    verb(token, "revoke", c.token_revoke, "revoke a credential (by id, or by the whole token)").add_argument(
        "id", metavar="ID")

    secret = verbs.add_parser("secret", help="secrets for task environments (values are never shown)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    verb(secret, "set", c.secret_set, "store a secret; the value is read from stdin or a prompt, never argv"
         " (at most 16384 characters, no NUL)").add_argument("name", metavar="NAME")
    verb(secret, "list", c.secret_list, "list secret names and dates")
    verb(secret, "rm", c.secret_rm, "delete a secret").add_argument("name", metavar="NAME")

    mcp = verb(verbs, "mcp", None, "bridge stdio to the daemon's MCP socket, for AI clients")
    mcp.add_argument("--token-file", metavar="FILE", help="read the API token from FILE ($QLEDGE_TOKEN)")
    mcp.add_argument("--mcp-socket", metavar="PATH", help="MCP socket (default <home>/mcp.sock)")
    verb(verbs, "status", c.status, "daemon status")
    call = verb(verbs, "call", c.call, "call a tool directly; prints its JSON result")
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("--args", metavar="JSON", help="arguments as a JSON object")
    return parser


def _task_update_verb(task: Subcommands, verb: Verb) -> None:
    from edge.cli import edit

    update = verb(task, "update", edit.task_update,
                  "change a task: qledge task update TASK [options] [-- COMMAND [ARGS...]]")
    edit.task_options(update, update=True)


def _history_verbs(verbs: Subcommands, run: Subcommands, start: argparse.ArgumentParser, verb: Verb) -> None:
    """Browsing what ran and what will: run list/get/log/cancel, qledge next, qledge audit."""
    from edge.cli import history as h
    from edge.cli.edit import bounded_int

    start.add_argument("--follow", action="store_true",
                       help="print the run's output as it comes, until it ends (implies --wait)")
    lst = verb(run, "list", h.run_list, "list runs, newest first (a page at a time, or --all)")
    h.list_options(lst)
    for action, handler, text in (("get", h.run_get, "show a run"), ("log", h.run_log, "print a run's log"),
                                  ("cancel", h.run_cancel, "cancel a run")):
        p = verb(run, action, handler, text)
        p.add_argument("run", metavar="RUN", help=h.RUN_HELP)
        p.epilog = h.RUN_EPILOG
    run.choices["log"].add_argument("--follow", "-f", action="store_true",
                                    help="keep printing the output of a running run until it ends")
    nxt = verb(verbs, "next", h.upcoming, "the next fires of every enabled trigger, in time order")
    nxt.add_argument("--count", type=bounded_int("--count", 1, 100), default=10, metavar="N",
                     help="how many (1..100, default 10)")
    audit = verb(verbs, "audit", h.audit, "the security audit log, newest first (owners: audit.read)")
    audit.add_argument("--limit", type=bounded_int("--limit", 1, 1000), default=20, metavar="N",
                       help="how many rows (1..1000, default 20)")
    audit.add_argument("--since", type=h.time_arg("--since"), metavar="WHEN",
                       help="only rows from then on: a duration back from now (30m, 12h, 7d) or a date/time")


def _schedule_verbs(verbs: Subcommands, verb: Verb) -> None:
    from edge.cli import edit
    from edge.cli import schedule_commands as s

    cron = verbs.add_parser("cron", help="cron expressions (offline)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    nxt = verb(cron, "next", s.cron_next, "print the next fire times of a cron expression (no daemon needed)")
    nxt.add_argument("expression", metavar="EXPR", help="5 fields, or 6 with seconds first; or @daily etc.")
    nxt.add_argument("--tz", type=edit.zone_arg, metavar="TZ", help="IANA time zone (default: the device's, else UTC)")
    nxt.add_argument("--after", metavar="ISO8601", help="list fires after this time (default: now)")
    nxt.add_argument("--count", type=s.count, default=5, metavar="N", help="how many (1..1000, default 5)")
    nxt.set_defaults(offline=True)

    trigger = verbs.add_parser("trigger", help="manage cron triggers").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    add = verb(trigger, "add", s.trigger_add, "add a cron trigger: qledge trigger add TASK --cron EXPR")
    add.add_argument("task", metavar="TASK")
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help="5 fields, or 6 with seconds first; @daily etc., @reboot (once per boot), @once (one shot)")
    add.add_argument("--tz", type=edit.zone_arg, metavar="TZ",
                     help="IANA time zone (default: config `timezone`, the device's, UTC)")
    add.add_argument("--misfire", choices=("skip", "fire_once"), default="skip",
                     help="fires missed by more than 30s: skip them, or run the oldest once (default skip)")
    add.add_argument("--jitter", type=edit.jitter, default=0, metavar="S",
                     help="delay each run by a random 0..S seconds (S: 0..3600, default 0)")
    add.add_argument("--id", metavar="ID", help="trigger id (default TASK-N)")
    add.epilog = edit.TRIGGER_LIMITS
    _trigger_update_verb(trigger, verb)
    verb(trigger, "list", s.trigger_list, "list triggers")
    for action, handler in (("get", s.trigger_get), ("enable", s.trigger_toggle), ("disable", s.trigger_toggle),
                            ("rm", s.trigger_rm)):
        verb(trigger, action, handler, f"{action} a trigger").add_argument("trigger", metavar="TRIGGER")
    repin = verb(trigger, "repin", s.trigger_repin, "pin a trigger to the task's current (or a given) revision")
    repin.add_argument("trigger", metavar="TRIGGER")
    repin.add_argument("--task-revision", type=int, metavar="N", help="pin to this task revision instead")
    events = verb(trigger, "events", s.trigger_events, "fires that were skipped or refused, newest first")
    events.add_argument("trigger", metavar="TRIGGER", nargs="?")
    events.add_argument("--limit", type=edit.bounded_int("--limit", 1, 64), default=32, metavar="N",
                        help="1..64 (default 32)")


def _trigger_update_verb(trigger: Subcommands, verb: Verb) -> None:
    from edge.cli import edit

    update = verb(trigger, "update", edit.trigger_update,
                  "change a trigger's schedule; its task, enabled flag and events stay")
    update.add_argument("trigger", metavar="TRIGGER")
    edit.trigger_options(update)


def _backup_verbs(verbs: Subcommands, verb: Verb) -> None:
    from edge.cli import commands as c

    exp = verb(verbs, "export", c.export_state,
               "write tasks and triggers (and, with --with-secrets, secret values) to FILE, mode 0600")
    exp.add_argument("file", metavar="FILE")
    exp.add_argument("--with-secrets", action="store_true", help="include secret values (needs secret.export)")
    sources = verbs.add_parser(
        "import", help="import tasks and triggers: qledge import FILE, or from crontab or qinglong").add_subparsers(
        dest="source", metavar="FILE|SOURCE", required=True)
    imp = verb(sources, "file", c.import_state,
               "import an export made by `qledge export`: create what is missing, skip what is identical")
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--replace", action="store_true", help="overwrite tasks, triggers and secrets that differ")
    imp.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    from edge.cli.import_commands import add_import_sources

    add_import_sources(sources, verb)
