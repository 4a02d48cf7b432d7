"""How a run's process is started (edge.runner.process.spawn): off the event loop with its
exit seen on a pidfd, or by asyncio where the kernel has no pidfds (forced here) — the same
guarantees either way: its exit status and signal, its own process group, cwd, environment
and umask, no descriptor but the ones passed, the user it switches to, and nothing left
running by a caller cancelled while it starts. Real processes throughout."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import subprocess
import sys
import threading

import pytest

from edge.core.tasks import RunAs
from edge.runner import process
from support import IS_ROOT

PATH = {"PATH": process.DEFAULT_PATH}


@pytest.fixture(params=["pidfd", "asyncio"])
def path(request, monkeypatch):
    """Both ways a run starts: the pidfd one, and asyncio's (forced, as on a kernel before 5.3)."""
    if request.param == "pidfd":
        if not process.pidfd_available():
            pytest.skip("this kernel has no pidfd_open")
    else:
        monkeypatch.setattr(process, "_pidfd", False)
    return request.param


async def _output(child: process.Child) -> bytes:
    assert child.stdout is not None
    async with asyncio.timeout(20):
        out = await child.stdout.read()
        await child.wait()
    return out


def _own() -> RunAs:
    return RunAs(user="me", uid=os.geteuid(), gid=os.getegid(), groups=(), switch=False, privileged="own")


async def test_exit_status_and_signal_are_reported_as_asyncio_does(path):
    child = await process.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"], "/", PATH, None)
    assert await _output(child) == b"out\nerr\n"  # stderr goes to the same log
    assert child.returncode == 3
    killed = await process.spawn(["sh", "-c", "kill -KILL $$"], "/", PATH, None)
    await _output(killed)
    assert killed.returncode == -signal.SIGKILL
    assert await killed.wait() == -signal.SIGKILL  # again, once reaped


async def test_cwd_environment_and_umask_are_the_runs(path, tmp_path):
    old = os.umask(0o027)
    try:
        child = await process.spawn(["sh", "-c", 'pwd; echo "$FOO"; umask; echo "${HOME-unset}"'], str(tmp_path),
                                    {**PATH, "FOO": "bar"}, None)
    finally:
        os.umask(old)
    assert (await _output(child)).decode().split("\n") == [str(tmp_path), "bar", "0027", "unset", ""]


async def test_a_missing_command_or_directory_is_an_oserror(path, tmp_path):
    with pytest.raises(FileNotFoundError):
        await process.spawn([str(tmp_path / "absent")], "/", PATH, None)
    with pytest.raises(FileNotFoundError):
        await process.spawn(["true"], str(tmp_path / "absent"), PATH, None)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_only_the_passed_descriptors_reach_the_child_and_none_stay_open(path):
    leaky = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(leaky, True)  # even one marked inheritable stays behind
    passed = os.open("/dev/null", os.O_RDONLY)
    try:
        before = _fds()
        child = await process.spawn(["ls", "/proc/self/fd"], "/", PATH, None, (passed,))
        seen = {int(fd) for fd in (await _output(child)).split()}
        # 0-2, the one passed, and the one `ls` opens to list them
        assert leaky not in seen and passed in seen and len(seen) == 5, seen
        async with asyncio.timeout(10):
            while _fds() != before:  # the pipe's transport closes on the next turns
                await asyncio.sleep(0.01)
    finally:
        os.close(leaky)
        os.close(passed)


async def test_the_child_leads_its_own_group_and_stop_group_ends_all_of_it(path):
    child = await process.spawn(["sh", "-c", "sleep 60 & echo $!; wait"], "/", PATH, None)
    assert child.stdout is not None
    grandchild = int(await child.stdout.readline())
    assert os.getpgid(child.pid) == child.pid and os.getsid(child.pid) == child.pid
    assert os.getpgid(grandchild) == child.pid
    await process.stop_group(child, 5.0)
    assert child.returncode == -signal.SIGTERM
    async with asyncio.timeout(10):
        while process.alive(grandchild):
            await asyncio.sleep(0.01)


async def test_no_thread_waits_for_each_child(path):
    """asyncio's watcher on 3.11 starts a thread per child; a pidfd needs none."""
    children = [await process.spawn(["sleep", "60"], "/", PATH, None) for _ in range(4)]
    try:
        waiting = [t.name for t in threading.enumerate() if "waitpid-" in t.name]
        if path == "pidfd" or sys.version_info >= (3, 12):
            assert waiting == []
        else:
            assert len(waiting) >= 4
    finally:
        for child in children:
            await process.stop_group(child, 5.0)


@pytest.mark.skipif(not IS_ROOT, reason="switching users needs root")
async def test_the_fork_and_exec_happen_off_the_event_loop(path, monkeypatch):
    """CPython forks (not vforks) a child that switches users, and waits for its exec
    (vfork too): that happens in the spawner thread, switching or not."""
    threads: list[int] = []

    class Spy(subprocess.Popen):  # the real Popen; records which thread ran it
        def __init__(self, *args, **kw):
            threads.append(threading.get_ident())
            super().__init__(*args, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    await _output(await process.spawn(["true"], "/", PATH, _nobody()))
    await _output(await process.spawn(["true"], "/", PATH, None))
    loop = threading.get_ident()
    assert [t == loop for t in threads] == [path == "asyncio"] * 2, threads


def _nobody() -> RunAs:
    nobody = pwd.getpwnam("nobody")
    return RunAs(user="nobody", uid=nobody.pw_uid, gid=nobody.pw_gid, groups=(), switch=True, privileged=None)


@pytest.mark.parametrize("switch", [False, pytest.param(True, marks=pytest.mark.skipif(not IS_ROOT, reason="root"))])
@pytest.mark.parametrize("turns", range(4))
async def test_a_caller_cancelled_while_it_starts_leaves_nothing_running(path, turns, switch):
    marker = f"QLEDGE_RUN_ID=cancelled-{path}-{turns}-{switch}"
    env = {**PATH, "QLEDGE_RUN_ID": marker.partition("=")[2]}
    before = _fds()
    call = asyncio.create_task(process.spawn(["sleep", "60"], "/", env, _nobody() if switch else None))
    for _ in range(turns):
        await asyncio.sleep(0)
    call.cancel()
    try:
        child = await call
    except asyncio.CancelledError:
        child = None
    if child is not None:  # it had started: the caller owns it
        await process.stop_group(child, 5.0)
    async with asyncio.timeout(10):
        while process.orphans(None, None, marker.encode()) or _fds() != before:
            await asyncio.sleep(0.01)


def test_no_switch_when_the_run_has_the_daemons_own_credentials():
    """Then CPython vforks: switching (even to the same user) makes it fork."""
    uid, gid = os.geteuid(), os.getegid()
    same = RunAs(user="me", uid=uid, gid=gid, groups=tuple(os.getgroups()), switch=True, privileged="own")
    assert process._identity(same) == {}
    assert process._identity(_own()) == {} and process._identity(None) == {}
    primary_too = RunAs(user="me", uid=uid, gid=gid, groups=(*os.getgroups(), gid), switch=True, privileged="own")
    assert process._identity(primary_too) == {}  # the primary group counts as a member either way
    other = RunAs(user="x", uid=uid + 1, gid=gid, groups=(), switch=True, privileged=None)
    assert process._identity(other) == {"user": uid + 1, "group": gid, "extra_groups": []}
    more = RunAs(user="me", uid=uid, gid=gid, groups=(*os.getgroups(), 4242), switch=True, privileged="own")
    assert process._identity(more)["extra_groups"] == [*os.getgroups(), 4242]


@pytest.mark.skipif(not IS_ROOT, reason="switching users needs root")
async def test_a_switched_child_has_exactly_the_users_ids(path):
    nobody = pwd.getpwnam("nobody")
    run_as = RunAs(user="nobody", uid=nobody.pw_uid, gid=nobody.pw_gid, groups=(4242,), switch=True, privileged=None)
    child = await process.spawn(["sh", "-c", "id -u; id -g; id -G"], "/", PATH, run_as)
    uid, gid, groups = (await _output(child)).decode().split("\n")[:3]
    assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
    assert set(map(int, groups.split())) == {nobody.pw_gid, 4242}
    root = RunAs(user="root", uid=0, gid=0, groups=(0,), switch=True, privileged="runs as root")
    child = await process.spawn(["id", "-u"], "/", PATH, root)
    assert await _output(child) == b"0\n"
