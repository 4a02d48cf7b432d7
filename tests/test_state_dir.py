"""Start-up that fails fast with one line, and a state directory that is trusted only when
it is ours (StrictModes): real daemon processes on real, deliberately damaged homes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import apsw
import pytest

from edge.storage.sqlite.schema import MIGRATIONS
from support import IS_ROOT, OWN_USER, DaemonProcess, short_tmpdir

FAIL_FAST_S = 2.5  # the start-up failures below must end the process within this


def _serve(home: str, *extra: str, timeout: float = 20.0) -> tuple[int, str, float]:
    """Run `qledge serve` on `home` until it exits; (exit code, stderr, seconds)."""
    env = {**os.environ, "QLEDGE_HOME": home}
    env.pop("NOTIFY_SOCKET", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edge", "serve", *extra], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return done.returncode, done.stderr, time.perf_counter() - started


def fail_fast_bound() -> float:
    """How long a start-up failure may take: FAIL_FAST_S beyond four times what starting the
    interpreter and the CLI takes on this machine now (`qledge --version`), which a loaded
    machine makes slower too. A wait on the database's 5 s busy timeout is well beyond it."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "edge", "--version"], capture_output=True, timeout=60,
                   stdin=subprocess.DEVNULL, check=True)
    return FAIL_FAST_S + 4 * (time.perf_counter() - started)


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _fresh(home: str) -> str:
    """A home a daemon has started in once (database, pepper, logs)."""
    d = DaemonProcess(home=home).start()
    d.stop()
    os.unlink(d.stderr_path)
    return home


@pytest.fixture
def started(home):
    return _fresh(home)


# -- start-up fails fast ------------------------------------------------------------


def test_random_bytes_as_the_database_exit_at_once_with_one_line(home):
    os.chmod(home, 0o700)
    with open(os.path.join(home, "qledge.db"), "wb") as f:
        f.write(os.urandom(64 * 1024))
    code, err, took = _serve(home)
    line = _one_line(err)
    assert code == 2 and line.startswith(
        "qledge: unavailable: qledge.db is not a SQLite database: file is not a database")
    assert took < fail_fast_bound(), took


def test_a_newer_schema_exits_at_once_naming_both_versions(started):
    conn = apsw.Connection(os.path.join(started, "qledge.db"))
    conn.pragma("user_version", 99)
    conn.close()
    code, err, took = _serve(started)
    assert code == 2 and _one_line(err) == (
        f"qledge: unavailable: database schema version 99 is newer than this qledge ({len(MIGRATIONS)}):"
        " upgrade qledge or restore a backup")
    assert took < fail_fast_bound(), took


# -- a database qledge refuses is never written -------------------------------------


def _fingerprint(home: str) -> dict[str, tuple[bytes, int, int]]:
    """Bytes, mtime and size of the database and of every file beside it (`-wal`, `-shm`,
    `-journal`), and the names of every `qledge.db*` file (a new one shows)."""
    import hashlib

    names = sorted(name for name in os.listdir(home) if name.startswith("qledge.db"))
    found: dict[str, tuple[bytes, int, int]] = {"": (repr(names).encode(), 0, 0)}
    for name in ("qledge.db", "qledge.db-wal", "qledge.db-shm", "qledge.db-journal"):
        path = os.path.join(home, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            info = os.stat(path)
            found[name] = (hashlib.sha256(data).digest(), info.st_mtime_ns, info.st_size)
    return found


def _newer_in_wal_mode(path: str, leftover_wal: bool) -> None:
    """A qledge database in WAL mode with schema version 999, closed cleanly (no `-wal`), or
    with a last change left in its `-wal` and `-shm` (what a crash leaves)."""
    conn = apsw.Connection(path)
    assert conn.pragma("journal_mode", "wal") == "wal"
    conn.pragma("user_version", 999)
    if leftover_wal:
        conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        conn.execute("INSERT INTO meta (key, value) VALUES ('left-in-the-wal', 1)")
    conn.close()
    assert os.path.exists(path + "-wal") == leftover_wal


def _foreign_wal_no_shm(path: str, application_id: int = 0x47504B47) -> None:
    """Another program's WAL database with a change left in its `-wal` and no `-shm`."""
    conn = apsw.Connection(path)
    if application_id:
        conn.pragma("application_id", application_id)
    conn.pragma("journal_mode", "wal")
    conn.execute("CREATE TABLE leases (mac TEXT PRIMARY KEY, ip TEXT)")
    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
    conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
    conn.execute("INSERT INTO leases VALUES ('aa', '10.0.0.2')")
    conn.close()
    os.unlink(path + "-shm")
    assert os.path.getsize(path + "-wal") > 0


_HOT_JOURNAL = """
import os, sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.pragma("cache_size", 2)  # spill changed pages into the file mid-transaction
conn.execute("BEGIN IMMEDIATE")
conn.execute("CREATE TABLE filler (x BLOB)")
for _ in range(300):
    conn.execute("INSERT INTO filler VALUES (randomblob(500))")
os._exit(0)  # dies mid-transaction: the journal is hot
"""


def _newer_with_hot_journal(path: str) -> None:
    """Schema version 999 in rollback-journal mode, with a transaction that died midway: a
    hot `-journal` that opening it would roll back into the file."""
    conn = apsw.Connection(path)
    conn.pragma("journal_mode", "delete")
    conn.pragma("user_version", 999)
    conn.close()
    subprocess.run([sys.executable, "-c", _HOT_JOURNAL, path], check=True, timeout=60)
    assert os.path.getsize(path + "-journal") > 0


def _big_pages(path: str, version: int | None = None, wal_pending: bool = False) -> None:
    """The database rewritten with 4096-byte pages (what a page-size conversion would undo);
    `version`: its schema version; `wal_pending`: a last change left in its WAL, not
    checkpointed (what a crash leaves)."""
    conn = apsw.Connection(path)
    conn.pragma("journal_mode", "delete")
    conn.pragma("page_size", 4096)
    conn.execute("VACUUM")
    if version is not None:
        conn.pragma("user_version", version)
    if wal_pending:
        conn.pragma("journal_mode", "wal")
        conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        conn.execute("INSERT INTO meta (key, value) VALUES ('left-in-the-wal', 1)")
    conn.close()


def _foreign(path: str, application_id: int = 0) -> None:
    conn = apsw.Connection(path)
    conn.pragma("page_size", 4096)
    if application_id:
        conn.pragma("application_id", application_id)
    conn.execute("CREATE TABLE leases (mac TEXT PRIMARY KEY, ip TEXT); INSERT INTO leases VALUES ('aa', '10.0.0.2')")
    conn.close()


@pytest.mark.parametrize("case", ["newer", "newer-wal", "newer-walmode", "newer-walmode-leftover",
                                  "newer-hot-journal", "foreign", "foreign-app", "foreign-app-wal",
                                  "foreign-wal", "wrong-owner", "bad-config"])
def test_a_refused_database_keeps_every_byte_and_its_mtime(home, tmp_path, case):
    if case in ("wrong-owner", "bad-config") and not IS_ROOT:
        pytest.skip("giving a file to another uid, and task users, need root")
    db = os.path.join(home, "qledge.db")
    extra: list[str] = []
    if case.startswith("newer-walmode") or case == "newer-hot-journal":
        _fresh(home)
        if case == "newer-hot-journal":
            _newer_with_hot_journal(db)
        else:
            _newer_in_wal_mode(db, leftover_wal=case.endswith("leftover"))
        expected = f"database schema version 999 is newer than this qledge ({len(MIGRATIONS)})"
    elif case.startswith("newer"):
        _fresh(home)
        _big_pages(db, version=99, wal_pending=case == "newer-wal")
        expected = f"database schema version 99 is newer than this qledge ({len(MIGRATIONS)})"
    elif case.endswith("-wal") and case.startswith("foreign"):
        os.chmod(home, 0o700)
        _foreign_wal_no_shm(db, 0x47504B47 if case == "foreign-app-wal" else 0)
        expected = ("qledge.db belongs to another program (application id 0x47504b47)" if case == "foreign-app-wal"
                    else "qledge.db is not a qledge database (schema version 0, tables leases)")
    elif case.startswith("foreign"):
        os.chmod(home, 0o700)
        _foreign(db, 0x47504B47 if case == "foreign-app" else 0)
        expected = ("qledge.db belongs to another program (application id 0x47504b47)" if case == "foreign-app"
                    else "qledge.db is not a qledge database (schema version 0, tables leases)")
    else:
        _fresh(home)
        _big_pages(db)
        if case == "wrong-owner":
            os.chown(db, 65534, 65534)
            expected = f"{db} is owned by uid 65534"
        else:  # a configuration this system refuses: found before the database is touched
            config = tmp_path / "qledge.toml"
            config.write_text('[runner]\ntask_users = ["root"]\n')
            extra = ["--config", str(config)]
            expected = "[runner] task_users lists root, which owns the state directory"
    before = _fingerprint(home)
    time.sleep(0.01)  # a rewrite now would give another mtime
    code, err, took = _serve(home, *extra)
    assert code == 2 and expected in _one_line(err), err
    assert _fingerprint(home) == before
    assert took < fail_fast_bound(), took


def test_an_own_database_is_converted_to_small_pages_and_marked(home):
    os.chmod(home, 0o700)
    db = os.path.join(home, "qledge.db")
    conn = apsw.Connection(db)  # what the version before the mark wrote, with SQLite's default pages
    for number, sql in enumerate(MIGRATIONS[:12], start=1):
        conn.execute(sql)
        conn.pragma("user_version", number)
    assert conn.pragma("page_size") == 4096
    conn.close()
    d = DaemonProcess(home=home).start()
    d.stop()
    conn = apsw.Connection(db)
    assert (conn.pragma("page_size"), conn.pragma("user_version")) == (512, len(MIGRATIONS))
    assert conn.pragma("application_id") == 0x716C6564
    conn.close()


def test_an_uncreatable_home_and_a_dangling_logs_link_are_one_line(home, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err, _ = _serve(str(blocker / "home"))
    assert code == 2 and _one_line(err) == (
        f"qledge: unavailable: cannot create the state directory {blocker}/home: Not a directory")
    os.symlink(os.path.join(home, "gone"), os.path.join(home, "logs"))
    code, err, took = _serve(home)
    assert code == 2 and _one_line(err) == (
        f"qledge: permission_denied: {home}/logs is a symbolic link; the state directory's files must be its own:"
        " remove the link")
    assert took < fail_fast_bound(), took


def test_a_sighup_while_starting_is_remembered_not_fatal(home):
    """OpenWrt's `reload` sends SIGHUP right after `start`: from the moment qledge's own code
    runs until it is ready, HUPs are deferred and honoured once, as a reload."""
    notify = os.path.join(home, "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify)
    listener.setblocking(False)
    env = {**os.environ, "QLEDGE_HOME": home, "NOTIFY_SOCKET": notify}
    with open(os.path.join(home, "daemon.stderr"), "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edge", "serve"], env=env, stderr=err,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    sent, ready = 0, False
    try:
        deadline = time.monotonic() + 20
        while not ready and time.monotonic() < deadline and proc.poll() is None:
            if _catches_hup(proc.pid):  # our handler is in place: the interpreter is past its start
                os.kill(proc.pid, signal.SIGHUP)
                sent += 1
            try:
                ready = b"READY=1" in listener.recv(4096)
            except BlockingIOError:
                time.sleep(0.002)
        assert proc.poll() is None, f"the daemon died (exit {proc.returncode})"
        assert ready and sent >= 1, (ready, sent)
        log = _log_with(home, "reloaded", 1)
        assert "Traceback" not in log
        os.kill(proc.pid, signal.SIGHUP)  # after start-up, a HUP is an ordinary reload
        log = _log_with(home, "reloaded", log.count("reloaded") + 1)
        assert proc.poll() is None and "Traceback" not in log
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        listener.close()


def _log_with(home: str, line: str, times: int, timeout_s: float = 20.0) -> str:
    """The daemon's stderr once it holds `line` `times` times."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(os.path.join(home, "daemon.stderr")) as f:
            log = f.read()
        if log.count(line) >= times:
            return log
        assert time.monotonic() < deadline, log
        time.sleep(0.02)


def _catches_hup(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGHUP - 1)))


# -- the state directory is trusted only when it is ours -----------------------------


def test_a_new_home_is_made_0700_and_its_files_0600():
    parent = short_tmpdir()
    home = os.path.join(parent, "new", "home")  # the daemon makes it, and its parent
    notify = os.path.join(parent, "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify)
    listener.settimeout(20)
    env = {**os.environ, "QLEDGE_HOME": home, "NOTIFY_SOCKET": notify}
    proc = subprocess.Popen([sys.executable, "-m", "edge", "serve"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while b"READY=1" not in listener.recv(4096):
            pass
        assert os.stat(home).st_mode & 0o777 == 0o700
        assert os.stat(os.path.join(home, "logs")).st_mode & 0o777 == 0o700
        for name in ("pepper", "qledge.db", "lock", "ballast"):
            assert os.stat(os.path.join(home, name)).st_mode & 0o777 == 0o600, name
        assert "work" not in os.listdir(home)  # runs no longer start inside the home
    finally:
        proc.terminate()
        proc.wait(20)
        listener.close()
        subprocess.run(["rm", "-rf", parent], check=True)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_home_writable_by_others_is_refused(started, mode):
    os.chmod(started, mode)
    code, err, took = _serve(started)
    assert code == 2 and _one_line(err) == (
        f"qledge: permission_denied: {started} is writable by group or others (mode {mode:04o}): chmod go-w {started}")
    assert took < fail_fast_bound(), took


@pytest.mark.parametrize("name", ["qledge.db", "pepper", "logs"])
def test_a_state_file_writable_by_others_is_refused(started, name):
    path = os.path.join(started, name)
    os.chmod(path, 0o666 if name != "logs" else 0o777)
    code, err, _ = _serve(started)
    assert code == 2 and _one_line(err).startswith(
        f"qledge: permission_denied: {path} is writable by group or others")
    assert f"chmod go-w {path}" in err


@pytest.mark.parametrize("name", ["qledge.db", "pepper", "qledge.db-wal", "lock", "audit-spool.jsonl"])
def test_a_planted_link_is_refused_not_followed(started, tmp_path, name):
    """With a home others could once write, a `qledge.db` link made a root daemon run an
    attacker's tasks, and a `pepper` link gave an attacker-known pepper."""
    path = os.path.join(started, name)
    target = tmp_path / "attacker"
    if os.path.exists(path):
        os.replace(path, target)
    else:
        target.write_bytes(b"")
    os.symlink(target, path)
    code, err, _ = _serve(started)
    assert code == 2 and _one_line(err) == (
        f"qledge: permission_denied: {path} is a symbolic link; the state directory's files must be its own:"
        " remove the link")


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another uid needs root")
def test_a_home_or_file_owned_by_another_uid_is_refused(started):
    os.chown(os.path.join(started, "pepper"), 65534, 65534)
    code, err, _ = _serve(started)
    pepper = os.path.join(started, "pepper")
    assert code == 2 and _one_line(err) == (
        f"qledge: permission_denied: {pepper} is owned by uid 65534, not by this daemon's uid 0: chown 0 {pepper}"
        " (or start the daemon as its owner)")
    os.chown(pepper, 0, 0)
    os.chown(started, 65534, 65534)
    code, err, _ = _serve(started)
    assert code == 2 and f"qledge: permission_denied: {started} is owned by uid 65534" in _one_line(err)


def test_a_home_reached_through_a_link_is_fine(tmp_path):
    real = short_tmpdir()
    link = str(tmp_path / "link")
    os.symlink(real, link)
    d = DaemonProcess(home=link).start()
    try:
        assert d.call("qledge.status")["dbPath"] == os.path.join(real, "qledge.db")
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", real], check=True)


# -- the log tools read only logs ----------------------------------------------------


def _finished_run(d: DaemonProcess) -> str:
    d.cli("task", "add", "t", "--user", OWN_USER, "--", "echo", "an ordinary log line")
    run = d.call("qledge.run.start", {"taskId": "t"})
    while not d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})["done"]:
        pass
    return run["id"]


def _read(d: DaemonProcess, run_id: str) -> tuple[str, str]:
    raw = d.cli("run", "log", run_id)
    excerpt = d.cli("call", "qinglong.run.log.excerpt", "--args", f'{{"runId": "{run_id}"}}')
    return raw.stderr, excerpt.stderr


@pytest.mark.parametrize("swap", ["symlink", "hardlink", "fifo", "dir"])
def test_the_log_tools_refuse_anything_but_a_regular_log(daemon, swap):
    run_id = _finished_run(daemon)
    log = os.path.join(daemon.home, "logs", f"{run_id}.log")
    assert daemon.cli("run", "log", run_id).stdout == "an ordinary log line\n"
    os.unlink(log)
    pepper = os.path.join(daemon.home, "pepper")
    if swap == "symlink":
        os.symlink("../pepper", log)  # what a task running as the daemon once did
    elif swap == "hardlink":
        os.link(pepper, log)
    elif swap == "fifo":
        os.mkfifo(log, 0o600)
    else:
        os.mkdir(log)
    raw, excerpt = _read(daemon, run_id)
    assert raw.startswith("qledge: unavailable: the run's log ") and raw.count("\n") == 1, raw
    assert excerpt.startswith("qledge: unavailable: "), excerpt
    with open(pepper, "rb") as f:
        assert f.read().hex() not in raw + excerpt
    # Retention or `task rm` removes the link itself, never what it names.
    if swap in ("symlink", "hardlink"):
        daemon.call("qledge.task.delete", {"taskId": "t"})
        assert not os.path.lexists(log) and os.path.getsize(pepper) == 32
