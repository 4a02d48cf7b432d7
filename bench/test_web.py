"""`qledge web`'s budget, measured on a regular install against a real daemon: RSS idle
(signed in, the overview loaded) and with five browsers following live logs, the static
assets' bytes, and page-load timings on loopback (HTTP, and Chromium's own navigation
timing when Debian's chromium is installed). CI runs this with the budget checks."""

from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import threading
import time
import zlib
from typing import Any

import pytest

from daemons import BenchDaemon, install_venv, memory, record

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from web_support import WebProcess, chromium_available  # noqa: E402

from edge.web import panel  # noqa: E402

BUDGET = {"idle_rss_mib": 14.0, "five_followers_over_idle_mib": 4.0, "assets_gzip_bytes": 64 * 1024}
REPORT: dict[str, Any] = {"budget": BUDGET}
STATIC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge", "web", "static")
TICKS = "i=0; while [ $i -lt 120 ]; do echo tick $i; i=$((i+1)); sleep 0.25; done"
CHATTY = {"command": {"kind": "shell", "command": TICKS}, "overlap": "allow"}


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    record("web", REPORT)


@pytest.fixture(scope="module")
def stack():
    python = install_venv()
    daemon = BenchDaemon(python).start()
    web = WebProcess(daemon, python=python, env={"PYTHONPATH": ""})
    try:
        yield daemon, web
    finally:
        web.stop()
        daemon.cleanup()


def _follow(web: WebProcess, cookie: str, run_id: str, got: list[int], stop: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=60)
    conn.request("GET", f"/api/log?run={run_id}", headers={"Host": web.netloc, "Cookie": cookie})
    answer = conn.getresponse()
    assert answer.status == 200
    while not stop.is_set():
        line = answer.fp.readline()
        if not line:
            break
        if line.startswith(b"event: log"):
            got.append(1)
    conn.close()


def test_panel_memory_idle_and_with_five_followers(stack):
    daemon, web = stack
    _, token = daemon.token("owner")
    sessions = [web.login(token) for _ in range(2)]  # at most four live logs per session
    for tool in ("qledge.status", "qledge.run.list", "qledge.trigger.upcoming", "qledge.task.list"):
        assert sessions[0].call(tool, {"limit": 5} if tool != "qledge.status" else {})[0] in (200, 400)
    time.sleep(1)
    idle = memory(web.pid)
    daemon.call("qledge.task.create", {"taskId": "chatty", "spec": CHATTY})
    runs = [daemon.call("qledge.run.start", {"taskId": "chatty"})["id"] for _ in range(2)]
    stop, counters, threads = threading.Event(), [[] for _ in range(5)], []
    for i in range(5):
        t = threading.Thread(target=_follow, args=(web, sessions[i % 2].cookie, runs[i % 2], counters[i], stop),
                             daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + 60
    while min(len(c) for c in counters) < 10:  # every follower has seen lines arrive
        assert time.monotonic() < deadline, [len(c) for c in counters]
        time.sleep(0.1)
    following = memory(web.pid)
    stop.set()
    for run in runs:
        daemon.call("qledge.run.cancel", {"runId": run})
    over = {k: round(following[k] - idle[k], 2) for k in ("VmRSS", "RssAnon")}
    REPORT["memory_mib"] = {"idle": idle, "five_followers": following, "five_followers_over_idle": over}
    assert idle["VmRSS"] <= BUDGET["idle_rss_mib"], idle
    assert following["VmHWM"] - idle["VmRSS"] <= BUDGET["five_followers_over_idle_mib"], (idle, following)


def test_asset_bytes():
    raw = gz = 0
    files = {}
    for name in panel.ASSETS:
        with open(os.path.join(STATIC, name), "rb") as f:
            data = f.read()
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        packed = len(packer.compress(data) + packer.flush())
        files[name] = [len(data), packed]
        raw, gz = raw + len(data), gz + packed
    REPORT["assets"] = {"raw_bytes": raw, "gzip_bytes": gz, "files": files}
    assert gz <= BUDGET["assets_gzip_bytes"], gz


def _timed(web: WebProcess, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
    started = time.perf_counter()
    conn.request(method, path, body=body, headers={"Host": web.netloc, "Accept-Encoding": "gzip", **headers})
    answer = conn.getresponse()
    answer.read()
    took = time.perf_counter() - started
    conn.close()
    assert answer.status in (200, 304), (path, answer.status)
    return took * 1000


def test_page_load_timings_on_loopback(stack):
    daemon, web = stack
    _, token = daemon.token("viewer")
    s = web.login(token)
    auth = {"Cookie": s.cookie}
    call = {**auth, "Origin": web.origin, "X-CSRF-Token": s.csrf, "Content-Type": "application/json"}
    timings: dict[str, float] = {}
    for label, method, path, headers, body in (
            ("index_html", "GET", "/", {}, None), ("app_js", "GET", "/static/app.js", {}, None),
            ("strings_js", "GET", "/static/strings.js", {}, None), ("session", "GET", "/api/session", auth, None),
            ("status_call", "POST", "/api/call/qledge.status", call, b"{}"),
            ("run_list_call", "POST", "/api/call/qledge.run.list", call, b'{"limit":32}')):
        samples = [_timed(web, method, path, headers, body) for _ in range(30)]
        timings[label] = round(statistics.median(samples), 2)
    REPORT["http_median_ms"] = timings
    if chromium_available():
        REPORT["browser_ms"] = _browser_timings(web, token)


def _browser_timings(web: WebProcess, token: str) -> dict[str, float]:
    from test_web_browser import make_driver, sign_in, visit

    driver = make_driver()
    try:
        sign_in(driver, web, token)
        found: dict[str, list[float]] = {"overview_rendered": [], "dom_content_loaded": [], "load": []}
        for _ in range(5):
            started = time.perf_counter()
            visit(driver, web, "")
            found["overview_rendered"].append((time.perf_counter() - started) * 1000)
            nav = json.loads(driver.execute_script(
                "return JSON.stringify(performance.getEntriesByType('navigation')[0])"))
            found["dom_content_loaded"].append(nav["domContentLoadedEventEnd"])
            found["load"].append(nav["loadEventEnd"])
        return {k: round(statistics.median(v), 1) for k, v in found.items()}
    finally:
        driver.quit()
