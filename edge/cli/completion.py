"""`qledge completion bash|zsh|fish`: a completion script generated from the parser itself
(every noun, verb and option of this build), so it cannot drift from the commands.

Task, run and trigger ids are completed by asking the daemon: the script runs the hidden
`qledge completion --list tasks` (runs, triggers), which prints one id a line and prints
nothing, quietly, when the daemon is not there or does not answer within a second. zsh uses
the bash script through bashcompinit; fish gets its own `complete` lines.
"""

from __future__ import annotations

import sys

from edge import EXIT_OK, EXIT_USAGE
from edge.cli.shared import Verb

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

SHELLS = ("bash", "zsh", "fish")
LISTS = {"tasks": "qledge.task.list", "runs": "qledge.run.list", "triggers": "qledge.trigger.list"}
LIST_TIMEOUT_S = 1.0
# A positional argument of this metavar is completed from the daemon (the list's name).
_DYNAMIC = {"TASK": "tasks", "RUN": "runs", "TRIGGER": "triggers"}
_FILES = ("FILE", "PATH", "FILE|-", "DIR")


class Command:
    """One completable command line prefix (`task`, `task add`): its sub-words, its options
    (and which take a value), and what each positional argument is."""

    __slots__ = ("path", "help", "words", "options", "valued", "args", "repeats")

    def __init__(self, path: tuple[str, ...], help: str) -> None:
        self.path, self.help = path, help
        self.words: list[tuple[str, str]] = []  # (verb, help)
        self.options: list[tuple[str, str, bool]] = []  # (option, help, takes a value)
        self.valued: set[str] = set()
        self.args: list[str] = []  # per positional: tasks|runs|triggers|file|w:a,b|-
        self.repeats = False  # the last positional takes many values


def commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """Every noun and verb of the parser (the whole CLI's by default), parents first."""
    import argparse

    if parser is None:
        from edge.cli.main import build_parser

        parser = build_parser()
    found: list[Command] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...], help: str) -> None:
        cmd = Command(path, help)
        found.append(cmd)
        subs: list[tuple[str, str, argparse.ArgumentParser]] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help or "" for c in action._choices_actions}
                subs = [(n, helps.get(n, ""), s) for n, s in action.choices.items()]
            elif action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            elif action.option_strings:
                takes = action.nargs != 0
                for option in action.option_strings:
                    if option.startswith("--"):
                        cmd.options.append((option, " ".join((action.help or "").split()), takes))
                    if takes:
                        cmd.valued.add(option)
            else:
                cmd.args.append(_kind(action))
                cmd.repeats = action.nargs in ("*", "+", argparse.REMAINDER)
        cmd.words = [(n, h) for n, h, _ in subs]
        for name, sub_help, sub in subs:
            walk(sub, (*path, name), sub_help)

    walk(parser, (), "")
    return found


def _kind(action: argparse.Action) -> str:
    if action.choices:
        return "w:" + ",".join(str(c) for c in action.choices)
    metavar = str(action.metavar or "")
    if metavar in _DYNAMIC:
        return _DYNAMIC[metavar]
    return "file" if metavar in _FILES else "-"


# -- bash (and zsh through bashcompinit) ----------------------------------------------------

_BASH_BODY = r'''_qledge() {
    [ -n "${ZSH_VERSION-}" ] && setopt localoptions ksharrays
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" w i skip="" words=() conn=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if [ -n "$skip" ]; then
            case "$skip" in --home|--socket|--config) conn+=("$skip" "$w") ;; esac
            skip=""
            continue
        fi
        case "$w" in
            --) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
            --*=*) ;;
            -*) _qledge_valued "$w" && skip="$w" ;;
            *) words+=("$w") ;;
        esac
    done
    if [ -n "$skip" ]; then
        case "$skip" in
            --home|--socket|--config|--file|--out|--cwd) COMPREPLY=($(compgen -f -- "$cur")) ;;
            *) COMPREPLY=($(compgen -W "$(_qledge_choices "$skip")" -- "$cur")) ;;
        esac
        return 0
    fi
    local path="" n=${#words[@]} verbs
    if [ "$n" -eq 0 ]; then
        case "$cur" in
            -*) COMPREPLY=($(compgen -W "$_qledge_common --version --help" -- "$cur")) ;;
            *) COMPREPLY=($(compgen -W "$_qledge_nouns" -- "$cur")) ;;
        esac
        return 0
    fi
    path="${words[0]}"
    n=$((n - 1))
    verbs="$(_qledge_verbs "$path")"
    if [ -n "$verbs" ]; then
        if [ "$n" -eq 0 ]; then
            case "$cur" in
                -*) COMPREPLY=($(compgen -W "$_qledge_common --help" -- "$cur")) ;;
                *) COMPREPLY=($(compgen -W "$verbs" -- "$cur")) ;;
            esac
            return 0
        fi
        path="$path ${words[1]}"
        n=$((n - 1))
    fi
    case "$cur" in
        -*) COMPREPLY=($(compgen -W "$(_qledge_options "$path") $_qledge_common --help" -- "$cur")); return 0 ;;
    esac
    local kinds=($(_qledge_args "$path")) kind=""
    if [ "$n" -lt "${#kinds[@]}" ]; then
        kind="${kinds[n]}"
    elif [ "${#kinds[@]}" -gt 0 ] && [ -n "$(_qledge_repeats "$path")" ]; then
        kind="${kinds[${#kinds[@]}-1]}"
    fi
    case "$kind" in
        tasks|runs|triggers)
            COMPREPLY=($(compgen -W "$(qledge completion --list "$kind" "${conn[@]}" 2>/dev/null)" -- "$cur")) ;;
        file) COMPREPLY=($(compgen -f -- "$cur")) ;;
        w:*) COMPREPLY=($(compgen -W "$(echo "${kind#w:}" | tr , ' ')" -- "$cur")) ;;
    esac
    return 0
}
complete -F _qledge qledge
'''


def _case(name: str, rows: list[tuple[str, str]]) -> str:
    """A shell function that echoes the value of its argument's row."""
    lines = [f"{name}() {{", '    case "$1" in']
    lines += [f"        {_quote(key)}) echo {_quote(value)} ;;" for key, value in rows if value]
    lines += ["    esac", "}"]
    return "\n".join(lines)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash(cmds: list[Command]) -> str:
    root = cmds[0]
    common = sorted({o for o, _, _ in root.options if o not in ("--version",)})
    valued = sorted({o for c in cmds for o in c.valued})
    verbs = [(c.path[0], " ".join(w for w, _ in c.words)) for c in cmds if len(c.path) == 1]
    leaves = [c for c in cmds if c.path and not c.words]
    options = [(" ".join(c.path), " ".join(o for o, _, _ in c.options if o not in common)) for c in leaves]
    args = [(" ".join(c.path), " ".join(c.args)) for c in leaves]
    repeats = [(" ".join(c.path), "1") for c in leaves if c.repeats]
    valued_case = "\n".join([
        "_qledge_valued() {", '    case "$1" in', f"        {'|'.join(valued)}) return 0 ;;", "    esac",
        "    return 1", "}"])
    return "\n".join([
        "# qledge completion for bash: generated by `qledge completion bash` from its parser.",
        "# Load it with: source <(qledge completion bash)",
        f"_qledge_nouns={_quote(' '.join(w for w, _ in root.words))}",
        f"_qledge_common={_quote(' '.join(common))}",
        valued_case,
        _case("_qledge_choices", sorted(_OPTION_CHOICES.items())),
        _case("_qledge_verbs", verbs),
        _case("_qledge_options", options),
        _case("_qledge_args", args),
        _case("_qledge_repeats", repeats),
        _BASH_BODY,
    ])


# The values of options that take one of a few (`--role owner operator viewer`), by option.
_OPTION_CHOICES: dict[str, str] = {}


def _collect_choices(parser: argparse.ArgumentParser) -> None:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _collect_choices(sub)
        elif action.option_strings and action.choices and action.nargs != 0 and len(list(action.choices)) <= 20:
            for option in action.option_strings:
                _OPTION_CHOICES.setdefault(option, " ".join(str(c) for c in action.choices))


def zsh(cmds: list[Command]) -> str:
    return "\n".join([
        "# qledge completion for zsh (through bashcompinit): generated by `qledge completion zsh`.",
        "# Load it with: source <(qledge completion zsh)   (after compinit)",
        "autoload -U +X bashcompinit && bashcompinit",
        bash(cmds).split("\n", 2)[2],
    ])


# -- fish -----------------------------------------------------------------------------------


def fish(cmds: list[Command]) -> str:
    root = cmds[0]
    nouns = " ".join(w for w, _ in root.words)
    lines = ["# qledge completion for fish: generated by `qledge completion fish` from its parser.",
             "complete -c qledge -f"]
    for option, text, takes in root.options:
        lines.append(f"complete -c qledge -l {option[2:]}{' -r' if takes else ''} -d {_quote(text[:80])}")
    for noun, text in root.words:
        lines.append(f"complete -c qledge -n 'not __fish_seen_subcommand_from {nouns}' -a {noun}"
                     f" -d {_quote(text[:80])}")
    for c in cmds[1:]:
        seen = " ".join(f"; and __fish_seen_subcommand_from {w}" for w in c.path)[6:]
        if c.words:
            verbs = " ".join(w for w, _ in c.words)
            for verb, text in c.words:
                lines.append(f"complete -c qledge -n '{seen}; and not __fish_seen_subcommand_from {verbs}'"
                             f" -a {verb} -d {_quote(text[:80])}")
            continue
        for option, text, takes in c.options:
            if any(option == o for o, _, _ in root.options):
                continue
            values = f" -x -a {_quote(_OPTION_CHOICES[option])}" if takes and option in _OPTION_CHOICES else (
                " -r" if takes else "")
            lines.append(f"complete -c qledge -n '{seen}' -l {option[2:]}{values} -d {_quote(text[:80])}")
        for kind in dict.fromkeys(c.args):
            if kind in LISTS:
                lines.append(f"complete -c qledge -n '{seen}' -a '(qledge completion --list {kind} 2>/dev/null)'")
            elif kind == "file":
                lines.append(f"complete -c qledge -n '{seen}' -F")
            elif kind.startswith("w:"):
                lines.append(f"complete -c qledge -n '{seen}' -a {_quote(' '.join(kind[2:].split(',')))}")
    return "\n".join(lines) + "\n"


# -- the command ------------------------------------------------------------------------------


def script(shell: str) -> str:
    from edge.cli.main import build_parser

    parser = build_parser()
    _collect_choices(parser)
    cmds = commands(parser)
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](cmds)


def listing(kind: str, args: argparse.Namespace) -> list[str]:
    """The ids (and, for tasks, the names) the daemon lists; [] on any trouble."""
    import os

    from edge.cli.main import _client_socket_for
    from edge.transports.client import Client

    with Client(_client_socket_for(args), token=os.environ.get("QLEDGE_TOKEN") or None,
                timeout_s=LIST_TIMEOUT_S) as c:
        reply = c.call(LISTS[kind], {})
    items = reply.get(kind, []) if isinstance(reply, dict) else []
    words: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        for key in ("id", "name") if kind == "tasks" else ("id",):
            value = item.get(key)
            if isinstance(value, str) and value and not any(ch.isspace() for ch in value) and value not in words:
                words.append(value)
    return words


def completion(args: argparse.Namespace) -> int:
    if args.list:
        try:
            words = listing(args.list, args)
        except Exception:  # completion must never print an error into a prompt
            return EXIT_OK
        sys.stdout.write("".join(w + "\n" for w in words))
        return EXIT_OK
    if args.shell is None:
        from edge.cli.shared import UsageError

        raise UsageError("name a shell: qledge completion bash, zsh or fish")
    sys.stdout.write(script(args.shell))
    return EXIT_OK if args.shell in SHELLS else EXIT_USAGE


def _options(p: argparse.ArgumentParser) -> None:
    import argparse

    p.add_argument("shell", nargs="?", choices=SHELLS, help="the shell to print the script for")
    p.add_argument("--list", choices=tuple(LISTS), help=argparse.SUPPRESS)


VERBS = {"completion": Verb("completion", completion,
                            "print a shell completion script: qledge completion bash|zsh|fish", _options, offline=True)}
