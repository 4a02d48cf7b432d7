"""Process-group helpers: spawning in a new session and stopping the whole group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from edge.core.tasks import ArgvCommand, ShellCommand, TaskSpec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def argv(spec: TaskSpec) -> list[str]:
    command = spec.command
    if isinstance(command, ArgvCommand):
        return [command.file, *command.args]
    if isinstance(command, ShellCommand):
        return [command.shell, "-c", command.command]
    raise ValueError("an AI task is not a command")


async def spawn(args: list[str], cwd: str, env: dict[str, str], pass_fds: tuple[int, ...] = ()
                ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,  # own session and process group: we can stop all of it
        pass_fds=pass_fds,
    )


def job_descriptor(data: bytes, fallback_dir: str) -> int:
    """An anonymous, unlinked file holding `data`, positioned at its start: what an AI run's
    child reads its job from (the runner passes it with pass_fds; it has no name anyone
    could open). Falls back to an O_TMPFILE (0600) where memfd_create is missing."""
    try:
        fd = os.memfd_create("qledge-job", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = os.open(fallback_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3, the state, first)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses; fields resume after the last ')'.
    return raw[raw.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Process start time (clock ticks since boot) from /proc: with the pid it names a
    process uniquely, so a recycled pid is never mistaken for a run's process."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int, ticks: int | None = None) -> bool:
    """The process exists, is not a zombie and (if given) started at `ticks`."""
    fields = _stat(pid)
    if not fields or fields[0] == b"Z":
        return False
    return ticks is None or (len(fields) > 19 and fields[19] == str(ticks).encode())


def orphans(pgid: int | None, since_ticks: int | None, marker: bytes) -> list[int]:
    """Live members of process group `pgid` (any group when None) whose environment
    carries `marker` and that started no earlier than `since_ticks`: what is left of a
    run whose leader is gone.

    The kernel does not reuse a pid while a group of that id has members, and the marker
    (the run's id in its environment) rules out a group of the same id formed later.
    """
    found: list[int] = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            fields = _stat(pid)
            try:
                if not fields or fields[0] == b"Z" or (pgid is not None and int(fields[2]) != pgid):
                    continue
                if since_ticks is not None and int(fields[19]) < since_ticks:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile, or not ours to read
            found.append(pid)
    return found


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


async def stop_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the group, then SIGKILL if the leader outlives the grace period."""
    if not signal_group(proc.pid, signal.SIGTERM):
        return
    try:
        async with asyncio.timeout(grace_s):
            await proc.wait()
    except TimeoutError:
        pass
    # Whatever is left of the group (the leader or children that ignored TERM) goes now.
    signal_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


async def stop_orphaned_run(pid: int | None, ticks: int | None, marker: bytes, grace_s: float) -> int:
    """Stop what survives of a run started by a daemon that died; returns how many
    processes (or 1 for a whole group) were signalled.

    Not our children, so nothing can be waited for: SIGTERM, poll /proc until they are
    gone or the grace period ends, then SIGKILL. Targets are re-identified before every
    signal, by the leader's pid and start time, else by the run marker in the environment.
    """

    def targets() -> list[int] | None:  # None: the leader's whole group
        if pid is not None and ticks is not None and alive(pid, ticks):
            return None
        if pid is not None and alive(pid):
            return []  # the pid now names another process: ours are all gone
        return orphans(pid, ticks, marker)

    def send(found: list[int] | None, sig: int) -> None:
        if found is None:
            signal_group(pid, sig)  # type: ignore[arg-type]
        for member in found or ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, sig)

    found = targets()
    if found == []:
        return 0
    count = 1 if found is None else len(found)
    send(found, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    # Not our children: their exit cannot be awaited, only seen in /proc.
    while (found := targets()) != [] and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if found != []:
        send(found, signal.SIGKILL)
    return count
