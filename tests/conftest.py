from __future__ import annotations

import os
import shutil

import pytest

from support import DaemonProcess, scratch_dir, short_tmpdir


def _emulator() -> str | None:
    """The CPU emulator this interpreter runs under (qemu-user), or None on a real CPU. qemu
    answers /proc/self/exe with the guest's program but passes /proc/thread-self/exe through:
    there the kernel names the emulator."""
    try:
        exe = os.path.basename(os.path.realpath("/proc/thread-self/exe"))
    except OSError:
        return None
    return exe if exe.startswith("qemu-") else None


EMULATOR = _emulator()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.emulated("what it measures")`: skipped under a CPU emulator, where the
    process's memory and timings are the emulator's (the architecture tier, packaging/arch/)."""
    if EMULATOR is None:
        return
    for item in items:
        marker = item.get_closest_marker("emulated")
        if marker is not None:
            what = marker.args[0] if marker.args else "memory or timings"
            item.add_marker(pytest.mark.skip(reason=f"measures {what}, which under {EMULATOR} are the emulator's"))


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


from pg_support import drop_test_databases, pg_dsn, pg_server  # noqa: E402, F401  (a real PostgreSQL, for the cluster tests)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After every fixture of the test is torn down (its daemons stopped), its databases go."""
    try:
        return (yield)
    finally:
        drop_test_databases()
