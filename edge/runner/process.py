"""Process-group helpers: spawning in a new session and stopping the whole group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from edge.core.tasks import ArgvCommand, TaskSpec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def argv(spec: TaskSpec) -> list[str]:
    command = spec.command
    if isinstance(command, ArgvCommand):
        return [command.file, *command.args]
    return [command.shell, "-c", command.command]


async def spawn(args: list[str], cwd: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,  # own session and process group: we can stop all of it
    )


def start_ticks(pid: int) -> int | None:
    """Process start time (clock ticks since boot) from /proc: with the pid it names a
    process uniquely, so a recycled pid is never mistaken for a run's process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


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
