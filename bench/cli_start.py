"""What a `qledge` command costs to start: whole-process CPU against `python3 -c pass`.

Every command runs as a process of its own, and on a router CPU its start (the interpreter,
the imports, compiling what has no bytecode) is most of what a person waits for. The figure
is the process's user + system CPU as the kernel accounts it (`wait4`'s rusage), which a
loaded machine disturbs far less than wall time. The sides are interleaved (pass, status,
version, pass, …) and each command's ratio is taken pair by pair against the `pass` of its
own round, so a burst of load shifts both sides of a ratio alike.

    python bench/cli_start.py [--python PY] [--rounds N]

starts a daemon of its own for `status`, measures the launcher pip installs (`bin/qledge`),
`python -m edge` (how the CLI started on OpenWrt before its launcher ran it with -c) and the
`edge` and `full` zipapps run by the same interpreter, records the figures in
bench/results/latest.json (section `cli_start`) and prints them as JSON.
bench/test_budgets.py holds the ratios to their goals.
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


MAIN = "from edge.cli.main import main; raise SystemExit(main())"  # the OpenWrt launcher's -c


def _zipapp(profile: str, python: str, out: str) -> str:
    """Build the profile's zipapp with bytecode for `python` where the profile carries any."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(os.path.dirname(here), "packaging", "build.py")
    subprocess.run([sys.executable, build, "--profile", profile, "--out", out, "--python", python],
                   check=True, capture_output=True, timeout=300)
    return os.path.join(out, f"qledge-{profile}.pyz")


def measure_install(python: str, rounds: int = 15, zipapps: bool = True) -> dict[str, Any]:
    """The figures for a qledge installed in `python`'s environment, against a daemon of its own."""
    import shutil
    import tempfile

    from daemons import BenchDaemon

    qledge = os.path.join(os.path.dirname(python), "qledge")
    out = tempfile.mkdtemp(prefix="qlcli")
    daemon = BenchDaemon(python).start()
    try:
        # -P: with -c or -m the current directory (maybe this checkout) would come before the install.
        commands = {"pass": [python, "-c", "pass"], "status": [qledge, "status"], "version": [qledge, "--version"],
                    "help": [qledge, "--help"], "run_help": [qledge, "run", "--help"],
                    "c_status": [python, "-P", "-c", MAIN, "status"],
                    "c_version": [python, "-P", "-c", MAIN, "--version"],
                    "m_status": [python, "-P", "-m", "edge", "status"],
                    "m_version": [python, "-P", "-m", "edge", "--version"]}
        if zipapps:
            for profile in ("edge", "full"):
                pyz = _zipapp(profile, python, out)
                commands[f"pyz_{profile}_status"] = [python, pyz, "status"]
                commands[f"pyz_{profile}_version"] = [python, pyz, "--version"]
        return measure(commands, daemon.env, rounds)
    finally:
        daemon.cleanup()
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(os.path.dirname(here), "tests")]
    from daemons import install_venv, record

    parser = argparse.ArgumentParser(description="qledge status / --version CPU against python3 -c pass")
    parser.add_argument("--python", help="the interpreter of a qledge install (default: a fresh install of this tree)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    figures = measure_install(args.python or install_venv(), args.rounds)
    record("cli_start", figures)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
