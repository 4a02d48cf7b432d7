"""SIGHUP: the daemon re-reads its config file for the live keys and keeps serving."""

from __future__ import annotations

import signal
import time

import msgspec
import pytest

from edge.app.config import Config, changed_keys, merge_live
from edge.app.daemon import LIVE_KEYS
from edge.cli.client import CallFailed


def _reload(daemon, config: str | None = None, marker: str = "reloaded") -> None:
    if config is not None:
        with open(daemon.config_path, "w") as f:
            f.write(config)
    before = daemon.stderr().count(marker)
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while daemon.stderr().count(marker) == before:
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.05)


def test_changed_keys_and_merge_live():
    old = Config()
    new = msgspec.convert(
        {"log_level": "debug", "runner": {"concurrency": 4, "queue_limit": 3}, "home": "/elsewhere"}, Config)
    assert changed_keys(old, new) == {"log_level", "runner.concurrency", "runner.queue_limit", "home"}
    merged = merge_live(old, new, LIVE_KEYS)
    assert merged.log_level == "debug" and merged.runner.queue_limit == 3
    assert merged.runner.concurrency == 2 and merged.home is None  # restart-only keys keep running values


def test_sighup_applies_live_keys_and_names_the_rest(daemon_factory):
    d = daemon_factory(config="[runner]\nqueue_limit = 32\n").start()
    d.cli("task", "add", "t", "--overlap", "allow", "--", "sleep", "30")
    _reload(d, "[runner]\nqueue_limit = 0\nconcurrency = 3\n")
    for _ in range(2):  # the two slots of the running concurrency, and no queue
        d.call("qledge.run.start", {"taskId": "t"})
    with pytest.raises(CallFailed) as err:
        d.call("qledge.run.start", {"taskId": "t"})
    assert err.value.code == "resource_exhausted"
    assert "runner.concurrency changed; restart to apply" in d.stderr()
    _reload(d, "[runner]\nqueue_limit = 32\n")
    assert d.call("qledge.run.start", {"taskId": "t"})["status"] == "queued"


def test_bad_config_on_reload_keeps_the_running_one(daemon_factory):
    d = daemon_factory(config="log_level = \"info\"\n").start()
    _reload(d, "log_level = \"loud\"\n")
    assert "keeping the running configuration" in d.stderr()
    assert "Traceback" not in d.stderr()
    assert d.call("qledge.status")["pid"] == d.pid


def test_sighup_picks_up_a_trigger_added_behind_the_daemons_back(daemon_factory):
    from edge.core.triggers import CronSpec
    from edge.storage.catalog import create_trigger
    from edge.storage.sqlite.db import SqliteTx, immediate
    from edge.storage.sqlite.sql import CATALOG

    d = daemon_factory().start()
    assert d.cli("task", "add", "t", "--", "true").returncode == 0

    def armed() -> str:
        return d.call("qledge.status")["extra"]["scheduler"]

    assert armed().startswith("0 triggers armed")
    conn = d.db()  # another writer: the daemon is not told
    try:
        with immediate(conn):
            create_trigger(SqliteTx(conn), CATALOG, "default", "late", "t", None,
                           CronSpec(expression="0 3 1 1 *", timezone="UTC"), int(time.time() * 1000))
    finally:
        conn.close()
    time.sleep(0.5)
    assert armed().startswith("0 triggers armed")
    _reload(d)
    assert armed().startswith("1 triggers armed, next fire")
