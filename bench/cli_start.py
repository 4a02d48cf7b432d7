"""What a `qledge` command costs to start: whole-process CPU against `python3 -c pass`.

Every command runs as a process of its own, and on a router CPU its start (the interpreter,
the imports, compiling what has no bytecode) is most of what a person waits for. The figure
is the process's user + system CPU as the kernel accounts it (`wait4`'s rusage), which a
loaded machine disturbs far less than wall time. The sides are interleaved (pass, status,
version, pass, …) and each command's ratio is taken pair by pair against the `pass` of its
own round, so a burst of load shifts both sides of a ratio alike.

    python bench/cli_start.py [--python PY] [--pyz PYZ] [--rounds N]

starts a daemon of its own for `status` and prints the figures as JSON.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any


def cpu_ms(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Run `argv` to its end, its output discarded; (user + system CPU in ms, exit status)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
    finally:
        os.close(devnull)
    _, status, usage = os.wait4(pid, 0)
    return (usage.ru_utime + usage.ru_stime) * 1000, os.waitstatus_to_exitcode(status)


def _spread(values: list[float], digits: int = 2) -> dict[str, float]:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


def measure(commands: dict[str, list[str]], env: dict[str, str], rounds: int = 15,
            floor: str = "pass") -> dict[str, Any]:
    """CPU ms of each command over `rounds` interleaved rounds, and each one's ratio to
    `commands[floor]` of the same round. A command that fails is an error, not a figure."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    ratios: dict[str, list[float]] = {name: [] for name in commands if name != floor}
    names = list(commands)
    for n in range(rounds + 1):
        order = names[n % len(names):] + names[:n % len(names)]  # who goes first moves round by round
        taken: dict[str, float] = {}
        for name in order:
            ms, code = cpu_ms(commands[name], env)
            if code != 0:
                raise RuntimeError(f"{name}: {commands[name]} exited {code}")
            taken[name] = ms
        if n == 0:
            continue  # a warm-up round: the page cache, the bytecode caches
        for name, ms in taken.items():
            samples[name].append(ms)
            if name != floor:
                ratios[name].append(ms / max(taken[floor], 0.001))
    return {"rounds": rounds, "cpu_ms": {k: _spread(v) for k, v in samples.items()},
            "ratio_to_" + floor: {k: _spread(v) for k, v in ratios.items()}}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(os.path.dirname(here), "tests")]
    from daemons import install_venv
    from support import DaemonProcess

    parser = argparse.ArgumentParser(description="qledge status / --version CPU against python3 -c pass")
    parser.add_argument("--python", help="the interpreter of a qledge install (default: a fresh install of this tree)")
    parser.add_argument("--pyz", help="a zipapp to measure too, run by that interpreter")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    python = args.python or install_venv()
    qledge = os.path.join(os.path.dirname(python), "qledge")
    daemon = DaemonProcess(argv=[python, "-P", "-m", "edge"])
    daemon.env = {k: v for k, v in daemon.env.items() if not k.startswith(("QLEDGE_", "PYTHON"))}
    daemon.env["QLEDGE_HOME"] = daemon.home
    daemon.start()
    try:
        commands = {"pass": [python, "-c", "pass"], "status": [qledge, "status"], "version": [qledge, "--version"],
                    "help": [qledge, "--help"], "run_help": [qledge, "run", "--help"]}
        if args.pyz:
            commands.update({"pyz_status": [python, args.pyz, "status"],
                             "pyz_version": [python, args.pyz, "--version"]})
        print(json.dumps(measure(commands, daemon.env, args.rounds), indent=2))
    finally:
        daemon.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
