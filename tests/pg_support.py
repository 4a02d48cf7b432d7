"""A real PostgreSQL server for the cluster tests: `initdb` into a temporary directory,
run as an unprivileged user (root cannot run postgres: as root, the `postgres` user of the
Debian package runs it through runuser), listening only on a Unix socket in that
directory. One server per test session; each test gets a fresh database."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

PG_USER = "postgres"  # the database superuser initdb creates
_counter = itertools.count(1)


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


class PostgresServer:
    def __init__(self) -> None:
        self.initdb = find_bin("initdb")
        self.pg_ctl = find_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) are not installed"
                               " (Debian: apt-get install postgresql)")
        self.root = tempfile.mkdtemp(prefix="qlpg", dir="/tmp")
        self.data = os.path.join(self.root, "data")
        self.socket_dir = self.root
        self.port = 5432
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no `postgres` user to run the server") from None
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        os.chmod(self.root, 0o755)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self) -> PostgresServer:
        done = self._run(self.initdb, "-D", self.data, "-U", PG_USER, "-A", "trust", "-E", "UTF8",
                         "--locale=C.UTF-8", "--no-sync", timeout=120)
        if done.returncode != 0:
            done = self._run(self.initdb, "-D", self.data, "-U", PG_USER, "-A", "trust", "-E", "UTF8",
                             "--no-locale", "--no-sync", timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-500:]}")
        self._start_server()
        return self

    def _options(self) -> str:
        return (f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' -c port={self.port}"
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
                " -c shared_buffers=64MB")

    def _start_server(self) -> None:
        done = self._run(self.pg_ctl, "-D", self.data, "-l", os.path.join(self.root, "server.log"), "-w",
                         "-t", "60", "-o", self._options(), "start", timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()[-500:]} {self.log()[-800:]}")

    def restart(self) -> None:
        """A real restart (fast shutdown: every session is cut), like an HA failover blip."""
        done = self._run(self.pg_ctl, "-D", self.data, "-l", os.path.join(self.root, "server.log"), "-w", "-t",
                         "60", "-m", "fast", "-o", self._options(), "restart", timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed: {done.stderr.strip()[-500:]}")

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", self.data, "-w", "-t", "30", "-m", "immediate", "stop", timeout=60)

    def cleanup(self) -> None:
        self.stop()
        pid_file = os.path.join(self.data, "postmaster.pid")
        if os.path.exists(pid_file):  # pragma: no cover - pg_ctl did not stop it
            with open(pid_file) as f:
                os.kill(int(f.readline()), signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        try:
            with open(os.path.join(self.root, "server.log")) as f:
                return f.read()
        except OSError:
            return ""

    def dsn(self, dbname: str = "postgres", password: str | None = None) -> str:
        extra = f" password={password}" if password else ""
        return f"host={self.socket_dir} port={self.port} user={PG_USER} dbname={dbname}{extra}"

    def create_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            # FILE_COPY: with fsync off, copying template0's files beats logging them page by page.
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 STRATEGY FILE_COPY')
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        """Drop a database create_database made, cutting whatever is still connected to it (a
        daemon the test left running): the server's files stay as small as one test's."""
        import psycopg

        name = dsn.rsplit("dbname=", 1)[1].split()[0]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


# -- a real PostgreSQL server for the cluster tests (tests/pg_support.py) --------------


@pytest.fixture(scope="session")
def pg_server():
    """One server per session; a test that needs one skips, with the reason, only where
    PostgreSQL or psycopg cannot be had (.ci/run installs both)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'qledge[cluster]')")
    try:
        server = PostgresServer().start()
    except RuntimeError as exc:
        pytest.skip(f"cannot start PostgreSQL: {exc}")
    yield server
    # The session's last test: its fixtures (its daemons) are gone, its databases go
    # before the server does (conftest's teardown hook runs after this).
    drop_test_databases()
    server.cleanup()


_to_drop: list[tuple[PostgresServer, str]] = []


@pytest.fixture
def pg_dsn(pg_server):
    """A fresh, empty database on the session's server, dropped once the test's fixtures
    (its daemons among them) are torn down: drop_test_databases, from tests/conftest.py."""
    dsn = pg_server.create_database()
    _to_drop.append((pg_server, dsn))
    return dsn


def drop_test_databases() -> None:
    while _to_drop:
        server, dsn = _to_drop.pop()
        server.drop_database(dsn)
