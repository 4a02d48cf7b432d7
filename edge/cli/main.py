"""`qledge` entry point: argparse, dispatch, exit codes.

Exit codes: 0 ok, 1 tool error, 2 usage error, 3 daemon unreachable.
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


def _common() -> argparse.ArgumentParser:
    import argparse

    # SUPPRESS lets these flags appear before or after the verb without clobbering.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--home", default=argparse.SUPPRESS, help="state directory ($QLEDGE_HOME)")
    p.add_argument("--socket", default=argparse.SUPPRESS, help="tool socket path ($QLEDGE_SOCKET)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    return p


def _without_openssl_hashes() -> None:
    """The command modules import the tool modules, whose edge.core.auth imports hashlib and hmac.
    Nothing the CLI runs needs OpenSSL's hashes: use CPython's builtin ones rather than map
    libcrypto (~3.5 MiB), as the daemon does (edge.app.lean.restrict_imports)."""
    if "hashlib" not in sys.modules and "hmac" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    import argparse

    common = _common()
    parser = argparse.ArgumentParser(
        prog="qledge", parents=[common],
        description="A minimal-footprint task runtime for routers and small boards.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    def verb(sub: Subcommands, name: str, handler: Handler | None, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    serve = verb(verbs, "serve", None, "run the daemon in the foreground")
    serve.add_argument("--config", help="TOML configuration file (optional)")

    _without_openssl_hashes()
    from edge.cli import commands as c

    task = verbs.add_parser("task", help="manage tasks").add_subparsers(dest="action", metavar="ACTION", required=True)
    add = verb(task, "add", c.task_add, "add a task: qledge task add NAME [options] -- COMMAND [ARGS...]")
    add.add_argument("name", help="task id (letters, digits, . _ -)")
    add.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    add.add_argument("--timeout", type=float, metavar="S", help="kill the run after S seconds (default 3600)")
    add.add_argument("--env", action="append", default=[], metavar="K=V", help="environment variable")
    add.add_argument("--secret-env", action="append", default=[], metavar="K=SECRET",
                     help="environment variable taken from a stored secret")
    add.add_argument("--cwd", help="working directory (default: <home>/work)")
    add.add_argument("--shell", action="store_true", help="run COMMAND through /bin/sh -c")
    add.add_argument("--overlap", choices=("forbid", "allow", "replace"), default="forbid",
                     help="what a new run does while one is active (default forbid)")
    add.add_argument("--log-cap", type=int, metavar="BYTES", help="log cap for this task's runs")
    verb(task, "list", c.task_list, "list tasks")
    for action in ("get", "enable", "disable", "rm"):
        handler = {"get": c.task_get, "rm": c.task_rm}.get(action, c.task_toggle)
        p = verb(task, action, handler, f"{action} a task")
        p.add_argument("name", metavar="TASK")

    run = verbs.add_parser("run", help="start and inspect runs").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    start = verb(run, "start", c.run_start, "start a run of a task now")
    start.add_argument("task", metavar="TASK")
    start.add_argument("--wait", action="store_true", help="wait until it finishes; exit 1 unless it succeeded")
    lst = verb(run, "list", c.run_list, "list runs, newest first")
    lst.add_argument("--task", metavar="TASK")
    lst.add_argument("--limit", type=int, default=20, choices=range(1, 65), metavar="N", help="1..64 (default 20)")
    for action, handler, text in (("get", c.run_get, "show a run"), ("log", c.run_log, "print a run's log"),
                                  ("cancel", c.run_cancel, "cancel a run")):
        verb(run, action, handler, text).add_argument("run", metavar="RUN")

    _schedule_verbs(verbs, verb)
    _agent_verbs(verbs, verb)

    token = verbs.add_parser("token", help="API credentials").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    create = verb(token, "create", c.token_create, "create a credential; prints its token once")
    create.add_argument("--role", required=True, choices=("owner", "operator", "viewer"))
    create.add_argument("--name")
    create.add_argument("--permission", action="append", metavar="P",
                        help="restrict to this permission (repeatable)")
    verb(token, "list", c.token_list, "list credentials")
    verb(token, "revoke", c.token_revoke, "revoke a credential").add_argument("id", metavar="ID")

    secret = verbs.add_parser("secret", help="secrets for task environments (values are never shown)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    verb(secret, "set", c.secret_set, "store a secret; the value is read from stdin or a prompt, never argv"
         ).add_argument("name", metavar="NAME")
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


def _schedule_verbs(verbs: Subcommands, verb: Verb) -> None:
    from edge.cli import schedule_commands as s

    cron = verbs.add_parser("cron", help="cron expressions (offline)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    nxt = verb(cron, "next", s.cron_next, "print the next fire times of a cron expression (no daemon needed)")
    nxt.add_argument("expression", metavar="EXPR", help="5 fields, or 6 with seconds first; or @daily etc.")
    nxt.add_argument("--tz", metavar="TZ", help="IANA time zone (default: the device's, else UTC)")
    nxt.add_argument("--after", metavar="ISO8601", help="list fires after this time (default: now)")
    nxt.add_argument("--count", type=s.count, default=5, metavar="N", help="how many (1..1000, default 5)")
    nxt.set_defaults(offline=True)

    trigger = verbs.add_parser("trigger", help="manage cron triggers").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    add = verb(trigger, "add", s.trigger_add, "add a cron trigger: qledge trigger add TASK --cron EXPR")
    add.add_argument("task", metavar="TASK")
    add.add_argument("--cron", required=True, metavar="EXPR", help="5 fields, or 6 with seconds first")
    add.add_argument("--tz", metavar="TZ", help="IANA time zone (default: config `timezone`, the device's, UTC)")
    add.add_argument("--misfire", choices=("skip", "fire_once"), default="skip",
                     help="fires missed by more than 30s: skip them, or run the oldest once (default skip)")
    add.add_argument("--jitter", type=int, default=0, metavar="S", help="delay each run by a random 0..S seconds")
    add.add_argument("--id", metavar="ID", help="trigger id (default TASK-N)")
    verb(trigger, "list", s.trigger_list, "list triggers")
    for action, handler in (("get", s.trigger_get), ("enable", s.trigger_toggle), ("disable", s.trigger_toggle),
                            ("rm", s.trigger_rm)):
        verb(trigger, action, handler, f"{action} a trigger").add_argument("trigger", metavar="TRIGGER")
    repin = verb(trigger, "repin", s.trigger_repin, "pin a trigger to the task's current (or a given) revision")
    repin.add_argument("trigger", metavar="TRIGGER")
    repin.add_argument("--task-revision", type=int, metavar="N", help="pin to this task revision instead")
    events = verb(trigger, "events", s.trigger_events, "fires that were skipped or refused, newest first")
    events.add_argument("trigger", metavar="TRIGGER", nargs="?")
    events.add_argument("--limit", type=int, default=32, choices=range(1, 65), metavar="N", help="1..64 (default 32)")


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
    verb(agent, "get", c.agent_get, "one AI run's evidence record").add_argument("run", metavar="RUN")
    retry = verb(agent, "retry", c.agent_retry,
                 "start the next attempt of an AI run's mission (its ledger carries over)")
    retry.add_argument("run", metavar="RUN")
    retry.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    verb(agent, "mission", c.agent_mission, "an AI run's mission: attempts, specialists' constraints and work items"
         ).add_argument("run", metavar="RUN")


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
    from edge.app import config as cfg
    from edge.app.lean import choose_loop, restrict_imports

    try:
        config = cfg.load(args.config)
    except cfg.ConfigError as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loop = choose_loop(config.loop)
    restrict_imports(loop)
    home = cfg.resolve_home(getattr(args, "home", None), config)
    from edge.app.daemon import run_daemon

    socket_path = cfg.resolve_socket(getattr(args, "socket", None), config, home)
    config_path = os.path.abspath(args.config) if args.config else None
    return run_daemon(config, home, socket_path, loop, config_path=config_path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "mcp" in argv:  # the stdio bridge must not pay for argparse or msgspec
        from edge.cli.mcp_bridge import main as bridge

        code = bridge(argv)
        if code is not None:
            return code
    fast = _serve_fast_path(argv)
    if fast is not None:
        return _serve(fast)
    head, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(head)
    if command:
        if getattr(args, "command", None) is None:
            parser.error("`--` is only used by `task add`")
        args.command = [*args.command, *command]
    args.json = getattr(args, "json", False)
    if args.verb == "serve":
        return _serve(args)
    if getattr(args, "offline", False):
        return args.handler(args)
    return _client_verb(args)


def _client_verb(args: argparse.Namespace) -> int:
    from edge.cli.client import BadReply, CallFailed, Client, Unreachable
    from edge.cli.commands import UsageError

    path = client_socket(getattr(args, "socket", None), getattr(args, "home", None))
    try:
        with Client(path, token=os.environ.get("QLEDGE_TOKEN") or None) as client:
            return args.handler(client, args)
    except UsageError as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except CallFailed as exc:
        print(f"qledge: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_TOOL
    except BadReply as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return EXIT_TOOL
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


def client_socket(flag_socket: str | None, flag_home: str | None, system_dir: str | None = None) -> str:
    """--socket, $QLEDGE_SOCKET, else qledge.sock in the home (or a system daemon's: home_socket)."""
    from edge import SYSTEM_RUN_DIR, home_socket

    return flag_socket or os.environ.get("QLEDGE_SOCKET") or home_socket(
        "qledge.sock", flag_home, system_dir or SYSTEM_RUN_DIR)
