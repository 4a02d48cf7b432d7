"""Instructions per audited read call, the daemon's and the floor's, under callgrind.

Wall and CPU time move with the machine's load; an instruction count does not. Each server
runs under `valgrind --tool=callgrind`; after a warm-up its counters are zeroed, N sequential
calls are made (bench/callfloor.py's client), and the dump's total is divided by N. Both the
event loop's thread and SQLite's worker thread are counted; the kernel is not.

`python bench/callgrind_calls.py [N]` prints the two figures and their ratio, and leaves the
dumps (`callgrind.out.*`, for callgrind_annotate) in the directory it names.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from callfloor import FLOOR, SPEC, Target, _calls  # noqa: E402

VALGRIND = ["valgrind", "--tool=callgrind", "--quiet", "--separate-threads=yes"]


def _counted(target: Target, out_dir: str, pid: int, n: int, warm: int = 300) -> float:
    """Instructions per call: zero the counters after `warm` calls, make `n`, dump."""
    _calls(target, warm)
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    _calls(target, n)
    before = set(glob.glob(os.path.join(out_dir, f"callgrind.out.{pid}*")))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    dumps = sorted(set(glob.glob(os.path.join(out_dir, f"callgrind.out.{pid}*"))) - before)
    total = 0
    for path in dumps:  # one dump per thread with --separate-threads, else one
        with open(path) as f:
            for line in f:
                if line.startswith("summary:") or line.startswith("totals:"):
                    total += int(line.split()[1])
                    print(f"  {os.path.basename(path)}: {int(line.split()[1]) / n:,.0f} per call")
                    break
    return total / n


def daemon(n: int, out_dir: str) -> float:
    from support import DaemonProcess

    from edge.cli.client import Client

    argv = [*VALGRIND, f"--callgrind-out-file={out_dir}/callgrind.out.%p", sys.executable, "-m", "edge"]
    proc = DaemonProcess(argv=argv)
    import support

    support.READY_TIMEOUT_S = 300.0
    proc.start()
    try:
        with Client(proc.socket) as client:
            client.call("qledge.task.create", {"taskId": "bench", "spec": SPEC})
        assert proc.proc is not None
        target = Target("qledge", proc.socket, proc.proc.pid, "qledge.task.get", {"taskId": "bench"})
        return _counted(target, out_dir, proc.proc.pid, n)
    finally:
        proc.cleanup()


def floor(n: int, out_dir: str) -> float:
    sock = os.path.join(out_dir, "floor.sock")
    p = subprocess.Popen([*VALGRIND, f"--callgrind-out-file={out_dir}/callgrind.out.%p", sys.executable, FLOOR,
                          sock, "audit"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert p.stdout is not None
        if p.stdout.readline().strip() != b"ready":
            raise RuntimeError("the floor server did not start")
        return _counted(Target("floor", sock, p.pid, "get", {"id": "x"}), out_dir, p.pid, n)
    finally:
        p.terminate()
        p.wait(60)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    out_dir = tempfile.mkdtemp(prefix="qlcg", dir="/tmp")
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    q = daemon(n, out_dir) if which in ("both", "qledge") else 0.0
    f = floor(n, out_dir) if which in ("both", "floor") else 0.0
    print(f"dumps in {out_dir}")
    print(f"qledge {q:,.0f} instructions/call, floor {f:,.0f}, ratio {q / f if f else 0:.2f}")


if __name__ == "__main__":
    main()
