"""Shared by the benchmarks: an honest install of qledge, daemons started from it, /proc readings.

Memory figures must come from a regular (non-editable) install: the editable finder alone
costs ~1.5 MiB. So the benchmarks build a virtualenv with `pip install <repo>`, cached by
a hash of the sources, and run its interpreter.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from support import DaemonProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "latest.json")
CACHE = os.environ.get("QLEDGE_BENCH_CACHE") or os.path.join(tempfile.gettempdir(), "qledge-bench-cache")
MiB = 1 << 20


def source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "edge", "**", "*.py"), recursive=True)) + sorted(
        glob.glob(os.path.join(ROOT, "edge", "web", "static", "*"))) + [os.path.join(ROOT, "pyproject.toml"),
                                                                  os.path.join(ROOT, "packaging", "qledge")]:
        digest.update(os.path.relpath(path, ROOT).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def _pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
                   check=True, timeout=600)


def install_venv() -> str:
    """A venv with qledge installed from this tree (not editable); its python. Cached."""
    venv = os.path.join(CACHE, f"venv-{source_digest()}")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, ".complete")):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    os.makedirs(CACHE, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    _pip(python, ROOT)
    open(os.path.join(venv, ".complete"), "w").close()
    return python


def uvloop_path() -> str:
    """A directory holding uvloop, put on PYTHONPATH for the uvloop variant. Cached."""
    target = os.path.join(CACHE, f"uvloop-py{sys.version_info.major}{sys.version_info.minor}")
    if not os.path.exists(os.path.join(target, ".complete")):
        shutil.rmtree(target, ignore_errors=True)
        _pip(sys.executable, "--target", target, "uvloop")
        open(os.path.join(target, ".complete"), "w").close()
    return target


class BenchDaemon(DaemonProcess):
    """A daemon run by another interpreter (the benchmark venv), in a clean environment."""

    def __init__(self, python: str, config: str | None = None, env: dict[str, str] | None = None) -> None:
        # -P: `python -m` would otherwise put the cwd (maybe this checkout) before the install.
        super().__init__(config=config, argv=[python, "-P", "-m", "edge"])
        # Nothing from this (test) environment may change what the measured daemon imports.
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("QLEDGE_", "PYTHON"))}
        self.env.update({"QLEDGE_HOME": self.home, **(env or {})})


def unit_environment(unit: str = os.path.join(ROOT, "packaging", "systemd", "qledge.service")) -> dict[str, str]:
    """The variables the systemd unit sets for the daemon, but for its paths (QLEDGE_*, which
    name systemd's directories): the daemon measured as that unit starts it."""
    env: dict[str, str] = {}
    with open(unit) as f:
        for line in f:
            key, eq, value = line.strip().partition("=")
            if eq and key == "Environment":
                env.update(item.split("=", 1) for item in value.split())
    return {k: v for k, v in env.items() if not k.startswith("QLEDGE_")}


# -- /proc readings --------------------------------------------------------------------


def _kv(path: str) -> dict[str, str]:
    values: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            values[key.strip()] = rest.strip()
    return values


def memory(pid: int) -> dict[str, float]:
    """VmHWM, VmRSS, RssAnon, RssFile from status and Pss from smaps_rollup, in MiB."""
    status = _kv(f"/proc/{pid}/status")
    out = {k: int(status[k].split()[0]) / 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
    with contextlib.suppress(OSError, KeyError):  # smaps_rollup needs Linux 4.14
        out["Pss"] = int(_kv(f"/proc/{pid}/smaps_rollup")["Pss"].split()[0]) / 1024
    return {k: round(v, 2) for k, v in out.items()}


def context_switches(pid: int) -> dict[str, int]:
    """Voluntary and involuntary switches summed over all the process's threads."""
    total = {"voluntary": 0, "nonvoluntary": 0, "threads": 0}
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            values = _kv(status)
        except OSError:
            continue  # a thread that just ended
        total["voluntary"] += int(values["voluntary_ctxt_switches"])
        total["nonvoluntary"] += int(values["nonvoluntary_ctxt_switches"])
        total["threads"] += 1
    return total


def io_counters(pid: int) -> dict[str, int]:
    return {k: int(v) for k, v in _kv(f"/proc/{pid}/io").items()}


# -- results ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }


def record(section: str, data: dict[str, Any]) -> None:
    """Merge one section into bench/results/latest.json (budgets and speed write separately).

    The section names the machine it was measured on: sections are re-measured one at a time,
    not always on the machine the others were."""
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    try:
        with open(RESULTS) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}
    results["machine"] = machine()
    results[section] = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "machine": results["machine"], **data}
    with open(RESULTS + ".tmp", "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(RESULTS + ".tmp", RESULTS)
