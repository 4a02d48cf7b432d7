"""Run logs on disk: the one owner of their files (RunLogs: paths, creation, reading,
recovery, removal) and of their format (LogSink: 0600, capped to head and tail,
credentials and secrets redacted, never a reason to stop reading the child's pipe).

Memory stays small whatever the child prints. Output goes straight into the log file
until the cap is reached, line by line (redaction needs to see a line whole), so a log
within the cap is complete up to what redaction holds back, and readable, as it grows.
What is held back (an unfinished line, or the end of one a secret could continue past) is
written when the runner says it has waited long enough (`LogSink.release`), so a follower
or a crash never loses more than that wait.
Beyond the cap, output is spooled in fixed-size segment files in `<log>.tail/`, each named
by the stream offset of its first byte; the oldest is deleted once the newer ones cover
the tail. Closing rewrites the file in place as head + marker + tail. Because segments
carry their offsets, the log of a run whose daemon died is assembled the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from collections.abc import Callable, Iterable

from edge.core.errors import unavailable
from edge.core.ports.stores import LogRange
from edge.core.runs import LOG_HEAD_MAX, log_cap_marker

HEAD_MAX = LOG_HEAD_MAX
SEGMENT_MAX = 256 * 1024  # fewer, larger files: creating and deleting them is the cost
LINE_MAX = 8192  # an unfinished line longer than this is decided without waiting for its end
KEY_MAX = 16384  # after a private key's BEGIN, how much is masked while its END does not come
_COPY = 64 * 1024
# Never through a link: a log or segment path that is one (or anything else) is refused.
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Redactor:
    """Masks credentials and configured secret values (edge.core.redaction: the same rules
    as the AI excerpt) in a byte stream fed in arbitrary chunks.

    Output is decided line by line: the unfinished last line is held back (unredacted,
    never emitted) until its end arrives, and so are the last characters before it that a
    secret continuing on the next line could start with. A line longer than `LINE_MAX` is
    decided without waiting for its end. A private key whose END has not arrived yet keeps
    being masked, line after line, up to `KEY_MAX` characters.

    `release` decides what is held without waiting for more, as the end of the output
    would (a secret cut there is masked from its first few characters on). The text just
    emitted is kept as context: a secret or a credential's value that it began is masked
    in what follows, though the part already emitted cannot be taken back.
    """

    def __init__(self, secrets: Iterable[bytes]) -> None:
        # Loaded with the first run's log, not by an idle daemon: the rules are large.
        from edge.core.redaction import PEM_BEGIN, PEM_END, Masker, apply, merge

        self._masker = Masker(s.decode("utf-8", "surrogateescape") for s in secrets)
        self._apply, self._merge = apply, merge
        self._begin, self._end = PEM_BEGIN, PEM_END
        self._carry = b""
        self._context = ""  # emitted text that what follows may continue (after a release, or a cut mid-line)
        self._in_key = 0  # characters masked so far inside a key whose END is still to come; 0: none

    @property
    def held(self) -> int:
        """Bytes fed but not emitted yet."""
        return len(self._carry)

    def feed(self, chunk: bytes, final: bool = False) -> bytes:
        return self._decide(chunk, final)

    def release(self) -> bytes:
        """Everything held, decided now (the stream goes on)."""
        return self._decide(b"", True)

    def flush(self) -> bytes:
        return self.feed(b"", final=True)

    def _decide(self, chunk: bytes, now: bool) -> bytes:
        buf = self._carry + chunk if self._carry else chunk
        if not buf:
            return b""
        text = buf.decode("utf-8", "surrogateescape")  # bytes in, the same bytes out
        # Spans are found on the context and the text together, and masked in the text only.
        base = len(self._context)
        full = self._context + text if base else text
        cut = len(full) if now else base + self._decided(text)
        found = self._masker.spans(full, cut_at_end=now)
        if self._in_key:
            closing = self._end.search(full, base)
            found.append((base, closing.end() if closing else cut, "private_key"))
        decided = [span for span in self._merge(found) if span[0] < cut and span[1] > base]
        end = max(cut, decided[-1][1] if decided else 0)
        emitted = text[:end - base]
        out = self._apply(emitted, [[max(a, base) - base, b - base] for a, b in decided])
        self._follow_key(emitted, end - base)
        self._carry = text[end - base:].encode("utf-8", "surrogateescape")
        if end > base:
            self._context = self._continued(full[:end]) if now or full[end - 1] not in "\r\n" else ""
        return out.encode("utf-8", "surrogateescape")

    def _continued(self, emitted: str) -> str:
        """What of the emitted text a secret or a credential may continue past: its last
        line, and the characters a secret could have started with, within LINE_MAX."""
        line = max(emitted.rfind("\n"), emitted.rfind("\r")) + 1
        start = min(line, self._masker.undecided(emitted))
        return emitted[max(start, len(emitted) - LINE_MAX - self._masker.longest):]

    def _decided(self, text: str) -> int:
        """Where the text that can be decided now ends: at the start of a line, so that no
        line is cut between a key and its value (unless it is longer than LINE_MAX)."""
        line_end = max(text.rfind("\n"), text.rfind("\r")) + 1
        if len(text) - line_end > LINE_MAX:
            return len(text) - LINE_MAX
        held = self._masker.undecided(text)
        if held >= line_end:
            return line_end
        start = max(text.rfind("\n", 0, held), text.rfind("\r", 0, held)) + 1
        return start if held - start <= LINE_MAX else held

    def _follow_key(self, emitted: str, size: int) -> None:
        begin = None
        for begin in self._begin.finditer(emitted):  # noqa: B007 - the last one is wanted
            pass
        if begin is not None and not self._end.search(emitted, begin.end()):
            self._in_key = max(1, len(emitted) - begin.start())
        elif self._in_key and not self._end.search(emitted):
            self._in_key += size
        else:
            self._in_key = 0
        if self._in_key > KEY_MAX:
            self._in_key = 0  # a BEGIN line without a key after it: stop masking


def marker(dropped: int) -> bytes:
    return log_cap_marker(dropped)


def incomplete_marker(reason: str, lost: int) -> bytes:
    return f"\n[qledge: log incomplete: {reason}; {lost} bytes of output are missing from here on]\n".encode()


def spool_dir(path: str) -> str:
    return path + ".tail"


class LogSink:
    """Keeps the first `head` and the last bytes of the output, within `cap` bytes in all.

    Storage errors (a full disk) stop the writing, never the reading: the child keeps
    running and its pipe keeps being drained.
    """

    def __init__(self, path: str, cap: int, secrets: Iterable[bytes] = (),
                 on_full: Callable[[], bool] | None = None) -> None:
        self.path = path
        self._on_full = on_full  # gives space back (the ballast) for the last line of an incomplete log
        self._cap = cap
        self._head = head_size(cap)
        self._tail = cap - self._head
        self._segment_max = max(4096, min(SEGMENT_MAX, self._tail // 4))
        self._redactor = Redactor(secrets)
        # Made with the first byte of output: a run that prints nothing (most scheduled
        # runs) has no file to create, allocate an inode for, and delete again with its run.
        self._fd: int | None = None
        self._spool = spool_dir(path)
        self._segments: deque[list[int]] = deque()  # [stream offset, size], oldest first
        self._kept = 0  # bytes in the segments
        self._seg_fd: int | None = None
        self.total = 0  # bytes of (redacted) output seen
        self.size = 0  # bytes in the finished log file
        self.failed: OSError | None = None
        self._closed = False

    @property
    def truncated(self) -> bool:
        return self.total > self._cap or self.failed is not None

    @property
    def held(self) -> int:
        """Bytes written but held back by redaction, not in the file yet."""
        return 0 if self._closed else self._redactor.held

    def write(self, chunk: bytes) -> None:
        self._store(self._redactor.feed(chunk))

    def release(self) -> None:
        """Write what redaction holds back now, without waiting for more output."""
        if not self._closed:
            self._store(self._redactor.release())

    def _store(self, data: bytes) -> None:
        view = memoryview(data)
        start = self.total
        self.total += len(view)
        if self.failed is not None or not view:
            return
        try:
            if self._fd is None:
                self._fd = os.open(self.path, _FLAGS, 0o600)
            if start < self._cap:
                n = min(len(view), self._cap - start)
                _write_all(self._fd, view[:n])
                view, start = view[n:], start + n
            while view:
                room = self._segment_max - self._segments[-1][1] if self._segments else 0
                if room == 0:
                    self._rotate(start)
                    room = self._segment_max
                n = min(len(view), room)
                assert self._seg_fd is not None
                _write_all(self._seg_fd, view[:n])
                self._segments[-1][1] += n
                self._kept += n
                view, start = view[n:], start + n
        except OSError as exc:
            self.failed = exc

    def _rotate(self, offset: int) -> None:
        if self._seg_fd is None:
            _private_subdir(self._spool)
        else:
            os.close(self._seg_fd)
            self._seg_fd = None
        # The oldest segment goes once the others still cover the whole tail.
        while self._segments and self._kept - self._segments[0][1] >= self._tail:
            off, size = self._segments.popleft()
            self._kept -= size
            os.unlink(os.path.join(self._spool, str(off)))
        self._seg_fd = os.open(os.path.join(self._spool, str(offset)), _FLAGS, 0o600)
        self._segments.append([offset, 0])

    def close(self) -> int:
        """Finish the file; returns its size in bytes. Safe to call twice."""
        if self._closed:
            return self.size
        self._closed = True
        self._store(self._redactor.flush())
        if self._seg_fd is not None:
            os.close(self._seg_fd)
        if self._fd is None:  # nothing printed (or the file could not be made: `failed` says why)
            return self.size
        try:
            if self.failed is None and self.total > self._cap:
                segments = [(off, size) for off, size in self._segments]
                _assemble(self._fd, self._spool, self._head, self._cap, self.total, self._cap, segments)
            self.size = os.fstat(self._fd).st_size
        except OSError as exc:
            self.failed = exc
        try:
            if self.failed is not None:
                with contextlib.suppress(OSError):
                    self.size = _mark_incomplete(self._fd, self.failed, self.total, self._cap, self._on_full)
        finally:
            os.close(self._fd)
            _remove_spool(self._spool)
        return self.size


def head_size(cap: int) -> int:
    return min(HEAD_MAX, cap // 2)


def _write_all(fd: int, data: memoryview) -> None:
    # A short write (the disk filled up mid-chunk) is followed by one that raises.
    while data:
        data = data[os.write(fd, data):]


def _mark_incomplete(fd: int, failed: OSError, total: int, cap: int, on_full: Callable[[], bool] | None) -> int:
    """End a log that could not be written completely with a line saying so; returns its
    size. On a full disk there may be no room even for that line: then `on_full` gives
    space back (the ballast; the run has ended, nothing else takes it), or else the last
    bytes written make room for it (an overwrite within blocks the file already has)."""
    size = os.fstat(fd).st_size
    reason = failed.strerror or str(failed)
    for room in (0, -1, 4096, 65536):  # -1: append, once space was given back
        if room < 0:
            if on_full is None or not on_full():
                continue
            room = 0
        keep = max(0, min(size - room, cap - len(incomplete_marker(reason, total))))
        note = incomplete_marker(reason, total - keep)
        try:
            os.ftruncate(fd, keep)
            os.pwrite(fd, note, keep)
            return keep + len(note)
        except OSError:
            continue
    return os.fstat(fd).st_size


def _assemble(fd: int, spool: str, head: int, cap: int, total: int, on_file: int,
              segments: list[tuple[int, int]]) -> int:
    """Rewrite the log in `fd` (holding the first `on_file` bytes of the stream) as head
    + marker + the last bytes on hand, within `cap`; returns how many were dropped."""
    first = segments[0][0] if segments else total
    # The tail on hand runs from the end of the head when the segments continue the file.
    avail = head if first <= on_file else first
    mark = marker(0)
    for _ in range(3):  # the marker's length depends on the count it prints
        keep = max(0, min(total - avail, cap - head - len(mark)))
        dropped = total - head - keep
        mark = marker(dropped)
    skip = total - keep  # stream offset where the kept tail starts; always past the marker
    os.pwrite(fd, mark, head)
    pos = head + len(mark)
    if skip < on_file:  # part of the tail is still in the file: move it down (reads stay ahead of writes)
        pos = _copy(fd, fd, skip, on_file, pos)
    for offset, size in segments:
        if offset + size <= skip:
            continue
        src = os.open(os.path.join(spool, str(offset)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            pos = _copy(src, fd, max(0, skip - offset), size, pos)
        finally:
            os.close(src)
    os.ftruncate(fd, pos)
    return dropped


def _copy(src: int, dst: int, start: int, end: int, pos: int) -> int:
    while start < end:
        data = os.pread(src, min(_COPY, end - start), start)
        if not data:
            break
        os.pwrite(dst, data, pos)
        start += len(data)
        pos += len(data)
    return pos


def _private_subdir(path: str) -> None:
    """Create the spool directory; one that exists must be a real directory of ours."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(errno.EEXIST, "not a directory of ours", path) from None


def _remove_spool(spool: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(spool).st_mode):
            os.unlink(spool)  # a link (or a file) planted there goes; what it names stays
            return
        fd = os.open(spool, _DIR)
        try:
            for name in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(spool)


def recover(path: str, cap: int) -> tuple[int, bool]:
    """Assemble the log of a run whose daemon died; returns (size, truncated).

    The file holds the stream's first bytes; the segments carry their own offsets. What is
    in the log's place but is not a log of ours (a link, a FIFO, a directory) counts as no
    log and is left alone.
    """
    spool = spool_dir(path)
    try:
        names = [n for n in os.listdir(spool) if n.isdigit()] if stat.S_ISDIR(os.lstat(spool).st_mode) else []
    except FileNotFoundError:
        names = []
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, or a link (ELOOP) or a directory (EISDIR) in its place
        _remove_spool(spool)
        return 0, False
    try:
        if not _ours(os.fstat(fd)):
            return 0, False
        on_file = os.fstat(fd).st_size
        segments = sorted((int(n), size) for n in names if (size := _segment_size(os.path.join(spool, n))) >= 0)
        total = segments[-1][0] + segments[-1][1] if segments else on_file
        dropped = 0
        if total > cap or (segments and segments[0][0] != on_file):
            dropped = _assemble(fd, spool, head_size(cap), cap, total, on_file, segments)
        return os.fstat(fd).st_size, dropped > 0
    finally:
        os.close(fd)
        _remove_spool(spool)


def _ours(info: os.stat_result) -> bool:
    """A log is a regular file of ours with no other name: not a link, FIFO or device, and
    not a hard link to some other file (the pepper, say)."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.geteuid()


def _segment_size(path: str) -> int:
    """The size of a spool segment, or -1 when it is not a regular file of ours."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return -1
    return info.st_size if _ours(info) else -1


class RunLogs:
    """The run-log directory, `<home>/logs`: `<run id>.log`, made with the run's first output
    (and `<run id>.log.tail/` while a long run spools). Implements RunLogFiles
    (edge.core.ports.stores): a run without a file reads as None, an empty log.

    Every log is opened by its name inside the directory (opened itself without following
    a link), never through a link, and used only when it is a regular file of ours.
    """

    def __init__(self, directory: str, on_full: Callable[[], bool] | None = None) -> None:
        self.directory = directory
        self._on_full = on_full  # the ballast's release: room for the last line of an incomplete log

    def _name(self, run_id: str) -> str:
        # A run id is a UUID the store made; refuse anything that could leave the directory.
        if not run_id or os.path.basename(run_id) != run_id or run_id.startswith("."):
            raise unavailable("a run id that cannot name a log file")
        return f"{run_id}.log"

    def _path(self, run_id: str) -> str:
        return os.path.join(self.directory, self._name(run_id))

    def create(self, run_id: str, cap: int, secrets: Iterable[bytes]) -> LogSink:
        path = self._path(run_id)
        if not stat.S_ISDIR(os.lstat(self.directory).st_mode):
            raise OSError(errno.ENOTDIR, "the log directory is not a directory", self.directory)
        return LogSink(path, cap, secrets, self._on_full)

    def recover(self, run_id: str, cap: int) -> tuple[int, bool]:
        return recover(self._path(run_id), cap)

    def _open(self, run_id: str) -> int | None:
        """A read descriptor on the run's log, None when there is none; raises unavailable
        for anything but a regular file of ours."""
        name = self._name(run_id)
        try:
            directory = os.open(self.directory, _DIR)
        except OSError as exc:
            raise unavailable(f"the log directory cannot be opened ({exc.strerror})") from None
        try:
            # O_NOFOLLOW|O_NONBLOCK: never follow a planted link, never block on a FIFO.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise unavailable("the run's log is not a regular file of this daemon's (a link)") from None
            raise unavailable(f"the run's log cannot be opened ({exc.strerror})") from None
        finally:
            os.close(directory)
        try:
            ok = _ours(os.fstat(fd))
        except OSError:
            ok = False
        if not ok:
            os.close(fd)
            raise unavailable("the run's log is not a regular file of this daemon's")
        return fd

    def read(self, run_id: str, offset: int, length: int) -> LogRange | None:
        fd = self._open(run_id)
        if fd is None:
            return None
        try:
            total = os.fstat(fd).st_size
            data = os.pread(fd, length, offset) if offset < total else b""
        except OSError as exc:
            raise unavailable(f"the run's log cannot be read ({exc.strerror})") from None
        finally:
            os.close(fd)
        return LogRange(data=data, start=offset, total=total)

    def tail(self, run_id: str, size: int) -> LogRange | None:
        fd = self._open(run_id)
        if fd is None:
            return None
        try:
            info = os.fstat(fd)
            start = max(0, info.st_size - size)
            return LogRange(data=os.pread(fd, info.st_size - start, start), start=start, total=info.st_size)
        except OSError as exc:
            raise unavailable(f"the run's log cannot be read ({exc.strerror})") from None
        finally:
            os.close(fd)

    def remove(self, run_ids: Iterable[str]) -> None:
        for run_id in run_ids:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(run_id))  # unlinks a link itself, never what it names


class LocalLogReader:
    """RunLogReader (edge.core.ports.stores) of a single node: its own log files."""

    def __init__(self, files: RunLogs) -> None:
        self._files = files

    async def read(self, run_id: str, offset: int, length: int) -> LogRange | None:
        return self._files.read(run_id, offset, length)

    async def tail(self, run_id: str, size: int) -> LogRange | None:
        return self._files.tail(run_id, size)
