"""Runner hardening against real daemon processes: the head+tail log cap with a 50 MiB
output, secret redaction of real output, the free-space reserve, crash recovery after
kill -9 (including a recycled pid), and retention on real runs and log files."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from edge.storage.run_logs import HEAD_MAX
from edge.runner.process import alive, start_ticks
from support import OWN_USER

FIFTY_MIB = 50 << 20


def _start_and_wait(d, task: str, timeout_s: float = 60) -> dict:
    run = d.call("qledge.run.start", {"taskId": task})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waited = d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})
        if waited["done"]:
            return waited["run"]
    raise AssertionError(f"run {run['id']} did not finish")


def _log(d, run_id: str) -> bytes:
    with open(os.path.join(d.home, "logs", f"{run_id}.log"), "rb") as f:
        return f.read()


def _until(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])


def _lines(start: int, end: int) -> bytes:
    """Bytes [start, end) of the output of `seq -f %09.0f 0 N` (10 bytes a line)."""
    first, last = start // 10, (end + 9) // 10
    text = b"".join(b"%09d\n" % i for i in range(first, last))
    return text[start - first * 10 : end - first * 10]


@pytest.mark.emulated("memory (the daemon's VmHWM while a task prints 50 MiB)")
def test_fifty_mib_output_keeps_head_marker_and_tail(daemon):
    lines = FIFTY_MIB // 10
    daemon.call("qledge.task.create", {"taskId": "chatty", "spec": {
        "command": {"kind": "argv", "file": "seq", "args": ["-f", "%09.0f", "0", str(lines - 1)]}}})
    before = _hwm_kib(daemon.pid)
    run = _start_and_wait(daemon, "chatty")
    grew = _hwm_kib(daemon.pid) - before
    # The child was drained to the end, never SIGPIPEd.
    assert (run["status"], run["exitCode"]) == ("succeeded", 0)
    body = _log(daemon, run["id"])
    assert run["logTruncated"] is True and run["logBytes"] == len(body) == 1 << 20
    assert body[:HEAD_MAX] == _lines(0, HEAD_MAX)
    m = re.match(rb"\n\[qledge: log cap reached; (\d+) bytes dropped here\]\n", body[HEAD_MAX:])
    assert m, body[HEAD_MAX : HEAD_MAX + 80]
    tail = body[HEAD_MAX + m.end() :]
    assert tail == _lines(FIFTY_MIB - len(tail), FIFTY_MIB) and tail.endswith(b"%09d\n" % (lines - 1))
    assert int(m.group(1)) == FIFTY_MIB - HEAD_MAX - len(tail)
    assert os.listdir(os.path.join(daemon.home, "logs")) == [f"{run['id']}.log"]  # no spool left
    assert grew < 4096, f"daemon peak RSS grew by {grew} KiB while a task printed 50 MiB"


def test_a_task_log_cap_applies_to_its_runs(daemon):
    daemon.cli("task", "add", "small", "--log-cap", "8192", "--", "seq", "1", "100000")
    run = _start_and_wait(daemon, "small")
    body = _log(daemon, run["id"])
    assert run["logBytes"] == len(body) == 8192 and run["logTruncated"]
    assert body.startswith(b"1\n2\n3\n") and body.endswith(b"99999\n100000\n")


def test_secret_output_is_redacted_even_across_pipe_reads(daemon):
    secret, other = "hunter2-very-secret", "unrelated-secret-42"
    for name, value in (("pw", secret), ("other", other)):
        done = daemon.cli("secret", "set", name, input=value + "\n")
        assert done.returncode == 0 and done.stdout == f"secret {name} stored\n"
    with contextlib.closing(daemon.db()) as db:  # one trailing newline is not part of the value
        assert db.execute("SELECT value FROM secrets WHERE name = 'pw'").fetchone() == (secret,)
    # Half the value, a pause (so the daemon reads it on its own), then the rest; then
    # the value whole, a short value left alone, and another secret of the project.
    script = ("import os, sys, time\n"
              "v = os.environ['PW']\n"
              "sys.stdout.write('a=' + v[:7]); sys.stdout.flush(); time.sleep(0.3)\n"
              "print(v[7:] + '!'); print('b=' + v, 'abc'); print('c=unrelated-secret-42')\n")
    # As the daemon's user: the test's interpreter need not be one every user may run.
    added = daemon.cli("task", "add", "leaky", "--user", OWN_USER, "--secret-env", "PW=pw", "--",
                       sys.executable, "-c", script)
    assert added.returncode == 0
    run = _start_and_wait(daemon, "leaky")
    assert run["status"] == "succeeded", run
    # The pause is longer than the runner holds output back: what came of the value is
    # written masked, and the rest is masked when it comes (read together: one mask).
    assert re.fullmatch(rb"a=(\*\*\*)?\[REDACTED\]!\nb=\[REDACTED\] abc\nc=\[REDACTED\]\n", _log(daemon, run["id"]))
    assert secret not in daemon.stderr() and "hunter2" not in daemon.stderr()


def test_secret_tools_never_return_a_value(daemon):
    value = "s3cret-value-never-shown"
    daemon.cli("secret", "set", "api", input=value)
    raw = []
    with daemon.client() as c:
        raw.append(repr(c.call("qledge.secret.set", {"name": "api", "value": value})))
        raw.append(repr(c.call("qledge.secret.list", {})))
    listed = daemon.cli("secret", "list", "--json")
    assert all(value not in r for r in [*raw, listed.stdout, daemon.cli("secret", "list").stdout])
    entry = daemon.call("qledge.secret.list", {})["secrets"][0]
    assert set(entry) == {"name", "createdAtMs", "updatedAtMs"} and entry["name"] == "api"
    # Values never come from argv; a missing one is one clear line.
    assert daemon.cli("secret", "set", "api", value).returncode == 2
    assert daemon.cli("secret", "set", "empty", input="").stderr == (
        "qledge: invalid_argument: empty value; nothing was stored\n")
    assert daemon.cli("secret", "rm", "api").stdout == "secret api deleted\n"
    gone = daemon.cli("secret", "rm", "api")
    assert gone.returncode == 1 and gone.stderr == "qledge: not_found: secret 'api' not found\n"


def test_secret_permissions(daemon):
    _, operator = daemon.token("operator")
    _, viewer = daemon.token("viewer")
    assert daemon.cli("secret", "list", token=operator).returncode == 0
    denied = daemon.cli("secret", "set", "x", input="value", token=operator)
    assert denied.returncode == 1 and "requires permission secret.write" in denied.stderr
    assert "requires permission" in daemon.cli("secret", "list", token=viewer).stderr


def test_disk_reserve_refuses_to_start_runs_and_the_daemon_keeps_serving(daemon_factory, home):
    st = os.statvfs(home)
    reserve = st.f_bavail * st.f_frsize + (1 << 30)  # more than this filesystem has free
    d = daemon_factory(config=f"[runner]\ndisk_reserve_bytes = {reserve}\n").start()
    d.cli("task", "add", "t", "--cwd", d.scratch, "--", "touch", "ran")
    # A manual start is refused, like one beyond the queue: nothing is admitted.
    refused = d.cli("run", "start", "t", "--wait")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("qledge: resource_exhausted: disk_space_low: only ")
    assert "disk_reserve_bytes" in refused.stderr and d.call("qledge.status")["counts"]["runs"] == 0
    # A scheduled fire is recorded: failed, disk_space_low, never started.
    d.cli("trigger", "add", "t", "--cron", "* * * * * *", "--tz", "UTC")
    run = _until(lambda: next(iter(d.call("qledge.run.list", {})["runs"]), None), what="a scheduled run")
    run = d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 10_000})["run"]
    assert (run["status"], run["errorCode"], run["origin"]) == ("failed", "disk_space_low", "scheduled")
    assert "free in" in run["errorSummary"] and "disk_reserve_bytes" in run["errorSummary"]
    assert run["startedAtMs"] is None and not os.path.exists(os.path.join(d.scratch, "ran"))
    assert d.call("qledge.status")["counts"]["runs"] >= 1  # still serving


def _db_process(d, run_id: str) -> tuple[int, int]:
    with contextlib.closing(d.db()) as db:
        return db.execute("SELECT pid, pid_start_ticks FROM runs WHERE id = ?", (run_id,)).fetchone()


def _running(d, task: str) -> dict:
    run = d.call("qledge.run.start", {"taskId": task})
    return _until(lambda: (r := d.call("qledge.run.get", {"runId": run["id"]}))["status"] == "running" and r,
                  what="the run to start")


def _kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _napping(daemon_factory):
    """A daemon running a shell (the group leader) with a background child in its group."""
    d = daemon_factory().start()
    d.cli("task", "add", "nap", "--cwd", d.scratch, "--shell", "--", "sleep 300 & echo $! > bg.pid; sleep 301")
    run = _running(d, "nap")
    pid, ticks = _db_process(d, run["id"])
    bg_file = os.path.join(d.scratch, "bg.pid")
    _until(lambda: os.path.exists(bg_file) and os.path.getsize(bg_file), what="bg.pid")
    with open(bg_file) as f:
        return d, run, pid, ticks, int(f.read())


@pytest.mark.e2e
def test_kill_9_then_restart_marks_the_run_lost_and_kills_its_group(daemon_factory):
    d, run, pid, ticks, bg = _napping(daemon_factory)
    try:
        assert start_ticks(pid) == ticks
        d.stop(signal.SIGKILL)
        assert alive(pid, ticks) and alive(bg)  # the orphans outlive the daemon
        d.start()
        lost = d.call("qledge.run.get", {"runId": run["id"]})
        assert (lost["status"], lost["errorCode"]) == ("lost", "daemon_lost")
        assert "stopped what was left of process group" in lost["errorSummary"]
        events = d.call("qledge.run.events", {"runId": run["id"]})["events"]
        assert [e["type"] for e in events] == ["run.queued", "run.running", "run.lost"]
        assert not alive(pid) and not alive(bg)
        assert d.call("qledge.run.list", {})["runs"][0]["status"] == "lost"
    finally:
        _kill_all([pid, bg])


def test_a_quick_run_records_its_start_with_its_end(daemon):
    daemon.cli("task", "add", "q", "--", "true")
    done = _start_and_wait(daemon, "q")
    events = daemon.call("qledge.run.events", {"runId": done["id"]})["events"]
    assert [(e["type"], e["actorType"]) for e in events] == [
        ("run.queued", "user"), ("run.running", "runner"), ("run.succeeded", "runner")]
    assert events[1]["createdAtMs"] == done["startedAtMs"] <= done["finishedAtMs"] == events[2]["createdAtMs"]
    pid, _ = _db_process(daemon, done["id"])
    assert pid > 0  # where it ran is kept as for any run (its start time, if /proc still had it)
    assert (done["status"], done["version"], done["exitCode"]) == ("succeeded", 3, 0)


def test_a_longer_run_is_recorded_running_after_a_second(daemon):
    daemon.cli("task", "add", "nap", "--", "sleep", "30")
    run = daemon.call("qledge.run.start", {"taskId": "nap"})
    began = time.monotonic()
    running = _running_from(daemon, run["id"])
    assert time.monotonic() - began >= 0.5  # not at once: a quick run would not need the write
    pid, ticks = _db_process(daemon, run["id"])
    assert alive(pid, ticks) and running["startedAtMs"] is not None
    daemon.call("qledge.run.cancel", {"runId": run["id"]})


def _running_from(d, run_id: str) -> dict:
    return _until(lambda: (r := d.call("qledge.run.get", {"runId": run_id}))["status"] == "running" and r,
                  what="the run to be recorded running")


@pytest.mark.e2e
def test_kill_9_before_the_start_is_recorded_still_stops_the_run(daemon_factory):
    d = daemon_factory().start()
    d.cli("task", "add", "nap", "--cwd", d.scratch, "--shell", "--", "echo $$ > nap.pid; exec sleep 300")
    run = d.call("qledge.run.start", {"taskId": "nap"})
    pid_file = os.path.join(d.scratch, "nap.pid")
    _until(lambda: os.path.exists(pid_file) and os.path.getsize(pid_file), what="nap.pid")
    assert d.call("qledge.run.get", {"runId": run["id"]})["status"] == "queued"  # its start is not stored yet
    d.stop(signal.SIGKILL)
    with open(pid_file) as f:
        pid = int(f.read())
    try:
        assert alive(pid)
        d.start()
        lost = d.call("qledge.run.get", {"runId": run["id"]})
        assert (lost["status"], lost["errorCode"]) == ("lost", "daemon_lost")
        assert lost["errorSummary"].endswith("stopped its processes")  # found by the run id in its environment
        assert not alive(pid)
    finally:
        _kill_all([pid])


@pytest.mark.e2e
def test_orphans_of_a_dead_leader_are_found_by_group_and_run_marker(daemon_factory):
    d, run, pid, ticks, bg = _napping(daemon_factory)
    try:
        d.stop(signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)  # the leader dies too; its group lives on in `bg`
        _until(lambda: not alive(pid), what="the leader to die")
        assert alive(bg)
        d.start()
        assert d.call("qledge.run.get", {"runId": run["id"]})["status"] == "lost"
        assert not alive(bg)
    finally:
        _kill_all([pid, bg])


@pytest.mark.e2e
def test_a_recycled_pid_is_never_killed(daemon_factory):
    d = daemon_factory().start()
    d.cli("task", "add", "t", "--", "true")
    d.stop()
    # An unrelated process, leader of its own group, holds the pid a dead run recorded;
    # only its start time differs. Killing by pid (or group) alone would hit it.
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ticks = start_ticks(bystander.pid)
        now = time.time_ns() // 1_000_000
        with contextlib.closing(d.db()) as db:
            db.execute(
                "INSERT INTO runs (id, project_id, task_id, task_revision, origin, status, version, event_seq,"
                " created_at_ms, started_at_ms, pid, pid_start_ticks, events)"
                " VALUES ('r-recycled', 'default', 't', 1, 'manual', 'running', 2, 2, ?1, ?1, ?2, ?3,"
                " json_array(json_array(1, 'queued', 'user', 0), json_array(2, 'running', 'runner', 0)))",
                (now, bystander.pid, ticks - 1),
            )
        d.start()
        lost = d.call("qledge.run.get", {"runId": "r-recycled"})
        assert lost["status"] == "lost" and lost["errorSummary"].endswith("no process was left")
        assert bystander.poll() is None and alive(bystander.pid, ticks)
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.e2e
def test_queued_runs_of_a_dead_daemon_are_lost_too(daemon_factory):
    d = daemon_factory(config="[runner]\nconcurrency = 1\n").start()
    d.cli("task", "add", "nap", "--overlap", "allow", "--", "sleep", "300")
    first = _running(d, "nap")
    second = d.call("qledge.run.start", {"taskId": "nap"})
    pid, _ = _db_process(d, first["id"])
    try:
        d.stop(signal.SIGKILL)
        d.start()
        queued = d.call("qledge.run.get", {"runId": second["id"]})
        assert queued["status"] == "lost" and queued["errorSummary"].endswith("it had not started")
        assert d.call("qledge.status")["counts"]["activeRuns"] == 0
        assert not alive(pid)
    finally:
        _kill_all([pid])


@pytest.mark.e2e
def test_the_log_of_a_lost_run_is_assembled_from_what_was_written(daemon_factory):
    d = daemon_factory().start()
    d.cli("task", "add", "loud", "--shell", "--", "seq -f %09.0f 0 299999; echo done; sleep 300")
    run = _running(d, "loud")
    pid, _ = _db_process(d, run["id"])
    spool = os.path.join(d.home, "logs", f"{run['id']}.log.tail")
    try:
        def written() -> int:  # segments are named by the stream offset of their first byte
            with contextlib.suppress(FileNotFoundError, ValueError):
                last = max(os.listdir(spool), key=int)
                return int(last) + os.path.getsize(os.path.join(spool, last))
            return 0

        _until(lambda: written() == 3_000_005, what="all the output to reach the spool")
        d.stop(signal.SIGKILL)
        d.start()
        lost = d.call("qledge.run.get", {"runId": run["id"]})
        body = _log(d, run["id"])
        assert lost["status"] == "lost" and lost["logTruncated"] and lost["logBytes"] == len(body) == 1 << 20
        assert body.startswith(_lines(0, 100)) and body.endswith(b"000299999\ndone\n")
        assert not os.path.exists(spool)
    finally:
        _kill_all([pid])


def test_only_one_daemon_per_home(daemon):
    other = os.path.join(daemon.home, "other.sock")
    env = {**os.environ, "QLEDGE_HOME": daemon.home}
    result = subprocess.run([sys.executable, "-m", "edge", "serve", "--socket", other], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == f"qledge: conflict: another qledge daemon is already running in {daemon.home}\n"
    assert not os.path.exists(other)


def test_retention_keeps_n_runs_and_their_logs_on_a_real_daemon(daemon_factory):
    d = daemon_factory(config="[retention]\nruns_per_task = 65\n").start()
    d.cli("task", "add", "tick", "--", "echo", "tick")
    ids = [_start_and_wait(d, "tick")["id"] for _ in range(70)]
    kept = [r["id"] for r in d.call("qledge.run.list", {"taskId": "tick", "limit": 64})["runs"]]
    with contextlib.closing(d.db()) as db:
        stored = [r[0] for r in db.execute("SELECT id FROM runs ORDER BY created_at_ms, id")]
    assert stored == ids[5:] and kept == ids[:5:-1][:64]
    assert sorted(os.listdir(os.path.join(d.home, "logs"))) == sorted(f"{i}.log" for i in ids[5:])


@pytest.mark.parametrize("limit", [1 << 20])
def test_log_quota_on_a_real_daemon(daemon_factory, limit):
    d = daemon_factory(config=f"[retention]\nlog_quota_bytes = {limit}\n").start()
    d.cli("task", "add", "half", "--shell", "--", "head -c 400000 /dev/zero")
    runs = [_start_and_wait(d, "half") for _ in range(4)]
    logs = os.path.join(d.home, "logs")
    on_disk = sum(os.path.getsize(os.path.join(logs, n)) for n in os.listdir(logs))
    assert on_disk <= limit and sorted(os.listdir(logs)) == sorted(f"{r['id']}.log" for r in runs[-2:])
    first = d.call("qledge.run.get", {"runId": runs[0]["id"]})
    assert first["logBytes"] == 400_000 and first["logDroppedAtMs"] >= first["finishedAtMs"]
    assert d.call("qledge.run.events", {"runId": runs[0]["id"]})["events"][-1]["type"] == "run.log_dropped"
    assert "dropped" in d.cli("run", "get", runs[0]["id"]).stdout
    # What AI clients read says the log existed and is no longer kept.
    assert d.call("qinglong.run.log.excerpt", {"runId": runs[0]["id"]})["status"] == "retired"
    assert d.call("qinglong.run.log.excerpt", {"runId": runs[-1]["id"]})["status"] == "available"


def test_secret_set_prompts_on_a_terminal_without_echo(daemon):
    import pty

    master, slave = pty.openpty()
    # A new session has no controlling terminal, so getpass uses the terminal on stdin
    # and prompts on stderr.
    proc = subprocess.Popen([sys.executable, "-m", "edge", "secret", "set", "typed"], env=daemon.env, stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    os.close(slave)
    err = b""
    try:
        for prompt in (b"value for secret typed: ", b"again: "):
            while not err.endswith(prompt):  # input typed before the prompt would be flushed
                chunk = os.read(proc.stderr.fileno(), 1024)
                assert chunk, err
                err += chunk
            os.write(master, b"typed-value-1\n")
        out = proc.stdout.read()
        proc.wait(timeout=30)
        echoed = b""
        os.set_blocking(master, False)
        with contextlib.suppress(OSError):
            echoed = os.read(master, 4096)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == b"secret typed stored\n" and b"typed-value-1" not in echoed + err  # echo was off
    with contextlib.closing(daemon.db()) as db:
        assert db.execute("SELECT name, value FROM secrets").fetchall() == [("typed", "typed-value-1")]


def test_audit_rows_stay_within_the_configured_bound(daemon_factory):
    d = daemon_factory(config="[retention]\naudit_max_rows = 100\n").start()
    with d.client() as c:
        for _ in range(180):
            c.call("qledge.status", {})
    with contextlib.closing(d.db()) as db:
        count, newest = db.execute("SELECT count(*), max(id) FROM security_audit").fetchone()
    assert newest >= 180 and count <= 100
