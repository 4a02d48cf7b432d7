"""The cluster benchmark's peer: procrastinate (installed for the benchmark only, never a
dependency of qledge) on the same PostgreSQL, with a no-op job: `DSN N CLIENTS CONCURRENCY`
defers N jobs from CLIENTS concurrent callers while one worker of CONCURRENCY runs them, and
prints {"seconds": from the first defer to the last completion} as JSON. The database has
procrastinate's schema already (applied apart, so that its transactions are not counted)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time

import procrastinate


async def main(dsn: str, total: int, clients: int, concurrency: int) -> dict[str, float]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    done = asyncio.Event()
    finished = 0

    @app.task(name="noop")
    async def noop() -> None:
        nonlocal finished
        finished += 1
        if finished == total:
            done.set()

    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(concurrency=concurrency, wait=True,
                                                          install_signal_handlers=False))
        await asyncio.sleep(1.0)  # the worker is up and listening, as a node is

        async def client(count: int) -> None:
            for _ in range(count):
                await noop.defer_async()

        began = time.perf_counter()
        await asyncio.gather(*(client(total // clients) for _ in range(clients)))
        await done.wait()
        seconds = time.perf_counter() - began
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return {"seconds": seconds}


if __name__ == "__main__":
    dsn, n, clients, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(dsn, n, clients, concurrency))))
