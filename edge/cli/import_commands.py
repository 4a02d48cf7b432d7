"""`qledge import FILE|crontab|qinglong` and `qledge export FILE`: the export file both ways
(tasks, triggers, secrets, the notification channels and the copied scripts that travel with
it), a crontab, and a qinglong install: read the source, plan with edge.core.imports, and
create through the daemon's import tools (one transaction and one audit row per task; a
second run creates nothing new).

Everything that reads files lives here; the meaning of each entry is edge.core.imports.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

from edge.cli import shared
from edge.cli.shared import EXIT_OK, UsageError, Verb, show
from edge.core.imports import (
    MAX_CRONTAB_BYTES,
    CrontabUser,
    Entry,
    Problem,
    QlPlace,
    assign_ids,
    disable_lines,
    import_key,
    is_notification_key,
    join_envs,
    parse_crontab,
    parse_shell_exports,
    ql_cron,
    ql_entry,
    ql_env,
    unrepresentable,
)
from edge.core.schedule import ScheduleError, load_zone
from edge.core.tasks import (
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    ArgvCommand,
    ImportedTask,
    ImportRecord,
    ImportTask,
    ShellCommand,
)
from edge.tools.builtin import backup as backup_tools
from edge.tools.builtin import credentials as secret_tools
from edge.tools.builtin import status as status_tools
from edge.tools.builtin import tasks as task_tools
from edge.transports.client import BadReply, CallFailed, Client, Unreachable, all_pages

if TYPE_CHECKING:
    import argparse
    import pwd
    import tarfile

T = TypeVar("T")
DEFAULT_CRONTAB = "/etc/crontabs/root"  # busybox crond's, on OpenWrt
DISK_RESERVE = 8 * 1024 * 1024  # what the runner keeps free: a copy must leave it
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,126}$")


# -- what the report says -----------------------------------------------------------


class PlannedTask(msgspec.Struct, rename="camel", omit_defaults=True):
    where: str
    status: str  # create (dry run), created, exists
    task_id: str
    command: str
    triggers: list[str]
    enabled: bool = True
    notes: list[str] = []


class PlannedSecret(msgspec.Struct, rename="camel"):
    name: str
    env: str
    status: str  # create (dry run), created, exists, taken


class ImportedChannel(msgspec.Struct, rename="camel"):
    name: str
    kind: str
    keys: list[str]  # the qinglong settings it comes from
    status: str  # create (dry run), created, exists, failed
    note: str | None = None


class Report(msgspec.Struct, rename="camel", omit_defaults=True):
    source: str
    dry_run: bool
    tasks: list[PlannedTask] = []
    secrets: list[PlannedSecret] = []
    not_imported: list[Problem] = []
    channels: list[ImportedChannel] = []
    notices: list[str] = []


def _command(entry: Entry) -> str:
    return "; ".join(shared.command_text(entry.task.spec).splitlines())


def _records(c: Client) -> dict[str, ImportRecord]:
    def page(after: str | None) -> tuple[list[ImportRecord], str | None]:
        got = c.typed("qledge.import.list", task_tools.ImportListArgs(after=after), task_tools.ImportPage)
        return got.imports, got.next

    return {r.key: r for r in all_pages(page)}


def _task_ids(c: Client) -> set[str]:
    def page(after: str | None) -> tuple[list[str], str | None]:
        got = c.typed("qledge.task.list", task_tools.ListArgs(after=after), task_tools.TaskPage)
        return [t.id for t in got.tasks], got.next

    return set(all_pages(page))


_BATCH_ITEMS = 256  # entries per qledge.import.tasks call
_BATCH_BYTES = 160 << 10  # and about this much of a call's 256 KiB frame


def _batches(entries: list[Entry]) -> list[list[Entry]]:
    out: list[list[Entry]] = []
    size = 0
    for entry in entries:
        n = len(msgspec.msgpack.encode(entry.task))
        if not out or len(out[-1]) >= _BATCH_ITEMS or size + n > _BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(entry)
        size += n
    return out


def _import_calls(c: Client, entries: list[Entry], check: bool, undo: Undo | None = None) -> list[ImportedTask]:
    """A call per batch (each a transaction); the tasks created go to `undo`."""
    results: list[ImportedTask] = []
    for batch in _batches(entries):
        got = c.typed("qledge.import.tasks", task_tools.ImportTasksArgs(items=[e.task for e in batch], check=check),
                      task_tools.ImportTasksResult)
        if len(got.results) != len(batch):
            raise CallFailed("internal", "the daemon answered an import batch with another number of results")
        if undo is not None:
            for result in got.results:
                if result.status == "created":
                    undo.add(f"task {result.task_id}", functools.partial(
                        c.call, "qledge.task.delete", {"taskId": result.task_id, "withTriggers": True}))
            undo.check()
        results += got.results
    return results


def _check_tasks(c: Client, report: Report, entries: list[Entry], records: dict[str, ImportRecord],
                 who: str) -> list[Entry]:
    """Every new entry checked by the daemon before anything is written; the ones it takes.
    A refusal of one entry alone (its working directory) is reported; any other stops the
    import, naming the entries."""
    problems = {id(e): p for e in entries if (p := unrepresentable(e)) is not None}
    report.not_imported += problems.values()
    entries = [e for e in entries if id(e) not in problems]
    fresh = [e for e in entries if e.task.key not in records]
    assign_ids(fresh, _task_ids(c))
    # Entries alike in what the daemon checks are checked once (many lines, few users and schedules).
    alike: dict[bytes, list[Entry]] = {}
    for entry in fresh:
        alike.setdefault(_checked_as(entry.task), []).append(entry)
    firsts = [group[0] for group in alike.values()]
    stops: list[tuple[Entry, ImportedTask]] = []
    refused: set[int] = set()
    for group, result in zip(alike.values(), _import_calls(c, firsts, check=True), strict=True):
        if result.status != "refused":
            continue
        for entry in group:
            refused.add(id(entry))
            local = _local_refusal(entry, result)
            if local is None:
                stops.append((entry, result))
            else:
                report.not_imported.append(local)
    if stops:
        raise _stopped(sorted(stops, key=lambda s: _order(s[0].where)), who)
    return [e for e in entries if id(e) not in refused]


_signature = msgspec.msgpack.Encoder(order="deterministic")


def _checked_as(task: ImportTask) -> bytes:
    """What the daemon's check of an entry depends on (may_run, the program's path, the schedules)."""
    spec, command = task.spec, task.spec.command
    program = ("argv", "/" in command.file and not command.file.startswith("/")) if isinstance(command, ArgvCommand) \
        else (type(command).__name__, False)
    return _signature.encode((program, spec.user, spec.group, spec.working_dir, spec.secrets(),
                              [(t.expression, t.timezone, t.misfire) for t in task.triggers]))


def _local_refusal(entry: Entry, result: ImportedTask) -> Problem | None:
    message = result.message or ""
    if result.code == "invalid_argument" and message.startswith("working directory"):
        return Problem(entry.where, entry.task.name or entry.task.task_id, f"the daemon refuses it: {message}",
                       "working directory refused")
    return None


def _stopped(stops: list[tuple[Entry, ImportedTask]], who: str) -> CallFailed:
    first = stops[0][1]
    message, code = first.message or "refused", first.code or "invalid_argument"
    if "task.privileged" in message:
        message += f" ({who}: import as an owner, or name one of the daemon's [runner] task_users with --user)"
    elif "user" in message or "group" in message:
        message += f" ({who}; --user USER names another)"
    where = _named([e.where for e, _ in stops])
    return CallFailed(code, f"nothing was imported: {len(stops)} entries would be refused ({where}): {message}")


def _apply_tasks(c: Client, report: Report, entries: list[Entry], records: dict[str, ImportRecord],
                 dry_run: bool, undo: Undo | None = None) -> list[Entry]:
    """Create the checked entries not imported before (a transaction per batch; what each
    creates goes to `undo`); the entries in qledge now."""
    fresh = [e for e in entries if e.task.key not in records]
    made = {} if dry_run else dict(zip((id(e) for e in fresh), _import_calls(c, fresh, False, undo), strict=True))
    kept: list[Entry] = []
    for entry in entries:
        triggers = [t.expression for t in entry.task.triggers]
        done = records.get(entry.task.key)
        if done is not None:
            status, task_id = "exists", done.target
        elif dry_run:
            status, task_id = "create", entry.task.task_id
        else:
            result = made[id(entry)]
            if result.status == "refused":  # changed since it was checked
                report.not_imported.append(_local_refusal(entry, result) or Problem(
                    entry.where, entry.task.name or entry.task.task_id, f"the daemon refuses it: {result.message}",
                    "refused"))
                continue
            status, task_id = result.status, result.task_id
        kept.append(entry)
        report.tasks.append(PlannedTask(where=entry.where, status=status, task_id=task_id, command=_command(entry),
                                        triggers=triggers, enabled=entry.task.enabled, notes=entry.notes))
    return kept


def _order(where: str) -> tuple[str, int]:
    kind, _, number = where.partition(" ")
    return (kind, int(number)) if number.isdigit() else (kind, 0)


def _print(report: Report) -> None:
    verb = {"create": "would create", "created": "created", "exists": "already imported as"}
    lines: list[tuple[tuple[str, int], list[str]]] = []
    for t in report.tasks:
        state = "" if t.enabled else " (disabled)"
        text = [f"{t.where}: {verb[t.status]} task {t.task_id}{state}: {' | '.join(t.triggers)}  {t.command}"]
        lines.append((_order(t.where), text + [f"  note: {note}" for note in t.notes]))
    for p in report.not_imported:
        lines.append((_order(p.where), [f"{p.where}: not imported: {p.reason}", f"  {p.text}"]))
    for s in report.secrets:
        what = {"create": "would store", "created": "stored", "exists": "already imported:",
                "taken": "not stored (a secret of that name exists and is not replaced):"}[s.status]
        lines.append((("env", 0), [f"env {s.env}: {what} secret {s.name}"]))
    for ch in report.channels:
        made = {"create": "would create", "created": "created", "exists": "already there:", "failed": "not created:"}
        lines.append((("env", 1), [f"notifications: {made[ch.status]} channel {ch.name} ({ch.kind}) from"
                                   f" {', '.join(ch.keys)}" + (f": {ch.note}" if ch.note else "")]))
    for _, text in sorted(lines, key=lambda item: item[0]):
        print("\n".join(text))
    for notice in report.notices:
        print(notice)
    print(_summary(report))


def _summary(report: Report) -> str:
    def count(items: list[PlannedTask] | list[PlannedSecret], *states: str) -> int:
        return sum(1 for x in items if x.status in states)

    new = ("create",) if report.dry_run else ("created",)
    triggers = sum(len(t.triggers) for t in report.tasks if t.status in new)
    done = "to create" if report.dry_run else "created"
    parts = [f"{count(report.tasks, *new)} tasks with {triggers} triggers {done}",
             f"{count(report.tasks, 'exists')} already imported"]
    if report.secrets:
        parts.append(f"{count(report.secrets, *new)} secrets {'to store' if report.dry_run else 'stored'}"
                     f" ({count(report.secrets, 'exists')} already imported, {count(report.secrets, 'taken')} taken)")
    reasons: dict[str, int] = {}
    for p in report.not_imported:
        reasons[p.kind or "other"] = reasons.get(p.kind or "other", 0) + 1
    skipped = f"{len(report.not_imported)} not imported"
    if reasons:
        skipped += " (" + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda x: (-x[1], x[0]))) + ")"
    parts.append(skipped)
    return ("dry run, nothing changed: " if report.dry_run else "summary: ") + ", ".join(parts)


def _done(a: argparse.Namespace, report: Report) -> int:
    if a.json:
        shared.json_out(report)
    else:
        _print(report)
    return EXIT_OK


def _timeout_ms(a: argparse.Namespace) -> int:
    if a.timeout is None:
        return DEFAULT_TIMEOUT_MS
    ms = int(a.timeout * 1000)
    if not 1000 <= ms <= MAX_TIMEOUT_MS:
        raise UsageError(f"--timeout must be 1..{MAX_TIMEOUT_MS // 1000} seconds")
    return ms


# -- crontab ------------------------------------------------------------------------


def state_dir(c: Client) -> str | None:
    """The daemon's state directory; None for a cluster node (its state is in PostgreSQL)."""
    status = c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status)
    return os.path.dirname(status.db_path) if os.path.isabs(status.db_path) else None


def _crontab_user(path: str, wanted: str | None, state: str | None) -> CrontabUser:
    """Whom the entries run as: `--user`, else the crontab's user (busybox keeps one
    crontab per user, named after the user), else (standard input, another name) you. Its
    home is HOME and, when it is a directory outside the daemon's state directory (the
    home of the daemon's own user may be that), the working directory, as under crond."""
    import pwd

    if wanted is not None:
        entry = _account(wanted)
    else:
        try:
            entry = pwd.getpwnam(os.path.basename(path)) if path != "-" else pwd.getpwuid(os.getuid())
        except KeyError:
            entry = pwd.getpwuid(os.getuid())
    home = entry.pw_dir or None
    usable = home is not None and os.path.isdir(home) and not (state is not None and _inside(home, state))
    return CrontabUser(name=entry.pw_name, home=home, work_dir=home if usable else None)


def _account(user: str) -> pwd.struct_passwd:
    import pwd

    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise UsageError(f"--user {user}: there is no such user on this system") from None


def _read(path: str) -> str:
    """The crontab, at most MAX_CRONTAB_BYTES of it (a bound on what an import reads)."""
    try:
        if path == "-":
            text = sys.stdin.read(MAX_CRONTAB_BYTES + 1)
        else:
            with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
                text = f.read(MAX_CRONTAB_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(text) > MAX_CRONTAB_BYTES:
        raise UsageError(f"{path} is larger than {MAX_CRONTAB_BYTES >> 20} MiB: not a crontab qledge imports")
    return text


def import_crontab(c: Client, a: argparse.Namespace) -> int:
    path = a.file or DEFAULT_CRONTAB
    if a.disable_source and path == "-":
        raise UsageError("--disable-source needs a crontab file, not standard input")
    text = _read(path)
    user = _crontab_user(path, a.user, state_dir(c))
    plan = parse_crontab(text, user, _timeout_ms(a))
    report = Report(source=path, dry_run=a.dry_run, not_imported=list(plan.problems))
    who = f"the entries run as {user.name}, " + ("as --user says" if a.user else "the crontab's user")
    records = _records(c)
    entries = _check_tasks(c, report, plan.entries, records, who)
    undo = Undo()
    if not a.dry_run:
        try:  # the tasks, a transaction per batch: on a failure or a stop, the batches before are taken back
            undo.start()
            entries = _apply_tasks(c, report, entries, records, a.dry_run, undo)
            undo.check()
        except (*FAILURES, Interrupted) as exc:
            raise undo.stopped(exc, "tasks") from None
    else:
        entries = _apply_tasks(c, report, entries, records, a.dry_run)
    for line, first in plan.duplicates:
        report.notices.append(f"line {line}: the same entry as line {first}: imported once")
    if a.disable_source:  # after the tasks: when it fails, they stay, and the message says so
        lines = [int(e.where.split()[1]) for e in entries] + [line for line, _ in plan.duplicates]
        report.notices.append(_disable_source(path, text, lines, a.dry_run))
    return _done(a, report)


def _disable_source(path: str, text: str, lines: list[int], dry_run: bool) -> str:
    """Comment the imported lines out, after a backup, by replacing the file whole (busybox
    crond reloads a crontab whose directory changed); relative to that directory, following
    no link: the directory must be one (not a link to one), the crontab a regular file, the
    backup and the new file are new files."""
    if not lines:
        return f"{path}: no line to comment out"
    if dry_run:
        return f"{path}: would comment out {len(lines)} imported lines (after a backup)"
    directory, name = os.path.split(os.path.abspath(path))
    try:
        parent = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UsageError(f"the tasks are imported, but {directory} is a symbolic link or not a directory:"
                             " --disable-source changes a crontab only in a real directory (name the path it"
                             " points to); nothing was commented out") from None
        raise UsageError(f"the tasks are imported, but {path} could not be changed: {exc.strerror or exc}") from None
    try:
        info, current = _regular(parent, name, path)
        if current != text.encode("utf-8", "surrogateescape"):
            raise UsageError(f"the tasks are imported, but {path} changed meanwhile: nothing was commented out;"
                             " run the import again to comment out what it imported")
        backup = _create(parent, f"{name}.qledge-{time.strftime('%Y%m%d%H%M%S')}.bak", current, info)
        rewritten = disable_lines(text, lines).encode("utf-8", "surrogateescape")
        tmp = _create(parent, f".{name}.qledge-{os.getpid()}", rewritten, info)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as exc:
        raise UsageError(f"the tasks are imported, but {path} could not be changed: {exc.strerror or exc}") from None
    finally:
        os.close(parent)
    return (f"{path}: {len(lines)} imported lines commented out (backup {os.path.join(directory, backup)});"
            " busybox crond re-reads its crontabs when their directory changes (on OpenWrt, /etc/init.d/cron"
            " restart applies it at once)")


def _regular(parent: int, name: str, path: str) -> tuple[os.stat_result, bytes]:
    """The bytes of `name`, a regular file with one link, in `parent`."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"the tasks are imported, but {path} is a symbolic link: --disable-source changes only"
                             " a regular file (name the file it points to)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise UsageError(f"the tasks are imported, but {path} is not a regular file with one name:"
                             " --disable-source leaves it as it is")
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return info, b"".join(chunks)
    finally:
        os.close(fd)


def _create(parent: int, name: str, data: bytes, like: os.stat_result) -> str:
    """A new file `name` (else `name.1`, …) in `parent` holding `data`, with the mode and owner of `like`."""
    for n in range(100):
        candidate = name if n == 0 else f"{name}.{n}"
        try:
            fd = os.open(candidate, _NEW_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            with contextlib.suppress(PermissionError):  # only root may give a file away
                os.fchown(fd, like.st_uid, like.st_gid)
            os.fchmod(fd, stat.S_IMODE(like.st_mode))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(candidate, dir_fd=parent)
            raise
        os.close(fd)
        return candidate
    raise UsageError(f"the tasks are imported, but no free name for {name} was found: remove old backups")


# -- qinglong -------------------------------------------------------------------------


class QlSource(msgspec.Struct):
    """A qinglong install as found on disk: its data directory (None: a bare database file)."""

    data_dir: str | None
    db_path: str
    label: str
    unpacked: bool = False  # from a backup, in a temporary directory


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


@contextlib.contextmanager
def qinglong_source(path: str) -> Iterator[QlSource]:
    """A data directory, its db/database.sqlite, or a data.tgz backup (unpacked to a
    private temporary directory: db, config and scripts only, no links, nothing outside)."""
    if os.path.isdir(path):
        for data in (path.rstrip(os.sep) or os.sep, os.path.join(path, "data")):
            db = os.path.join(data, "db", "database.sqlite")
            for part in (data, os.path.dirname(db), db):  # a link here could point anywhere: not followed
                if os.path.islink(part):
                    raise UsageError(f"{part} is a symbolic link: not followed; give the directory it points to")
            if os.path.isfile(db):
                yield QlSource(data_dir=os.path.abspath(data), db_path=db, label=path)
                return
        raise UsageError(f"{path} is not a qinglong data directory (it has no db/database.sqlite)")
    if not os.path.isfile(path):
        raise UsageError(f"{path} does not exist")
    if _is_sqlite(path):
        parent = os.path.dirname(os.path.abspath(path))
        beside = os.path.dirname(parent) if os.path.basename(parent) == "db" else None
        yield QlSource(data_dir=beside, db_path=path, label=path)
        return
    import tarfile

    if not tarfile.is_tarfile(path):
        raise UsageError(f"{path} is neither a qinglong data directory, its database.sqlite, nor a data.tgz backup")
    with tempfile.TemporaryDirectory(prefix="qledge-ql-") as tmp:
        yield _unpack(path, tmp)


def extract(tar: tarfile.TarFile, into: str, under: tuple[str, ...] = ("",)) -> None:
    """The regular files and directories of `tar` under `under` into `into`: no links, nothing outside."""
    import tarfile

    safe = [m for m in tar.getmembers() if m.name.startswith(under) and (m.isfile() or m.isdir())
            and not os.path.isabs(m.name) and ".." not in m.name.split("/")]
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, members=safe, filter="data")
    else:  # pragma: no cover - Pythons before the extraction filters
        tar.extractall(into, members=safe)  # noqa: S202 (members checked above)


def _unpack(path: str, into: str) -> QlSource:
    import tarfile

    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
            db = next((m.name for m in members if m.name.endswith("db/database.sqlite") and m.isfile()), None)
            if db is None:
                raise UsageError(f"{path}: no db/database.sqlite in this archive")
            root = db[: -len("db/database.sqlite")]
            wanted = tuple(root + part for part in ("db/", "config/", "scripts/"))
            extract(tar, into, wanted)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"cannot unpack {path}: {exc}") from None
    data = os.path.join(into, root)
    return QlSource(data_dir=data, db_path=os.path.join(data, "db", "database.sqlite"), label=path, unpacked=True)


def _rows(conn: object, table: str) -> list[dict[str, object]]:
    """Every row of a table as column → value: an older install's missing columns are
    simply absent (PRAGMA table_info says which there are); a missing table gives none."""
    import apsw

    assert isinstance(conn, apsw.Connection)
    columns = [r[1] for r in conn.execute(f"PRAGMA table_info(`{table}`)")]
    if not columns:
        return []
    sql = f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM `{table}` ORDER BY `id`" if "id" in columns else \
        f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM `{table}`"
    return [dict(zip(columns, row, strict=True)) for row in conn.execute(sql)]


class QlData(msgspec.Struct):
    crons: list[dict[str, object]]
    envs: list[dict[str, object]]
    auths: list[dict[str, object]]
    apps: list[dict[str, object]]
    subscriptions: list[dict[str, object]]


def read_qinglong_db(db_path: str) -> QlData:
    """The tables the import reads, from a private copy (qinglong may be writing it)."""
    import apsw

    with tempfile.TemporaryDirectory(prefix="qledge-qldb-") as tmp:
        copy = os.path.join(tmp, "database.sqlite")
        try:
            shutil.copyfile(db_path, copy)
            if os.path.exists(db_path + "-wal"):
                shutil.copyfile(db_path + "-wal", copy + "-wal")
            conn = apsw.Connection(copy)
            try:
                return QlData(crons=_rows(conn, "Crontabs"), envs=_rows(conn, "Envs"), auths=_rows(conn, "Auths"),
                              apps=_rows(conn, "Apps"), subscriptions=_rows(conn, "Subscriptions"))
            finally:
                conn.close()
        except (OSError, apsw.Error) as exc:
            raise UsageError(f"cannot read the qinglong database {db_path}: {exc}") from None


def json_obj(value: object) -> dict[str, object]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _secret_name(env: str) -> str:
    """The secret an env becomes: its own name when that is a valid secret name."""
    return env if env[0].isalnum() else "ql" + env


def _ql_notices(data: QlData, source: QlSource, held: list[str], config_keys: list[str], other_config: int,
                with_notifications: bool) -> list[str]:
    """What is there and is not imported (never silently): notification settings, app
    secrets, subscription credentials, the panel's login."""
    notices: list[str] = []
    if held:
        notices.append(f"notification keys in qinglong's environment, not imported: {', '.join(held)}"
                       " (--with-notifications imports them as secrets, for the scripts that read them)")
    if config_keys:
        verb = "imported as secrets" if with_notifications else "not imported (--with-notifications imports them)"
        notices.append(f"config.sh notification keys, {verb}: {', '.join(config_keys)}")
    if other_config:
        notices.append(f"config.sh: {other_config} other settings not imported (qinglong's own, such as"
                       " RandomDelay; set what your scripts need with qledge secret set)")
    for auth in data.auths:
        info = json_obj(auth.get("info"))
        if auth.get("type") == "notification" and info.get("type") and not with_notifications:
            fields = ", ".join(sorted(k for k in info if k != "type"))
            how = ("--with-notifications makes it a qledge channel" if NOTIFY is not None and NOTIFY.maps(info)
                   else "qledge has no channel for this service")
            notices.append(f"qinglong's own failure notification ({info['type']}: {fields}): not imported; {how}")
        elif auth.get("type") in ("authConfig", "authToken"):
            notices.append(f"qinglong's panel login ({auth.get('type')}): not imported")
    if data.apps:
        notices.append(f"{len(data.apps)} qinglong open-API apps (client ids and secrets): not imported")
    credentials = sum(1 for s in data.subscriptions if json_obj(s.get("pull_option")))
    if data.subscriptions:
        notices.append(f"{len(data.subscriptions)} subscriptions (repository pulls): not imported"
                       + (f"; {credentials} of them carry credentials" if credentials else ""))
    if source.data_dir and os.path.exists(os.path.join(source.data_dir, "config", "auth.json")):
        notices.append("config/auth.json (qinglong's panel login): not imported")
    return notices


def _ql_zone(data: QlData, report: Report) -> str | None:
    """qinglong's own zone setting, when it has one this machine knows (else the daemon's)."""
    for auth in data.auths:
        if auth.get("type") == "systemConfig":
            zone = json_obj(auth.get("info")).get("timezone")
            if isinstance(zone, str) and zone:
                try:
                    load_zone(zone)
                except ScheduleError as exc:
                    report.notices.append(f"qinglong's time zone is not used: {exc}; triggers get the daemon's")
                    return None
                return zone
    return None


def _config_exports(source: QlSource) -> list[tuple[int, str, str]]:
    if source.data_dir is None:
        return []
    path = os.path.join(source.data_dir, "config", "config.sh")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_shell_exports(f.read())
    except OSError:
        return []


def _plan_secrets(data: QlData, source: QlSource, with_notifications: bool) -> tuple[dict[str, str], list[str],
                                                                                   list[str], int]:
    """(env name → value to store, notification envs held back, config.sh notification
    keys, how many other config.sh settings)."""
    envs = join_envs(ql_env(row) for row in data.envs)
    exports = _config_exports(source)
    config_keys = sorted({name for _, name, _ in exports if is_notification_key(name)})
    other = len({name for _, name, _ in exports if not is_notification_key(name)})
    held = sorted(name for name in envs if is_notification_key(name)) if not with_notifications else []
    wanted = {name: value for name, value in envs.items() if name not in held}
    if with_notifications:  # qinglong sources config.sh first: its Envs win
        for _, name, value in exports:
            if is_notification_key(name):
                wanted.setdefault(name, value)
    return wanted, held, config_keys, other


def _store_secrets(c: Client, report: Report, wanted: dict[str, str], records: dict[str, ImportRecord],
                   dry_run: bool, undo: Undo | None = None) -> dict[str, str]:
    """Store the envs as secrets (the ones created go to `undo`); returns env name → secret
    name for those in qledge now."""
    usable: dict[str, str] = {}
    for env, value in sorted(wanted.items()):
        if not _ENV_NAME.match(env):
            report.not_imported.append(Problem(f"env {env}", env, "not an environment variable name", "bad env name"))
            continue
        name = _secret_name(env)
        key = import_key("qinglong-env", env)
        if len(value) > 16384 or "\x00" in value:
            report.not_imported.append(Problem(f"env {env}", env, "the value is longer than 16384 characters"
                                               " or holds a NUL byte", "value too long"))
            continue
        if key in records:
            status = "exists"
        elif dry_run:
            status = "create"
        else:
            try:
                status = c.typed("qledge.import.secret", secret_tools.ImportArgs(key=key, name=name, value=value),
                                 secret_tools.Imported).status
            except CallFailed as exc:
                if exc.code == "permission_denied":
                    raise CallFailed(exc.code, exc.message + " (qinglong's environment becomes secrets: import as an"
                                     " owner)") from None
                raise
            if status == "created" and undo is not None:
                undo.add(f"secret {name}", functools.partial(c.call, "qledge.secret.delete", {"name": name}))
                undo.check()
        report.secrets.append(PlannedSecret(name=name, env=env, status=status))
        if status != "taken":
            usable[env] = name
    return usable


class NotifyImports(Protocol):
    """What a build with notifications adds to imports (edge.cli.notify_import)."""

    def ql_channels(self, c: Client, report: Report, data: QlData, wanted: dict[str, str], usable: dict[str, str],
                    records: dict[str, ImportRecord], dry_run: bool) -> None: ...

    def maps(self, info: Mapping[str, object]) -> bool: ...

    def export(self, c: Client, with_secrets: bool) -> tuple[backup_tools.ExportedNotify | None, list[str]]: ...

    def check(self, c: Client, doc: backup_tools.Document, replace: bool) -> list[str]: ...

    def apply(self, c: Client, doc: backup_tools.Document, replace: bool, dry_run: bool, undo: Undo) -> list[str]:
        ...


FAILURES = (CallFailed, UsageError, BadReply, Unreachable, OSError)  # what a part of an import can end with
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what an import takes back its writes for


class Interrupted(BaseException):
    """A stop signal during an import (a BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(signum, message)
        self.signum = signum
        self.message = message


class _Signals:
    """The stop signals while an import runs. Before its first write one stops it at once;
    after, at the next point where every write so far is on record in its Undo (a call in
    flight completes first, so the undo knows what it wrote)."""

    def __init__(self) -> None:
        self.writing = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        if self.pending is None:
            self.pending = signum
        if not self.writing:
            raise Interrupted(signum)


_signals: _Signals | None = None  # the running import's, while one runs in this process


def interruptible(verb: Callable[[Client, argparse.Namespace], int]) -> Callable[[Client, argparse.Namespace], int]:
    """Run an import with SIGTERM, SIGINT and SIGHUP turned into Interrupted (its undo runs),
    then exit as for the signal (128 + its number) with one line."""
    @functools.wraps(verb)
    def run(c: Client, a: argparse.Namespace) -> int:
        global _signals
        import threading

        if threading.current_thread() is not threading.main_thread():
            return verb(c, a)
        _signals = _Signals()
        # One ignored already (nohup's SIGHUP) stays ignored.
        before = {n: signal.signal(n, _signals.handler) for n in STOPS if signal.getsignal(n) != signal.SIG_IGN}
        try:
            return verb(c, a)
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            shared.report("cancelled", exc.message or f"stopped by {name} before anything was written", a.json)
            return 128 + exc.signum
        finally:
            for n, handler in before.items():
                signal.signal(n, handler)
            _signals = None

    return run


class Undo:
    """What an import wrote, to take back (newest first) when a later part fails, and what it
    cannot take back."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], object]]] = []
        self.stays: list[str] = []

    def start(self) -> None:
        """The first write comes next: from here a stop signal waits for the next check()."""
        if _signals is not None:
            _signals.writing = True
        self.check()

    def add(self, what: str, step: Callable[[], object]) -> None:
        self._steps.append((what, step))

    def check(self) -> None:
        """Where every write so far is on record: a stop signal received meanwhile stops here."""
        if _signals is not None and _signals.pending is not None:
            raise Interrupted(_signals.pending)

    def stopped(self, exc: BaseException, stage: str) -> BaseException:
        """What the import raises after a failure or a stop in `stage`: everything undone, one line."""
        if isinstance(exc, Interrupted):
            name = signal.Signals(exc.signum).name
            return Interrupted(exc.signum, f"stopped by {name} (importing the {stage}); {self.run()}")
        code = (exc.code if isinstance(exc, CallFailed) else "unavailable" if isinstance(exc, Unreachable)
                else "invalid_argument" if isinstance(exc, UsageError) else "internal")
        message = exc.message if isinstance(exc, CallFailed) else " ".join(str(exc).split())
        return CallFailed(code, f"{message} (importing the {stage}); the import stopped there, {self.run()}")

    def run(self) -> str:
        """Every step, each failure kept apart: one clause saying what was undone and what was not."""
        done: list[str] = []
        failed: list[str] = []
        for what, step in reversed(self._steps):
            try:
                step()
                done.append(what)
            except FAILURES as exc:
                if not (isinstance(exc, CallFailed) and exc.code == "not_found"):  # else never written
                    failed.append(f"{what} ({' '.join(str(exc).split())})")
        self._steps.clear()
        line = f"undone: {_named(done[::-1])}" if done else "nothing had been written"
        if failed:
            line += f"; could not undo: {_named(failed[::-1])}"
        if self.stays:
            line += f"; left as imported: {_named(self.stays)}"
        return line


NOTIFY: NotifyImports | None = None  # edge.cli.notify_import, set by edge.cli.main when the build ships it


QL_USER = "root"  # qinglong runs every script as root
SCRIPTS_BESIDE = "-scripts"  # <state dir>-scripts/qinglong: beside the state directory, never in it


def _inside(path: str, directory: str) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(directory)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _scripts_dir(c: Client, wanted: str | None) -> tuple[str, str]:
    """Where the scripts go, and the first directory of it qledge manages: `--scripts-dir`,
    else `<state dir>-scripts/qinglong` (beside the state directory, which task users cannot
    read, never in it)."""
    state = state_dir(c)
    if wanted is None:
        if state is None:
            raise UsageError("this daemon is a cluster node (its state is in PostgreSQL): say where the scripts go"
                             " with --scripts-dir DIR, the same directory on every node")
        top = state.rstrip(os.sep) + SCRIPTS_BESIDE
        return os.path.join(top, "qinglong"), top
    dest = os.path.abspath(wanted)
    if state is not None and _inside(dest, state):
        raise UsageError(f"--scripts-dir {wanted} is inside the daemon's state directory {state}, which task users"
                         " cannot read and where no run starts: choose a directory outside it")
    return dest, dest


# -- copying the scripts, never through a link ------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAMED = 12  # entries a report names; the count covers the rest
_CHUNK = 1 << 16


class Copied(msgspec.Struct):
    files: int = 0
    size: int = 0
    kept: list[str] = []  # the importer's own files that differ from the source: kept (they may have been edited)
    skipped: list[str] = []  # in the source: links, FIFOs, devices, files with several hard links
    replaced: list[str] = []  # in the destination: links or special files where a copy belongs
    untrusted: list[str] = []  # in the destination: files another user could change, replaced by the source's
    foreign: list[str] = []  # in the destination, not from the source: what another user could change, removed
    private: list[str] = []  # readable only by their owner in the source: so in the copy (the importer's)


def _named(paths: list[str]) -> str:
    return ", ".join(paths[:_NAMED]) + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def _open(parent: int, name: str, flags: int = _DIR_FLAGS) -> int | None:
    """`name` in `parent`, never through a link; None when missing or a link."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _entry(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _one_file(parent: int, name: str) -> int | None:
    """`name` for reading when it is a regular file with one link."""
    fd = _open(parent, name, _READ_FLAGS)
    if fd is not None and not (stat.S_ISREG((st := os.fstat(fd)).st_mode) and st.st_nlink == 1):
        os.close(fd)
        return None
    return fd


class _Tree:
    """A walk of a scripts tree by directory descriptors, following no link: in the source,
    links, FIFOs, devices and files with several hard links are skipped; in the destination,
    a link or special file in a copy's place is removed (the entry), a file another user
    owns or may write is replaced by the source's copy (whatever it holds is not to be
    trusted: an earlier version left the copy to the task user), only the importer's own
    files may be kept as changed, and the directories become the importer's, writable by no
    one else."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.done = Copied()
        self._me = (os.geteuid(), os.getegid())
        self.root = ""  # the destination: the walk's paths are relative to it
        self.made: list[str] = []  # what the copy created (directories and files), in order, by path

    def walk(self, src: int, dst: int | None, rel: str) -> None:
        names = sorted(os.listdir(src))
        for name in names:
            path, st = rel + name, _entry(src, name)
            if st is not None and stat.S_ISDIR(st.st_mode) and (sub := _open(src, name)) is not None:
                into = self.directory(dst, name, path) if dst is not None else None
                try:
                    self.walk(sub, into, path + "/")
                finally:
                    os.close(sub)
                    if into is not None:
                        os.close(into)
            elif st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                self._file(src, dst, name, path, st)
            elif st is not None:
                self.done.skipped.append(path)
        if dst is not None:
            self._foreign(dst, set(names), rel)

    def _foreign(self, dst: int, ours: set[str], rel: str) -> None:
        """Entries here that are not from the source and another user could change: removed
        (by descriptor, never followed), since a script of the copy may load them (a
        `node_modules/` or `requests.py` beside it); the importer's own directories are
        searched the same way."""
        for name in sorted(set(os.listdir(dst)) - ours):
            st = _entry(dst, name)
            if st is None:
                continue
            if not self._trusted(st):
                self.done.foreign.append(rel + name)
                if not self.dry_run:
                    self._remove(dst, name)
            elif stat.S_ISDIR(st.st_mode) and (sub := _open(dst, name)) is not None:
                try:
                    self._foreign(sub, set(), rel + name + "/")
                finally:
                    os.close(sub)

    def _remove(self, parent: int, name: str) -> None:
        """`name` in `parent` and all below it, by descriptor: a directory is made the
        importer's and closed to others first, so nothing is added to it meanwhile."""
        st = _entry(parent, name)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode) and (fd := _open(parent, name)) is not None:
            try:
                os.fchown(fd, *self._me)
                os.fchmod(fd, 0o700)
                for sub in os.listdir(fd):
                    self._remove(fd, sub)
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)

    def _trusted(self, st: os.stat_result) -> bool:
        return st.st_uid == self._me[0] and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)

    def own(self, fd: int, path: str, mode: int) -> None:
        st = os.fstat(fd)
        if self.dry_run or ((st.st_uid, st.st_gid) == self._me and stat.S_IMODE(st.st_mode) == mode):
            return
        try:
            os.fchown(fd, *self._me)
            os.fchmod(fd, mode)
        except PermissionError:
            raise UsageError(f"cannot take over {path} in the scripts directory (uid {st.st_uid}'s): import as"
                             " root, or remove it") from None

    def directory(self, parent: int, name: str, path: str) -> int | None:
        fd = _open(parent, name)
        if fd is None:
            if _entry(parent, name) is not None:
                self.done.replaced.append(path)
                if not self.dry_run:
                    os.unlink(name, dir_fd=parent)
            if self.dry_run:
                return None
            os.mkdir(name, 0o755, dir_fd=parent)
            self.made.append(os.path.join(self.root, path))
            if (fd := _open(parent, name)) is None:
                raise UsageError(f"{path} changed while the scripts were copied: import again")
        self.own(fd, path, 0o755)
        return fd

    def _file(self, src: int, dst: int | None, name: str, path: str, st: os.stat_result) -> None:
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        if not st.st_mode & stat.S_IROTH:  # the source's owner alone reads it: so does the copy's
            mode &= 0o700
            self.done.private.append(path)
        there = _entry(dst, name) if dst is not None else None
        if dst is not None and there is not None and stat.S_ISDIR(there.st_mode):
            # A directory is never an edit: the source's file takes its place.
            self.done.replaced.append(path + "/")
            if not self.dry_run:
                self._remove(dst, name)
            there = None
        elif dst is not None and there is not None:
            regular = stat.S_ISREG(there.st_mode) and there.st_nlink == 1
            theirs = _one_file(dst, name) if regular and self._trusted(there) else None
            if theirs is not None:
                try:
                    if self._trusted(os.fstat(theirs)):
                        if not self._same(src, name, theirs):
                            self.done.kept.append(path)
                        self.own(theirs, path, mode)
                        return
                finally:
                    os.close(theirs)
            # Replaced: what another user could write there is theirs to choose.
            (self.done.untrusted if regular else self.done.replaced).append(path)
        self.done.files += 1
        self.done.size += st.st_size
        if self.dry_run or dst is None:
            return
        fd = _one_file(src, name)
        if fd is None or (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
            self.done.skipped.append(path)  # replaced in the source meanwhile
            return
        tmp = f".qledge-{os.getpid()}-{name}"[:255]
        try:
            out = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=dst)
            try:
                while chunk := os.read(fd, _CHUNK):
                    os.write(out, chunk)
                os.fchmod(out, mode)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=dst, dst_dir_fd=dst)  # replaces a link itself, never follows it
            if there is None:
                self.made.append(os.path.join(self.root, path))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dst)
            raise
        finally:
            os.close(fd)

    def _same(self, src: int, name: str, theirs: int) -> bool:
        ours = _one_file(src, name)
        if ours is None:
            return True
        try:
            while (a := os.read(ours, _CHUNK)) == os.read(theirs, _CHUNK):
                if not a:
                    return True
            return False
        finally:
            os.close(ours)


def _changeable(st: os.stat_result) -> bool:
    """Whether a directory above the scripts lets another user replace what is in it."""
    return st.st_uid not in (0, os.geteuid()) or bool(st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)


def _scripts_root(dest: str, top: str, tree: _Tree) -> int | None:
    """The destination, reached from / without a link: every directory above `top` exists
    as a directory no other user may change (a sticky one only when root's or the
    importer's), `top` and what lies below it are the importer's and writable by no one else
    or made here; None (dry only) when it is not there yet."""
    parts = [p for p in dest.split(os.sep) if p]
    top_at = len([p for p in top.split(os.sep) if p])
    fd = os.open(os.sep, _DIR_FLAGS)
    path = os.sep
    try:
        for n, name in enumerate(parts, start=1):
            st = os.fstat(fd)
            if _changeable(st):
                raise UsageError(f"{path} can be changed by other users (uid {st.st_uid}, mode"
                                 f" {stat.S_IMODE(st.st_mode):04o}): not a place for scripts; choose another"
                                 " --scripts-dir")
            path = os.path.join(path, name)
            sub = _open(fd, name)
            if sub is None and _entry(fd, name) is not None:
                raise UsageError(f"{path} is a symbolic link or not a directory: give the path without links,"
                                 " or choose another --scripts-dir")
            if sub is not None and n >= top_at:
                there = os.fstat(sub)
                if there.st_uid != os.geteuid() or there.st_mode & 0o022:
                    os.close(sub)
                    raise UsageError(f"{path} is not a new directory nor the importer's own (uid {there.st_uid},"
                                     f" mode {stat.S_IMODE(there.st_mode):04o}): what is in it is another user's"
                                     " to choose; give a new directory or one of your own as --scripts-dir")
            if sub is None:
                sub = tree.directory(fd, name, path)
            os.close(fd)
            if sub is None:
                return None
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def _source_root(source_dir: str) -> int:
    """The source's scripts directory, neither it nor the directory holding it reached
    through a link (a link there is refused: it could point at any of root's files)."""
    try:
        parent = os.open(os.path.dirname(source_dir) or ".", _DIR_FLAGS)
        try:
            src = _open(parent, os.path.basename(source_dir))
            if src is None:
                raise UsageError(f"{source_dir} is a symbolic link or not a directory: not followed; give the"
                                 " directory itself")
            return src
        finally:
            os.close(parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{os.path.dirname(source_dir)} is a symbolic link: not followed; give the directory"
                             " it points to") from None
        raise UsageError(f"cannot read the scripts in {source_dir}: {exc.strerror or exc}") from None


def _copy_scripts(source_dir: str, dest: str, top: str, dry_run: bool, undo: Undo | None = None) -> str:
    """Copy the files not there yet (one of the importer's that differs is kept: it may have
    been edited); the copy is the importer's, read-only to tasks (_Tree). What it creates can
    be taken back through `undo` (what it replaced cannot)."""
    src = _source_root(source_dir)
    try:
        plan = _Tree(dry_run=True)
        root = _scripts_root(dest, top, plan)
        try:
            plan.walk(src, root, "")
        finally:
            if root is not None:
                os.close(root)
        anchor = dest
        while not os.path.isdir(anchor):
            anchor = os.path.dirname(anchor)
        free = shutil.disk_usage(anchor).free  # checked by a dry run too: an import's dry pass finds it
        if plan.done.size + DISK_RESERVE > free:
            raise CallFailed("resource_exhausted", f"scripts need {plan.done.size} bytes in {dest}, {free} are free"
                             f" (and {DISK_RESERVE} stay reserved); free some space or use --scripts-in-place")
        if dry_run:
            return _copy_line(plan.done, dest, dry_run)
        tree = _Tree(dry_run=False)
        tree.root = dest
        if undo is not None:
            undo.add(f"the scripts copied to {dest}", lambda: _remove_made(tree.made))
        try:
            root = _scripts_root(dest, top, tree)
            assert root is not None
            try:
                tree.walk(src, root, "")
            finally:
                os.close(root)
        finally:
            if undo is not None:
                undo.stays += [f"{os.path.join(dest, p)} (now the source's copy)"
                               for p in tree.done.replaced + tree.done.untrusted]
    except OSError as exc:
        raise UsageError(f"cannot copy the scripts to {dest}: {exc.strerror or exc}") from None
    finally:
        os.close(src)
    return _copy_line(tree.done, dest, dry_run)


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _make_place(dest: str, top: str, undo: Undo) -> None:
    """The scripts directory of an import that brings no scripts, made now (the importer's,
    writable by no one else): the tasks name it, and a directory they name but nobody made
    is one any local user could make first and fill with code they would run."""
    tree = _Tree(dry_run=False)
    tree.root = dest
    undo.add(f"the scripts directory {dest}", lambda: _remove_made(tree.made))
    _close(_scripts_root(dest, top, tree))


def _remove_made(made: list[str]) -> None:
    """What a copy created, newest first: its files, then its directories (each left when
    something not of the copy is in it)."""
    for path in reversed(made):
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise


def _copy_line(done: Copied, dest: str, dry_run: bool) -> str:
    what = f"{done.files} files ({done.size} bytes)"
    line = f"scripts: would copy {what} to {dest}" if dry_run else f"scripts: {what} copied to {dest}"
    if done.kept:
        line += f"; changed here by the importer, kept as they are: {_named(done.kept)}"
    if done.untrusted:
        line += (f"; {'would replace' if dry_run else 'replaced'} with the source's copy, because another user"
                 f" could change them: {_named(done.untrusted)}")
    if done.foreign:
        line += (f"; {'would remove' if dry_run else 'removed'}, not from the source and another user could change"
                 f" them (a script of the copy may load them): {_named(done.foreign)}")
    if done.private:
        line += (f"; readable only by the importer, as only their owner could read them in the source (a task"
                 f" running as another user cannot read them): {_named(done.private)}")
    if done.skipped:
        line += f"; not copied (links, FIFOs, devices, files with several hard links): {_named(done.skipped)}"
    if done.replaced:
        line += (f"; {'would replace' if dry_run else 'replaced'} (a link or special file in the copy's place):"
                 f" {_named(done.replaced)}")
    return line


def _interpreters(entries: list[Entry]) -> list[str]:
    needed = set()
    for entry in entries:
        command = entry.task.spec.command
        if isinstance(command, ArgvCommand) and "/" not in command.file:
            needed.add(command.file)
        elif isinstance(command, ShellCommand):
            needed.update(w for w in ("node", "python3", "bash") if command.command.startswith(w + " ")
                          or f"\n{w} " in command.command)
    missing = sorted(n for n in needed if shutil.which(n) is None)
    return [f"{n} is not on PATH here: install it before the tasks that use it run" for n in missing]


def _ql_entries(data: QlData, place: QlPlace, usable: dict[str, str]) -> list[Entry | Problem]:
    if len(usable) > 128:
        raise UsageError(f"qinglong's environment has {len(usable)} variables; a task takes at most 128")
    return [ql_entry(ql_cron(row), place, usable) for row in data.crons]


def import_qinglong(c: Client, a: argparse.Namespace) -> int:
    with qinglong_source(a.path) as source:
        if a.scripts_in_place and (source.data_dir is None or source.unpacked):
            raise UsageError("--scripts-in-place needs a qinglong data directory (not a backup or a bare database)")
        data = read_qinglong_db(source.db_path)
        report = Report(source=source.label, dry_run=a.dry_run)
        scripts_src = os.path.join(source.data_dir, "scripts") if source.data_dir else None
        user = a.user or QL_USER
        _account(user)
        if a.scripts_in_place and scripts_src:
            if a.scripts_dir is not None:
                raise UsageError("--scripts-dir and --scripts-in-place exclude each other")
            scripts_dir = top = scripts_src
        else:
            scripts_dir, top = _scripts_dir(c, a.scripts_dir)
        place = QlPlace(scripts_dir=scripts_dir, data_dir=source.data_dir or scripts_dir, zone=_ql_zone(data, report),
                        user=user, copied=not a.scripts_in_place)
        wanted, held, config_keys, other = _plan_secrets(data, source, a.with_notifications)
        records = _records(c)
        who = (f"the tasks run as {user}, " + ("as --user says" if a.user else "as every script did under qinglong"))
        copy = scripts_src is not None and os.path.isdir(scripts_src) and not a.scripts_in_place
        # Everything is checked before anything is written: every entry, as its import would
        # be (with the secrets it will reference), and where the scripts go.
        planned = _ql_entries(data, place, _store_secrets(c, Report(source="", dry_run=True), wanted, records, True))
        _check_tasks(c, Report(source="", dry_run=True), [e for e in planned if isinstance(e, Entry)], records, who)
        if copy and not a.dry_run:
            assert scripts_src is not None
            _copy_scripts(scripts_src, scripts_dir, top, dry_run=True)
        elif not copy and not a.scripts_in_place:
            _close(_scripts_root(scripts_dir, top, _Tree(dry_run=True)))  # where they will go, checked
        entries, usable = _write_qinglong(c, a, report, (wanted, records, who), place,
                                  None if a.scripts_in_place else (scripts_src if copy else None, top), data)
        if not copy and not a.scripts_in_place:
            report.notices.append("no scripts directory beside this database: the tasks expect their scripts in"
                                  f" {scripts_dir}, " + ("which would be made empty" if a.dry_run else
                                                         "made empty (the importer's): copy them there"))
        if a.with_notifications and NOTIFY is not None:
            NOTIFY.ql_channels(c, report, data, wanted, usable, records, a.dry_run)
        elif a.with_notifications:
            report.notices.append("qinglong's notification settings are imported as secrets only: this qledge has"
                                  " no notification channels to take them over (a build without edge/notify)")
        report.notices += _ql_notices(data, source, held, config_keys, other, a.with_notifications)
        report.notices += _interpreters(entries)
    return _done(a, report)


def _write_qinglong(c: Client, a: argparse.Namespace, report: Report,
                    plan: tuple[dict[str, str], dict[str, ImportRecord], str], place: QlPlace,
                    copy: tuple[str | None, str] | None, data: QlData) -> tuple[list[Entry], dict[str, str]]:
    """The secrets, the scripts, then the tasks (the order they depend on each other); on a
    failure or a stop signal, what this import wrote is taken back (Undo) and one line says
    where it stopped and what was undone. The entries imported, and env name → secret name."""
    wanted, records, who = plan
    undo = Undo()
    stage = "secrets"
    try:
        if not a.dry_run:
            undo.start()
        usable = _store_secrets(c, report, wanted, records, a.dry_run, undo)
        entries: list[Entry] = []
        for entry in _ql_entries(data, place, usable):
            if isinstance(entry, Entry):
                entries.append(entry)
            else:
                report.not_imported.append(entry)
        if copy is not None:
            stage = "scripts"
            if copy[0] is not None:
                report.notices.append(_copy_scripts(copy[0], place.scripts_dir, copy[1], a.dry_run,
                                                    None if a.dry_run else undo))
            elif not a.dry_run:
                _make_place(place.scripts_dir, copy[1], undo)
            undo.check()
        stage = "tasks"
        entries = _check_tasks(c, report, entries, records, who)
        entries = _apply_tasks(c, report, entries, records, a.dry_run, None if a.dry_run else undo)
    except (*FAILURES, Interrupted) as exc:
        if a.dry_run:
            raise
        raise undo.stopped(exc, stage) from None
    return entries, usable


# -- argparse -------------------------------------------------------------------------


def _crontab_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", metavar="FILE|-", help=f"the crontab (default {DEFAULT_CRONTAB}; - for stdin)")
    p.add_argument("--disable-source", action="store_true",
                   help="comment the imported lines out of the crontab (after a backup), so nothing runs twice")
    p.add_argument("--timeout", type=float, metavar="S", help="kill a run after S seconds (default 3600)")
    p.add_argument("--user", metavar="USER",
                   help="run the entries as USER (default: the crontab's user, its file name, e.g. root)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")


def _qinglong_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="qinglong's data directory, its db/database.sqlite, or a data.tgz")
    p.add_argument("--user", metavar="USER", help=f"run the tasks as USER (default {QL_USER}, as qinglong does)")
    p.add_argument("--scripts-dir", metavar="DIR",
                   help=f"copy the scripts to DIR (default <state dir>{SCRIPTS_BESIDE}/qinglong, beside the"
                        " state directory)")
    p.add_argument("--scripts-in-place", action="store_true",
                   help="run the scripts where they are instead of copying them")
    p.add_argument("--with-notifications", action="store_true",
                   help="also import notification keys (BARK_PUSH, TG_BOT_TOKEN, …) as secrets")
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")


# -- moving a device: the copied scripts and the notifications travel with an export ---------

SCRIPTS_ARCHIVE_MAX = 64 << 20  # what an export carries of the scripts, at most
SCRIPTS_FILES_MAX = 20_000


def export_scripts(c: Client, file: str) -> tuple[backup_tools.ExportedScripts | None, list[str]]:
    """`<state dir>-scripts` (ours) as a gzipped tar beside `file`, mode 0600: regular files, bounded."""
    import hashlib
    import io
    import tarfile

    state = state_dir(c)
    root = state.rstrip(os.sep) + SCRIPTS_BESIDE if state else None
    if root is None or not os.path.isdir(root):
        return None, [] if state else ["scripts: not exported (a cluster node keeps them where --scripts-dir said)"]
    skipped: list[str] = []
    count = size = 0

    def regular(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal count, size
        if info.isdir():
            return info
        if not info.isfile():
            skipped.append(info.name)
            return None
        count, size = count + 1, size + info.size
        if size > SCRIPTS_ARCHIVE_MAX or count > SCRIPTS_FILES_MAX:
            raise UsageError(f"the scripts in {root} are more than {SCRIPTS_ARCHIVE_MAX >> 20} MiB or"
                             f" {SCRIPTS_FILES_MAX} files: move some away, or copy them to the new device yourself")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name, filter=regular)
    name = os.path.basename(file) + ".scripts.tar.gz"
    write_private(os.path.join(os.path.dirname(os.path.abspath(file)), name), buffer.getvalue())
    notes = [f"scripts: not exported (links, FIFOs, devices): {_named(skipped)}"] if skipped else []
    return backup_tools.ExportedScripts(root=root, archive=name, files=count, bytes=size,
                                        sha256=hashlib.sha256(buffer.getvalue()).hexdigest()), notes


def _unpack_scripts(scripts: backup_tools.ExportedScripts, file: str, into: str) -> str:
    import hashlib
    import io
    import tarfile

    path = os.path.join(os.path.dirname(os.path.abspath(file)), scripts.archive)
    try:
        with open(path, "rb") as f:
            data = f.read(SCRIPTS_ARCHIVE_MAX + 1)
        if hashlib.sha256(data).hexdigest() != scripts.sha256:
            raise UsageError(f"{path} is not the scripts archive {file} was exported with (its digest differs)")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            extract(tar, into)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"{file} carries its scripts in {scripts.archive}, which cannot be read beside it: {exc}"
                         " (copy it along)") from None
    return into


def _rehomed(task: backup_tools.ExportedTask, old: str, new: str) -> backup_tools.ExportedTask:
    """The task with its paths under `old` moved to `new` (a spec not matching its digest stays)."""
    from edge.core.tasks import content_digest

    if old == new or content_digest(task.spec) != task.content_digest:
        return task
    spec, command = task.spec, task.spec.command

    def moved(text: str) -> str:
        return text.replace(old.rstrip("/") + "/", new.rstrip("/") + "/")

    if isinstance(command, ArgvCommand):
        command = ArgvCommand(file=moved(command.file), args=[moved(a) for a in command.args])
    elif isinstance(command, ShellCommand):
        command = ShellCommand(command=moved(command.command), shell=command.shell)
    spec = msgspec.structs.replace(spec, command=command, working_dir=spec.working_dir and moved(spec.working_dir))
    return msgspec.structs.replace(task, spec=spec, content_digest=content_digest(spec))


class Move(msgspec.Struct):
    """An import's scripts (unpacked), its tasks with their scripts' paths moved here, what stops it."""

    tasks: list[backup_tools.ExportedTask]
    scripts_from: str | None = None  # the unpacked scripts (a private temporary directory)
    scripts_to: str | None = None
    refused: list[str] = []


def prepare_move(c: Client, doc: backup_tools.Document, file: str, into: str, replace: bool) -> Move:
    move = Move(tasks=list(doc.tasks))
    if doc.scripts is not None:
        state = state_dir(c)
        if state is None:
            raise UsageError("this daemon is a cluster node, without a state directory for the scripts: copy them"
                             " yourself")
        move.scripts_from, move.scripts_to = _unpack_scripts(doc.scripts, file, into), state + SCRIPTS_BESIDE
        _copy_scripts(move.scripts_from, move.scripts_to, move.scripts_to, dry_run=True)  # a place for them here
        move.tasks = [_rehomed(t, doc.scripts.root, move.scripts_to) for t in doc.tasks]
    if doc.notify is not None and NOTIFY is not None:
        move.refused += NOTIFY.check(c, doc, replace)
    return move


def import_scripts(move: Move, dry_run: bool, undo: Undo) -> list[str]:
    if move.scripts_from is None or move.scripts_to is None:
        return []
    return [_copy_scripts(move.scripts_from, move.scripts_to, move.scripts_to, dry_run, undo)]


def export_notify(c: Client, with_secrets: bool) -> tuple[backup_tools.ExportedNotify | None, list[str]]:
    return NOTIFY.export(c, with_secrets) if NOTIFY is not None else (None, [])


def import_notify(c: Client, doc: backup_tools.Document, replace: bool, dry_run: bool, undo: Undo) -> list[str]:
    if doc.notify is None:
        return []
    if NOTIFY is None:
        return ["notification channels and rules: not imported (this qledge has no notifications)"]
    return NOTIFY.apply(c, doc, replace, dry_run, undo)


# -- the export file: qledge export FILE, qledge import FILE ------------------------------------

MAX_EXPORT_FILE = 64 << 20  # far beyond any router's tasks; a bound on what import reads
_RESTORE_BYTES = 128 << 10  # each import call stays well inside the 256 KiB frame cap


class Exported(msgspec.Struct, rename="camel"):
    file: str
    tasks: int
    triggers: int
    secrets: int | None = None
    channels: int = 0
    scripts: int = 0
    scripts_archive: str | None = None
    not_exported: list[str] = []


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


def write_private(path: str, data: bytes) -> None:
    """Replace `path` with a new 0600 file holding `data`, all or nothing."""
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
    import edge

    tasks, triggers = _export_pages(c)
    secrets = all_pages(lambda after: _secret_page(c, after)) if a.with_secrets else None
    notify, not_exported = export_notify(c, a.with_secrets)
    scripts, more = export_scripts(c, a.file)
    doc = backup_tools.Document(
        format=backup_tools.FORMAT, version=backup_tools.FORMAT_VERSION, qledge_version=edge.__version__,
        exported_at_ms=int(time.time() * 1000), tasks=tasks, triggers=triggers, secrets=secrets, notify=notify,
        scripts=scripts, not_exported=not_exported + more,
    )
    write_private(a.file, msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    done = Exported(file=a.file, tasks=len(tasks), triggers=len(triggers),
                    secrets=None if secrets is None else len(secrets),
                    channels=len(notify.channels) if notify else 0, scripts=scripts.files if scripts else 0,
                    scripts_archive=scripts.archive if scripts else None, not_exported=doc.not_exported)

    def human(e: Exported) -> None:
        what = f"{e.tasks} tasks, {e.triggers} triggers" + ("" if e.secrets is None else f", {e.secrets} secrets")
        what += f", {e.channels} notification channels" if e.channels else ""
        print(f"exported {what} to {e.file} (mode 0600)")
        if e.scripts_archive:
            print(f"exported {e.scripts} scripts to {e.scripts_archive} beside it (mode 0600): keep the two together")
        for note in e.not_exported:
            print(f"note: {note}")

    return show(a, done, human)


_document = msgspec.json.Decoder(backup_tools.Document)


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
    """Consecutive runs of at most BATCH items and about _RESTORE_BYTES each."""
    out: list[list[T]] = []
    size = 0
    for item in items:
        n = len(msgspec.msgpack.encode(item))
        if not out or len(out[-1]) >= backup_tools.BATCH or size + n > _RESTORE_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def _restore_calls(doc: backup_tools.Document, replace: bool, dry: bool) -> list[tuple[str, msgspec.Struct]]:
    """Tasks and triggers as the parts of one session (checked together and written in one
    transaction by its last part), then secrets."""
    parts: list[tuple[list[backup_tools.ExportedTask], list[backup_tools.ExportedTrigger]]] = [
        (b, []) for b in batches(doc.tasks)] + [([], b) for b in batches(doc.triggers)]
    session = os.urandom(12).hex()
    calls: list[tuple[str, msgspec.Struct]] = [
        ("qledge.import", backup_tools.ImportArgs(tasks=tasks, triggers=triggers, replace=replace, dry_run=dry,
                                                  session=backup_tools.ImportSession(id=session, part=n,
                                                                                     last=n == len(parts) - 1)))
        for n, (tasks, triggers) in enumerate(parts)]
    calls += [("qledge.secret.import", backup_tools.SecretImportArgs(secrets=b, replace=replace, dry_run=dry))
              for b in batches(doc.secrets or [])]
    return calls


def import_state(c: Client, a: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="qledge-move-") as tmp:
        return _import_state(c, a, read_document(a.file), tmp)


def _import_state(c: Client, a: argparse.Namespace, doc: backup_tools.Document, tmp: str) -> int:
    move = prepare_move(c, doc, a.file, tmp, a.replace)  # the scripts unpacked, their tasks' paths moved here
    doc = msgspec.structs.replace(doc, tasks=move.tasks)
    # A dry pass over everything first: every entry that would be refused (a permission, a
    # user, a secret, a schedule, a changed spec, a channel or its secret, the place for the
    # scripts) or that differs is found before anything is written, and all of them are named.
    report = backup_tools.ImportReport(refused=list(move.refused), refused_count=len(move.refused),
                                       refused_code="invalid_argument" if move.refused else None)
    secrets: dict[str, str] = {}  # name: "created" or "updated", as the write would do
    for tool_name, args in _restore_calls(doc, a.replace, dry=True):
        part = c.typed(tool_name, args, backup_tools.ImportReport)
        if tool_name == "qledge.secret.import":
            secrets |= {label.removeprefix("secret "): "created" for label in part.created}
            secrets |= {label.removeprefix("secret "): "updated" for label in part.updated}
        report.add(part)
    if report.refused_count or report.conflicts:
        if a.json:
            shared.json_out(report)
        if report.refused_count:
            line = backup_tools.refused_line(report.refused, report.refused_count)
            if report.conflicts:
                line += f"; {len(report.conflicts)} more differ from what this daemon has (--replace overwrites them)"
            raise CallFailed(report.refused_code or "invalid_argument", line)
        raise CallFailed("conflict", backup_tools.refusal(report.conflicts) + " (qledge import --replace overwrites)")
    if a.dry_run:
        report.notes += import_scripts(move, True, Undo()) + import_notify(c, doc, a.replace, True, Undo())
    else:
        report = _write_import(c, doc, move, a.replace, secrets)

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


def _write_import(c: Client, doc: backup_tools.Document, move: Move, replace: bool,
                  secrets: dict[str, str]) -> backup_tools.ImportReport:
    """The parts in the order they depend on each other: the secrets, the notification
    channels and rules, the scripts, then every task and trigger in one transaction (the
    last part of one session). When a part fails, what the parts before it wrote is taken
    back (Undo), and one line says where it stopped and what was undone."""
    calls = _restore_calls(doc, replace, dry=False)
    report = backup_tools.ImportReport()
    undo = Undo()
    stage = "secrets"
    try:
        undo.start()
        for _, args in calls:
            if isinstance(args, backup_tools.SecretImportArgs):
                _import_secrets(c, report, args, secrets, undo)
                undo.check()
        stage = "notification channels and rules"
        notes = import_notify(c, doc, replace, False, undo)
        undo.check()
        stage = "scripts"
        notes = import_scripts(move, False, undo) + notes
        stage = "tasks and triggers"
        for tool_name, args in calls:
            if tool_name == "qledge.import":
                undo.check()  # the parts before the last write nothing; the last writes them all
                report.add(c.typed(tool_name, args, backup_tools.ImportReport))
    except (*FAILURES, Interrupted) as exc:
        raise undo.stopped(exc, stage) from None
    report.notes += notes
    return report


def _import_secrets(c: Client, report: backup_tools.ImportReport, args: backup_tools.SecretImportArgs,
                    planned: dict[str, str], undo: Undo) -> None:
    """One batch of secrets (each its own write): the ones it created can be deleted again;
    the ones it overwrote (--replace) keep the file's value, as no earlier value is read back."""
    def wrote(labels: list[str], how: str) -> None:
        for name in (label.removeprefix("secret ") for label in labels):
            if how == "created":
                undo.add(f"secret {name}", functools.partial(c.call, "qledge.secret.delete", {"name": name}))
            else:
                undo.stays.append(f"secret {name} (the file's value)")

    try:
        part = c.typed("qledge.secret.import", args, backup_tools.ImportReport)
    except FAILURES:  # the ones written before it failed: as planned
        for how in ("created", "updated"):
            wrote([s.name for s in args.secrets if planned.get(s.name) == how], how)
        raise
    wrote(part.created, "created")
    wrote(part.updated, "updated")
    report.add(part)


def _export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument("--with-secrets", action="store_true", help="include secret values (needs secret.export)")


def _file_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument("--replace", action="store_true", help="overwrite tasks, triggers and secrets that differ")
    p.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")


VERBS = {
    "export": Verb("export", export_state, options=_export_options),
    "import": (
        Verb("file", interruptible(import_state),
             "import an export made by `qledge export`: create what is missing, skip what is identical", _file_options),
        Verb("crontab", interruptible(import_crontab),
             "import a crontab: each entry becomes a shell task with a trigger (run it again: nothing new)",
             _crontab_options),
        Verb("qinglong", interruptible(import_qinglong),
             "import a qinglong install: its crons, environment (as secrets) and scripts", _qinglong_options),
    ),
}
