"""A first week's work in the panel, in a real browser (Debian's headless Chromium via
selenium) against a real daemon and a real `qledge web`: schedule, fix, filter and cancel
runs, store a secret, get alerted through a real loopback webhook, and follow a live log
across a dropped connection. The HTTP-level checks (the cookie under TLS, the LAN warning,
the caps on live logs) speak to a real `qledge web` without a browser.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from notify_support import Loopback, self_signed
from support import DaemonProcess
from web_support import WebProcess, chromium_available

pytestmark = pytest.mark.skipif(not chromium_available(), reason="needs Debian's chromium and chromium-driver"
                                " (.ci/run installs them: apt-get install chromium chromium-driver)")

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

from test_web_browser import main_text, make_driver, sign_in, until, visit  # noqa: E402


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = DaemonProcess(config="[runner]\nconcurrency = 8\n").start()  # runs that wait, side by side
    yield d
    d.cleanup()


@pytest.fixture(scope="module")
def tokens(daemon: DaemonProcess) -> dict[str, str]:
    return {role: daemon.token(role)[1] for role in ("owner", "operator")}


@pytest.fixture(scope="module")
def web(daemon: DaemonProcess) -> Iterator[WebProcess]:
    w = WebProcess(daemon)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = make_driver()
    yield driver
    driver.quit()


def shell_task(daemon: DaemonProcess, task: str, command: str, **extra: Any) -> None:
    spec = {"command": {"kind": "shell", "command": command}}
    daemon.call("qledge.task.create", {"taskId": task, **extra, "spec": spec})


def stop(daemon: DaemonProcess, runs: list[str]) -> None:
    """Cancel runs and wait until they have ended: the next test finds the runner free."""
    for run in runs:
        daemon.call("qledge.run.cancel", {"runId": run})
    for run in runs:
        daemon.call("qledge.run.wait", {"runId": run, "timeoutMs": 30_000})


def row(driver: Any, task: str) -> Any:
    return until(lambda: driver.find_element(By.CSS_SELECTOR, f"tbody tr[data-search^='{task} ']"),
                 f"the row of {task}")


def channel(driver: Any, name: str) -> Any:
    return until(lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "tbody tr")
                          if r.text.startswith(name)], f"the channel {name}")[0]


def confirm(driver: Any, answer: str) -> None:
    """Press `answer` in the panel's confirmation dialog."""
    dialog = until(lambda: driver.find_element(By.CSS_SELECTOR, "dialog[open]"), "the confirmation")
    dialog.find_element(By.XPATH, f".//button[text()='{answer}']").click()
    until(lambda: not driver.find_elements(By.CSS_SELECTOR, "dialog[open]")
          or driver.find_element(By.CSS_SELECTOR, "dialog[open]") != dialog, "the dialog to close")


# -- schedule ------------------------------------------------------------------------------


def test_add_a_cron_trigger_with_its_live_preview_and_the_busybox_note(browser, web, daemon, tokens):
    shell_task(daemon, "nightly", "true", name="夜间备份")
    sign_in(browser, web, tokens["operator"])
    visit(browser, web, "schedules")
    Select(until(lambda: browser.find_element(By.ID, "sch-task"), "the task choice")).select_by_value("nightly")
    zone = browser.find_element(By.ID, "sch-zone")
    zone.clear()
    zone.send_keys("UTC")
    cron = browser.find_element(By.ID, "sch-cron")
    cron.clear()
    cron.send_keys("15 4 1 * 1")  # day of month and day of week: busybox fires on either
    expected = daemon.call("qledge.cron.preview", {"expression": "15 4 1 * 1", "timezone": "UTC"})
    assert expected["daysOred"] and len(expected["fires"]) == 5, expected
    wanted = [time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ms / 1000)) for ms in expected["fires"]]
    until(lambda: [t.get_attribute("datetime") for t in
                   browser.find_elements(By.CSS_SELECTOR, "#sch-preview li time")] == wanted, f"the fires {wanted}")
    preview = browser.find_element(By.ID, "sch-preview").text
    assert "Next fires (UTC)" in preview and "either one fires" in preview, preview
    cron.clear()
    cron.send_keys("15 4 * * *")  # one day field: the note goes
    until(lambda: "either one fires" not in browser.find_element(By.ID, "sch-preview").text
          and browser.find_elements(By.CSS_SELECTOR, "#sch-preview li"), "the preview without the note")
    cron.clear()
    cron.send_keys("61 4 * * *")
    until(lambda: browser.find_element(By.ID, "sch-cron-err").text, "the message next to the cron field")
    cron.clear()
    cron.send_keys("15 4 1 * 1")
    until(lambda: not browser.find_element(By.ID, "sch-cron-err").text, "the message to go")
    browser.find_element(By.XPATH, "//form//button[@type='submit'][text()='Add schedule']").click()
    listed = until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr")
                            if "15 4 1 * 1" in r.text], "the trigger in the list")[0]
    assert "夜间备份" in listed.text and "UTC" in listed.text, listed.text
    triggers = [t for t in daemon.call("qledge.trigger.list")["triggers"] if t["taskId"] == "nightly"]
    assert [t["spec"]["expression"] for t in triggers] == ["15 4 1 * 1"], triggers


# -- fix -----------------------------------------------------------------------------------


def test_edit_a_task_disable_enable_and_delete_it_with_its_triggers(browser, web, daemon, tokens):
    shell_task(daemon, "fixme", "echo old")
    daemon.call("qledge.trigger.create", {"taskId": "fixme", "expression": "0 5 * * *", "triggerId": "fixme-5"})
    before = daemon.call("qledge.task.get", {"taskId": "fixme"})["revision"]
    sign_in(browser, web, tokens["owner"])
    visit(browser, web, "tasks")
    row(browser, "fixme").find_element(By.XPATH, ".//a[text()='Edit']").click()
    until(lambda: f"Revision {before};" in browser.find_element(By.ID, "task-revision").text, "the revision shown")
    shell = browser.find_element(By.ID, "task-shell")
    shell.clear()
    shell.send_keys("echo new")
    browser.find_element(By.XPATH, "//form//button[@type='submit'][text()='Save']").click()
    until(lambda: browser.current_url.endswith("#/tasks") and "echo new" in row(browser, "fixme").text,
          "the new command")
    assert daemon.call("qledge.task.get", {"taskId": "fixme"})["revision"] == before + 1
    visit(browser, web, "tasks/edit/fixme")
    until(lambda: f"Revision {before + 1};" in browser.find_element(By.ID, "task-revision").text, "the new revision")
    assert browser.find_element(By.ID, "task-shell").get_attribute("value") == "echo new"

    visit(browser, web, "tasks")
    row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Disable']").click()
    until(lambda: row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Enable']"), "Enable offered")
    assert daemon.call("qledge.task.get", {"taskId": "fixme"})["enabled"] is False
    row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Enable']").click()
    until(lambda: row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Disable']"), "Disable offered")
    assert daemon.call("qledge.task.get", {"taskId": "fixme"})["enabled"] is True

    row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Delete']").click()
    confirm(browser, "Cancel")  # changing one's mind keeps everything
    assert daemon.call("qledge.task.get", {"taskId": "fixme"})["id"] == "fixme"
    row(browser, "fixme").find_element(By.XPATH, ".//button[text()='Delete']").click()
    confirm(browser, "Delete")
    dialog = until(lambda: browser.find_element(By.CSS_SELECTOR, "dialog[open]"), "the question about its triggers")
    assert "trigger" in dialog.text, dialog.text
    confirm(browser, dialog.find_element(By.CSS_SELECTOR, "button.danger").text)
    until(lambda: not browser.find_elements(By.CSS_SELECTOR, "tbody tr[data-search^='fixme ']"),
          "the task gone")
    assert all(t["id"] != "fixme" for t in daemon.call("qledge.task.list")["tasks"])
    assert all(t["taskId"] != "fixme" for t in daemon.call("qledge.trigger.list")["triggers"])


def test_no_page_shows_a_stray_null_for_a_control_the_role_lacks(browser, web, tokens):
    sign_in(browser, web, tokens["operator"])
    for path in ("", "tasks", "schedules", "runs", "notify"):
        visit(browser, web, path)
        text = main_text(browser)  # read once: the failure shows the text that was judged
        words = text.split()
        assert "null" not in words and "undefined" not in words, f"page {path!r} showed: {text}"


# -- runs ----------------------------------------------------------------------------------


def listed(driver: Any, run: str) -> bool:
    return bool(driver.find_elements(By.CSS_SELECTOR, f"main tbody a[href='#/runs/{run}']"))


def test_filter_runs_by_status_and_cancel_a_running_one(browser, web, daemon, tokens):
    shell_task(daemon, "fine", "true")
    shell_task(daemon, "fails", "exit 4")
    done = [daemon.call("qledge.run.start", {"taskId": task})["id"] for task in ("fine", "fails")]
    for run in done:
        daemon.call("qledge.run.wait", {"runId": run, "timeoutMs": 30_000})
    sign_in(browser, web, tokens["operator"])
    visit(browser, web, "runs")
    until(lambda: listed(browser, done[0]) and listed(browser, done[1]), "both runs")
    Select(browser.find_element(By.ID, "runs-status")).select_by_value("failed")
    browser.find_element(By.XPATH, "//form//button[@type='submit']").click()
    until(lambda: not listed(browser, done[0]), "the filtered list")
    rows = browser.find_elements(By.CSS_SELECTOR, "main tbody tr")
    assert rows and all(r.find_element(By.CSS_SELECTOR, ".badge").get_attribute("data-status") == "failed"
                        for r in rows), [r.text for r in rows]
    assert listed(browser, done[1])

    shell_task(daemon, "long", "echo started; sleep 120")
    run = daemon.call("qledge.run.start", {"taskId": "long"})["id"]
    visit(browser, web, f"runs/{run}")
    until(lambda: "started" in browser.find_element(By.ID, "run-log").text, "the running run's log")
    browser.find_element(By.XPATH, "//button[text()='Cancel run']").click()
    until(lambda: browser.find_element(By.CSS_SELECTOR, "#run-facts .badge[data-status='cancelled']"),
          "the cancelled badge")
    assert daemon.call("qledge.run.get", {"runId": run})["status"] == "cancelled"


# -- secrets -------------------------------------------------------------------------------


def test_a_secret_goes_in_and_never_comes_back(browser, web, daemon, tokens):
    value = "s3cr3t-Value-9f2b"
    sign_in(browser, web, tokens["owner"])
    visit(browser, web, "secrets")
    browser.find_element(By.ID, "secret-name").send_keys("ROUTER_API_KEY")
    browser.find_element(By.ID, "secret-value").send_keys(value)
    browser.find_element(By.XPATH, "//form//button[text()='Store secret']").click()
    until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr") if "ROUTER_API_KEY" in r.text],
          "the secret listed")
    assert browser.find_element(By.ID, "secret-value").get_attribute("value") == ""
    assert value not in browser.page_source
    answers = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/api/session').then(r => r.json()).then(about => fetch('/api/call/qledge.secret.list', {
          method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': about.csrf},
          body: '{}'})).then(r => r.text()).then(done);
    """)
    assert "ROUTER_API_KEY" in answers and value not in answers, answers
    # It is stored: a task that uses it gets the value in its environment.
    daemon.call("qledge.task.create", {"taskId": "usekey", "spec": {"command": {
        "kind": "shell", "command": 'test "$K" = "' + value + '"'}, "env": {"K": {"secret": "ROUTER_API_KEY"}}}})
    ran = daemon.call("qledge.run.start", {"taskId": "usekey"})
    assert daemon.call("qledge.run.wait", {"runId": ran["id"], "timeoutMs": 30_000})["run"]["status"] == "succeeded"


# -- get alerted ---------------------------------------------------------------------------


def test_a_webhook_channel_and_its_test_button_show_what_the_channel_answered(browser, web, daemon, tokens):
    hook = Loopback({"accepted": True})
    try:
        sign_in(browser, web, tokens["owner"])
        visit(browser, web, "notify")
        browser.find_element(By.ID, "ch-name").send_keys("phone")
        Select(browser.find_element(By.ID, "ch-kind")).select_by_value("webhook")
        spec = browser.find_element(By.ID, "ch-spec")
        spec.clear()
        spec.send_keys(json.dumps({"kind": "webhook", "url": f"{hook.url}/alert"}))
        browser.find_element(By.XPATH, "//form//button[@type='submit'][text()='Save channel']").click()
        channel(browser, "phone").find_element(By.XPATH, ".//button[text()='Send a test']").click()
        result = until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, ".test-result.good")
                                if r.text.startswith("Delivered")], "the delivered answer")[0]
        assert hook.requests and hook.requests[0].path == "/alert", hook.requests
        assert result.text.strip() == "Delivered.", result.text  # a 2xx: the daemon reports no more
        hook.replies.append((500, {"error": "mailbox full"}, {}))
        visit(browser, web, "notify")
        channel(browser, "phone").find_element(By.XPATH, ".//button[text()='Send a test']").click()
        refused = until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, ".test-result.bad")
                                 if r.text.startswith("Not delivered")], "the refusal")[0]
        assert "500" in refused.text, refused.text
    finally:
        hook.close()


# -- a live log across a dropped connection -----------------------------------------------------


class Cutter:
    """A TCP relay in front of the panel that can drop every connection through it at once, as
    a Wi-Fi hop or a restarted proxy would."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        self.sent: list[bytes] = []  # what browsers sent through it, in order
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.pairs.append((client, upstream))
                self.accepted += 1
            for a, b, log in ((client, upstream, self.sent), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(a, b, log), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket, log: list[bytes] | None) -> None:
        try:
            while data := a.recv(65536):
                if log is not None:
                    log.append(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.server.close()
        self.cut()


def test_a_live_log_resumes_after_a_dropped_connection_without_a_reload(daemon, tokens):
    w = WebProcess(daemon)
    relay = Cutter(w.port)
    driver = make_driver()
    try:
        shell_task(daemon, "ticker", 'for i in $(seq 1 12); do echo "tick $i"; sleep 1; done')
        sign_in(driver, _At(relay.port), tokens["operator"])
        run = daemon.call("qledge.run.start", {"taskId": "ticker"})["id"]
        visit(driver, _At(relay.port), f"runs/{run}")
        driver.execute_script("window.__sameDocument = true")
        log = until(lambda: driver.find_element(By.ID, "run-log"), "the log")
        until(lambda: "tick 2" in log.text, "the first lines")
        before = relay.accepted
        relay.cut()
        sent = len(relay.sent)
        until(lambda: relay.accepted > before, "the browser reconnecting")
        # The browser asked again for the live log, saying where it stopped.
        until(lambda: any(b"/api/log?run=" in part and b"last-event-id: " in part.lower()
                          for part in relay.sent[sent:]), "the resumed request")
        until(lambda: "tick 12" in log.text, "the last line after the drop")
        assert driver.execute_script("return window.__sameDocument === true"), "the page was reloaded"
        lines = log.text.splitlines()
        assert lines == [f"tick {i}" for i in range(1, 13)], lines  # each line once: resumed where it stopped
        until(lambda: driver.find_element(By.CSS_SELECTOR, "#run-facts .badge[data-status='succeeded']"), "the end")
    finally:
        driver.quit()
        relay.close()
        w.stop()


def test_leaving_a_run_page_frees_its_live_log_for_the_next(browser, web, daemon, tokens):
    """The per-session cap is four live logs: a person who looks at five running runs one
    after another is never refused, because leaving a run's page gives its place back."""
    daemon.call("qledge.task.create", {"taskId": "busy", "spec": {
        "command": {"kind": "shell", "command": "echo started; sleep 120"}, "overlap": "allow"}})
    runs = [daemon.call("qledge.run.start", {"taskId": "busy"})["id"] for _ in range(6)]
    sign_in(browser, web, tokens["operator"])
    try:
        for run in runs:
            browser.execute_script("location.hash = arguments[0]", f"#/runs/{run}")
            try:
                until(lambda run=run: run in browser.find_element(By.CSS_SELECTOR, "main h1").text
                      and "started" in browser.find_element(By.ID, "run-log").text, f"the live log of {run}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {browser.find_element(By.ID, 'log-state').text!r}") from None
    finally:
        stop(daemon, runs)


class _At:
    """The panel as the browser reaches it through the relay."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/"


# -- HTTP level: the cookie under TLS, the LAN warning, the caps on live logs ----------------------


def test_under_tls_the_cookie_is_secure_and_host_prefixed(daemon, tokens):
    folder = tempfile.mkdtemp(prefix="qlw")
    made = self_signed(folder)
    if made is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = made
    w = WebProcess(daemon, ["--tls-cert", cert, "--tls-key", key])
    try:
        assert w.scheme == "https" and "warning" not in w.stderr()
        context = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("127.0.0.1", w.port, timeout=30, context=context)
        try:
            conn.request("POST", "/api/login", body=json.dumps({"token": tokens["operator"]}),
                         headers={"Host": w.netloc, "Origin": w.origin, "Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200
            cookie = answer.getheader("Set-Cookie") or ""
        finally:
            conn.close()
        parts = [p.strip() for p in cookie.split(";")]
        assert parts[0].startswith("__Host-qledge=") and len(parts[0]) > len("__Host-qledge=") + 16, cookie
        assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/"} <= set(parts), cookie
        assert not any(p.lower().startswith("domain=") for p in parts), cookie  # __Host-: no Domain
    finally:
        w.stop()
    plain = WebProcess(daemon)
    try:
        status, headers, _ = plain.request("POST", "/api/login", {"token": tokens["operator"]},
                                           {"Origin": plain.origin})
        assert status == 200 and headers["set-cookie"].startswith("qledge_session=")
        assert "Secure" not in headers["set-cookie"]
    finally:
        plain.stop()


def test_plain_http_beyond_loopback_is_warned_about(daemon):
    lan = WebProcess(daemon, ["--listen", "0.0.0.0:0"])
    try:
        assert "plain HTTP beyond this machine" in lan.stderr() and "session cookie" in lan.stderr(), lan.stderr()
    finally:
        lan.stop()
    local = WebProcess(daemon)
    try:
        assert "warning" not in local.stderr(), local.stderr()
    finally:
        local.stop()


def _follow(w: WebProcess, cookie: str, run: str) -> tuple[int, bytes, http.client.HTTPResponse]:
    """Open a live log: the answer's status, the start of its body, and the answer, whose
    connection stays open while it is held."""
    conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=30)
    conn.request("GET", f"/api/log?run={run}", headers={"Host": w.netloc, "Cookie": cookie,
                                                          "Accept": "text/event-stream"})
    answer = conn.getresponse()
    if answer.status == 200:
        return 200, answer.readline(), answer
    return answer.status, answer.read(), answer


def test_the_live_log_caps_refuse_the_next_follower_clearly(daemon, tokens):
    shell_task(daemon, "quiet", "sleep 120")
    run = daemon.call("qledge.run.start", {"taskId": "quiet"})["id"]
    w = WebProcess(daemon)
    opened: list[http.client.HTTPResponse] = []
    try:
        first = w.login(tokens["operator"])
        for _ in range(4):
            status, _, answer = _follow(w, first.cookie, run)
            opened.append(answer)
            assert status == 200
        status, body, answer = _follow(w, first.cookie, run)
        opened.append(answer)
        assert status == 429, (status, body)
        assert json.loads(body)["error"] == {"code": "resource_exhausted",
                                             "message": "too many live logs are open; close one"}
        second = w.login(tokens["operator"])
        for _ in range(4):
            status, _, answer = _follow(w, second.cookie, run)
            opened.append(answer)
            assert status == 200  # another session has its own four, within the eight in all
        third = w.login(tokens["operator"])
        status, body, answer = _follow(w, third.cookie, run)
        opened.append(answer)
        assert status == 429 and json.loads(body)["error"]["code"] == "resource_exhausted", (status, body)
        opened[0].close()  # a browser leaves a log: its place is given back at once
        status, body, answer = _follow(w, third.cookie, run)
        opened.append(answer)
        assert status == 200, (status, body)
        assert w.request("GET", "/static/app.js")[0] == 200  # the panel keeps serving
    finally:
        for answer in opened:
            answer.close()
        stop(daemon, [run])
        w.stop()

