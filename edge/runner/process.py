"""Process helpers: who a run is (the system's users), spawning it in a new session as
that user, and stopping the whole process group."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import pwd
import signal
import stat
import subprocess
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, TypedDict

import msgspec

from edge.core.errors import ToolError, invalid
from edge.core.tasks import DATA_DIR, ArgvCommand, RunAs, ShellCommand, Task, TaskSpec

if TYPE_CHECKING:
    from edge.core.ports.runtime import Clock
    from edge.core.ports.stores import TaskStore

log = logging.getLogger("qledge.runner")
# Uids a task that uses a secret may be given, as systemd's DynamicUser ([runner] dynamic_uids).
DYNAMIC_UIDS = (61184, 65519)
DATA_BESIDE = "-tasks"  # <state dir>-tasks: every task's data directory

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_WORK_DIR = "/"  # a run's working directory unless its task names one


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    import grp  # only for tasks that name a group, or messages about one: a module fewer idle

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class SystemUsers:
    """TaskUsers (edge.core.ports.runtime) from the system's passwd and group databases.

    A root daemon switches each run to its task's user; a task is privileged when it would
    run as root or the daemon's user, with group root or the daemon's group, as a user not
    in `task_users`, or with a group its user is not a member of. A daemon that is not root
    cannot switch: every task runs as the daemon's user, so every task is privileged.
    """

    def __init__(self, task_users: Iterable[str], default_user: str | None, state_dir: str,
                 work_dir: str = DEFAULT_WORK_DIR, dynamic_uids: tuple[int, int] | None = DYNAMIC_UIDS) -> None:
        self._uid = os.geteuid()
        self._gid = os.getegid()
        self._root = self._uid == 0
        self._own = _name(self._uid)
        self._task_users = tuple(task_users)
        self._state_dir = os.path.realpath(state_dir)
        self._work_dir = work_dir
        self.data_root = self._state_dir.rstrip(os.sep) + DATA_BESIDE
        self._dynamic = dynamic_uids if self._root else None  # only a root daemon can switch
        self._uids: TaskStore | None = None
        self._clock: Clock | None = None
        if not self._root:
            self._default = self._own
        else:
            self._default = default_user or (self._task_users[0] if self._task_users else self._own)

    def attach(self, tasks: TaskStore, clock: Clock) -> None:
        """Where task uids are recorded (composition, once the stores exist)."""
        self._uids, self._clock = tasks, clock

    @property
    def can_switch(self) -> bool:
        return self._root

    @property
    def default_user(self) -> str:
        return self._default

    def problems(self) -> list[str]:
        """What is wrong with the configuration on this system: a task user that owns the
        state directory (root or the daemon's user), or a working directory inside it."""
        found: list[str] = []
        for user in self._task_users if self._root else ():
            try:
                uid = pwd.getpwnam(user).pw_uid
            except KeyError:
                continue  # a missing user only fails the tasks that name it
            if uid in (0, self._uid):
                found.append(f"[runner] task_users lists {user}, which owns the state directory;"
                             " list only unprivileged users (e.g. nobody)")
        try:
            self.working_dir(None)
        except ToolError as exc:
            found.append(f"[runner] work_dir: {exc.message}")
        if self._dynamic is not None:
            low, high = self._dynamic
            if not 0 < low <= high < 2**31 - 1 or low <= self._uid <= high:
                found.append(f"[runner] dynamic_uids {low}-{high} is not a range of uids tasks can be given"
                             " (1 to 2147483646, without the daemon's own uid)")
        return found

    def resolve(self, user: str | None, group: str | None) -> RunAs:
        if user is None or not self._root:
            return self._self(user, group)
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise invalid(f"there is no user {user!r} on this system") from None
        member_of = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        gid = pw.pw_gid
        if group is not None:
            import grp

            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise invalid(f"there is no group {group!r} on this system") from None
        return RunAs(user=user, uid=pw.pw_uid, gid=gid, groups=member_of, switch=True,
                     privileged=self._why(user, pw.pw_uid, gid, member_of, group))

    def _self(self, user: str | None, group: str | None) -> RunAs:
        """The daemon's own user: a revision that names none, or any task of a daemon that
        is not root (which may name only that user)."""
        if user is not None and user != self._own:
            raise invalid(f"this daemon runs as {self._own} (not root) and cannot switch users:"
                          f" name user {self._own}, or none")
        if group is not None and group != _group_name(self._gid):
            raise invalid(f"this daemon runs as {self._own} (not root) and cannot switch groups")
        why = "runs as root" if self._root else f"runs as the daemon's user {self._own}"
        return RunAs(user=self._own, uid=self._uid, gid=self._gid, groups=(), switch=False, privileged=why)

    def _why(self, user: str, uid: int, gid: int, member_of: tuple[int, ...], group: str | None) -> str | None:
        if uid == 0:
            return "runs as root"
        if uid == self._uid:
            return f"runs as the daemon's user {user}"
        for g in (gid, *member_of):
            if g in (0, self._gid):
                return f"runs with group {_group_name(g)}"
        if user not in self._task_users:
            return f"user {user} is not in [runner] task_users"
        if group is not None and gid not in member_of:
            return f"user {user} is not a member of group {group}"
        return None

    def working_dir(self, path: str | None, run_as: RunAs | None = None) -> str:
        if path == DATA_DIR:  # the task's own data directory: made for its run (for_task)
            return run_as.data_dir if run_as is not None and run_as.data_dir else DATA_DIR
        where = path or self._work_dir
        if not os.path.isabs(where):
            raise invalid(f"working directory {where!r} is relative, not an absolute path: give an absolute path")
        real = os.path.realpath(where)
        if real == self._state_dir or real.startswith(self._state_dir.rstrip(os.sep) + os.sep):
            raise invalid(f"working directory {where} is inside the state directory {self._state_dir};"
                          " runs never start there")
        # The child enters it before it switches users: it must be somewhere the user could go.
        if run_as is not None and run_as.switch and run_as.uid != 0:
            blocked = _unreachable(real, run_as)
            if blocked is not None:
                raise invalid(f"working directory {where}: user {run_as.user} may not enter {blocked}")
        return where

    def program(self, spec: TaskSpec, run_as: RunAs) -> None:
        command = spec.command
        file = command.file if isinstance(command, ArgvCommand) else command.shell if isinstance(
            command, ShellCommand) else None
        if file is None or not os.path.isabs(file) or not run_as.switch or run_as.uid == 0:
            return
        try:
            st = os.stat(file)
        except OSError:  # not there (yet), or behind a directory the daemon cannot search either
            return
        for directory in dict.fromkeys((os.path.realpath(os.path.dirname(file)),
                                        os.path.dirname(os.path.realpath(file)))):
            blocked = _unreachable(directory, run_as)
            if blocked is not None:
                raise invalid(f"program {file}: user {run_as.user} may not enter {blocked}")
        if not _allowed(st, run_as, 0o111):
            raise invalid(f"program {file}: user {run_as.user} may not execute it (mode {stat.filemode(st.st_mode)},"
                          f" owner uid {st.st_uid})")

    def describe(self) -> str:
        if not self._root:
            return (f"tasks run as the daemon's user {self._own} (the daemon is not root and cannot switch users);"
                    " only owners (task.privileged) may write them")
        users = ", ".join(self._task_users) or "none"
        line = f"tasks run as their own users: {users} (default {self._default}); others need task.privileged"
        if self._dynamic is not None:
            line += f"; a task that uses a secret runs as a uid of its own ({self._dynamic[0]}-{self._dynamic[1]})"
        return line

    async def for_task(self, task: Task) -> RunAs:
        spec = task.spec
        run_as = self.resolve(spec.user, spec.group)
        if self._dynamic is not None and run_as.switch and run_as.privileged is None and spec.secrets():
            uid = await self._task_uid(task)
            groups = tuple(g for g in (run_as.gid,) if spec.group is not None)
            run_as = RunAs(user=str(uid), uid=uid, gid=uid, groups=groups, switch=True, privileged=None, home="")
        data = self._data_dir(task.project_id, task.id, run_as)
        return msgspec.structs.replace(run_as, data_dir=data, home=data if run_as.home is not None else None)

    async def _task_uid(self, task: Task) -> int:
        if self._uids is None or self._clock is None or self._dynamic is None:
            raise ToolError("unavailable", "task uids are not wired in this daemon")
        uid = await self._uids.task_uid(task.project_id, task.id)
        if uid is None:
            low, high = self._dynamic
            uid = await self._uids.allocate_task_uid(task.project_id, task.id, low, high, _system_ids(low, high),
                                                     self._clock.now_ms())
        return uid

    def _data_dir(self, project: str, task_id: str, run_as: RunAs) -> str:
        path = os.path.join(self.data_root, project, task_id)
        me = (self._uid, self._gid)
        try:
            root = _directory(None, self.data_root, *me, 0o711)
            try:
                parent = _directory(root, project, *me, 0o711)
            finally:
                os.close(root)
            try:
                os.close(_directory(parent, task_id, run_as.uid, run_as.gid, 0o700, anew=True))
            finally:
                os.close(parent)
        except OSError as exc:
            raise ToolError("unavailable", f"cannot make the data directory {path}: {exc.strerror or exc}") from None
        return path

    def forget(self, project: str, task_id: str) -> None:
        try:
            parent = os.open(os.path.join(self.data_root, project), _DIR_FLAGS)
        except OSError:
            return  # none was made
        try:
            _remove(parent, task_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # a task that never ran has none
                log.warning("could not remove the data directory of task %s: %s", task_id, exc)
        finally:
            os.close(parent)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _directory(parent: int | None, name: str, uid: int, gid: int, mode: int, anew: bool = False) -> int:
    """`name` (in `parent`, or a path) as a directory of uid:gid with `mode`, never through a
    link: made when missing. One another uid owns is refused, or with `anew` removed with
    what is in it (by descriptors), so what one identity left never reaches another; a link
    or file in its place is removed with `anew` (the entry, not what it points to)."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or (st.st_uid != uid and not made):
        if not anew:
            raise PermissionError(errno.EPERM, f"{name} is not a directory of uid {uid}")
        _remove(parent, name)
        return _directory(parent, name, uid, gid, mode)
    # By name: `parent` is the daemon's, so no task's uid can swap the entry meanwhile. The
    # mode first, while the directory is ours (taken back when a task's uid has it), and only
    # then handed over: a root daemon needs CAP_CHOWN for this, not CAP_FOWNER or CAP_DAC_OVERRIDE.
    me = os.geteuid()
    owner = st.st_uid
    if stat.S_IMODE(st.st_mode) != mode:
        if owner != me:
            os.chown(name, me, -1, dir_fd=parent, follow_symlinks=False)
            owner = me
        os.chmod(name, mode, dir_fd=parent)
    if (owner, st.st_gid) != (uid, gid):
        os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
    # Another uid's directory need not be readable to the daemon: a path descriptor then.
    return os.open(name, _DIR_FLAGS | (os.O_PATH if uid != me else 0), dir_fd=parent)


_REMOVE_DEPTH = 16  # directories a removal holds open at once; deeper ones are moved up first


def _remove(parent: int | None, name: str) -> None:
    """`name` in `parent` and what is in it, by descriptors, following no link. Each directory
    is made the daemon's (0700) before it is read (_taken), so what a task left goes whatever
    its modes, and a root daemon needs CAP_CHOWN for it, not CAP_DAC_OVERRIDE. Without
    recursion and with at most _REMOVE_DEPTH descriptors, however deep a task nested it: a
    directory deeper than that is renamed into the top one and removed from there."""
    top = _taken(parent, name)
    if top is None:
        return
    stack: list[tuple[int | None, str, int, list[str]]] = [(parent, name, top, _listed(top))]
    names = set(stack[0][3])
    try:
        while stack:
            up, here, fd, entries = stack[-1]
            if not entries:
                stack.pop()
                os.close(fd)
                os.rmdir(here, dir_fd=up)
                continue
            entry = entries.pop()
            sub = _taken(fd, entry)
            if sub is None:
                continue
            if len(stack) < _REMOVE_DEPTH:
                stack.append((fd, entry, sub, _listed(sub)))
                continue
            os.close(sub)
            moved = next(f".qledge-rm-{n}" for n in range(len(names) + 1) if f".qledge-rm-{n}" not in names)
            names.add(moved)
            os.rename(entry, moved, src_dir_fd=fd, dst_dir_fd=top)
            stack[0][3].append(moved)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def _listed(fd: int) -> list[str]:
    """The entries of the directory `fd`; `fd` closed when they cannot be read."""
    try:
        return os.listdir(fd)
    except OSError:
        os.close(fd)
        raise


def _taken(parent: int | None, name: str) -> int | None:
    """`name` unlinked when it is not a directory (None), else made the daemon's, 0700, and
    opened. From then on no task's uid may change it (its parent is the daemon's already)."""
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return None
    me = os.geteuid()
    if st.st_uid != me:
        os.chown(name, me, -1, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR((st := os.stat(name, dir_fd=parent, follow_symlinks=False)).st_mode) or st.st_uid != me:
        raise PermissionError(errno.EPERM, f"{name} changed while it was removed")
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(name, 0o700, dir_fd=parent)  # ours, and a directory: no link is followed
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _system_ids(low: int, high: int) -> frozenset[int]:
    """The uids and gids of [low, high] the system's users and groups have: never a task's."""
    import grp

    return frozenset({p.pw_uid for p in pwd.getpwall() if low <= p.pw_uid <= high}
                     | {g.gr_gid for g in grp.getgrall() if low <= g.gr_gid <= high})


def _unreachable(real: str, run_as: RunAs) -> str | None:
    """The first directory on the way to `real` (itself included) that `run_as` may not
    search, by its mode bits as the kernel reads them; None when every one is open to it
    (or when the path does not exist yet: entering it then fails at the start of the run)."""
    path = os.sep
    for part in [p for p in real.split(os.sep) if p] + [""]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not _allowed(st, run_as, 0o111):
            return path
        path = os.path.join(path, part)
    return None


def _allowed(st: os.stat_result, run_as: RunAs, bits: int) -> bool:
    """Whether `run_as` holds `bits` (0o111: execute/search, 0o444: read) of a file, by its
    mode as the kernel reads it: the owner's bits, else the group's, else the others'."""
    if st.st_uid == run_as.uid:
        return bool(st.st_mode & bits & 0o700)
    if st.st_gid in {run_as.gid, *run_as.groups}:
        return bool(st.st_mode & bits & 0o070)
    return bool(st.st_mode & bits & 0o007)


DEFAULT_LANG = "C.UTF-8"
_NO_LOGIN = ("nologin", "false")  # a service account's "shell": scripts that run $SHELL get /bin/sh


def user_environment(uid: int, timezone: str, lang: str = DEFAULT_LANG) -> dict[str, str]:
    """What a login would give the user a run executes as: HOME, USER, LOGNAME and SHELL
    from its passwd entry (a uid without one gets its number, / and /bin/sh), and PATH,
    LANG and TZ. Nothing of the daemon's own environment leaks into a run."""
    try:
        entry = pwd.getpwuid(uid)
        name, home, shell = entry.pw_name, entry.pw_dir or "/", entry.pw_shell or "/bin/sh"
    except KeyError:
        name, home, shell = str(uid), "/", "/bin/sh"
    if os.path.basename(shell) in _NO_LOGIN:
        shell = "/bin/sh"
    return {"HOME": home, "USER": name, "LOGNAME": name, "SHELL": shell, "PATH": DEFAULT_PATH, "LANG": lang,
            "TZ": timezone}


def run_environment(run_as: RunAs | None) -> dict[str, str]:
    """What a run gets beyond its user's login variables: its task's data directory
    (QLEDGE_DATA_DIR) and, for a uid of the task's own (no passwd entry), HOME there."""
    env: dict[str, str] = {}
    if run_as is not None and run_as.home:
        env["HOME"] = run_as.home
    if run_as is not None and run_as.data_dir:
        env["QLEDGE_DATA_DIR"] = run_as.data_dir
    return env


def argv(spec: TaskSpec) -> list[str]:
    command = spec.command
    if isinstance(command, ArgvCommand):
        return [command.file, *command.args]
    if isinstance(command, ShellCommand):
        return [command.shell, "-c", command.command]
    raise ValueError("an AI task is not a command")


class Child(Protocol):
    """A run's process as the runner sees it: its pid (the leader of its own process
    group), its output, and its exit. asyncio.subprocess.Process is one."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    async def wait(self) -> int: ...


class _Ids(TypedDict, total=False):
    user: int
    group: int
    extra_groups: list[int]
    umask: int


def _identity(run_as: RunAs | None) -> _Ids:
    """What the child must switch to; nothing when it would run with the daemon's own
    credentials (a root daemon's task of root), so CPython can vfork instead of fork. The
    primary group counts as a member either way, as it does for the kernel's checks.

    A run under a uid of its own (a task that uses a secret) starts with umask 0077: what
    it writes to a shared place (/tmp) is its own alone, not readable by another task's
    user. Other runs keep the daemon's umask."""
    if run_as is None or not run_as.switch:
        return {}
    uid, gid = run_as.uid, run_as.gid
    if (os.getresuid() == (uid, uid, uid) and os.getresgid() == (gid, gid, gid)
            and {*os.getgroups(), gid} == {*run_as.groups, gid}):
        return {}
    ids: _Ids = {"user": uid, "group": gid, "extra_groups": list(run_as.groups)}
    if run_as.home is not None:
        ids["umask"] = 0o077
    return ids


# Whether os.pidfd_open works here (Linux 5.3 and later; OpenWrt kernels before that, and
# sandboxes that filter it, do not): probed once. Without it a run starts as before.
_pidfd: bool | None = None
_spawner: concurrent.futures.ThreadPoolExecutor | None = None


def pidfd_available() -> bool:
    global _pidfd
    if _pidfd is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _pidfd = True
        except (AttributeError, OSError):
            _pidfd = False
    return _pidfd


async def spawn(
    args: list[str], cwd: str, env: dict[str, str], run_as: RunAs | None, pass_fds: tuple[int, ...] = ()
) -> Child:
    """Start `args` in its own session, as `run_as` (None: the daemon's own user).

    The child is forked (vforked when it needs no switch) and exec'd in a worker thread,
    the loop going on meanwhile (CPython releases the GIL while it waits for the exec), and
    its exit is seen through a pidfd on the loop: no thread per child. Where pidfds are
    missing, asyncio starts it (on the loop, its watcher waits in a thread per child).
    Either way it has returned once the child has exec'd (or failed to: OSError), and a
    caller cancelled meanwhile leaves no process behind."""
    # The child switches (setgroups, setregid, setreuid) itself, after fork and before
    # exec: no shell or helper runs in between with the daemon's rights. Descriptors in
    # `pass_fds` (an AI run's job and tool connection) are inherited; no other is.
    ids = _identity(run_as)
    if not pidfd_available():
        return await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=cwd, env=env,
            start_new_session=True,  # own session and process group: we can stop all of it
            pass_fds=pass_fds, **ids,
        )
    loop = asyncio.get_running_loop()
    global _spawner
    if _spawner is None:  # one thread, started with the first run
        _spawner = concurrent.futures.ThreadPoolExecutor(1, "qledge-spawn")
    started = _spawner.submit(_start, args, cwd, env, ids, pass_fds)
    ready = loop.create_future()
    started.add_done_callback(lambda _: _wake(loop, ready))
    try:
        await ready
    except asyncio.CancelledError:
        # Not begun: nothing started. Begun: it is done in a few milliseconds (the exec),
        # and what it started is stopped; the descriptors passed are safe to close then.
        if not started.cancel() and started.exception() is None:
            _discard(*started.result())
        raise
    popen, pidfd = started.result()  # OSError: could not start (the command, cwd, user)
    return await _attach(loop, popen, pidfd)


async def _attach(loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes], pidfd: int) -> Child:
    try:
        return await _PidfdChild.attach(loop, popen, pidfd)
    except BaseException:
        _discard(popen, pidfd)
        raise


def _wake(loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
    def done() -> None:
        if not ready.done():
            ready.set_result(None)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(done)


def _start(args: list[str], cwd: str, env: dict[str, str], ids: _Ids,
           pass_fds: tuple[int, ...]) -> tuple[subprocess.Popen[bytes], int]:
    """In the spawner thread: fork (vfork when no switch is needed) and exec, and a pidfd."""
    popen = subprocess.Popen(
        args, bufsize=0, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
        env=env, start_new_session=True, pass_fds=pass_fds, close_fds=True, **ids,
    )
    try:
        return popen, os.pidfd_open(popen.pid)
    except OSError:
        _discard(popen, None)
        raise


def _discard(popen: subprocess.Popen[bytes], pidfd: int | None) -> None:
    """Kill a child nobody will supervise, with its group, and reap it (in the spawner)."""
    signal_group(popen.pid, signal.SIGKILL)
    if popen.stdout is not None:
        popen.stdout.close()
    if pidfd is not None:
        os.close(pidfd)
    if _spawner is not None:
        _spawner.submit(popen.wait)


class _PidfdChild:
    """A child whose exit the loop sees on its pidfd, and reaps then (waitpid on a pid
    that stays ours until reaped: it cannot name another process)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes], pidfd: int,
                 stdout: asyncio.StreamReader) -> None:
        self.pid = popen.pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.returncode: int | None = None
        self._popen = popen
        self._loop = loop
        self._pidfd = pidfd
        self._exit = asyncio.Event()
        loop.add_reader(pidfd, self._exited)

    @classmethod
    async def attach(cls, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes],
                     pidfd: int) -> _PidfdChild:
        assert popen.stdout is not None
        reader = asyncio.StreamReader(limit=2**16, loop=loop)  # as asyncio's own subprocesses
        # The transport closes the pipe at its end of file.
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), popen.stdout)
        return cls(loop, popen, pidfd, reader)

    def _exited(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, code = self.pid, 255  # reaped elsewhere: asyncio reports the same
        else:
            if pid == 0:
                return  # not yet (the pidfd is readable once it has exited)
            code = os.waitstatus_to_exitcode(status)  # -N: killed by signal N, as asyncio reports
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._popen.returncode = code  # reaped: Popen never waits for it again
        self._exit.set()

    async def wait(self) -> int:
        await self._exit.wait()
        assert self.returncode is not None
        return self.returncode


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


async def stop_group(proc: Child, grace_s: float) -> None:
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
