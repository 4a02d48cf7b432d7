"""Making or migrating the database file in a short-lived child before it is opened.

What SQLite allocates while it makes a database, migrates one or rewrites one with another
page size is freed when that ends, but the freed memory stays with the process's allocator:
about 0.2 MiB of a new daemon's resident size for its whole life (measured idle with 100
tasks and triggers: VmHWM 23.8 MiB when it made its database, 23.6 when the file was made
before). In a child that ends, it goes with the child. A fork is taken only where it is
safe: a POSIX system, and the calling thread the process's only one (else the caller does
the work in place, as before).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextlib import suppress

import msgspec

_MESSAGE_MAX = 4096
_LOGGED_MAX = 64  # records the child passes on (what the work logs: a line or two)


class Logged(msgspec.Struct, array_like=True):
    """A record the child logged, for the parent to log again."""

    level: int
    name: str
    message: str


class Outcome(msgspec.Struct, array_like=True):
    """What the child tells its parent: what it logged, and the one line of its failure."""

    logged: list[Logged]
    failure: str | None = None


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Outcome).decode


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Logged] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.kept) < _LOGGED_MAX:
            self.kept.append(Logged(record.levelno, record.name, record.getMessage()))


def _keep_records() -> _Keep:
    """In the child: every record kept for the parent instead of written by the handlers it inherited."""
    keep = _Keep()
    for logger in logging.root.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.handlers = []
    logging.root.handlers = [keep]
    return keep


def run_apart(work: Callable[[], None], describe: Callable[[BaseException], str]) -> str | None | bool:
    """Run `work` in a forked child and wait for it. Returns None when it succeeded, the
    one line `describe` made of what it raised when it failed, and False when no child
    was made (the caller does the work itself)."""
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the work, what it logged and its failure, then out without the parent's cleanup
        code = 0
        with suppress(BaseException):
            os.close(read)
            keep = _keep_records()
            failure = None
            try:
                work()
            except BaseException as exc:  # every failure becomes the parent's line
                code, failure = 1, describe(exc)[:_MESSAGE_MAX]
            os.write(write, _encode(Outcome(keep.kept, failure)))
        os._exit(code)
    os.close(write)
    try:
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        outcome = _decode(b"".join(chunks))
    except msgspec.DecodeError:
        outcome = Outcome([])
    for record in outcome.logged:
        logging.getLogger(record.name).log(record.level, "%s", record.message)
    if code == 0:
        return None
    return outcome.failure or f"the process preparing the database ended {_ended(code)}"


def _ended(code: int) -> str:
    return f"by signal {-code}" if code < 0 else f"with exit code {code}"
