"""Notifications, measured on a regular install: the idle daemon's memory and module set with
20 channels configured (against the same daemon, with the same secret and task, and none),
and the delay from a run's end (`finishedAtMs`) to the request arriving at a loopback
webhook, per message."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from daemons import BenchDaemon, install_venv, memory, record

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from notify_support import Loopback  # noqa: E402

CHANNELS = 20
IDLE_S = float(os.environ.get("QLEDGE_BENCH_NOTIFY_IDLE_S", "20"))
SAMPLES = 10
REPORT: dict[str, Any] = {}


def _common(d: BenchDaemon) -> None:
    """What both daemons get: a secret and the failing task (a task costs the same on both,
    e.g. resolving its user may map the system's NSS libraries)."""
    d.call("qledge.secret.set", {"name": "TOKEN", "value": "123456:bench-token"})
    d.call("qledge.task.create", {"taskId": "fail", "spec": {"command": {"kind": "argv", "file": "false"},
                                                            "overlap": "allow"}})


def _configure(d: BenchDaemon, url: str) -> None:
    kinds = [
        {"kind": "webhook", "url": url + "/w"}, {"kind": "telegram", "token": {"secret": "TOKEN"}, "chatId": "1"},
        {"kind": "bark", "deviceKey": {"secret": "TOKEN"}}, {"kind": "ntfy", "topic": "bench-topic"},
        {"kind": "dingtalk", "accessToken": {"secret": "TOKEN"}, "signSecret": {"secret": "TOKEN"}},
    ]
    for i in range(CHANNELS):
        spec = dict(kinds[i % len(kinds)])
        if spec["kind"] != "webhook":
            spec["baseUrl"] = url
        d.call("qledge.notify.channel.set", {"name": f"ch-{i:02d}", "spec": spec})
    d.call("qledge.notify.rules.set", {"rules": [{"channels": ["ch-00"], "on": ["failure"]}]})


def test_memory_with_20_channels_and_delivery_delay():
    python = install_venv()
    server = Loopback(default={"ok": True, "code": 200, "errcode": 0})
    # A rate limit above the sampling rate: each message goes alone, as the first of a minute does.
    plain, loaded = BenchDaemon(python), BenchDaemon(python, config="[notify]\nper_minute = 600\n")
    try:
        plain.start()
        loaded.start()
        for d in (plain, loaded):
            _common(d)
        _configure(loaded, server.url)
        time.sleep(IDLE_S)
        idle = {"none": memory(plain.pid), "channels_20": memory(loaded.pid)}
        modules = loaded.call("qledge.status", {"includeModules": True})["modules"]
        for absent in ("ssl", "_ssl", "http", "http.client", "smtplib", "email", "edge.notify.send"):
            assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent
        delays = []
        for _ in range(SAMPLES):
            plain.call("qledge.run.start", {"taskId": "fail"})  # the same runs, without a channel
            before = len(server.requests)
            run = loaded.call("qledge.run.start", {"taskId": "fail"})
            deadline = time.monotonic() + 20
            while len(server.requests) == before and time.monotonic() < deadline:
                time.sleep(0.002)
            arrived = time.time() * 1000
            finished = loaded.call("qledge.run.get", {"runId": run["id"]})["finishedAtMs"]
            delays.append(round(arrived - finished, 1))
            time.sleep(0.5)
        after = {"none": memory(plain.pid), "channels_20": memory(loaded.pid)}
        delays.sort()
        REPORT.update({"channels": CHANNELS, "idle_mib": idle, "after_runs_mib": after,
                       "delay_ms": {"samples": delays, "median": delays[len(delays) // 2], "max": delays[-1]},
                       "module_count": len(modules)})
        record("notify", REPORT)
        # Configured channels load the notify tools, the channel shapes and the store; sending loads
        # the notifier: well under a MiB each time (TLS alone, were the daemon to load it, is ~4.5).
        assert idle["channels_20"]["RssAnon"] - idle["none"]["RssAnon"] < 1.0, idle
        assert after["channels_20"]["RssAnon"] - after["none"]["RssAnon"] < 1.0, after
        assert len(server.requests) == SAMPLES
        assert delays[len(delays) // 2] < 2000, delays
    finally:
        plain.cleanup()
        loaded.cleanup()
        server.close()
