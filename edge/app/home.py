"""The state directory (`home`): created private, and trusted only when it is ours.

Like ssh's StrictModes, the daemon refuses to start when the home or one of its files is
owned by another uid or writable by group or others, or when one of its files is a
symbolic link: whoever could write there could plant the database (and with it the tasks a
root daemon runs) or the pepper (and with it every token). Its files are opened without
following links. Each refusal is one line naming the path and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

# What the daemon keeps in its home (the socket is replaced on every start).
# audit-spool.jsonl: a cluster node's audit rows while PostgreSQL is unreachable.
STATE_FILES = ("pepper", "lock", "qledge.db", "qledge.db-wal", "qledge.db-shm", "qledge.db-journal", "ballast",
               "audit-spool.jsonl")
STATE_DIRS = ("logs",)
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


UNTRUSTED = "permission_denied"  # the code of a refusal by the state directory's checks


class StartupError(Exception):
    """One clear line with its error code; the daemon exits 2 without a traceback. What the
    state directory's checks refuse to trust is `permission_denied` (UNTRUSTED)."""

    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message)
        self.code = code


def check_ours(path: str, info: os.stat_result) -> None:
    """Refuse what is not owned by this daemon's uid or is writable by group or others."""
    me = os.geteuid()
    if info.st_uid != me:
        raise StartupError(f"{path} is owned by uid {info.st_uid}, not by this daemon's uid {me}:"
                           f" chown {me} {path} (or start the daemon as its owner)", UNTRUSTED)
    if info.st_mode & 0o022:
        raise StartupError(f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}):"
                           f" chmod go-w {path}", UNTRUSTED)


def private_dir(path: str) -> str:
    """A 0700 directory of ours (created when missing); raises StartupError otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StartupError(f"cannot create {path}: {exc.strerror}") from None
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise StartupError(f"cannot use {path}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise StartupError(f"{path} is a symbolic link; it must be a directory of its own: remove the link",
                           UNTRUSTED)
    if not stat.S_ISDIR(info.st_mode):
        raise StartupError(f"{path} is not a directory", UNTRUSTED)
    check_ours(path, info)
    return path


def prepare(home: str) -> str:
    """Create the home (0700, with its parents) or check the one there, and every file of
    ours in it; returns the home's real path (SQLite is given a path without links)."""
    try:
        os.makedirs(home, 0o700, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot create the state directory {home}: {exc.strerror}") from None
    real = os.path.realpath(home)  # a home reached through a link is fine; what is in it must be real
    try:
        info = os.stat(real)
    except OSError as exc:
        raise StartupError(f"cannot use the state directory {home}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StartupError(f"the state directory {home} is not a directory")
    check_ours(home, info)
    for name in (*STATE_FILES, *STATE_DIRS):
        path = os.path.join(real, name)
        try:
            entry = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StartupError(f"cannot check {path}: {exc.strerror}") from None
        if stat.S_ISLNK(entry.st_mode):
            raise StartupError(f"{path} is a symbolic link; the state directory's files must be its own:"
                               " remove the link", UNTRUSTED)
        want_dir = name in STATE_DIRS
        if want_dir != stat.S_ISDIR(entry.st_mode) or not (want_dir or stat.S_ISREG(entry.st_mode)):
            raise StartupError(f"{path} is not a {'directory' if want_dir else 'regular file'}: remove it", UNTRUSTED)
        check_ours(path, entry)
    private_dir(os.path.join(real, "logs"))
    return real


def load_pepper(path: str) -> bytes:
    """32 random bytes in a 0600 file; the HMAC key for credential digests."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
    except FileExistsError:
        return _read_pepper(path)
    except OSError as exc:
        raise StartupError(f"cannot create {path}: {exc.strerror}") from None
    try:
        pepper = os.urandom(32)
        os.write(fd, pepper)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)  # a short pepper would be refused at the next start
        raise StartupError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    return pepper


def _read_pepper(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise StartupError(f"{path} {why}: remove it only if no token must survive",
                           UNTRUSTED if exc.errno == errno.ELOOP else "unavailable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise StartupError(f"{path} is not a regular file of this daemon's uid", UNTRUSTED)
        if st.st_mode & 0o077:
            raise StartupError(f"{path} has mode {st.st_mode & 0o777:04o}; it must be 0600", UNTRUSTED)
        pepper = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(pepper) < 32:
        raise StartupError(f"{path} is damaged (expected 32 bytes)")
    return pepper


def lock_home(home: str) -> int:
    """Hold an exclusive lock on `<home>/lock` for the daemon's lifetime: only one daemon
    may reconcile and run the runs of a home. The kernel drops it when we die, however we
    die; the descriptor is not inherited by runs."""
    path = os.path.join(home, "lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN, 0o600)
    except OSError as exc:
        raise StartupError(f"cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another qledge daemon is already running in {home}", "conflict") from None
    try:  # the pid is for people; a full disk must not stop the start for it
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return fd
