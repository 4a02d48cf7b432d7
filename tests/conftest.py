from __future__ import annotations

import shutil

import pytest

from support import DaemonProcess, scratch_dir, short_tmpdir


@pytest.fixture
def home():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scratch():
    """A 1777 directory outside the daemon's home, for files tasks write."""
    path = scratch_dir()
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


from pg_support import pg_dsn, pg_server  # noqa: E402, F401  (a real PostgreSQL, for the cluster tests)
