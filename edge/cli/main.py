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


def _without_openssl_hashes() -> None:
    """The command modules reach hashlib (edge.core.imports, through the import commands).
    Nothing the CLI runs needs OpenSSL's hashes: use CPython's builtin ones rather than map
    libcrypto (~3.5 MiB), as the daemon does (edge.app.lean.restrict_imports)."""
    if "hashlib" not in sys.modules and "hmac" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (edge.cli.commands.build_parser), which `serve` never loads."""
    _without_openssl_hashes()
    from edge.cli.commands import build_parser as build

    return build()


# `qledge import` takes a file, or names one of these sources (each its own subcommand).
IMPORT_SOURCES = ("file", "crontab", "qinglong")


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


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` is the task's command, untouched by argparse."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


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
