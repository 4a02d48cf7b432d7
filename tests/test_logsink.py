"""Run logs on real files: head + marker + tail, bounded disk spool, streaming redaction
across chunk boundaries, assembling the log of a run whose daemon died, and the log
directory's reads (a bounded tail that follows no link and blocks on no FIFO)."""

from __future__ import annotations

import os
import random
import re

import pytest

from edge.core.errors import ToolError
from edge.storage import run_logs as logsink
from edge.storage.run_logs import HEAD_MAX, LogSink, Redactor, RunLogs, marker


def _feed(redactor: Redactor, data: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for size in sizes:
        out.append(redactor.feed(data[pos : pos + size]))
        pos += size
    out.append(redactor.feed(data[pos:]))
    out.append(redactor.flush())
    return b"".join(out)


def _reference(data: bytes, secrets: list[bytes]) -> bytes:
    values = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
    return re.sub(b"|".join(map(re.escape, values)), b"***", data)


def test_secret_straddling_two_reads_is_redacted():
    r = Redactor([b"hunter2-secret"])
    out = r.feed(b"login hunt") + r.feed(b"er2-sec") + r.feed(b"ret ok\n") + r.flush()
    assert out == b"login *** ok\n"


def test_held_back_bytes_are_never_emitted_early_and_appear_at_the_end():
    r = Redactor([b"abcdefgh"])
    assert r.feed(b"xxabcd") == b""  # could still become the secret: held back
    assert r.flush() == b"xxabcd"  # it did not: emitted unchanged


def test_short_values_are_not_redacted_and_no_secrets_is_a_passthrough():
    r = Redactor([b"abc", b""])
    assert not r.active and r.feed(b"abc abc") == b"abc abc"


def test_overlapping_and_nested_secrets_match_a_whole_stream_replace():
    secrets = [b"abab", b"ababab", b"xyz1", b"1xyz12"]
    rng = random.Random(7)
    alphabet = b"abxyz12 "
    for _ in range(300):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        sizes = [rng.randint(0, 9) for _ in range(rng.randint(0, 20))]
        assert _feed(Redactor(secrets), data, sizes) == _reference(data, secrets), (data, sizes)


def test_every_chunk_boundary_of_a_secret(tmp_path):
    secret = b"s3cr3t-VALUE-42"
    data = b"A" * 10 + secret + b"B" * 10 + secret
    for cut in range(len(data) + 1):
        assert _feed(Redactor([secret]), data, [cut]) == b"A" * 10 + b"***" + b"B" * 10 + b"***"


def _sink_roundtrip(tmp_path, cap: int, data: bytes, chunk: int, secrets=()) -> tuple[bytes, LogSink]:
    path = str(tmp_path / f"r{cap}-{chunk}-{len(data)}.log")
    sink = LogSink(path, cap, secrets)
    for i in range(0, len(data), chunk):
        sink.write(data[i : i + chunk])
        if not secrets and i + chunk <= cap:  # within the cap the file is the output so far
            assert os.path.getsize(path) == min(i + chunk, len(data))
    size = sink.close()
    with open(path, "rb") as f:
        body = f.read()
    assert size == len(body) and not os.path.exists(path + ".tail")
    assert os.stat(path).st_mode & 0o777 == 0o600
    return body, sink


@pytest.mark.parametrize("chunk", [7, 1000, 4096, 65536, 100_000])
def test_output_within_the_cap_is_kept_whole(tmp_path, chunk):
    data = os.urandom(300_000 if chunk > 7 else 70_000)
    body, sink = _sink_roundtrip(tmp_path, 1 << 20, data, chunk)
    assert body == data and not sink.truncated


@pytest.mark.parametrize("cap,chunk,extra", [
    (1 << 20, 65536, 2 << 20), (1 << 20, 777, 2 << 20), (4096, 100, 9000), (200_000, 65536, 400_000),
    # Just past the cap: most of the tail is still in the log file and moves down in it.
    (1 << 20, 65536, 1), (1 << 20, 4000, 5000), (200_000, 65536, 70_000),
])
def test_head_marker_tail_and_exact_sizes(tmp_path, cap, chunk, extra):
    data = random.Random(cap + extra).randbytes(cap + extra)
    body, sink = _sink_roundtrip(tmp_path, cap, data, chunk)
    head = min(HEAD_MAX, cap // 2)
    assert sink.truncated and len(body) == cap and sink.total == len(data)
    assert body[:head] == data[:head]
    rest = body[head:]
    m = re.match(rb"\n\[qledge: log cap reached; (\d+) bytes dropped here\]\n", rest)
    assert m, rest[:80]
    tail = rest[m.end() :]
    assert int(m.group(1)) == len(data) - head - len(tail)
    assert tail == data[-len(tail) :]
    assert len(tail) == cap - head - len(marker(int(m.group(1))))


def test_spool_on_disk_stays_near_the_tail_size(tmp_path):
    path = str(tmp_path / "spool.log")
    cap = 1 << 20
    sink = LogSink(path, cap)
    biggest = 0
    spool = path + ".tail"
    for _ in range(200):  # 12.5 MiB
        sink.write(b"x" * 65536)
        if not os.path.exists(spool):
            continue  # still writing the head
        biggest = max(biggest, sum(os.path.getsize(os.path.join(spool, n)) for n in os.listdir(spool)))
    sink.close()
    tail = cap - HEAD_MAX
    assert tail <= biggest <= tail + tail // 4  # the tail plus one segment being written


def test_redaction_happens_before_the_head_tail_split(tmp_path):
    secret = b"TOPSECRETVALUE"
    # One occurrence straddles the end of the head, one the start of the kept tail;
    # small chunks put pipe-read boundaries inside them as well.
    # (Positions in the raw stream: where a split-then-redact sink would cut.)
    cap, middle = 1 << 20, 500_000
    keep = cap - HEAD_MAX - len(marker(middle + 14))
    data = (b"h" * (HEAD_MAX - 5) + secret + b"m" * middle + secret + b"t" * (keep - 24) + secret + b"\n")
    assert data.index(secret, HEAD_MAX) < len(data) - keep < data.index(secret, HEAD_MAX) + len(secret)
    body, _ = _sink_roundtrip(tmp_path, cap, data, 4093, [secret])
    for piece in (secret[:4], secret[4:8], secret[-5:], b"SECR"):
        assert piece not in body
    assert body.count(b"***") >= 2 and body.endswith(b"***\n")


def test_full_disk_stops_writing_but_not_draining(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    sink = LogSink(str(tmp_path / "full.log"), 1 << 20)
    os.dup2(os.open("/dev/full", os.O_WRONLY), sink._fd)  # every write now fails with ENOSPC
    for _ in range(10):
        sink.write(b"y" * 65536)  # must not raise: the child is still being read
    sink.close()
    assert sink.failed is not None and sink.truncated and sink.total == 10 * 65536


def test_recover_assembles_what_a_dead_daemon_left(tmp_path):
    path = str(tmp_path / "lost.log")
    cap = 1 << 20
    data = random.Random(3).randbytes(3 * cap)
    sink = LogSink(path, cap)
    for i in range(0, len(data), 50_000):
        sink.write(data[i : i + 50_000])
    os.close(sink._seg_fd)  # the daemon dies here: nothing is closed or assembled
    os.close(sink._fd)
    size, truncated = logsink.recover(path, cap)
    with open(path, "rb") as f:
        body = f.read()
    assert truncated and size == len(body) == cap and not os.path.exists(path + ".tail")
    m = re.search(rb"\n\[qledge: log cap reached; (\d+) bytes dropped here\]\n", body)
    assert body[: m.start()] == data[:HEAD_MAX] and data.endswith(body[m.end() :])
    assert int(m.group(1)) == len(data) - HEAD_MAX - len(body[m.end() :])


def test_recover_a_short_log_and_a_missing_one(tmp_path):
    path = str(tmp_path / "short.log")
    sink = LogSink(path, 1 << 20)
    sink.write(b"x" * 100_000)  # within the cap: the file is complete as written
    assert os.path.getsize(path) == 100_000 and not os.path.exists(path + ".tail")
    os.close(sink._fd)
    assert logsink.recover(path, 1 << 20) == (100_000, False)
    assert logsink.recover(str(tmp_path / "never.log"), 1 << 20) == (0, False)


# -- RunLogs: the one owner of the log directory -------------------------------------


@pytest.mark.parametrize("total, start", [(0, 0), (10, 0), (4096, 0), (4097, 1), (100_000, 100_000 - 4096)])
def test_tail_reads_at_most_the_last_window(tmp_path, total, start):
    logs = RunLogs(str(tmp_path))
    data = random.Random(total).randbytes(total)
    (tmp_path / "r.log").write_bytes(data)
    tail = logs.tail("r", 4096)
    assert (tail.start, tail.total, tail.data) == (start, total, data[start:])


def test_tail_refuses_links_and_fifos_and_missing_is_none(tmp_path):
    logs = RunLogs(str(tmp_path))
    assert logs.tail("gone", 4096) is None and logs.read("gone", 0, 10) is None
    (tmp_path / "secret").write_bytes(b"not a log")
    os.symlink(tmp_path / "secret", tmp_path / "link.log")
    os.mkfifo(tmp_path / "fifo.log")
    for run_id in ("link", "fifo", "../secret", ".hidden"):
        with pytest.raises(ToolError) as err:
            logs.tail(run_id, 4096)
        assert err.value.code == "unavailable"


def test_read_and_remove(tmp_path):
    logs = RunLogs(str(tmp_path))
    sink = logs.create("r", 1 << 20, [])
    sink.write(b"hello world")
    assert sink.close() == 11
    assert os.stat(tmp_path / "r.log").st_mode & 0o777 == 0o600
    part = logs.read("r", 6, 100)
    assert (part.data, part.start, part.total) == (b"world", 6, 11)
    assert logs.read("r", 50, 10).data == b""
    logs.remove(["r", "never"])
    assert not (tmp_path / "r.log").exists()


def test_read_recover_and_remove_never_follow_what_is_planted(tmp_path):
    """A link, a hard link or a FIFO where a log belongs is never read, assembled or
    emptied through; removing it removes the planted name only."""
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    logs = RunLogs(str(logs_dir))
    precious = tmp_path / "pepper"
    precious.write_bytes(b"p" * 32)
    os.symlink(precious, logs_dir / "sym.log")
    os.link(precious, logs_dir / "hard.log")
    os.mkfifo(logs_dir / "fifo.log")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_bytes(b"k")
    os.symlink(tmp_path / "elsewhere", logs_dir / "sym.log.tail")  # a planted spool directory
    for run_id in ("sym", "hard", "fifo"):
        with pytest.raises(ToolError) as err:
            logs.read(run_id, 0, 100)
        assert err.value.code == "unavailable" and "not a regular file" in err.value.message
        assert logs.recover(run_id, 1 << 20) == (0, False)
    assert precious.read_bytes() == b"p" * 32 and (tmp_path / "elsewhere" / "keep").exists()
    assert not os.path.lexists(logs_dir / "sym.log.tail")  # the link went, what it named stayed
    logs.remove(["sym", "hard"])
    assert precious.read_bytes() == b"p" * 32 and not os.path.lexists(logs_dir / "sym.log")


def test_a_sink_never_spools_through_a_planted_link(tmp_path):
    (tmp_path / "target").mkdir()
    path = str(tmp_path / "r.log")
    os.symlink(tmp_path / "target", path + ".tail")
    sink = LogSink(path, 8192)
    sink.write(b"x" * 50_000)  # beyond the cap: the tail would be spooled
    assert sink.failed is not None and os.listdir(tmp_path / "target") == []
    size = sink.close()
    with open(path, "rb") as f:
        body = f.read()
    assert size == len(body) <= 8192 and body.startswith(b"x" * 4096)
    assert body.endswith(b" bytes of output are missing from here on]\n") and b"log incomplete:" in body


def test_a_log_that_could_not_be_written_says_so_even_on_a_full_disk(tmp_path):
    """The last line is written after the space is given back (the ballast), or over the
    log's own last bytes when there is none to give."""
    path = str(tmp_path / "r.log")
    released = []
    sink = LogSink(path, 1 << 20, on_full=lambda: released.append(1) or True)
    sink.write(b"y" * 10_000)
    sink.failed = OSError(28, "No space left on device")  # what the next write met
    sink.write(b"z" * 5_000)
    size = sink.close()
    with open(path, "rb") as f:
        body = f.read()
    assert size == len(body) and body.startswith(b"y" * 10_000)
    assert body.endswith(b"\n[qledge: log incomplete: No space left on device; 5000 bytes of output are missing"
                         b" from here on]\n")
    assert released == []  # there was room: nothing given back
