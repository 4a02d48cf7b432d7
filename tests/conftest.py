from __future__ import annotations

import shutil

import pytest

from support import DaemonProcess, short_tmpdir


@pytest.fixture
def home():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon():
    d = DaemonProcess().start()
    yield d
    d.cleanup()


@pytest.fixture
def daemon_factory():
    made: list[DaemonProcess] = []

    def make(**kw) -> DaemonProcess:
        d = DaemonProcess(**kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.cleanup()


# -- a real PostgreSQL server for the cluster tests (tests/pg_support.py) --------------


@pytest.fixture(scope="session")
def pg_server():
    """One server per session; a test that needs one skips, with the reason, only where
    PostgreSQL or psycopg cannot be had (.ci/run installs both)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'qledge[cluster]')")
    from pg_support import PostgresServer

    try:
        server = PostgresServer().start()
    except RuntimeError as exc:
        pytest.skip(f"cannot start PostgreSQL: {exc}")
    yield server
    server.cleanup()


@pytest.fixture
def pg_dsn(pg_server):
    """A fresh, empty database on the session's server."""
    return pg_server.create_database()
