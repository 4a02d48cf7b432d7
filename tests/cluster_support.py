"""Cluster daemons for the tests: real `qledge serve` processes, each a node of one real
PostgreSQL database (tests/pg_support.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from support import DaemonProcess


def node_config(dsn: str, node: str, *, concurrency: int = 2, lease_s: float = 3, heartbeat_s: float = 0.5,
                poll_s: float = 0.5, extra: str = "", runner: str = "") -> str:
    return (
        f"[runner]\nconcurrency = {concurrency}\nkill_grace_s = 1\nqueue_limit = 64\n{runner}"
        f'[cluster]\ndsn = "{dsn}"\nnode = "{node}"\nlease_s = {lease_s}\nheartbeat_s = {heartbeat_s}\n'
        f"poll_s = {poll_s}\nwrite_retry_s = 30\n{extra}"
    )


def start_nodes(daemon_factory: Callable[..., DaemonProcess], dsn: str, count: int, **kw: Any) -> list[DaemonProcess]:
    return [daemon_factory(config=node_config(dsn, f"n{i + 1}", **kw)).start() for i in range(count)]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(every)


def task(name: str, argv: list[str], overlap: str = "allow", timeout_ms: int = 60_000) -> dict:
    return {"taskId": name, "spec": {"command": {"kind": "argv", "file": argv[0], "args": argv[1:]},
                                     "overlap": overlap, "timeoutMs": timeout_ms}}


def rows(dsn: str, query: str, params: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()
