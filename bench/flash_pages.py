"""Where a scheduled run's bytes go, page by page: `python bench/flash_pages.py [runs]`.

The daemon's own store, runner and scheduler in this process, as `test_budgets._minutely`
sets them up (a `* * * * *` trigger, its clock stepped a minute per run, four other tasks
with their history, every task at its retention limit). Each write transaction is watched
from the WAL: the frames it appended (read from the WAL index's header in `-shm`) and the
page each frame holds, named by the table or index that owns it (SQLite's `dbstat`). The
checkpoints are counted as the distinct pages the WAL held when it was copied back.
Printed: transactions per run, frames per run by rule and by B-tree, what the checkpoint
rewrote per run, and /proc/self/io write_bytes per run over the same window.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import struct
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import apsw  # noqa: E402

import edge.storage.sqlite.db as sqlite_db  # noqa: E402

FRAME_HEADER = 24
WAL_HEADER = 32


class Watch:
    """What each write transaction appended to the WAL, and what each checkpoint copied."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.on = False
        self.transactions: list[tuple[str, list[tuple[int, str]]]] = []
        self.checkpointed: list[int] = []  # distinct pages per checkpoint
        self.owner: dict[int, str] = {}
        self._backfill = 0

    def _header(self) -> tuple[int, int]:
        """mxFrame and nBackfill of the WAL index (its header and checkpoint info)."""
        with open(self.path + "-shm", "rb") as f:
            data = f.read(100)
        (mx,) = struct.unpack_from("=I", data, 16)
        (backfill,) = struct.unpack_from("=I", data, 96)
        return mx, backfill

    def _pages(self, first: int, last: int, page_size: int) -> list[int]:
        out = []
        with open(self.path + "-wal", "rb") as f:
            for i in range(first, last):
                f.seek(WAL_HEADER + i * (FRAME_HEADER + page_size))
                (page,) = struct.unpack(">I", f.read(4))
                out.append(page)
        return out

    def wrap(self, original: Any) -> Any:
        def write(conn: apsw.Connection, fn: Any, args: tuple[Any, ...]) -> Any:
            if not self.on:
                return original(conn, fn, args)
            before, backfill_before = self._header()
            result = original(conn, fn, args)
            after, backfill = self._header()
            size = conn.pragma("page_size")
            if backfill != backfill_before and backfill:  # this commit's autocheckpoint
                self.checkpointed.append(len(set(self._pages(0, backfill, size))))
            restarted = after < before or (backfill_before > 0 and backfill < backfill_before)
            first = 0 if restarted else before
            pages = self._pages(first, after, size)
            # Pages change hands (freed by retention, reused by the next insert): name them now.
            self.owner = {p: n for p, n in conn.execute("SELECT pageno, name FROM dbstat")}
            self.owner[1] = "page 1 (schema root, file header)"
            named = [(p, self.owner.get(p, "freelist trunk")) for p in pages]
            rule = getattr(fn, "__qualname__", str(fn))
            done = result[0] if isinstance(result, tuple) and len(result) == 2 else None
            if isinstance(done, tuple) and len(done) == 3 and isinstance(done[1], list) and done[1]:
                rule += " (with retention)"
            self.transactions.append((rule, named))
            return result
        return write


async def measure(home: str, runs: int) -> None:
    from test_budgets import OTHER_TASKS, SteppedClock

    from edge.app.config import Config
    from edge.app.graph import build_stores, build_workers
    from edge.core.tasks import ArgvCommand, TaskSpec
    from edge.core.triggers import CronSpec
    from edge.storage.sqlite.db import Database

    path = os.path.join(home, "qledge.db")
    watch = Watch(path)
    sqlite_db._write = watch.wrap(sqlite_db._write)
    clock = SteppedClock(1_780_000_000_000 // 60_000 * 60_000)
    db = await Database.open(path)
    config = Config()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    spec = TaskSpec(command=ArgvCommand(file="true"), overlap="allow")

    async def idle() -> None:
        async with asyncio.timeout(30):
            while await stores.runs.active():
                await asyncio.sleep(0.002)

    async def minute() -> None:
        clock.step(60_000)
        await workers.scheduler.tick()
        await workers.scheduler.settle()
        await idle()

    def written() -> int:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("write_bytes")).split()[1])

    try:
        for task in ["minutely", *OTHER_TASKS]:
            await stores.tasks.create("default", task, task, spec, clock.ms, privileged=True)
        for task in OTHER_TASKS:
            for _ in range(110):
                one = await stores.tasks.get("default", task)
                assert one is not None
                await workers.runner.start(one, "user")
                await idle()
        await stores.triggers.create("default", "minutely", "minutely", None,
                                     CronSpec(expression="* * * * *", timezone="UTC"), clock.ms)
        clock.step(1)
        await workers.scheduler.load()
        for _ in range(110):
            await minute()
        watch.on = True
        before = written()
        for _ in range(runs):
            await minute()
        io = (written() - before) / runs
        if os.environ.get("FLASH_PAGES_SIZES"):
            def sizes(conn: apsw.Connection) -> list[tuple[Any, ...]]:
                return conn.execute("SELECT name, count(*), sum(ncell), sum(payload) * 1.0 / sum(ncell), sum(unused)"
                                    " * 1.0 / count(*) FROM dbstat WHERE pagetype = 'leaf' GROUP BY name").fetchall()
            for row in await db.run(sizes):
                print(row)
    finally:
        await workers.scheduler.stop()
        await workers.runner.shutdown()
        await db.close()
    report(watch, runs, io, 512)


def report(watch: Watch, runs: int, io: float, page_size: int) -> None:
    frame = FRAME_HEADER + page_size
    by_rule: collections.Counter[str] = collections.Counter()
    tx_by_rule: collections.Counter[str] = collections.Counter()
    by_tree: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for rule, pages in watch.transactions:
        tx_by_rule[rule] += 1
        by_rule[rule] += len(pages)
        total += len(pages)
        for _, name in pages:
            by_tree[rule][name] += 1
    print(f"runs: {runs}; write transactions per run: {len(watch.transactions) / runs:.2f}")
    print(f"WAL frames per run: {total / runs:.2f} ({total / runs * frame:.0f} bytes at {frame} a frame)")
    for rule, n in by_rule.most_common():
        print(f"  {rule}: {tx_by_rule[rule] / runs:.2f} tx a run, {n / tx_by_rule[rule]:.2f} frames a tx,"
              f" {n / runs:.2f} frames a run")
        for tree, k in by_tree[rule].most_common():
            print(f"      {tree}: {k / runs:.2f}")
    copied = sum(watch.checkpointed)
    print(f"checkpoints: {len(watch.checkpointed)}, distinct pages copied {watch.checkpointed}:"
          f" {copied / runs:.2f} pages a run ({copied * page_size / runs:.0f} bytes)")
    print(f"/proc/self/io write_bytes per run: {io:.0f}")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 510
    home = tempfile.mkdtemp(prefix="qlfp")
    try:
        asyncio.run(measure(home, runs))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
