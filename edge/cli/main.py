"""`qledge` entry point: argparse, dispatch, the one error format and the exit codes.

Every error is one line on stderr, `qledge: <code>: <message>` (with --json, a JSON object
`{"error": {"code", "message"}}`), whoever found it. Exit codes follow the code, never the
place it was found: 0 ok; 2 invalid input (`invalid_argument`: usage, configuration, or an
argument the daemon refused) and `qledge serve` refusing to start; 3 the daemon cannot be
reached (`unavailable`); 1 every other error, and a waited run that did not succeed.
"""

from __future__ import annotations

import os
import sys

# Names for annotations only. argparse is imported lazily: the daemon's serve path never needs
# it; and not even `typing` here: it costs ~1.9 MiB that `qledge mcp` (reached from here) must not pay.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from types import SimpleNamespace
    from typing import NoReturn

    from edge.cli.client import Client

    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
    # (client, args) for verbs that talk to the daemon, (args) for offline ones; None: handled here.
    Handler = Callable[[Client, argparse.Namespace], int] | Callable[[argparse.Namespace], int]
    Verb = Callable[[Subcommands, str, Handler | None, str], argparse.ArgumentParser]

EXIT_OK, EXIT_TOOL, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def exit_code(code: str) -> int:
    """The exit code of an error with this code (see the module docstring)."""
    return EXIT_USAGE if code == "invalid_argument" else EXIT_TOOL


def report(code: str, message: str, as_json: bool) -> None:
    """Print an error the one way it is printed."""
    if as_json:
        import json  # only on this path: the daemon's start-up must not pay for it

        sys.stderr.write(json.dumps({"error": {"code": code, "message": message}}) + "\n")
    else:
        sys.stderr.write(f"qledge: {code}: {message}\n")


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


def _without_openssl_hashes() -> None:
    """Some commands import hashlib (the import planner's keys; edge.core.auth uses the builtin
    SHA-256 directly). Nothing the CLI runs needs OpenSSL's hashes: use CPython's builtin ones
    rather than map libcrypto (~3.5 MiB), as the daemon does (edge.app.lean.restrict_imports)."""
    if "hashlib" not in sys.modules and "hmac" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
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

    _without_openssl_hashes()
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
    _agent_verbs(verbs, verb)
    try:  # a build without notifications has no `qledge notify`
        from edge.notify.cli import add_notify_verbs
    except ImportError:
        pass
    else:
        add_notify_verbs(verbs, verb)
        from edge.cli import import_commands
        from edge.notify import imports as notify_imports

        import_commands.NOTIFY = notify_imports  # qinglong's notification settings become channels

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

    verb(verbs, "web", None, "serve the web panel (qledge web --help)")
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


# `qledge import` takes a file, or names one of these sources (each its own subcommand).
IMPORT_SOURCES = ("file", "crontab", "qinglong")


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


def _import_file_alias(argv: list[str]) -> list[str]:
    """`qledge import FILE` is `qledge import file FILE`: a first argument that names no
    source is the file. Options before the verb that take a value are stepped over."""
    i, n = 0, len(argv)
    while i < n and argv[i].startswith("-"):
        i += 2 if argv[i] in ("--home", "--socket", "--config") else 1
    if i >= n or argv[i] != "import":
        return argv
    j = i + 1
    while j < n and argv[j].startswith("-"):
        if argv[j] in ("-h", "--help"):
            return argv
        j += 2 if argv[j] in ("--home", "--socket", "--config") else 1
    if j < n and argv[j] not in IMPORT_SOURCES:
        return [*argv[: i + 1], "file", *argv[i + 1 :]]
    return argv


def _agent_verbs(verbs: Subcommands, verb: Verb) -> None:
    from edge.cli import commands as c

    ask = verb(verbs, "ask", c.ask, "ask the AI operator a question about this device's tasks and runs")
    ask.add_argument("question", nargs="+", metavar="QUESTION")
    ask.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    ask.add_argument("--profile", metavar="NAME", help="an [agent.profiles.NAME] of the daemon's config")
    agent = verbs.add_parser("agent", help="AI tasks and the AI operator's history").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    add = verb(agent, "add", c.agent_add, 'add an AI task: qledge agent add NAME "instruction"')
    add.add_argument("name", help="task id (letters, digits, . _ -)")
    add.add_argument("instruction", help="what the operator is to do (at most 2000 characters)")
    add.add_argument("--profile", metavar="NAME", help="an [agent.profiles.NAME] of the daemon's config")
    add.add_argument("--overlap", choices=("forbid", "allow", "replace"), default="forbid",
                     help="what a new run does while one is active (default forbid)")
    add.add_argument("--rounds", type=int, metavar="N", help="at most N model rounds (never above the config's)")
    add.add_argument("--input-tokens", type=int, metavar="N", help="input token budget")
    add.add_argument("--output-tokens", type=int, metavar="N", help="output token budget")
    add.add_argument("--cost-usd", type=float, metavar="USD", help="estimated cost budget")
    add.add_argument("--wall-clock", type=int, metavar="S", help="wall-clock budget in seconds")
    lst = verb(agent, "list", c.agent_list, "the AI operator's past runs (its evidence history), newest first")
    lst.add_argument("--limit", type=int, default=20, choices=range(1, 65), metavar="N", help="1..64 (default 20)")
    run_help = "a run id, its first 8 or more characters, TASK:latest or TASK:latest-failed"
    verb(agent, "get", c.agent_get, "one AI run's evidence record").add_argument("run", metavar="RUN", help=run_help)
    retry = verb(agent, "retry", c.agent_retry,
                 "start the next attempt of an AI run's mission (its ledger carries over)")
    retry.add_argument("run", metavar="RUN", help=run_help)
    retry.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    verb(agent, "mission", c.agent_mission, "an AI run's mission: attempts, specialists' constraints and work items"
         ).add_argument("run", metavar="RUN", help=run_help)
    check = verb(agent, "check", c.agent_check,
                 "check the provider with one request that exercises tool calling, and say what to change")
    check.add_argument("--profile", metavar="NAME", help="an [agent.profiles.NAME] of the daemon's config")


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` is the task's command, untouched by argparse."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _first_word(argv: list[str]) -> str | None:
    """The verb: the first word that is neither an option nor the value of one."""
    tokens = iter(argv)
    for token in tokens:
        if token in ("--home", "--socket", "--config"):
            next(tokens, None)
        elif not token.startswith("-"):
            return token
    return None


def _serve_fast_path(argv: list[str]) -> SimpleNamespace | None:
    """Parse `serve` without building the whole CLI: argparse costs the daemon ~0.5 MiB.

    Returns None for anything unusual (help, unknown flags), which argparse then handles.
    """
    values: dict[str, str | None] = {"config": None, "home": None, "socket": None}
    seen_verb = False
    tokens = iter(argv)
    for token in tokens:
        if token == "serve" and not seen_verb:
            seen_verb = True
            continue
        name, eq, inline = token.partition("=")
        key = name[2:] if name.startswith("--") else ""
        if key not in values:
            return None
        value = inline if eq else next(tokens, None)
        if not eq and (value is None or value.startswith("-")):
            return None
        values[key] = value
    if not seen_verb:
        return None
    from types import SimpleNamespace

    return SimpleNamespace(**values)


def _serve(args: argparse.Namespace | SimpleNamespace) -> int:
    from edge.app.lean import choose_loop, defer_hangups, restrict_imports

    defer_hangups()  # first: a SIGHUP while starting must not end the daemon
    from edge.app import config as cfg

    as_json = bool(getattr(args, "json", False))
    path = getattr(args, "config", None) or os.environ.get("QLEDGE_CONFIG") or None
    try:
        config = cfg.load(path)
        cfg.check_timezones(config, os.environ.get("TZ"))
    except cfg.ConfigError as exc:
        report("invalid_argument", str(exc), as_json)
        return EXIT_USAGE
    loop = choose_loop(config.loop)
    restrict_imports(loop)
    home = cfg.resolve_home(getattr(args, "home", None), config)
    from edge.app.daemon import run_daemon

    socket_path = cfg.resolve_socket(getattr(args, "socket", None), config, home)
    config_path = os.path.abspath(path) if path else None
    return run_daemon(config, home, socket_path, loop, config_path=config_path, report=lambda code, message: report(
        code, message, as_json))


# What the CLI and daemon import beyond the standard library, and where each comes from.
DEPENDENCIES = {"msgspec": "python3-msgspec", "apsw": "python3-apsw", "cronsim": "python3-cronsim"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Known before parsing, so that a usage error is reported the way it was asked for.
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    for arg in argv:
        try:
            arg.encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach us as lone surrogates
            report("invalid_argument", f"argument {ascii(arg)} is not valid UTF-8", as_json)
            return EXIT_USAGE
    try:
        return _main(argv, as_json)
    except ModuleNotFoundError as exc:
        if exc.name not in DEPENDENCIES:
            raise
        # An installation that lacks a package is a configuration error (exit 2).
        report("invalid_argument", f"the Python package {exc.name} is not installed: pip install {exc.name}"
               f" (OpenWrt: opkg install {DEPENDENCIES[exc.name]})", as_json)
        return EXIT_USAGE


def _main(argv: list[str], as_json: bool) -> int:
    if "mcp" in argv:  # the stdio bridge must not pay for argparse or msgspec
        from edge.cli.mcp_bridge import main as bridge

        code = bridge(argv)
        if code is not None:
            return code
    if "web" in argv and _first_word(argv) == "web":  # the panel loads none of the CLI
        try:
            from edge.web.command import main as web
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("edge.web"):
                raise
            report("invalid_argument", "the web panel is not included in this build", as_json)
            return EXIT_USAGE
        return web(argv)
    fast = _serve_fast_path(argv)
    if fast is not None:
        return _serve(fast)
    from edge.cli.client import BadReply, CallFailed, Unreachable, UsageError

    try:
        return _dispatch(argv)
    except UsageError as exc:
        report("invalid_argument", str(exc), as_json)
        return EXIT_USAGE
    except Unreachable as exc:
        report("unavailable", str(exc), as_json)
        return EXIT_UNREACHABLE
    except CallFailed as exc:
        report(exc.code, exc.message, as_json)
        return exit_code(exc.code)
    except BadReply as exc:
        report("internal", str(exc), as_json)
        return EXIT_TOOL
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


def _dispatch(argv: list[str]) -> int:
    from edge.app.config import tz_problem
    from edge.cli.client import Client, UsageError

    head, command = _split_command(_import_file_alias(argv))
    parser = build_parser()
    args = parser.parse_args(head)
    if command:
        if getattr(args, "command", None) is None:
            parser.error("`--` is only used by `task add` and `task update`")
        args.command = [*args.command, *command]
    args.json = getattr(args, "json", False)
    if args.verb == "serve":
        return _serve(args)
    # Times are printed in the local zone: a $TZ the C library does not know would make
    # them silently UTC.
    problem = tz_problem(os.environ.get("TZ"))
    if problem:
        raise UsageError(problem)
    if getattr(args, "offline", False):
        return args.handler(args)
    path = _client_socket_for(args)
    with Client(path, token=os.environ.get("QLEDGE_TOKEN") or None) as client:
        return args.handler(client, args)


def _client_socket_for(args: argparse.Namespace) -> str:
    """Where the daemon listens: --socket, $QLEDGE_SOCKET, else what its config file says
    (--config, $QLEDGE_CONFIG), resolved as the daemon resolves it, else client_socket()."""
    from edge.cli.client import UsageError

    flag_socket, flag_home = getattr(args, "socket", None), getattr(args, "home", None)
    path = getattr(args, "config", None) or os.environ.get("QLEDGE_CONFIG")
    if not path or flag_socket or os.environ.get("QLEDGE_SOCKET"):
        return client_socket(flag_socket, flag_home)
    from edge.app import config as cfg

    try:
        config = cfg.load(path)
    except cfg.ConfigError as exc:
        raise UsageError(str(exc)) from None
    return cfg.resolve_socket(None, config, cfg.resolve_home(flag_home, config))


def client_socket(flag_socket: str | None, flag_home: str | None, system_dir: str | None = None) -> str:
    """--socket, $QLEDGE_SOCKET, else qledge.sock in the home (or a system daemon's: home_socket)."""
    from edge import SYSTEM_RUN_DIR, home_socket

    return flag_socket or os.environ.get("QLEDGE_SOCKET") or home_socket(
        "qledge.sock", flag_home, system_dir or SYSTEM_RUN_DIR)
