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


def _text(seed: int, size: int) -> bytes:
    """Log-like bytes that hold no credential (letters a-j, spaces, line breaks)."""
    rng = random.Random(seed)
    return bytes(rng.choice(b"abcdefghij abcdefghij\n") for _ in range(size))


def test_secret_straddling_two_reads_is_redacted():
    r = Redactor([b"hunter2-secret"])
    out = r.feed(b"login hunt") + r.feed(b"er2-sec") + r.feed(b"ret ok\n") + r.flush()
    assert out == b"login [REDACTED] ok\n"


def test_a_line_waits_for_its_end_and_held_back_bytes_appear_at_the_end():
    r = Redactor([b"abcdefgh"])
    data = b"a first line\na line a secret could continue from: abcd\nxxabc"
    early = r.feed(data)
    assert early == b"a first line\n"  # the rest could still hold the secret: held back, whole lines
    assert early + r.flush() == data  # it did not: emitted unchanged
    # A run that ended in the middle of printing a secret: what it printed of it is masked.
    r = Redactor([b"abcdefgh"])
    assert r.feed(b"xx abcdef") + r.flush() == b"xx ***"


def test_short_values_are_masked_only_as_whole_tokens():
    r = Redactor([b"abc", b""])
    assert r.feed(b"abc abcdef xabc (abc)\n") + r.flush() == b"*** abcdef xabc (***)\n"


def test_credentials_are_masked_in_the_log_too():
    r = Redactor([])
    out = r.feed(b"wifi: option key 'hunter2hunter2'\nDB_PASS=s3cr3tDb ok\n") + r.flush()
    assert b"hunter2" not in out and b"s3cr3tDb" not in out and out.startswith(b"wifi: option key ")


def test_a_secret_split_by_a_line_break_or_colour_codes_is_masked():
    secret = b"Tr0ub4dor&3-extra"
    for shown in (b"Tr0ub4d\nor&3-extra", b"Tr0ub\x1b[31m4dor\x1b[0m&3-extra", "Tr0ub\u200b4dor&3-extra".encode()):
        out = _feed(Redactor([secret]), b"pw " + shown + b" end\n", [5, 3])
        assert b"Tr0ub" not in out and b"3-extra" not in out and out.endswith(b" end\n"), out


def test_any_chunking_gives_what_one_pass_over_the_whole_stream_gives():
    secrets = [b"abab", b"ababab", b"xyz1", b"1xyz12", b"longsecret-01", b"x\nyzlong-99"]
    rng = random.Random(7)
    alphabet = b"abxyz12 -\nlongsecret09=:p"
    for _ in range(300):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 160)))
        sizes = [rng.randint(0, 9) for _ in range(rng.randint(0, 20))]
        whole = Redactor(secrets).feed(data, final=True)
        assert _feed(Redactor(secrets), data, sizes) == whole, (data, sizes)
        assert len(whole) <= len(data)


def test_every_chunk_boundary_of_a_secret(tmp_path):
    secret = b"s3cr3t-VALUE-42"
    data = b"A" * 10 + b" " + secret + b" " + b"B" * 10 + b" " + secret
    expected = b"A" * 10 + b" [REDACTED] " + b"B" * 10 + b" [REDACTED]"
    for cut in range(len(data) + 1):
        assert _feed(Redactor([secret]), data, [cut]) == expected


def test_a_private_key_is_masked_line_after_line_until_its_end():
    body = [b"MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwQmSfdKNbGdMm",
            b"Qz9+Ab3dE4kRt8wQp1vXn2LmC7yZa0sHf6Ju5Tg4Vb1Ni8Kq3Wr9Oe2Px7Yc0Dd="]
    data = b"before\n-----BEGIN RSA PRIVATE KEY-----\n" + b"\n".join(body) + b"\n-----END RSA PRIVATE KEY-----\nafter\n"
    for size in (1, 7, 40, 64, 1000):
        out = _feed(Redactor([]), data, [size] * (len(data) // size + 1))
        assert out.startswith(b"before\n") and out.endswith(b"after\n"), out
        for line in body:
            assert line[:12] not in out and line[-12:] not in out


def _sink_roundtrip(tmp_path, cap: int, data: bytes, chunk: int, secrets=()) -> tuple[bytes, LogSink]:
    path = str(tmp_path / f"r{cap}-{chunk}-{len(data)}.log")
    sink = LogSink(path, cap, secrets)
    for i in range(0, len(data), chunk):
        sink.write(data[i : i + chunk])
        if not secrets and i + chunk <= cap:  # within the cap the file is the output so far, lines whole
            written = data[: i + chunk]
            done = max(written.rfind(b"\n") + 1, len(written) - logsink.LINE_MAX)
            assert (os.path.getsize(path) if done else os.path.lexists(path)) == done  # made with its first byte
    size = sink.close()
    with open(path, "rb") as f:
        body = f.read()
    assert size == len(body) and not os.path.exists(path + ".tail")
    assert os.stat(path).st_mode & 0o777 == 0o600
    return body, sink


@pytest.mark.parametrize("chunk", [7, 1000, 4096, 65536, 100_000])
def test_output_within_the_cap_is_kept_whole(tmp_path, chunk):
    data = _text(chunk, 300_000 if chunk > 7 else 70_000)
    body, sink = _sink_roundtrip(tmp_path, 1 << 20, data, chunk)
    assert body == data and not sink.truncated


@pytest.mark.parametrize("cap,chunk,extra", [
    (1 << 20, 65536, 2 << 20), (1 << 20, 777, 2 << 20), (4096, 100, 9000), (200_000, 65536, 400_000),
    # Just past the cap: most of the tail is still in the log file and moves down in it.
    (1 << 20, 65536, 1), (1 << 20, 4000, 5000), (200_000, 65536, 70_000),
])
def test_head_marker_tail_and_exact_sizes(tmp_path, cap, chunk, extra):
    data = _text(cap + extra, cap + extra)
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
    assert body.count(b"[REDACTED]") >= 2 and body.endswith(b"[REDACTED]\n")


def test_full_disk_stops_writing_but_not_draining(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    sink = LogSink(str(tmp_path / "full.log"), 1 << 20)
    sink.write(b"first\n")  # the file is made with the first output
    assert sink._fd is not None
    os.dup2(os.open("/dev/full", os.O_WRONLY), sink._fd)  # every write now fails with ENOSPC
    for _ in range(10):
        sink.write(b"y" * 65536)  # must not raise: the child is still being read
    sink.close()
    assert sink.failed is not None and sink.truncated and sink.total == 6 + 10 * 65536


def test_recover_assembles_what_a_dead_daemon_left(tmp_path):
    path = str(tmp_path / "lost.log")
    cap = 1 << 20
    data = _text(3, 3 * cap) + b"\n"
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
    sink.write(b"x" * 99_999 + b"\n")  # within the cap: the file is complete as written
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


def test_a_run_that_prints_nothing_has_no_log_file_and_one_planted_before_its_output_is_never_followed(tmp_path):
    """The file is made with the first byte of output (O_EXCL, never through a link): a quiet
    run creates no file; a link put in its place first is refused, not written through, and
    the sink says why."""
    logs = RunLogs(str(tmp_path))
    quiet = logs.create("quiet", 1 << 20, [])
    quiet.write(b"")
    assert quiet.close() == 0 and quiet.failed is None and not quiet.truncated
    assert os.listdir(tmp_path) == [] and logs.read("quiet", 0, 10) is None and logs.tail("quiet", 10) is None
    held = logs.create("held", 1 << 20, [])
    held.write(b"no newline yet")  # held back by redaction: still nothing on disk
    assert not os.path.lexists(tmp_path / "held.log")
    assert held.close() == 14 and (tmp_path / "held.log").read_bytes() == b"no newline yet"
    precious = tmp_path / "pepper"
    precious.write_bytes(b"p" * 32)
    planted = logs.create("planted", 1 << 20, [])
    os.symlink(precious, tmp_path / "planted.log")
    planted.write(b"output\n")
    assert isinstance(planted.failed, FileExistsError) and planted.truncated
    assert planted.close() == 0 and precious.read_bytes() == b"p" * 32


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
    sink.write(b"y" * 9_999 + b"\n")  # a whole line: written at once (an unfinished one is held back)
    sink.failed = OSError(28, "No space left on device")  # what the next write met
    sink.write(b"z" * 5_000)
    size = sink.close()
    with open(path, "rb") as f:
        body = f.read()
    assert size == len(body) and body.startswith(b"y" * 9_999 + b"\n")
    assert body.endswith(b"\n[qledge: log incomplete: No space left on device; 5000 bytes of output are missing"
                         b" from here on]\n")
    assert released == []  # there was room: nothing given back


def test_a_line_is_never_split_between_its_key_and_its_value():
    """Holding back what a long secret could start with must not cut a line in two (the
    key emitted, its value left to a buffer that no longer shows the key): however the
    output is chunked, the log is what one pass over the whole of it gives."""
    secret = b"Tr0ub4dor&3-correct-horse"
    data = (b"\toption key 'hunter2hunter2'\nwireless.default_radio0.key='wifi-pass-2024'\n"
            b"DB_PASS=s3cr3tDb sshpass -p Ssh-Pass-1 ssh root@10.0.0.2\nhex: " + secret.hex().encode()
            + b"\nsplit: " + secret[:9] + b"\n" + secret[9:] + b" (continued)\n")
    whole = Redactor([secret]).feed(data, final=True)
    assert not any(leak in whole for leak in (b"hunter2", b"wifi-pass", b"s3cr3tDb", b"Ssh-Pass", secret[9:]))
    rng = random.Random(11)
    for _ in range(500):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
        sizes = [b - a for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]
        assert _feed(Redactor([secret]), data, sizes) == whole, cuts


def _released(redactor: Redactor, parts: list[bytes]) -> bytes:
    """Each part fed, then what is held released (as the runner does after a pause)."""
    out = []
    for part in parts:
        out += [redactor.feed(part), redactor.release()]
    return b"".join([*out, redactor.flush()])


def test_a_release_writes_what_is_held_and_masks_what_continues_it():
    secret = b"Tr0ub4dor&3-extra"
    r = Redactor([secret])
    assert r.feed(b"tick 1\n") == b"" and r.held == 7  # a secret's forms are longer: held back
    assert r.release() == b"tick 1\n" and r.held == 0
    # A secret cut by a pause (on a line break or not): its start is masked when released,
    # the rest when it comes.
    for parts in ([b"pw Tr0ub4d\n", b"or&3-extra end\n"], [b"pw Tr0u", b"b4dor&3-extra end\n"],
                  [b"pw Tr0ub", b"4dor", b"&3-ex", b"tra end\n"]):
        out = _released(Redactor([secret]), parts)
        assert b"Tr0u" not in out and b"3-extra" not in out and b"extra" not in out, (parts, out)
        assert out.startswith(b"pw ") and out.endswith(b" end\n"), out
    # A credential's value cut by a pause: masked on both sides of it.
    for parts in ([b"DB_PASSWORD=s3cr", b"3t-value more\n"], [b"DB_PASSWORD=", b"s3cr3t-value more\n"]):
        out = _released(Redactor([]), parts)
        assert b"s3cr" not in out and b"value" not in out and out.endswith(b" more\n"), out


def test_releases_anywhere_leave_at_most_a_few_characters_of_a_secret():
    """However the output is cut by pauses, no more of a configured secret shows than the
    PARTIAL_SECRET_MIN - 1 characters printed just before one."""
    secret = b"ABCDEFGHIJKLMNOP"
    rng = random.Random(5)
    for _ in range(400):
        data = b"".join(rng.choice([b"xy ", b"z\n", b"q", secret, secret[:9] + b"\n" + secret[9:]])
                        for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(1, len(data) + 1), min(len(data), rng.randint(1, 6))))
        parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        out = _released(Redactor([secret]), parts).replace(b"\n", b"")
        assert not any(secret[i:i + 4] in out for i in range(len(secret) - 3)), (parts, out)
