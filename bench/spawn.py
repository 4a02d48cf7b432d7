"""Starting runs, against the floor, side by side (run as root; `python bench/spawn.py`):

- `run.start` → child exec: from the call being sent to the kernel opening the task's
  program for exec (inotify IN_OPEN on a private copy of `true`), one run at a time, the
  child switching to `nobody`; the floor is asyncio's own spawn of the same program as
  `nobody` (create_subprocess_exec, from the call to the exec), in a fresh interpreter.
- back-to-back `true` runs/s, the child switching to `nobody`, 2 at a time: qledge
  (run.start all, then run.wait all) against ../shared/tools/floor/floor_runs.py with and
  without `nobody` (one durable insert, spawn, wait, one durable update per run), and the
  CPU each side's own process spent per run (its threads, not its children; steadier than
  wall time on a busy machine).
- the same runs of tasks that use a secret, so that each runs as a uid of its own ([runner]
  dynamic_uids, with its own HOME and data directory): runs/s and the daemon's CPU per run,
  and what the own uid adds to a run's CPU.
- the spawn alone (edge.runner.process.spawn of `true`, as `nobody` and without a switch, one
  after another in a fresh interpreter): CPU and wall time per spawn, and the loop's busy
  time per spawn (outside its selector's wait): the stall every other call and run sees.

The sides are interleaved (their order alternates by repetition) and the ratios taken pair
by pair; figures are min/median/max over the repetitions. `--tree DIR` measures the qledge
of another checkout (e.g. a worktree of an older commit) with this interpreter.
Writes bench/results/spawn.json (or --out).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]

from daemons import machine  # noqa: E402
from support import DaemonProcess  # noqa: E402

# ../shared/tools/floor beside the checkout (or beside the folder of worktrees it is in).
FLOOR = os.environ.get("QLEDGE_FLOOR_DIR") or next(
    (d for d in (os.path.join(os.path.dirname(ROOT), *up, "shared", "tools", "floor") for up in ((), ("..",)))
     if os.path.isdir(d)), os.path.join(os.path.dirname(ROOT), "shared", "tools", "floor"))
IN_OPEN = 0x20
TASKS = ("b1", "b2", "b3", "b4")
# The same tasks with a secret in their environment: each runs as a uid of its own ([runner]
# dynamic_uids), with its own HOME and data directory; the difference is what that costs a run.
OWN_UID_TASKS = ("s1", "s2", "s3", "s4")  # retention keeps 100 runs a task: none is pruned before it is waited for

FLOOR_SPAWN = r"""
import asyncio, pwd, sys, time
exe, n = sys.argv[1], int(sys.argv[2])
pw = pwd.getpwnam("nobody")
async def main():
    for _ in range(n):
        t0 = time.perf_counter()
        p = await asyncio.create_subprocess_exec(exe, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                                                 start_new_session=True)
        print(t0, time.perf_counter() - t0, flush=True)
        await p.wait()
        await asyncio.sleep(0.02)
asyncio.run(main())
"""


# The spawn alone, in a fresh interpreter with the measured tree's edge.runner.process: CPU
# of the whole process per spawn (all threads), wall time, and the loop's busy time per spawn
# (wall time outside the selector's wait: what a stalled loop takes from every other call).
SPAWN_ALONE = r"""
import asyncio, json, pwd, resource, sys, time
from edge.core.tasks import RunAs
from edge.runner import process
nb = pwd.getpwnam("nobody")
users = {"nobody": RunAs(user="nobody", uid=nb.pw_uid, gid=nb.pw_gid, groups=(), switch=True, privileged=None),
         "no_switch": None}
env = {"PATH": process.DEFAULT_PATH}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
async def one(run_as):
    child = await process.spawn(["true"], "/", env, run_as)
    await child.stdout.read()
    await child.wait()
async def main(n):
    loop, out, idle = asyncio.get_running_loop(), {}, [0.0]
    select = loop._selector.select
    def waiting(timeout=None):  # the loop is free while it waits here
        t = time.perf_counter()
        try:
            return select(timeout)
        finally:
            idle[0] += time.perf_counter() - t
    loop._selector.select = waiting
    for name, run_as in users.items():
        for _ in range(10):
            await one(run_as)
        c0, t0, i0 = cpu(), time.perf_counter(), idle[0]
        for _ in range(n):
            await one(run_as)
        wall = time.perf_counter() - t0
        out[name] = {"cpu_us": (cpu() - c0) / n * 1e6, "wall_us": wall / n * 1e6,
                     "loop_busy_us": (wall - (idle[0] - i0)) / n * 1e6}
    print(json.dumps(out))
asyncio.run(main(int(sys.argv[1])))
"""


def spawn_alone(python: str, tree: str | None, n: int) -> dict[str, float]:
    """The figures of SPAWN_ALONE, by `python` (with `tree` first on its path, if given)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-P", "-c", SPAWN_ALONE, str(n)], capture_output=True, text=True, check=True,
                         env={**env, "PYTHONPATH": tree} if tree else env)
    return {f"spawn_{user}_{k}": v for user, figures in json.loads(out.stdout).items() for k, v in figures.items()}


class ExecWatch:
    """Times (perf_counter, system-wide CLOCK_MONOTONIC) at which `path` is opened for exec."""

    def __init__(self, path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_CLOEXEC)
        if self._fd < 0 or libc.inotify_add_watch(self._fd, path.encode(), IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify")
        self.times: list[float] = []
        self.seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            data = os.read(self._fd, 4096)
            now = time.perf_counter()
            with self.seen:
                self.times.extend([now] * (len(data) // 16))  # no name: 16 bytes an event
                self.seen.notify_all()

    def after(self, t0: float, timeout: float = 10.0) -> float:
        """The first exec at or after t0."""
        deadline = time.perf_counter() + timeout
        with self.seen:
            while True:
                found = [t for t in self.times if t >= t0]
                if found:
                    return found[0]
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError("no exec seen")
                self.seen.wait(left)


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


def qledge_exec_ms(daemon: DaemonProcess, watch: ExecWatch, n: int) -> float:
    samples = []
    with daemon.client() as client:
        for _ in range(n):
            t0 = time.perf_counter()
            run = client.call("qledge.run.start", {"taskId": "exec"})
            samples.append((watch.after(t0) - t0) * 1000)
            client.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 60_000})
            time.sleep(0.02)
    return statistics.median(samples)


def floor_exec_ms(python: str, exe: str, watch: ExecWatch, n: int) -> tuple[float, float]:
    out = subprocess.run([python, "-c", FLOOR_SPAWN, exe, str(n)], capture_output=True, text=True, check=True)
    lines = [line.split() for line in out.stdout.splitlines()]
    to_exec = [(watch.after(float(t0)) - float(t0)) * 1000 for t0, _ in lines]
    awaited = [float(d) * 1000 for _, d in lines]
    return statistics.median(to_exec), statistics.median(awaited)


def qledge_runs_per_s(daemon: DaemonProcess, n: int, tasks: tuple[str, ...] = TASKS) -> float:
    from edge.cli.client import CallFailed

    with daemon.client() as client:
        started = time.perf_counter()
        ids: list[str] = []
        while len(ids) < n:
            try:
                ids.append(client.call("qledge.run.start", {"taskId": tasks[len(ids) % len(tasks)]})["id"])
            except CallFailed as exc:
                if exc.code != "resource_exhausted":
                    raise
                time.sleep(0.005)
        statuses = [client.call("qledge.run.wait", {"runId": i, "timeoutMs": 60_000})["run"]["status"] for i in ids]
        elapsed = time.perf_counter() - started
    assert statuses == ["succeeded"] * n, statuses
    return n / elapsed


# The floor's own CPU (its threads, not its children), printed after its runs/s.
FLOOR_CPU = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__');"
             " r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)")


def floor_runs(python: str, scratch: str, n: int, user: str | None) -> tuple[float, float]:
    """Runs/s, and the seconds of CPU the floor's process used in all (start-up included)."""
    db = os.path.join(scratch, "floor.db")
    argv = [python, "-c", FLOOR_CPU, os.path.join(FLOOR, "floor_runs.py"), db, str(n), "2", *([user] if user else [])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads, ended ones too; not its children)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=ROOT, help="the checkout whose qledge is measured")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--execs", type=int, default=30)
    parser.add_argument("--spawns", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "spawn.json"))
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: both sides switch the child to nobody")
    python = sys.executable
    scratch = tempfile.mkdtemp(prefix="qlsp", dir="/tmp")
    os.chmod(scratch, 0o755)
    exe = shutil.copy("/bin/true", os.path.join(scratch, "true"))
    os.chmod(exe, 0o755)
    watch = ExecWatch(exe)
    tree = os.path.abspath(opts.tree)
    daemon = DaemonProcess(config="[runner]\nconcurrency = 2\nqueue_limit = 1024\n",
                           env={"PYTHONPATH": tree}, argv=[python, "-P", "-m", "edge"])
    daemon.start()
    reps: list[dict[str, float]] = []
    try:
        with daemon.client() as client:
            client.call("qledge.task.create", {"taskId": "exec", "spec": {
                "command": {"kind": "argv", "file": exe}, "overlap": "allow"}})
            for task in TASKS:
                client.call("qledge.task.create", {"taskId": task, "spec": {
                    "command": {"kind": "argv", "file": "true"}, "overlap": "allow"}})
            client.call("qledge.secret.set", {"name": "BENCH_S", "value": "bench-secret-value"})
            for task in OWN_UID_TASKS:
                client.call("qledge.task.create", {"taskId": task, "spec": {
                    "command": {"kind": "argv", "file": "true"}, "overlap": "allow",
                    "env": {"S": {"secret": "BENCH_S"}}}})
        qledge_runs_per_s(daemon, 8, OWN_UID_TASKS)  # each task's uid allocated before the count
        qledge_exec_ms(daemon, watch, 5)  # warm up both sides
        floor_exec_ms(python, exe, watch, 5)
        # What the floor's process costs without runs (start-up, the database): taken off its CPU per run.
        idle = {user: statistics.median(floor_runs(python, scratch, 0, user)[1] for _ in range(3))
                for user in ("nobody", None)}
        for rep in range(opts.reps):
            order = [0, 1] if rep % 2 == 0 else [1, 0]
            got: dict[str, float] = {}
            for side in order:
                if side == 0:
                    got["qledge_exec_ms"] = qledge_exec_ms(daemon, watch, opts.execs)
                    cpu0 = cpu_s(daemon.pid)
                    got["qledge_runs_per_s"] = qledge_runs_per_s(daemon, opts.runs)
                    got["qledge_cpu_ms_per_run"] = (cpu_s(daemon.pid) - cpu0) / opts.runs * 1000
                    cpu0 = cpu_s(daemon.pid)
                    got["own_uid_runs_per_s"] = qledge_runs_per_s(daemon, opts.runs, OWN_UID_TASKS)
                    got["own_uid_cpu_ms_per_run"] = (cpu_s(daemon.pid) - cpu0) / opts.runs * 1000
                else:
                    got["floor_exec_ms"], got["floor_spawn_await_ms"] = floor_exec_ms(python, exe, watch, opts.execs)
                    for user, name in (("nobody", "nobody"), (None, "no_switch")):
                        got[f"floor_runs_per_s_{name}"], cpu = floor_runs(python, scratch, opts.runs, user)
                        got[f"floor_cpu_ms_per_run_{name}"] = (cpu - idle[user]) / opts.runs * 1000
            got.update(spawn_alone(python, tree, opts.spawns))
            got["exec_ratio"] = got["qledge_exec_ms"] / got["floor_exec_ms"]
            got["runs_ratio_nobody"] = got["qledge_runs_per_s"] / got["floor_runs_per_s_nobody"]
            got["runs_ratio_no_switch"] = got["qledge_runs_per_s"] / got["floor_runs_per_s_no_switch"]
            got["cpu_per_run_ratio_nobody"] = got["qledge_cpu_ms_per_run"] / got["floor_cpu_ms_per_run_nobody"]
            got["own_uid_extra_cpu_ms_per_run"] = got["own_uid_cpu_ms_per_run"] - got["qledge_cpu_ms_per_run"]
            reps.append(got)
            print(f"rep {rep + 1}: " + "  ".join(f"{k} {v:.3g}" for k, v in got.items()), flush=True)
    finally:
        daemon.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {k: spread([r[k] for r in reps]) for k in reps[0]}
    result: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "tree": os.path.relpath(tree, ROOT) if tree != ROOT else ".",
        "method": {"reps": opts.reps, "runs_per_rep": opts.runs, "execs_per_rep": opts.execs,
                   "spawns_per_rep": opts.spawns, "concurrency": 2,
                   "child_user": "nobody", "exec": "inotify IN_OPEN of the program (median per rep)"},
        "summary": summary, "reps": [{k: round(v, 3) for k, v in r.items()} for r in reps],
    }
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    for key, s in summary.items():
        print(f"{key:>28}: {s['min']:.3g} / {s['median']:.3g} / {s['max']:.3g}")


if __name__ == "__main__":
    main()
