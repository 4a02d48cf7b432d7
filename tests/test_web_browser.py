"""The panel in a real browser: Debian's headless Chromium driven by selenium (ChromeDriver),
against a real daemon and a real `qledge web`. Chromium and the panel run under `nice`.

Screenshots of every page at phone (360 px) and desktop (1280 px) width are saved in
$QLEDGE_SCREENSHOTS (default: a folder under the system's temporary directory).
"""

from __future__ import annotations

import http.server
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from support import DaemonProcess
from web_support import CHROMEDRIVER, CHROMIUM, CHROMIUM_FLAGS, WebProcess, chromium_available

pytestmark = pytest.mark.skipif(not chromium_available(), reason="needs Debian's chromium and chromium-driver"
                                " (.ci/run installs them: apt-get install chromium chromium-driver)")

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

AXE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web", "axe.min.js")
SHOTS = os.environ.get("QLEDGE_SCREENSHOTS") or os.path.join(tempfile.gettempdir(), "qledge-screenshots")
WAIT_S = 30.0  # every wait polls until this deadline: a loaded machine is slow, never wrong
# The AI operator on, pointed at nothing: its page exists; nothing is asked of a provider here.
AGENT_ON = '[agent]\nenabled = true\nbase_url = "https://api.openai.com/v1"\nmodel = "gpt-4o-mini"\n'
PAGES = ["", "tasks", "tasks/new", "schedules", "runs", "secrets", "notify", "ai", "audit"]
XSS = "<img src=x onerror=alert(1)>"
RED = "179, 38, 30"  # rgb() or rgba(…, 1), as Chromium reports it


def until(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except Exception:  # the page is between states
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def make_driver(width: int = 1280) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--window-size={width},900", f"--user-data-dir={tempfile.mkdtemp(prefix='qlc')}"]:
        options.add_argument(flag)
    options.add_argument("--lang=en-US")
    service = Service(CHROMEDRIVER, popen_kw={"preexec_fn": lambda: os.nice(10)})
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = DaemonProcess(config=AGENT_ON).start()
    yield d
    d.cleanup()


@pytest.fixture(scope="module")
def tokens(daemon: DaemonProcess) -> dict[str, str]:
    return {role: daemon.token(role)[1] for role in ("owner", "operator", "viewer")}


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


def sign_in(driver: Any, web: WebProcess, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(web.url)
    field = until(lambda: driver.find_element(By.ID, "token"), "the sign-in form")
    field.send_keys(token)
    field.send_keys(Keys.ENTER)
    until(lambda: driver.find_element(By.ID, "logout"), "the signed-in header")


def visit(driver: Any, web: WebProcess, path: str) -> Any:
    driver.get(f"{web.url}#/{path}")
    return until(lambda: driver.find_element(By.CSS_SELECTOR, "main .page h1"), f"page {path!r}")


def main_text(driver: Any) -> str:
    return driver.find_element(By.TAG_NAME, "main").text


# -- signing in ------------------------------------------------------------------------


def test_sign_in_with_a_good_token_a_bad_one_and_many_bad_ones(daemon, tokens):
    w = WebProcess(daemon)  # its own rate limit: the other tests' address stays free
    driver = make_driver()
    try:
        driver.get(w.url)
        field = until(lambda: driver.find_element(By.ID, "token"), "the sign-in form")
        field.send_keys("qle_wrong_token" + Keys.ENTER)
        until(lambda: "not valid" in driver.find_element(By.ID, "login-error").text, "the bad-token message")
        for _ in range(5):
            field = driver.find_element(By.ID, "token")
            field.clear()
            field.send_keys("qle_wrong_token" + Keys.ENTER)
            time.sleep(0.2)
        until(lambda: "too many failed sign-ins" in driver.find_element(By.ID, "login-error").text, "the rate limit")
        assert driver.get_cookies() == []
    finally:
        driver.quit()
        w.stop()
    browser = make_driver()
    w = WebProcess(daemon)
    try:
        sign_in(browser, w, tokens["owner"])
        cookie = browser.get_cookies()[0]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert tokens["owner"] not in json.dumps(browser.get_cookies())
        storage = browser.execute_script("return JSON.stringify([localStorage, sessionStorage, location.href])")
        assert tokens["owner"] not in storage
        browser.find_element(By.ID, "logout").click()
        until(lambda: browser.find_element(By.ID, "token"), "the sign-in form after signing out")
        browser.get(w.url + "#/tasks")
        until(lambda: browser.find_element(By.ID, "token"), "the sign-in form, signed out")
    finally:
        browser.quit()
        w.stop()


def test_an_expired_session_sends_you_back_to_sign_in(daemon, tokens):
    w = WebProcess(daemon, ["--session-idle", "0.05"])  # three seconds idle
    driver = make_driver()
    try:
        sign_in(driver, w, tokens["viewer"])
        visit(driver, w, "")
        # Idle time must really pass (any request would restart it): nothing is polled meanwhile.
        time.sleep(3.5)
        driver.find_element(By.XPATH, "//nav//a[text()='Runs']").click()
        until(lambda: "ended" in driver.find_element(By.ID, "login-error").text, "the sign-in form, session ended")
        assert driver.find_element(By.ID, "token").is_displayed()
    finally:
        driver.quit()
        w.stop()


# -- roles -----------------------------------------------------------------------------


def test_a_viewer_sees_no_write_controls_and_a_forged_write_is_refused(browser, web, daemon, tokens):
    daemon.call("qledge.task.create", {"taskId": "viewed", "spec": {"command": {"kind": "shell", "command": "true"}}})
    sign_in(browser, web, tokens["viewer"])
    visit(browser, web, "tasks")
    until(lambda: "viewed" in main_text(browser), "the task list")
    buttons = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "main button, main a.button")]
    for control in ("Add a task", "Run now", "Edit", "Delete", "Disable"):
        assert control not in buttons, buttons
    nav = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "nav a")]
    assert "Secrets" not in nav and "Audit" not in nav
    answer = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/api/session').then(r => r.json()).then(about => fetch('/api/call/qledge.task.delete', {
          method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': about.csrf},
          body: JSON.stringify({taskId: 'viewed'})})).then(async r => done([r.status, await r.json()]));
    """)
    assert answer[0] == 403 and answer[1]["error"]["code"] == "permission_denied", answer
    assert daemon.call("qledge.task.get", {"taskId": "viewed"})["id"] == "viewed"


# -- the first week's work ---------------------------------------------------------------


def test_create_a_task_run_it_and_watch_its_log_arrive_line_by_line(browser, web, daemon, tokens):
    sign_in(browser, web, tokens["operator"])
    visit(browser, web, "tasks/new")
    browser.find_element(By.ID, "task-id").send_keys("greet")
    browser.find_element(By.ID, "task-name").send_keys("每日问候")
    browser.find_element(By.ID, "task-shell").send_keys('for i in 1 2 3; do echo "line $i"; sleep 1.5; done')
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    until(lambda: "每日问候" in main_text(browser) and "#/tasks" in browser.current_url, "the new task in the list")
    search = browser.find_element(By.ID, "task-search")
    search.send_keys("问候")
    row = until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr") if r.is_displayed()], "a match")
    assert len(row) == 1 and "每日问候" in row[0].text
    row[0].find_element(By.XPATH, ".//button[text()='Run now']").click()
    log = until(lambda: browser.find_element(By.ID, "run-log"), "the run page")
    seen: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while "line 3" not in (text := log.text) and time.monotonic() < deadline:
        if not seen or seen[-1] != text:
            seen.append(text)
        time.sleep(0.05)
    lines = [s for s in seen if s]
    assert any("line 1" in s and "line 3" not in s for s in lines), seen  # line 1 came before line 3 was written
    until(lambda: "line 3" in log.text, "the last line")
    badge = until(lambda: browser.find_element(By.CSS_SELECTOR, "#run-facts .badge[data-status='succeeded']"),
                  "the success badge")
    assert badge.text == "succeeded"
    assert "exited normally" in browser.find_element(By.ID, "run-exit").text


def test_a_failing_task_shows_red_on_the_overview(browser, web, daemon, tokens):
    daemon.call("qledge.task.create", {"taskId": "broken", "name": "坏掉的任务",
                                       "spec": {"command": {"kind": "shell", "command": "echo oops; exit 3"}}})
    run = daemon.call("qledge.run.start", {"taskId": "broken"})
    assert daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})["run"]["status"] == "failed"
    sign_in(browser, web, tokens["viewer"])
    visit(browser, web, "")
    item = until(lambda: [li for li in browser.find_elements(By.CSS_SELECTOR, ".failing li")
                          if "坏掉的任务" in li.text], "the failing task")[0]
    assert RED in item.value_of_css_property("color")
    assert RED in item.find_element(By.CSS_SELECTOR, ".badge").value_of_css_property("background-color")
    visit(browser, web, f"runs/{run['id']}")
    assert "exited with code 3" in until(lambda: browser.find_element(By.ID, "run-exit"), "the run").text


# -- attacks -----------------------------------------------------------------------------


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Another origin on this machine, serving a page with a form aimed at the panel."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        page = (f'<!doctype html><title>prize</title><form id=f method=post action="{self.target}">'
                '<input name=taskId value=victim><button id=go>claim</button></form>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: object) -> None:
        pass


def test_cross_origin_form_posts_and_requests_without_the_csrf_token_are_refused(browser, web, daemon, tokens):
    daemon.call("qledge.task.create", {"taskId": "victim", "spec": {"command": {"kind": "shell", "command": "true"}}})
    sign_in(browser, web, tokens["owner"])
    _Attacker.target = f"{web.url}api/call/qledge.task.delete"
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.2:{server.server_address[1]}/")
        browser.find_element(By.ID, "go").click()
        until(lambda: "cross-origin" in browser.find_element(By.TAG_NAME, "body").text
              or "not signed in" in browser.find_element(By.TAG_NAME, "body").text, "the refusal")
    finally:
        server.shutdown()
        server.server_close()
    visit(browser, web, "tasks")
    answer = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/api/call/qledge.task.delete', {method: 'POST', headers: {'Content-Type': 'application/json'},
          body: JSON.stringify({taskId: 'victim'})}).then(async r => done([r.status, await r.json()]));
    """)
    assert answer[0] == 403 and "CSRF" in answer[1]["error"]["message"], answer
    assert daemon.call("qledge.task.get", {"taskId": "victim"})["id"] == "victim"


def test_html_in_a_task_name_and_a_log_line_is_shown_as_text(browser, web, daemon, tokens):
    daemon.call("qledge.task.create", {"taskId": "xss", "name": XSS, "spec": {"command": {
        "kind": "shell", "command": "echo '<script>alert(2)</script><b>bold</b>'"}}})
    run = daemon.call("qledge.run.start", {"taskId": "xss"})
    daemon.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000})
    sign_in(browser, web, tokens["owner"])
    for path in ("tasks", f"runs/{run['id']}", "runs"):
        visit(browser, web, path)
        until(lambda: XSS in main_text(browser) or "alert(2)" in main_text(browser), f"the text on {path!r}")
        with pytest.raises(NoAlertPresentException):
            _ = browser.switch_to.alert.text
        assert browser.execute_script("return document.querySelectorAll('main img, main script, main b').length") == 0
    visit(browser, web, f"runs/{run['id']}")
    until(lambda: "<script>alert(2)</script><b>bold</b>" in browser.find_element(By.ID, "run-log").text, "the log")


# -- languages, accessibility, screenshots -------------------------------------------------


def _no_missing_strings(driver: Any, path: str) -> None:
    missing = driver.execute_script("return document.documentElement.dataset.missingStrings || ''")
    assert missing == "", (path, missing)
    assert "⟦" not in driver.find_element(By.TAG_NAME, "body").text, path


def test_every_page_has_every_string_in_chinese_and_english(browser, web, tokens):
    sign_in(browser, web, tokens["owner"])
    switch = until(lambda: browser.find_element(By.CSS_SELECTOR, "header button[lang='zh-CN']"), "the switch")
    switch.click()
    until(lambda: browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "zh-CN", "Chinese")
    for path in PAGES:
        heading = visit(browser, web, path)
        assert heading.text and not heading.text.isascii(), (path, heading.text)
        _no_missing_strings(browser, path)
    browser.find_element(By.CSS_SELECTOR, "header button[lang='en']").click()
    for path in PAGES:
        visit(browser, web, path)
        _no_missing_strings(browser, path)


def test_the_keyboard_alone_reaches_the_pages(browser, web, tokens):
    sign_in(browser, web, tokens["owner"])
    visit(browser, web, "")
    first = browser.execute_script(
        "return document.querySelector('a[href], button, input, select, textarea').className")
    assert first == "skip"  # the first stop of the Tab order skips to the content
    keys = ActionChains(browser)
    for _ in range(30):  # from the page's content back to its navigation, by keyboard alone
        keys.key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
        active = browser.switch_to.active_element
        if active.tag_name == "a" and active.text == "Runs":
            break
    else:
        raise AssertionError("Shift+Tab never reached the Runs link")
    keys.send_keys(Keys.ENTER).perform()
    until(lambda: browser.current_url.endswith("#/runs"), "the runs page, by keyboard")


def _axe(driver: Any) -> list[dict[str, Any]]:
    if not driver.execute_script("return typeof axe !== 'undefined'"):
        with open(AXE, encoding="utf-8") as f:
            driver.execute_script(f.read())
    result = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations), e => done(String(e)));
    """)
    assert isinstance(result, list), result
    return [{"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:3]}
            for v in result if v["impact"] in ("serious", "critical")]


def test_axe_finds_no_serious_or_critical_violations(browser, web, tokens):
    sign_in(browser, web, tokens["owner"])
    for width in (1280, 360):
        browser.set_window_size(width, 900)
        found = {}
        for path in PAGES:
            visit(browser, web, path)
            violations = _axe(browser)
            if violations:
                found[path] = violations
        assert found == {}, (width, found)
    browser.set_window_size(1280, 900)
    browser.delete_all_cookies()
    browser.get(web.url)
    until(lambda: browser.find_element(By.ID, "token"), "the sign-in form")
    assert _axe(browser) == []


def test_screenshots_of_every_page_at_phone_and_desktop_width(browser, web, daemon, tokens):
    os.makedirs(SHOTS, exist_ok=True)
    if _has_task(daemon, "greet"):  # a schedule to show
        daemon.call("qledge.trigger.create", {"taskId": "greet", "expression": "30 7 * * *", "triggerId": "morning"})
    sign_in(browser, web, tokens["owner"])
    for width, label in ((360, "phone"), (1280, "desktop")):
        browser.set_window_size(width, 900)
        for path in [*PAGES, _newest_run(daemon)]:
            visit(browser, web, path)
            time.sleep(0.3)  # let the live preview and logs settle for the picture
            if width == 360:
                overflow = browser.execute_script("return document.documentElement.scrollWidth")
                assert overflow <= 360 + 1, (path, overflow)  # nothing wider than the phone
            name = "run" if path.startswith("runs/") else (path.split("/")[0] or "overview") + (
                "-new" if path.endswith("new") else "")
            height = browser.execute_script("return Math.min(document.body.scrollHeight, 2400)")
            browser.set_window_size(width, max(640, height))
            assert browser.save_screenshot(os.path.join(SHOTS, f"{name}-{label}.png"))
            browser.set_window_size(width, 900)
    browser.set_window_size(1280, 900)
    assert len([f for f in os.listdir(SHOTS) if f.endswith(".png")]) >= 2 * len(PAGES)


def _has_task(daemon: DaemonProcess, task: str) -> bool:
    return any(t["id"] == task for t in daemon.call("qledge.task.list")["tasks"])


def _newest_run(daemon: DaemonProcess) -> str:
    runs = daemon.call("qledge.run.list", {"limit": 1})["runs"]
    return f"runs/{runs[0]['id']}" if runs else "runs"
