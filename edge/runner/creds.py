"""The spawner thread's own credentials, switched to a run's user around its start.

Linux keeps credentials per thread; the C libraries (glibc, musl) make setuid() and
friends apply to every thread of the process, but the raw system calls change only the
caller. The spawner thread takes the run's groups and ids that way, CPython vforks the
child (it forks instead when it is asked to switch itself, and a fork of the daemon costs
a copy of its page tables and then a write fault for every page the daemon touches), and
the thread takes the daemon's credentials back once the child has exec'd.

The thread keeps the daemon's saved uid meanwhile (its way back), and its child has it
until the exec, which sets the saved ids to the effective ones: what runs has the user's
ids in all three places and no capabilities, as after setreuid(). The switch is used only
where every step can be checked: a known architecture, ctypes loadable, no ambient
capabilities (which a saved uid of 0 would carry across the exec), and the thread's ids
read back exactly as asked. Elsewhere the child switches itself after a fork, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger("qledge.runner")

# (setgroups, setresuid, setresgid) with 32-bit ids, by `uname -m`.
_GENERIC = (159, 147, 149)  # the asm-generic table: arm64, riscv64, loongarch64
_CALLS: dict[str, tuple[int, int, int]] = {
    "x86_64": (116, 117, 119),
    "aarch64": _GENERIC, "arm64": _GENERIC, "riscv64": _GENERIC, "loongarch64": _GENERIC,
    "i386": (206, 208, 210), "i486": (206, 208, 210), "i586": (206, 208, 210), "i686": (206, 208, 210),
    "armv5tel": (206, 208, 210), "armv6l": (206, 208, 210), "armv7l": (206, 208, 210), "armv8l": (206, 208, 210),
}
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4

_Syscall = Callable[..., int]


class RestoreFailed(OSError):
    """The thread could not take the daemon's credentials back: it must start nothing more."""


class _Calls:
    def __init__(self, syscall: _Syscall, prctl: _Syscall, numbers: tuple[int, int, int]) -> None:
        import ctypes

        self._c = ctypes
        self._syscall = syscall
        self._prctl = prctl
        self._setgroups, self._setresuid, self._setresgid = numbers

    def _check(self, result: int) -> None:
        if result != 0:
            err = self._c.get_errno()
            raise OSError(err, os.strerror(err))

    def setgroups(self, groups: list[int]) -> None:
        array = (self._c.c_uint * max(1, len(groups)))(*groups)
        self._check(self._syscall(self._c.c_long(self._setgroups), self._c.c_long(len(groups)), array))

    def setresuid(self, r: int, e: int, s: int) -> None:
        c = self._c.c_long
        self._check(self._syscall(c(self._setresuid), c(r), c(e), c(s)))

    def setresgid(self, r: int, e: int, s: int) -> None:
        c = self._c.c_long
        self._check(self._syscall(c(self._setresgid), c(r), c(e), c(s)))

    def dumpable(self) -> int:
        return self._prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)

    def set_dumpable(self, value: int) -> None:
        self._prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)  # best effort: only who may read /proc/<pid>


_calls: _Calls | None = None
_probed = False
_lock = threading.Lock()


def _no_ambient() -> bool:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapAmb:"):
                    return int(line.split()[1], 16) == 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def _load() -> _Calls | None:
    numbers = _CALLS.get(platform.machine())
    if numbers is None or not _no_ambient():
        return None
    try:
        import ctypes  # loaded with the first run that switches users, not at start-up

        libc = ctypes.CDLL(None, use_errno=True)
        syscall, prctl = libc.syscall, libc.prctl
        syscall.restype = prctl.restype = ctypes.c_long
        return _Calls(syscall, prctl, numbers)
    except Exception as exc:  # no ctypes (a minimal build), or no memory it may execute  # noqa: BLE001
        log.debug("runs switch users after a fork: %s", exc)
        return None


def available() -> bool:
    """Whether the spawner thread can take a run's credentials itself (probed once)."""
    global _calls, _probed
    with _lock:
        if not _probed:
            _calls, _probed = _load(), True
        return _calls is not None


def _disable(why: str) -> None:
    global _calls
    log.warning("runs switch users after a fork from now on: %s", why)
    _calls = None


@contextlib.contextmanager
def switched(uid: int, gid: int, groups: list[int]) -> Iterator[bool]:
    """This thread as uid/gid with `groups` (and the daemon's saved uid) inside; True if
    it switched, False where it cannot (the caller then has the child switch itself).
    Raises RestoreFailed when the daemon's credentials could not be taken back."""
    calls = _calls
    if calls is None:
        yield False
        return
    own_uid, own_gid, own_groups = os.getresuid(), os.getresgid(), os.getgroups()
    dumpable = calls.dumpable()
    try:
        calls.setgroups(groups)
        calls.setresgid(gid, gid, gid)
        calls.setresuid(uid, uid, own_uid[2])
        if (os.getresuid(), os.getresgid(), sorted(os.getgroups())) != (
                (uid, uid, own_uid[2]), (gid, gid, gid), sorted(groups)):
            raise OSError(0, "the thread's ids did not read back as set")
    except OSError as exc:
        _restore(calls, own_uid, own_gid, own_groups, dumpable)
        _disable(f"the spawner thread could not switch: {exc}")
        yield False
        return
    try:
        yield True
    finally:
        _restore(calls, own_uid, own_gid, own_groups, dumpable)


def _restore(calls: _Calls, uid: tuple[int, int, int], gid: tuple[int, int, int], groups: list[int],
             dumpable: int) -> None:
    try:
        calls.setresuid(*uid)  # first: the rest needs the daemon's capabilities back
        calls.setresgid(*gid)
        calls.setgroups(groups)
    except OSError as exc:
        _disable("the spawner thread could not take its credentials back")
        raise RestoreFailed(exc.errno, f"the spawner thread could not take its credentials back: {exc}") from None
    if (os.getresuid(), os.getresgid(), sorted(os.getgroups())) != (uid, gid, sorted(groups)):
        _disable("the spawner thread's credentials did not read back")
        raise RestoreFailed(0, "the spawner thread's credentials did not read back")
    if dumpable > 0 and calls.dumpable() != dumpable:  # an effective uid change resets it for the process
        calls.set_dumpable(dumpable)
