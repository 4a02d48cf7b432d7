"""`qledge` entry point: the table of nouns, the parser built from it, dispatch.

A command imports the module of its noun only, and of its verb only the options: `--version`,
`qledge --help` (the table's one-line help) and `qledge NOUN --help` load no handler and
nothing the handlers need; `qledge serve` and `qledge status` with the common options only
are parsed without argparse (the daemon must not pay for it; a status check starts like a
shell tool). `qledge mcp` and `qledge web` hand the command line to the bridge and to the
panel before anything else. Errors and exit codes: edge.cli.shared.
"""

from __future__ import annotations

import os
import sys

# Names for annotations only, and not even `typing` here: it costs ~1.9 MiB that `qledge mcp`
# (reached from here) must not pay, and as long as a bare start of the interpreter.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from types import ModuleType, SimpleNamespace

    from edge.cli import shared


class Noun:
    """A row of the table: `qledge NAME …`, the line `qledge --help` lists it with, the module
    that registers its verbs (its `VERBS[name]`: one Verb, or a tuple of them under an ACTION),
    and for an optional capability's noun the capability it needs and what a build without it
    says (None: the noun is not offered there at all)."""

    __slots__ = ("name", "help", "module", "needs", "absent", "dest", "metavar")

    def __init__(self, name: str, help: str, module: str | None, needs: str | None = None,
                 absent: str | None = None, dest: str = "action", metavar: str = "ACTION") -> None:
        self.name, self.help, self.module = name, help, module
        self.needs, self.absent = needs, absent
        self.dest, self.metavar = dest, metavar  # a noun of several verbs: where the verb goes


_NO_AI = "the AI operator is not included in this build"
_NO_WEB = "the web panel is not included in this build"
# The smallest zipapp leaves out the commands about an installation (packaging/build.py).
_NOT_SMALLEST = "{} is not included in this build (the smallest zipapp): the packages and the other zipapps have it"

# Every noun, in the order `qledge --help` lists them. The optional capabilities' nouns are the
# rows with `needs`: the capability objects of edge.app will hand these rows (or their verbs)
# out, and this table keeps the core's own.
NOUNS = (
    Noun("serve", "run the daemon in the foreground (--config FILE, or $QLEDGE_CONFIG)", None),
    Noun("task", "manage tasks", "edge.cli.task"),
    Noun("run", "start and inspect runs", "edge.cli.run"),
    Noun("next", "the next fires of every enabled trigger, in time order", "edge.cli.trigger"),
    Noun("audit", "the security audit log, newest first (owners: audit.read)", "edge.cli.admin"),
    Noun("cron", "cron expressions (offline)", "edge.cli.trigger"),
    Noun("trigger", "manage cron triggers", "edge.cli.trigger"),
    Noun("export", "write tasks and triggers (and, with --with-secrets, secret values) to FILE, mode 0600",
         "edge.cli.import_commands"),
    Noun("import", "import tasks and triggers: qledge import FILE, or from crontab or qinglong",
         "edge.cli.import_commands", dest="source", metavar="FILE|SOURCE"),
    Noun("ask", "ask the AI operator a question about this device's tasks and runs", "edge.cli.agent",
         needs="agent", absent=_NO_AI),
    Noun("agent", "AI tasks and the AI operator's history", "edge.cli.agent", needs="agent", absent=_NO_AI),
    Noun("notify", "notifications: channels, rules, tests, the delivery log", "edge.cli.notify", needs="notify"),
    Noun("token", "API credentials", "edge.cli.admin"),
    Noun("secret", "secrets for task environments (values are never shown)", "edge.cli.admin"),
    Noun("web", "serve the web panel (qledge web --help)", None, needs="web", absent=_NO_WEB),
    Noun("mcp", "bridge stdio to the daemon's MCP socket, for AI clients", "edge.cli.mcp_bridge", needs="mcp",
         absent="the MCP bridge is not included in this build"),
    Noun("status", "daemon status", "edge.cli.admin"),
    Noun("call", "call a tool directly; prints its JSON result", "edge.cli.admin"),
    Noun("doctor", "check this installation: daemon, state directory, clock, zone data, space, capabilities",
         "edge.cli.doctor", absent=_NOT_SMALLEST.format("qledge doctor")),
    Noun("completion", "print a shell completion script: qledge completion bash|zsh|fish", "edge.cli.completion",
         absent=_NOT_SMALLEST.format("qledge completion")),
)
# What an optional capability adds to nouns it does not own: notification channels travel with
# an export and come from qinglong's settings (set as the noun module's NOTIFY when shipped).
HOOKS = {"export": "edge.cli.notify_import", "import": "edge.cli.notify_import"}
# `qledge import` takes a file, or names one of these sources (each its own verb).
IMPORT_SOURCES = ("file", "crontab", "qinglong")
_VALUED = ("--home", "--socket", "--config")  # the common options that take a value


def _load(module: str) -> ModuleType | None:
    """The module, or None when the build does not ship it (a missing dependency of it is raised)."""
    try:
        __import__(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None
    return sys.modules[module]


def _shipped(module: str) -> bool:
    """Whether the build (or the installation) has `module`, without importing it (its
    package is imported)."""
    parent = module.rpartition(".")[0]
    path = getattr(sys.modules[parent], "__path__", None) if parent else None
    return any(getattr(finder, "find_spec", None) and finder.find_spec(module, path) is not None
               for finder in sys.meta_path)


def _require(module: str) -> None:
    """Raise what importing `module` would (a missing dependency: one line naming its package)
    for a command that may not import it at all, without importing it."""
    if module not in sys.modules and not _shipped(module):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def _without_openssl_hashes() -> None:
    """Some commands import hashlib (the import planner's keys; edge.core.auth uses the builtin
    SHA-256 directly). Nothing the CLI runs needs OpenSSL's hashes: use CPython's builtin ones
    rather than map libcrypto (~3.5 MiB), as the daemon does (edge.app.lean.restrict_imports)."""
    if "hashlib" not in sys.modules and "hmac" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every noun, every verb and its options (for the tests and tools that
    walk it; a command builds only its own noun's)."""
    return _parser([], everything=True)


def _parser(words: list[str], everything: bool = False) -> argparse.ArgumentParser:
    """The parser for a command whose positional words are `words`: every noun listed, the
    named noun's verbs, the named verb's options."""
    import edge
    from edge.cli import shared

    _without_openssl_hashes()
    common = shared.common_options()
    parser = shared.parser_class()(
        prog="qledge", parents=[common],
        description="A minimal-footprint task runtime for routers and small boards.",
    )
    parser.add_argument("--version", action="version", version=f"qledge {edge.__version__}")
    nouns = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    chosen = words[0] if words else None
    for noun in NOUNS:
        if not everything and noun.name != chosen:
            if _offered(noun):
                nouns.add_parser(noun.name, help=noun.help)  # listed: its name and line are all --help shows
            continue
        module = _load(noun.module) if noun.module and (everything or _offered(noun)) else None
        if noun.module and module is None:
            if noun.absent is None:
                continue  # not offered in this build
            if not everything:
                raise shared.UsageError(noun.absent)
            nouns.add_parser(noun.name, help=noun.help)
            continue
        _add_noun(nouns, noun, module, words[1] if len(words) > 1 else None, everything, common)
    return parser


def _offered(noun: Noun) -> bool:
    """Whether this build serves `noun`: a noun of an optional capability is offered where the
    capability is available (edge.app.capabilities: the one table of which serves which noun),
    else where its module is shipped (a core noun the smallest build leaves out, too). Probes
    modules, imports none."""
    if noun.needs is None:
        return noun.absent is None or noun.module is None or _shipped(noun.module)
    from edge.app.capabilities import CAPABILITIES

    for capability in CAPABILITIES:
        if noun.name in capability.cli_nouns:
            return capability.available()
    return noun.module is None or _shipped(noun.module)


def _add_noun(nouns: shared.Subcommands, noun: Noun, module: ModuleType | None, verb: str | None,
              everything: bool, common: argparse.ArgumentParser) -> None:
    from edge.cli import shared

    declared = module.VERBS[noun.name] if module is not None else shared.Verb(noun.name, None)
    if isinstance(declared, shared.Verb):  # the noun is the verb: `qledge status`
        p = shared.add_verb(nouns, noun.name, declared.handler, noun.help, common)
        if declared.offline:
            p.set_defaults(offline=True)
        if declared.options is not None:
            declared.options(p)
        return
    verbs = nouns.add_parser(noun.name, help=noun.help).add_subparsers(
        dest=noun.dest, metavar=noun.metavar, required=True)
    for v in declared:
        p = shared.add_verb(verbs, v.name, v.handler, v.help, common)
        if v.offline:
            p.set_defaults(offline=True)
        if v.options is not None and (everything or v.name == verb):
            v.options(p)


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` is the task's command, untouched by argparse."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _words(argv: list[str]) -> list[str]:
    """The positional words (the noun, the verb, …): neither options nor the value of one."""
    found = []
    tokens = iter(argv)
    for token in tokens:
        if token in _VALUED:
            next(tokens, None)
        elif not token.startswith("-"):
            found.append(token)
    return found


def _first_word(argv: list[str]) -> str | None:
    """The noun: the first word that is neither an option nor the value of one."""
    words = _words(argv)
    return words[0] if words else None


def _import_file_alias(argv: list[str]) -> list[str]:
    """`qledge import FILE` is `qledge import file FILE`: a first argument that names no
    source is the file. Options before the verb that take a value are stepped over."""
    i, n = 0, len(argv)
    while i < n and argv[i].startswith("-"):
        i += 2 if argv[i] in _VALUED else 1
    if i >= n or argv[i] != "import":
        return argv
    j = i + 1
    while j < n and argv[j].startswith("-"):
        if argv[j] in ("-h", "--help"):
            return argv
        j += 2 if argv[j] in _VALUED else 1
    if j < n and argv[j] not in IMPORT_SOURCES:
        return [*argv[: i + 1], "file", *argv[i + 1 :]]
    return argv


def _asks_version(argv: list[str]) -> bool:
    """`qledge [common options] --version`: answered before anything is imported (argparse
    answers the rest: a verb first, help first, an abbreviation)."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--version":
            return True
        if token in _VALUED:
            next(tokens, None)
        elif token in ("-h", "--help", "--") or not token.startswith("-"):
            return False
    return False


def _plain(argv: list[str], verbs: tuple[str, ...] = ("serve", "status")) -> SimpleNamespace | None:
    """`serve` or `status` with the common options only, parsed without building the CLI
    (argparse costs the daemon ~0.5 MiB, and a status check most of its start).

    Returns None for anything unusual (help, other flags), which argparse then handles.
    """
    values: dict[str, str | bool | None] = {"config": None, "home": None, "socket": None, "json": False}
    verb = None
    tokens = iter(argv)
    for token in tokens:
        if token in verbs and verb is None:
            verb = token
            continue
        if token == "--json":
            values["json"] = True
            continue
        name, eq, inline = token.partition("=")
        key = name[2:] if name.startswith("--") else ""
        if key not in ("config", "home", "socket"):
            return None
        value = inline if eq else next(tokens, None)
        if not eq and (value is None or value.startswith("-")):
            return None
        values[key] = value
    if verb is None:
        return None
    from types import SimpleNamespace

    return SimpleNamespace(verb=verb, **values)


def _serve(args: argparse.Namespace | SimpleNamespace) -> int:
    from edge.app.lean import choose_loop, defer_hangups, import_msgspec, restrict_imports

    defer_hangups()  # first: a SIGHUP while starting must not end the daemon
    import_msgspec()  # before the config, which is the first to import it
    from edge import EXIT_USAGE
    from edge.app import config as cfg

    def report(code: str, message: str, as_json: bool) -> None:
        from edge.cli.shared import report as print_error  # on an error only: the daemon never needs the rest

        print_error(code, message, as_json)

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
            from edge.cli.shared import EXIT_USAGE, report

            report("invalid_argument", f"argument {ascii(arg)} is not valid UTF-8", as_json)
            return EXIT_USAGE
    try:
        return _main(argv, as_json)
    except ModuleNotFoundError as exc:
        if exc.name not in DEPENDENCIES:
            raise
        from edge.cli.shared import EXIT_USAGE, report

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
            from edge.cli.shared import EXIT_USAGE, report

            report("invalid_argument", _NO_WEB, as_json)
            return EXIT_USAGE
        return web(argv)
    if _asks_version(argv):
        import edge

        sys.stdout.write(f"qledge {edge.__version__}\n")
        return 0
    plain = _plain(argv)
    if plain is not None and plain.verb == "serve":
        return _serve(plain)
    try:
        return _dispatch(argv, plain)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # what a command may fail with becomes its one line; the rest is raised again
        return _failed(exc, as_json)


def _failed(exc: Exception, as_json: bool) -> int:
    """The error line and exit code of a command that failed (see edge.cli.shared)."""
    from edge.cli.shared import EXIT_OK, EXIT_TOOL, EXIT_UNREACHABLE, EXIT_USAGE, UsageError, exit_code, report
    from edge.transports.client import BadReply, CallFailed, Unreachable

    if isinstance(exc, UsageError):
        report("invalid_argument", str(exc), as_json)
        return EXIT_USAGE
    if isinstance(exc, Unreachable):
        report("unavailable", str(exc), as_json)
        return EXIT_UNREACHABLE
    if isinstance(exc, CallFailed):
        report(exc.code, exc.message, as_json)
        return exit_code(exc.code)
    if isinstance(exc, BadReply):
        report("internal", str(exc), as_json)
        return EXIT_TOOL
    if isinstance(exc, BrokenPipeError):
        return EXIT_OK
    raise exc


def _dispatch(argv: list[str], plain: SimpleNamespace | None) -> int:
    from edge.transports.client import Client

    if plain is not None:  # qledge status
        from edge.cli import admin

        args: argparse.Namespace | SimpleNamespace = plain
        handler = admin.status
        _check_tz()
    else:
        head, command = _split_command(_import_file_alias(argv))
        words = _words(head)
        parser = _parser(words)
        args = parser.parse_args(head)
        if command:
            if getattr(args, "command", None) is None:
                parser.error("`--` is only used by `task add` and `task update`")
            args.command = [*args.command, *command]
        args.json = getattr(args, "json", False)
        if args.verb == "serve":
            return _serve(args)
        if args.verb != "doctor":  # doctor reports a $TZ it does not know as one of its checks
            _check_tz()
        if getattr(args, "offline", False):
            return int(args.handler(args))
        if args.verb in HOOKS:
            owner = next(n.module for n in NOUNS if n.name == args.verb)
            setattr(sys.modules[owner or ""], "NOTIFY", _load(HOOKS[args.verb]))  # noqa: B010 (a module's)
        handler = args.handler
    # Every verb reads its reply with msgspec (status falls back on it): a Python without it
    # is told so before anything is asked of the daemon.
    _require("msgspec")
    path = _client_socket_for(args)
    with Client(path, token=os.environ.get("QLEDGE_TOKEN") or None) as client:
        # The handlers read attributes only: status takes the plain parse as well as argparse's.
        return int(handler(client, args))  # type: ignore[arg-type]


def _check_tz() -> None:
    """Times are printed in the local zone: a $TZ the C library does not know would make them
    silently UTC."""
    if os.environ.get("TZ"):  # unset or empty is fine, and costs no import
        from edge.app.config import tz_problem
        from edge.cli.shared import UsageError

        problem = tz_problem(os.environ.get("TZ"))
        if problem:
            raise UsageError(problem)


def _client_socket_for(args: argparse.Namespace | SimpleNamespace) -> str:
    """Where the daemon listens: --socket, $QLEDGE_SOCKET, else what its config file says
    (--config, $QLEDGE_CONFIG), resolved as the daemon resolves it, else client_socket()."""
    flag_socket, flag_home = getattr(args, "socket", None), getattr(args, "home", None)
    path = getattr(args, "config", None) or os.environ.get("QLEDGE_CONFIG")
    if not path or flag_socket or os.environ.get("QLEDGE_SOCKET"):
        return client_socket(flag_socket, flag_home)
    from edge.app import config as cfg
    from edge.cli.shared import UsageError

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
