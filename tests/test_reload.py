"""SIGHUP: the daemon re-reads its config file for the live keys and keeps serving."""

from __future__ import annotations

import signal
import time

import msgspec
import pytest

from edge.app.config import Config, changed_keys, merge_live
from edge.app.daemon import LIVE_KEYS
from edge.cli.client import CallFailed


def _reload(daemon, config: str, marker: str = "reloaded") -> None:
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
    d.cli("task", "add", "t", "--", "true")
    _reload(d, "[runner]\nqueue_limit = 0\nconcurrency = 3\n")
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
