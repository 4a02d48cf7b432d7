"""The smoke the architecture tier runs inside the chroot (smoke.sh): what an owner does first.

    python guest_smoke.py zipapp PYTHON PYZ   the edge zipapp: serve, a task, a run, its log, status
    python guest_smoke.py daemon QLEDGE       the installed CLI: a task, a seconds trigger for 20 s,
                                              the history, status, a restart that keeps it all
    python guest_smoke.py loaded QLEDGE HOME  a daemon with 100 tasks and 100 triggers (none due),
                                              its pid in HOME/pid, stopped when HOME/stop appears

Every step drives the real command line against a real daemon; a failed step prints what it
ran and what came back, and exits 1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

READY_S = 120.0  # a cold start under emulation, on a loaded machine
TRIGGER_S = 20
MIN_SCHEDULED = 5  # of the ~20 fires in the window; emulation and load cost some


class Failed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)
    print(f"  ok: {what}", flush=True)


class Daemon:
    def __init__(self, cli: list[str], home: str) -> None:
        self.cli = cli
        self.home = home
        self.env = {**os.environ, "QLEDGE_HOME": home}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        self.err = open(os.path.join(self.home, "daemon.stderr"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([*self.cli, "serve"], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        path = os.path.join(self.home, "qledge.sock")
        began = time.monotonic()
        while time.monotonic() - began < READY_S:
            if self.proc.poll() is not None:
                raise Failed(f"the daemon exited with {self.proc.returncode}: {self.stderr()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                print(f"  ok: daemon {self.proc.pid} listening after {time.monotonic() - began:.1f}s", flush=True)
                return self
            except OSError:
                time.sleep(0.2)
        raise Failed(f"the daemon did not listen within {READY_S:.0f}s: {self.stderr()}")

    def stderr(self) -> str:
        with open(os.path.join(self.home, "daemon.stderr"), errors="replace") as f:
            return f.read()[-2000:]

    def run(self, *args: str, expect: int = 0) -> str:
        done = subprocess.run([*self.cli, *args], env=self.env, capture_output=True, text=True, timeout=300)
        if done.returncode != expect:
            raise Failed(f"qledge {' '.join(args)} exited {done.returncode} (wanted {expect}):"
                         f" {done.stdout}{done.stderr}")
        return done.stdout

    def json(self, *args: str) -> object:
        return json.loads(self.run("--json", *args))

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(120)
        self.err.close()
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def first_run(d: Daemon) -> None:
    check("created" in d.run("task", "add", "hello", "--", "echo", "hi"), "task add hello -- echo hi")
    out = d.run("run", "start", "hello", "--wait")
    check("succeeded" in out, f"run start hello --wait: {out.splitlines()[-1]}")
    check(d.run("run", "log", "hello:latest") == "hi\n", "run log hello:latest says hi")


def zipapp(python: str, pyz: str) -> None:
    home = tempfile.mkdtemp(prefix="qlz", dir="/tmp")
    d = Daemon([python, pyz], home)
    try:
        d.start()
        first_run(d)
        status = d.json("status")
        assert isinstance(status, dict)
        check(status["pid"] == d.proc.pid if d.proc else False, f"status answers (version {status['version']})")
        check(d.stop() == 0, "SIGTERM: exit 0")
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


def scheduled(d: Daemon) -> list[dict[str, object]]:
    runs = d.json("run", "list", "--task", "hello", "--origin", "scheduled", "--all")
    assert isinstance(runs, list)
    return runs


def daemon(qledge: str) -> None:
    home = tempfile.mkdtemp(prefix="qld", dir="/tmp")
    d = Daemon([qledge], home)
    try:
        d.start()
        first_run(d)
        check("created" in d.run("trigger", "add", "hello", "--cron", "* * * * * *", "--id", "every-second"),
              "trigger add hello --cron '* * * * * *'")
        time.sleep(TRIGGER_S)
        d.run("trigger", "disable", "every-second")
        deadline = time.monotonic() + 60
        while any(r["status"] in ("queued", "running") for r in scheduled(d)):
            if time.monotonic() > deadline:
                raise Failed("scheduled runs still active 60 s after the trigger was disabled")
            time.sleep(1)
        runs = scheduled(d)
        ok = [r for r in runs if r["status"] == "succeeded"]
        check(len(ok) >= MIN_SCHEDULED and len(ok) == len(runs),
              f"{len(ok)} scheduled runs in {TRIGGER_S}s, all succeeded ({len(runs)} in all)")
        listed = d.run("run", "list", "--limit", "3")
        check(listed.startswith("RUN") and "succeeded" in listed, "run list shows the history")
        print("\n".join("    " + line for line in d.run("status").splitlines()), flush=True)
        counts = d.json("status")["counts"]  # type: ignore[index]
        check((counts["tasks"], counts["triggers"], counts["runs"]) == (1, 1, len(runs) + 1),
              f"status counts 1 task, 1 trigger, {len(runs) + 1} runs")
        before = {r["id"] for r in runs}
        check(d.stop() == 0, "SIGTERM: exit 0")
        d.start()
        check({r["id"] for r in scheduled(d)} == before, "after a restart the history is the same")
        out = d.run("run", "start", "hello", "--wait")
        check("succeeded" in out, "a run after the restart succeeds")
        check(d.stop() == 0, "SIGTERM: exit 0")
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


def loaded(qledge: str, home: str) -> None:
    """100 tasks and 100 yearly triggers, as bench/test_budgets.py loads the daemon it measures."""
    from edge.cli.client import Client

    d = Daemon([qledge], home)
    try:
        d.start()
        with Client(os.path.join(home, "qledge.sock")) as client:
            for i in range(100):
                spec = {"command": {"kind": "argv", "file": "true", "args": [str(i)]}, "overlap": "allow"}
                client.call("qledge.task.create", {"taskId": f"task-{i:03d}", "spec": spec})
            for i in range(100):
                client.call("qledge.trigger.create", {
                    "triggerId": f"trigger-{i:03d}", "taskId": f"task-{i:03d}",
                    "expression": f"{i % 60} 3 1 1 *", "timezone": "UTC"})
        print("  ok: loaded with 100 tasks and 100 triggers", flush=True)
        assert d.proc is not None
        with open(os.path.join(home, "pid.tmp"), "w") as f:
            f.write(str(d.proc.pid))
        os.replace(os.path.join(home, "pid.tmp"), os.path.join(home, "pid"))
        while not os.path.exists(os.path.join(home, "stop")):
            time.sleep(1)
        check(d.stop() == 0, "SIGTERM: exit 0")
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["zipapp"] and len(argv) == 3:
            zipapp(argv[1], argv[2])
        elif argv[:1] == ["daemon"] and len(argv) == 2:
            daemon(argv[1])
        elif argv[:1] == ["loaded"] and len(argv) == 3:
            loaded(argv[1], argv[2])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Failed as exc:
        print(f"  FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
