"""What a quiet run writes to the device, filesystem metadata and journal included (run as
root; `python bench/flash_device.py [--tree DIR] [--runs N] [--reps N]`).

bench/test_budgets.py counts the daemon's `write_bytes` (/proc/<pid>/io): the page-cache
pages it dirties, which is what SQLite writes. The filesystem's own writes for the daemon's
files (inodes, directory blocks, bitmaps, the journal) are not in it. Here the state
directory is on an ext4 image of its own on a loop device, and the device's count of
sectors written (/sys/block/loopN/stat) is read around the runs:

- each run is a manual run of `true` (`run.start`, `run.wait`), after the task is past
  retention's bound, so runs are deleted in the window as well;
- `sync` after every run, as ext4's journal commit does for runs a minute apart (`--batched`:
  once after all of them, runs back to back);
- this checkout and `--tree` (another checkout, e.g. a worktree of an older commit) in turn,
  their order alternating by repetition.

Prints device bytes per run for each side, min/median/max over the repetitions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests")]

from support import DaemonProcess  # noqa: E402

SPEC = {"command": {"kind": "argv", "file": "true"}, "overlap": "allow"}
WARM_RUNS = 150  # past the 100 a task keeps: retention deletes runs during the count too


def _sectors_written(device: str) -> int:
    with open(f"/sys/block/{os.path.basename(device)}/stat") as f:
        return int(f.read().split()[6]) * 512  # field 7: sectors written, 512 bytes each


def _run(client, n: int, each: bool) -> None:
    for _ in range(n):
        run = client.call("qledge.run.start", {"taskId": "quiet"})
        client.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})
        if each:
            os.sync()


def per_run(tree: str, mount: str, device: str, runs: int, each: bool) -> float:
    """Device bytes per quiet run of the qledge in `tree`, its home on the image."""
    home = tempfile.mkdtemp(prefix="h", dir=mount)
    # -P: `-m edge` would put the working directory ahead of PYTHONPATH (this checkout, whatever the tree)
    daemon = DaemonProcess(home=home, env={"PYTHONPATH": tree}, argv=[sys.executable, "-P", "-m", "edge"])
    try:
        daemon.start()
        with daemon.client() as client:
            client.call("qledge.task.create", {"taskId": "quiet", "spec": SPEC})
            _run(client, WARM_RUNS, False)
            os.sync()
            before = _sectors_written(device)
            _run(client, runs, each)
            os.sync()
            return (_sectors_written(device) - before) / runs
    finally:
        daemon.cleanup()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=None, help="another checkout to measure beside this one")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--batched", action="store_true", help="sync once after the runs, not after each")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the state directory goes on a loop device")
    scratch = tempfile.mkdtemp(prefix="qlfd", dir="/tmp")
    image, mount = os.path.join(scratch, "flash.img"), os.path.join(scratch, "mnt")
    os.mkdir(mount)
    with open(image, "wb") as f:
        f.truncate(128 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    device = subprocess.run(["losetup", "--find", "--show", image], check=True, capture_output=True,
                            text=True).stdout.strip()
    subprocess.run(["mount", device, mount], check=True)
    trees = {"this": ROOT, **({"tree": os.path.abspath(opts.tree)} if opts.tree else {})}
    figures: dict[str, list[float]] = {name: [] for name in trees}
    try:
        for rep in range(opts.reps):
            names = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in names:
                figures[name].append(per_run(trees[name], mount, device, opts.runs, not opts.batched))
            time.sleep(0.1)
    finally:
        subprocess.run(["umount", mount], check=False)
        subprocess.run(["losetup", "-d", device], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    how = "synced once after them" if opts.batched else "synced after each"
    print(f"device bytes per quiet manual run, {opts.runs} runs {how}, {opts.reps} repetitions:")
    for name, values in figures.items():
        print(f"  {name} ({trees[name]}): min {min(values):,.0f} / median {statistics.median(values):,.0f}"
              f" / max {max(values):,.0f}")


if __name__ == "__main__":
    main()
