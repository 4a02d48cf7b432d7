"""Imports from busybox crond and qinglong, as pure functions: what their entries mean in
qledge (a task, its triggers, its environment), what they cannot mean (a problem with its
line or row), and the import key that makes a second import of the same entry a no-op.

Nothing here reads files or talks to the daemon: edge.cli.import_commands does that and
hands the text and rows in. The daemon loads this module for its types only, so what only
planning needs (shlex) is imported where it is used.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping

import msgspec

from edge.core.schedule import ONCE, REBOOT, ScheduleError, days_ored, load_zone, normalize
from edge.core.tasks import (
    DATA_DIR,
    DEFAULT_TIMEOUT_MS,
    MAX_SHELL_CHARS,
    MAX_TIMEOUT_MS,
    MAX_TRIGGERS,
    ArgvCommand,
    Command,
    ImportTask,
    ImportTrigger,
    SecretRef,
    ShellCommand,
    TaskSpec,
    redact_label,
)

class Problem(msgspec.Struct, rename="camel"):
    """Something in the source qledge does not import, and why. `where`: `line 7`, `cron 12`, …;
    `kind`: a few words the summary counts by."""

    where: str
    text: str
    reason: str
    kind: str = ""


class Entry(msgspec.Struct, rename="camel"):
    """What one source entry becomes."""

    where: str
    task: ImportTask
    notes: list[str] = []


_check_task = msgspec.msgpack.Decoder(ImportTask)
_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")


def unrepresentable(entry: Entry) -> Problem | None:
    """A problem when the task breaks one of the daemon's limits (sizes, characters), which
    the daemon would refuse: checked here so that one bad entry never stops an import."""
    try:
        _check_task.decode(msgspec.msgpack.encode(entry.task))
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:
        return Problem(entry.where, entry.task.name or entry.task.task_id, f"qledge cannot store it: {exc}",
                       "too large or invalid characters")
    return None


def import_key(kind: str, *parts: object) -> str:
    """`<kind>:<digest>`: the same entry (what it runs and when) gives the same key."""
    digest = hashlib.sha256(msgspec.json.encode(parts, order="sorted")).hexdigest()
    return f"{kind}:{digest[:32]}"


# -- names ------------------------------------------------------------------------

_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_WRAPPERS = {"nice", "ionice", "nohup", "exec", "env", "sudo", "doas", "flock", "time", "command"}
_INTERPRETERS = re.compile(r"^(sh|ash|bash|dash|zsh|python[0-9.]*|node|php[0-9.]*|perl|ruby|lua[0-9.]*|ts-node.*)$")


def slug(text: str, fallback: str = "job") -> str:
    """A task id from free text: letters, digits, `.`, `_`, `-`, starting with a letter or digit."""
    cleaned = _NOT_NAME.sub("-", text).strip("-._")[:64].rstrip("-._")
    return cleaned or fallback


def _stem(path: str) -> str:
    base = posixpath.basename(path.rstrip("/"))
    stem, dot, ext = base.rpartition(".")
    return stem if dot and stem and len(ext) <= 4 else base


_NAME_FROM = 1024  # the start of a command a name is found in: bounded, whatever the command's length
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_NOT_PROGRAM = re.compile(r"[:@=?&%]")
_QUOTING = re.compile(r"['\"\\]")
_UNDECODED = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape reads it


def name_from_command(command: str) -> str:
    """The word of a shell command that names the job: the program, or the script an
    interpreter runs, past assignments, `cd DIR &&` and wrappers such as `nice`."""
    import shlex

    head = command[:_NAME_FROM]
    if _QUOTING.search(head) is None:
        words = head.split()  # what shlex would make of it, without reading it character by character
    else:
        try:
            words = shlex.split(head, comments=False)
        except ValueError:
            words = head.split()
    i = 0
    while i < len(words):
        word = words[i]
        if _ASSIGNMENT.match(word) or word in ("&&", ";", "||"):
            i += 1
        elif word in ("cd", "sleep"):
            i += 2
        elif word in _WRAPPERS or (word.startswith("-") and i > 0) or word.isdigit():
            i += 1
        elif _INTERPRETERS.match(posixpath.basename(word)) and i + 1 < len(words) and words[i + 1] not in ("-c",):
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
        elif _NOT_PROGRAM.search(word):  # a URL or an assignment, not a program: no name from it
            return "job"
        else:
            return slug(_stem(word))
    return "job"


def free_name(base: str, taken: set[str], next_n: dict[str, int] | None = None) -> str:
    """`base`, else `base-2`, `base-3`…: the first one not in `taken`. `next_n` remembers,
    per base, where the search ends, so naming many entries after one program stays linear."""
    if base not in taken:
        return base
    n = (next_n or {}).get(base, 2)
    while (candidate := f"{base[: 128 - len(str(n)) - 1]}-{n}") in taken:
        n += 1
    if next_n is not None:
        next_n[base] = n + 1
    return candidate


NEUTRAL_ID = "task"  # an imported task's id when its name would be masked: task, task-2, …


def assign_ids(entries: list[Entry], taken: Iterable[str]) -> None:
    """Give each entry a task id free among `taken` and the entries before it (in order)."""
    used = set(taken)
    counters: dict[str, int] = {}
    for entry in entries:
        base = entry.task.task_id
        if redact_label(base) != base:
            # Ids are shown unredacted (to viewers, AI tools, notifications): one derived from
            # a name that looks like a credential is a neutral one instead.
            base = NEUTRAL_ID
            entry.notes = [*entry.notes, "named after a word that looks like a credential: given a neutral id"]
        chosen = free_name(base, used, counters)
        used.add(chosen)
        entry.task.task_id = chosen


# -- crontab ----------------------------------------------------------------------

CRON_NICKNAMES = ("@reboot", "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# Matched on a stripped line, so that no pattern backtracks over its whitespace (linear time).
_ENV_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.*)", re.S)
_ENTRY = re.compile(r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(.*)", re.S)
_NICKNAME = re.compile(r"(@[A-Za-z]+)(?:\s+(.*))?", re.S)
# A line no entry could be: its command longer than any task takes (MAX_SHELL_CHARS), with
# room for the schedule. Refused by its length alone, before anything else reads it.
MAX_LINE_CHARS = MAX_SHELL_CHARS + 1024
MAX_CRONTAB_BYTES = 64 << 20


class CrontabUser(msgspec.Struct):
    """Whom crond runs the entries as: the user each task names (busybox names a crontab
    after its user), with its environment (HOME: `home`) and working directory (`work_dir`,
    its home when that is a directory; None: the daemon's default)."""

    name: str
    home: str | None = None
    shell: str = "/bin/sh"
    work_dir: str | None = None


class CrontabPlan(msgspec.Struct):
    entries: list[Entry]
    problems: list[Problem]
    duplicates: list[tuple[int, int]]  # (line, the line it repeats): imported once


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_crontab(text: str, user: CrontabUser, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> CrontabPlan:
    """A crontab as busybox crond reads it: comments, blank lines, `VAR=value` lines (the
    environment of the entries after them; `SHELL` picks the shell, `CRON_TZ` the zone),
    5-field entries and `@` nicknames. `%` stays literal, as in busybox."""
    env: dict[str, str] = {}
    shell, zone = user.shell, None
    entries: list[Entry] = []
    problems: list[Problem] = []
    duplicates: list[tuple[int, int]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        where = f"line {number}"
        if len(raw) > MAX_LINE_CHARS:
            problems.append(Problem(where, _label(raw[:120]), f"the line is {len(raw)} characters long; a crontab"
                                    f" line qledge imports has at most {MAX_LINE_CHARS} (a command at most"
                                    f" {MAX_SHELL_CHARS})", "line too long"))
            continue
        line = raw.rstrip("\r")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _UNDECODED.search(stripped):
            problems.append(Problem(where, stripped.encode("utf-8", "replace").decode(), "the line is not valid UTF-8",
                                    "not UTF-8"))
            continue
        if stripped[0] not in "0123456789*@" and (m := _ENV_LINE.fullmatch(stripped)):
            name, value = m.group(1), _unquote(m.group(2))
            if name == "MAILTO":
                if value:
                    problems.append(Problem(where, stripped, "MAILTO: qledge does not mail a job's output; every run"
                                            " and its log stay in qledge (qledge run list, qledge run log)",
                                            "MAILTO"))
            elif name == "CRON_TZ":
                zone = value or None
                if zone is not None and (bad_zone := _zone_problem(zone)):
                    problems.append(Problem(where, stripped, bad_zone, "unknown zone"))
                    zone = f"!{number}"  # the entries it governs cannot be imported
            elif "\x00" in value or len(value) > 16384:
                problems.append(Problem(where, stripped, f"the value of {name} is not a valid environment value",
                                        "bad environment value"))
            else:
                if name == "SHELL":
                    shell = value or user.shell
                env[name] = value
            continue
        if zone is not None and zone.startswith("!"):
            problems.append(Problem(where, stripped, f"CRON_TZ on line {zone[1:]} is not a zone qledge knows",
                                    "unknown zone"))
            continue
        parsed = _crontab_entry(where, stripped, user, env, shell, zone, timeout_ms)
        if isinstance(parsed, Problem):
            problems.append(parsed)
        elif parsed.task.key in seen:
            duplicates.append((number, seen[parsed.task.key]))
        else:
            seen[parsed.task.key] = number
            entries.append(parsed)
    return CrontabPlan(entries=entries, problems=problems, duplicates=duplicates)


def _zone_problem(zone: str) -> str | None:
    try:
        load_zone(zone)
    except ScheduleError as exc:
        return str(exc)
    return None


def _crontab_entry(
    where: str, line: str, user: CrontabUser, env: Mapping[str, str], shell: str, zone: str | None, timeout_ms: int
) -> Entry | Problem:
    if line.startswith("@"):
        m = _NICKNAME.fullmatch(line)
        if m is None or m.group(1).lower() not in CRON_NICKNAMES:
            word = line.split()[0]
            return Problem(where, line, f"{word} is not a crontab nickname ({', '.join(CRON_NICKNAMES)})",
                           "unknown nickname")
        expression, command = m.group(1).lower(), m.group(2) or ""
    else:
        m = _ENTRY.fullmatch(line)
        if m is None:
            return Problem(where, line, "not a crontab entry: expected 5 time fields and a command, or VAR=value",
                           "not an entry")
        expression, command = " ".join(m.groups()[:5]), m.group(6)
    if not command:
        return Problem(where, line, "the entry has no command", "no command")
    try:
        expression = normalize(expression) if expression != "@reboot" else REBOOT
    except ScheduleError as exc:
        return Problem(where, line, str(exc), "invalid schedule")
    # What busybox crond gives a job, unless the crontab says otherwise.
    job_env = {"SHELL": shell, "USER": user.name, "LOGNAME": user.name}
    if user.home:
        job_env["HOME"] = user.home
    job_env.update(env)
    notes = schedule_notes(expression)
    if "%" in command.replace("\\%", ""):
        notes.append("`%` is kept as it is, as busybox crond does (Vixie cron would make it a newline)")
    spec = TaskSpec(command=ShellCommand(command=command, shell=shell), env=dict(job_env),
                    working_dir=user.work_dir, timeout_ms=timeout_ms, user=user.name)
    key = import_key("crontab", user.name, expression, zone, command, sorted(job_env.items()))
    # Named after its program alone (the id; a counter when taken): the command line may hold
    # credentials, and a name is shown to every reader.
    task = ImportTask(key=key, task_id=name_from_command(command), spec=spec,
                      triggers=[ImportTrigger(expression=expression, timezone=zone)])
    return Entry(where=where, task=task, notes=notes)


def schedule_notes(expression: str) -> list[str]:
    """What an imported (normalized) schedule will do that its reader may not expect."""
    if expression == ONCE:
        return ["@once: runs once, as soon as it is imported (not at a time of day)"]
    if days_ored(expression):
        return ["day-of-month and day-of-week are both restricted: a day matching either fires"
                " (as busybox crond and qinglong do)"]
    return []


def _label(text: str) -> str:
    one_line = _CONTROLS.sub(" ", " ".join(text.split())).strip() or "-"
    return one_line if len(one_line) <= 128 else one_line[:127] + "…"


def disable_lines(text: str, lines: Iterable[int]) -> str:
    """The crontab with the given (1-based) lines commented out, marked as imported."""
    wanted = set(lines)
    out = [f"# qledge imported: {raw}" if n in wanted else raw for n, raw in enumerate(text.split("\n"), start=1)]
    return "\n".join(out)


# -- qinglong ---------------------------------------------------------------------

# Envs qinglong's notify.js / notify.py read: notification channel settings and keys.
NOTIFY_PREFIXES = (
    "BARK_", "TG_", "DD_BOT_", "QYWX_", "PUSH_PLUS_", "WE_PLUS_BOT_", "QMSG_", "AIBOTK_", "SMTP_", "PUSHME_",
    "CHRONOCAT_", "WEBHOOK_", "GOTIFY_", "GOBOT_", "CHAT_", "DEER_", "NTFY_", "WXPUSHER_", "IGOT_", "FS",
)
NOTIFY_NAMES = frozenset({"PUSH_KEY", "HITOKOTO", "SKIP_PUSH_TITLE"})
INTERPRETERS = {".js": "node", ".mjs": "node", ".ts": "node", ".py": "python3", ".sh": "bash"}
_QL_SCRIPT_ROOTS = ("/ql/data/scripts/", "/ql/scripts/")
_TIMEOUT = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def is_notification_key(name: str) -> bool:
    return name in NOTIFY_NAMES or name.startswith(NOTIFY_PREFIXES)


class QlCron(msgspec.Struct):
    """A row of qinglong's Crontabs, with what older installs lack defaulted."""

    id: int
    name: str
    command: str
    schedule: str
    extra_schedules: list[str] = []
    disabled: bool = False
    system: bool = False
    allow_multiple_instances: bool = False
    work_dir: str | None = None
    task_before: str | None = None
    task_after: str | None = None


class QlEnv(msgspec.Struct):
    name: str
    value: str
    enabled: bool = True
    pinned: bool = False
    position: float = 0.0
    created_at: str = ""


def _text(value: object) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _flag(value: object) -> bool:
    return bool(value) and value not in ("0", "false")


def _json_list(value: object) -> list[object]:
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return []
    return value if isinstance(value, list) else []


def ql_cron(row: Mapping[str, object]) -> QlCron:
    """A Crontabs row (column name → value, the missing columns absent) as a QlCron."""
    extra = [item["schedule"] for item in _json_list(row.get("extra_schedules"))
             if isinstance(item, dict) and isinstance(item.get("schedule"), str) and item["schedule"].strip()]
    raw_id = row.get("id")
    return QlCron(
        id=raw_id if isinstance(raw_id, int) else 0, name=_text(row.get("name")) or "",
        command=_text(row.get("command")) or "", schedule=_text(row.get("schedule")) or "",
        extra_schedules=extra, disabled=_flag(row.get("isDisabled")), system=_flag(row.get("isSystem")),
        allow_multiple_instances=_flag(row.get("allow_multiple_instances")), work_dir=_text(row.get("work_dir")),
        task_before=_text(row.get("task_before")), task_after=_text(row.get("task_after")),
    )


def ql_env(row: Mapping[str, object]) -> QlEnv:
    position, value = row.get("position"), row.get("value")
    return QlEnv(
        name=_text(row.get("name")) or "", value=value if isinstance(value, str) else "",
        enabled=row.get("status") in (0, None, "0"), pinned=_flag(row.get("isPinned")),
        position=float(position) if isinstance(position, (int, float)) else 0.0,
        created_at=str(row.get("createdAt") or ""),
    )


def join_envs(envs: Iterable[QlEnv]) -> dict[str, str]:
    """Enabled values by name, same-name values joined with `&` in qinglong's order
    (pinned first, then by position descending, then oldest first)."""
    ordered = sorted((e for e in envs if e.enabled and e.value), key=lambda e: (-e.pinned, -e.position, e.created_at))
    joined: dict[str, list[str]] = {}
    for env in ordered:
        joined.setdefault(env.name, []).append(env.value)
    return {name: "&".join(values) for name, values in joined.items()}


def parse_timeout(text: str) -> int | None:
    """`-m` of qinglong's `task` (GNU timeout's: 90, 90s, 10m, 2h, 1d) in ms; None if invalid."""
    m = _TIMEOUT.match(text.strip())
    if m is None:
        return None
    ms = int(float(m.group(1)) * _UNIT_S[m.group(2)] * 1000)
    return min(max(ms, 1000), MAX_TIMEOUT_MS)


class QlCommand(msgspec.Struct):
    script: str  # relative to the scripts directory, or absolute; "" for a plain shell command
    args: list[str]
    timeout_ms: int | None
    shell: str | None = None  # a command that is no `task <script>`: run as it is


def parse_ql_command(command: str) -> QlCommand | str:
    """`task <script> [now] [-m T] [-l] [args…]` (a bare script path means `task <path>`);
    a string when it cannot be represented: the reason."""
    import shlex

    if len(command) > MAX_SHELL_CHARS:  # refused by its length, before it is read word by word
        return f"the command is {len(command)} characters long; a task's command has at most {MAX_SHELL_CHARS}"
    try:
        words = shlex.split(command)
    except ValueError:
        return "the command is not valid shell quoting"
    if not words:
        return "the command is empty"
    if words[0] == "ql":
        return f"`ql {words[1] if len(words) > 1 else ''}` is qinglong's own command (repository or file pulls)"
    if words[0] == "task":
        words = words[1:]
    elif any(c in command for c in ";|&$`><") or posixpath.splitext(words[0])[1].lower() not in INTERPRETERS:
        return QlCommand(script="", args=[], timeout_ms=None, shell=command)
    if not words:
        return "`task` without a script"
    script, rest = words[0], words[1:]
    args: list[str] = []
    timeout: int | None = None
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in ("conc", "desi"):
            return f"`task … {word}` (qinglong's per-account split of an environment variable) has no qledge equivalent"
        if word == "-m" and i + 1 < len(rest):
            timeout = parse_timeout(rest[i + 1])
            if timeout is None:
                return f"`-m {rest[i + 1]}` is not a timeout (e.g. 300, 30m, 2h)"
            i += 2
            continue
        if word not in ("now", "-l"):
            args.append(word)
        i += 1
    return QlCommand(script=script, args=args, timeout_ms=timeout)


def _script_path(script: str, scripts_dir: str) -> str:
    for root in _QL_SCRIPT_ROOTS:
        if script.startswith(root):
            return posixpath.join(scripts_dir, script[len(root):])
    return script if script.startswith("/") else posixpath.normpath(posixpath.join(scripts_dir, script))


def _within(path: str, directory: str) -> bool:
    root = posixpath.normpath(directory)
    return posixpath.normpath(path).startswith(root.rstrip("/") + "/")


def _work_dir(work_dir: str | None, script_path: str, scripts_dir: str, data_dir: str) -> str:
    if not work_dir:
        return posixpath.dirname(script_path)
    for root in _QL_SCRIPT_ROOTS:  # the scripts run from where they were imported to
        if (work_dir + "/").startswith(root):
            return posixpath.normpath(posixpath.join(scripts_dir, work_dir[len(root):]))
    if work_dir.startswith("/ql/data/"):
        return posixpath.join(data_dir, work_dir[len("/ql/data/"):])
    return work_dir if work_dir.startswith("/") else posixpath.normpath(posixpath.join(scripts_dir, work_dir))


class QlPlace(msgspec.Struct):
    """Where the imported qinglong data lives for the tasks that use it, and whom they run as."""

    scripts_dir: str
    data_dir: str
    zone: str | None = None  # qinglong's own zone setting, when it has one
    user: str | None = None  # the user every task names (qinglong runs everything as root)
    copied: bool = True  # the scripts are qledge's copy, read-only to tasks (False: run where they are)


def ql_entry(cron: QlCron, place: QlPlace, secret_env: Mapping[str, str]) -> Entry | Problem:
    """One qinglong cron as a task with its triggers. `secret_env`: env name → secret name,
    given to every task (qinglong's scripts read their accounts from the environment)."""
    where, text = f"cron {cron.id}", f"{cron.name or '(no name)'}: {cron.schedule} {cron.command}"
    if cron.system:
        return Problem(where, text, "qinglong's own system task", "qinglong system task")
    parsed = parse_ql_command(cron.command)
    if isinstance(parsed, str):
        return Problem(where, text, parsed, "command not representable")
    notes: list[str] = []
    path = _script_path(parsed.script, place.scripts_dir)
    if parsed.shell is None and not _within(path, place.scripts_dir):
        return Problem(where, text, f"the script {_label(parsed.script)} is outside the imported scripts directory"
                       f" {place.scripts_dir}", "script outside the scripts directory")
    ext = posixpath.splitext(path)[1].lower()
    interpreter = INTERPRETERS.get(ext)
    main: Command
    if parsed.shell is not None:
        notes.append("not a `task <script>` command: runs as a shell command, in the scripts directory")
        main = ShellCommand(command=parsed.shell)
        path = posixpath.join(place.scripts_dir, "-")
    elif interpreter is None:
        notes.append(f"no interpreter is known for {ext or 'a file without extension'}: the file runs itself")
        main = ArgvCommand(file=path, args=parsed.args)
    else:
        main = ArgvCommand(file=interpreter, args=[path, *parsed.args])
    if cron.task_before or cron.task_after:
        main = ShellCommand(command=_wrapper(main, cron.task_before, cron.task_after))
        notes.append("task_before/task_after run around the script in one shell")
    triggers, bad = _ql_triggers(cron, place.zone)
    if not triggers:
        return Problem(where, text, "; ".join(bad) or "no schedule", "invalid schedule")
    notes += [f"schedule not imported: {reason}" for reason in bad]
    notes += [note for t in triggers if t.enabled for note in schedule_notes(t.expression)]
    env: dict[str, str | SecretRef] = {name: SecretRef(secret=secret) for name, secret in secret_env.items()}
    spec = TaskSpec(
        # The scripts are code, read-only to the task: one that writes beside itself (as under
        # qinglong) writes in its own data directory, where it starts unless the cron says otherwise.
        command=main, env=env,
        working_dir=_work_dir(cron.work_dir, path, place.scripts_dir, place.data_dir) if cron.work_dir
        or parsed.shell is not None or not place.copied else DATA_DIR,
        timeout_ms=parsed.timeout_ms or DEFAULT_TIMEOUT_MS,
        overlap="allow" if cron.allow_multiple_instances else "forbid", user=place.user,
    )
    key = import_key("qinglong", cron.name, cron.command, cron.schedule, cron.extra_schedules, cron.task_before,
                     cron.task_after)
    base = slug(_stem(parsed.script), fallback="") if parsed.shell is None else name_from_command(parsed.shell)
    task = ImportTask(key=key, task_id=base or f"qinglong-{cron.id}", spec=spec,
                      name=_label(cron.name or parsed.script or base), enabled=not cron.disabled, triggers=triggers)
    return Entry(where=where, task=task, notes=notes)


def _ql_triggers(cron: QlCron, zone: str | None) -> tuple[list[ImportTrigger], list[str]]:
    triggers: list[ImportTrigger] = []
    bad: list[str] = []
    for schedule in [cron.schedule, *cron.extra_schedules]:
        try:
            expression = normalize(schedule)
        except ScheduleError as exc:
            bad.append(str(exc))
            continue
        if any(t.expression == expression for t in triggers):
            continue
        # A one-shot of a disabled task waits, disabled, for the task (it would be spent on a skip).
        triggers.append(ImportTrigger(expression=expression, timezone=zone,
                                      enabled=not (cron.disabled and expression == "@once")))
    return triggers[:MAX_TRIGGERS], bad


def _wrapper(main: Command, before: str | None, after: str | None) -> str:
    """qinglong runs task_before, the script and task_after in one shell; so does this,
    and exits with the script's status."""
    import shlex

    run = shlex.join([main.file, *main.args]) if isinstance(main, ArgvCommand) else main.command
    lines = [before or "", run, "status=$?", after or "", "exit $status"]
    return "\n".join(line for line in lines if line)


def parse_shell_exports(text: str) -> list[tuple[int, str, str]]:
    """`export NAME="value"` (or `NAME=value`) lines of qinglong's config.sh with a non-empty
    value: (line, name, value). Anything that is not a plain assignment is ignored."""
    import shlex

    found: list[tuple[int, str, str]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        m = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*?)\s*(?:#.*)?$", line)
        if m is None:
            continue
        value = m.group(2)
        try:
            words = shlex.split(value) if value else []
        except ValueError:
            continue
        if len(words) == 1 and words[0] and "$" not in value:
            found.append((number, m.group(1), words[0]))
    return found
