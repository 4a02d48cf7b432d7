"""A full disk, for real: the daemon's home on a 12 MiB tmpfs that the tests fill to the
last byte. Audited reads keep working (the ballast), a manual start says
`disk_space_low`, a run whose log could not be written says so, and a start-up on a full
disk without a ballast fails at once with one line."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

from support import IS_ROOT, DaemonProcess, short_tmpdir

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
SIZE = "12m"


@pytest.fixture
def small_disk():
    """A 12 MiB tmpfs; the daemon's home is `<mount>/home`."""
    mount = short_tmpdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs", mount],
                          capture_output=True, text=True)
    if done.returncode != 0:
        os.rmdir(mount)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    os.mkdir(os.path.join(mount, "home"), 0o700)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)
        os.rmdir(mount)


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: str) -> None:
    """Write `path` until the disk holding it has not one byte left."""
    chunk = b"\xa5" * 65536
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk[:size])


def _audit_count(d: DaemonProcess, tool: str) -> int:
    with contextlib.closing(d.db()) as db:
        return db.execute("SELECT count(*) FROM security_audit WHERE tool = ? AND outcome = 'allowed'",
                          (tool,)).fetchone()[0]


def _wait(d: DaemonProcess, run_id: str) -> dict:
    while True:
        waited = d.call("qledge.run.wait", {"runId": run_id, "timeoutMs": 30_000})
        if waited["done"]:
            return waited["run"]


def test_audited_reads_keep_working_at_zero_bytes_free(small_disk):
    home = os.path.join(small_disk, "home")
    d = DaemonProcess(home=home).start()
    try:
        assert os.path.getsize(os.path.join(home, "ballast")) == 1 << 20
        d.cli("task", "add", "t", "--", "true")
        first = _wait(d, d.call("qledge.run.start", {"taskId": "t"})["id"])
        assert first["status"] == "succeeded"
        filler = os.path.join(small_disk, "filler")
        _fill(filler)
        assert _free(small_disk) == 0
        before = _audit_count(d, "qledge.status")
        # A small page's audit row may still fit in the slack of the WAL's last block: the
        # first write that does not fit releases the ballast, and is retried.
        calls = 0
        while True:
            status = d.cli("status")
            calls += 1
            assert status.returncode == 0, status.stderr
            if "the 1.0 MiB ballast was released (the disk filled up)" in status.stdout:
                break
            assert calls < 200, status.stdout
        for args in (("run", "list"), ("run", "get", first["id"]), ("task", "list"), ("status",)):
            done = d.cli(*args)
            assert done.returncode == 0, (args, done.stderr)
        assert _audit_count(d, "qledge.status") == before + calls + 1  # every read left its row
        refused = d.cli("run", "start", "t")
        assert refused.returncode == 1
        assert re.match(r"qledge: resource_exhausted: disk_space_low: only [01]\.\d MiB free in ", refused.stderr)
        assert _audit_count(d, "qledge.run.start") == 2  # audited, then refused: nothing admitted
        assert len(d.call("qledge.run.list", {})["runs"]) == 1
        # Space comes back: the ballast is made again (looked at every 5 s), runs start again.
        os.unlink(filler)
        deadline = time.monotonic() + 20
        while "1.0 MiB ballast held" not in d.cli("status").stdout:
            assert time.monotonic() < deadline, "the ballast was not made again"
            time.sleep(0.5)
        assert os.path.getsize(os.path.join(home, "ballast")) == 1 << 20
        again = d.cli("run", "start", "t", "--wait")
        assert again.returncode == 0, again.stderr
    finally:
        d.cleanup()


def test_a_run_that_fills_the_disk_says_its_log_is_incomplete(small_disk):
    home = os.path.join(small_disk, "home")
    scratch = os.path.join(small_disk, "scratch")
    os.mkdir(scratch)
    os.chmod(scratch, 0o1777)  # for the task's user
    d = DaemonProcess(home=home).start()
    try:
        fill = f"dd if=/dev/zero of={scratch}/fill bs=64k 2>/dev/null; seq 1 100000"
        d.cli("task", "add", "filler", "--shell", "--", fill)
        run = json.loads(d.cli("run", "start", "filler", "--wait", "--json").stdout)
        assert run["status"] == "succeeded", run  # seq exited 0: the run itself succeeded
        assert run["errorCode"] == "log_incomplete" and run["logTruncated"] is True
        assert "the log is incomplete: No space left on device" in run["errorSummary"]
        log = d.cli("run", "log", run["id"]).stdout
        last = log.splitlines()[-1]
        assert last.startswith("[qledge: log incomplete: No space left on device; ")
        assert last.endswith(" bytes of output are missing from here on]")
        missing = int(last.split("; ")[1].split()[0])
        assert missing + len(log) - len(last) - 2 >= 588_895  # seq 1 100000 prints 588,895 bytes
        assert d.call("qledge.status")["counts"]["runs"] == 1  # still serving, on a full disk
    finally:
        d.cleanup()


def test_start_up_on_a_full_disk(small_disk):
    home = os.path.join(small_disk, "home")
    d = DaemonProcess(home=home, config="[store]\nballast_bytes = 0\n").start()
    d.stop()
    _fill(os.path.join(small_disk, "filler"))
    env = {**d.env}
    env.pop("NOTIFY_SOCKET", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edge", "serve", "--config", d.config_path], env=env,
                          capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - started
    assert done.returncode == 2 and done.stderr == (
        f"qledge: unavailable: the disk holding {home}/qledge.db is full (0.0 MiB free): free some space\n")
    assert took < 2.0, took
    # With a ballast (the default), the same full disk still starts: the ballast goes first.
    os.unlink(os.path.join(small_disk, "filler"))
    d2 = DaemonProcess(home=home).start()  # makes the ballast
    d2.stop()
    _fill(os.path.join(small_disk, "filler"))
    d2.start()
    try:
        assert "ballast was released" in d2.cli("status").stdout
        assert d2.cli("task", "list").returncode == 0
    finally:
        d2.stop()
        d.cleanup()
