"""`qledge web` against a real daemon, over real HTTP: sessions and their cookie, CSRF,
Origin and Host checks, the login rate limit, headers, bounds, and that every action is
the signed-in user's own tool call (audited as transport `web`)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from web_support import WebProcess

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


@pytest.fixture
def web(daemon):
    w = WebProcess(daemon)
    yield w
    w.stop()


def test_login_gives_an_httponly_strict_cookie_and_never_the_token(web, daemon):
    _, token = daemon.token("viewer")
    status, headers, body = web.request("POST", "/api/login", {"token": token}, {"Origin": web.origin})
    assert status == 200, body
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback; under TLS it is Secure (test_tls_…)
    about = json.loads(body)
    assert token not in body.decode() and token.split("_")[2] not in cookie
    assert about["role"] == "viewer" and "qledge.task.create" not in about["tools"]
    assert len(about["csrf"]) == 64


def test_a_bad_token_is_refused_and_many_are_rate_limited(web, daemon):
    for _ in range(5):
        status, _, body = web.request("POST", "/api/login", {"token": "qle_nope_nope"}, {"Origin": web.origin})
        assert status == 401, body
    status, headers, body = web.request("POST", "/api/login", {"token": "qle_nope_nope"}, {"Origin": web.origin})
    assert status == 429 and "try again" in json.loads(body)["error"]["message"]
    assert int(headers["retry-after"]) > 0
    _, good = daemon.token("owner")  # the address waits, whatever it sends
    assert web.request("POST", "/api/login", {"token": good}, {"Origin": web.origin})[0] == 429


def test_state_changes_need_the_csrf_token_and_the_panels_origin(web, daemon):
    _, token = daemon.token("owner")
    s = web.login(token)
    spec = {"taskId": "t1", "spec": {"command": {"kind": "shell", "command": "true"}}}
    status, body = s.call("qledge.task.create", spec, csrf="")
    assert status == 403 and "CSRF" in body["error"]["message"]
    status, body = s.call("qledge.task.create", spec, csrf="0" * 64)
    assert status == 403
    status, body = s.call("qledge.task.create", spec, origin="http://evil.example")
    assert status == 403 and "cross-origin" in body["error"]["message"]
    # A form another site posts: no JSON, another Origin, and (in a browser) no cookie.
    status, _, _ = web.request("POST", "/api/call/qledge.task.delete", raw=b"taskId=t1",
                               headers={"Content-Type": "application/x-www-form-urlencoded", "Cookie": s.cookie,
                                        "Origin": "null"})
    assert status == 403
    assert daemon.call("qledge.task.list")["tasks"] == []  # nothing of the above reached the daemon
    status, body = s.call("qledge.task.create", spec)
    assert status == 200 and body["result"]["id"] == "t1"


def test_a_viewers_forged_write_is_refused_by_the_daemon_and_audited_as_web(web, daemon):
    _, token = daemon.token("viewer")
    s = web.login(token)
    spec = {"command": {"kind": "shell", "command": "id"}}
    status, body = s.call("qledge.task.create", {"taskId": "x", "spec": spec})
    assert status == 403 and body["error"]["code"] == "permission_denied"
    assert "requires permission" in body["error"]["message"]  # the daemon's words, not the panel's
    rows = daemon.call("qledge.audit.list", {"limit": 20})["entries"]
    refused = [r for r in rows if r["tool"] == "qledge.task.create"]
    assert refused and refused[0]["transport"] == "web" and refused[0]["outcome"] == "denied"
    allowed = [r for r in rows if r["tool"] == "qledge.tools.list" and r["outcome"] == "allowed"]
    assert allowed and allowed[0]["transport"] == "web"


def test_the_panel_offers_only_its_tools_and_calls_none_without_a_session(web, daemon):
    _, token = daemon.token("owner")
    s = web.login(token)
    status, body = s.call("qledge.credential.create", {"role": "owner"})
    assert status == 404 and "offers no tool" in body["error"]["message"]
    before = len(daemon.call("qledge.audit.list", {"limit": 64})["entries"])
    status, _, body = web.request("POST", "/api/call/qledge.status", {}, {"Origin": web.origin, "X-CSRF-Token": s.csrf})
    assert status == 401
    # The panel runs as an owner uid here; had it called without a token, the daemon would have
    # taken that uid for the caller. It called nothing.
    after = daemon.call("qledge.audit.list", {"limit": 64})["entries"]
    assert [e for e in after[: len(after) - before] if e["transport"] == "web"] == []


def test_logout_ends_the_session(web, daemon):
    _, token = daemon.token("viewer")
    s = web.login(token)
    assert s.call("qledge.status")[0] == 200
    status, headers, _ = web.request("POST", "/api/logout", {}, {"Cookie": s.cookie, "Origin": web.origin,
                                                                  "X-CSRF-Token": s.csrf})
    assert status == 200 and "Max-Age=0" in headers["set-cookie"]
    assert s.call("qledge.status")[0] == 401
    assert web.request("GET", "/api/session", headers={"Cookie": s.cookie})[0] == 401


def test_a_revoked_credential_ends_its_session(web, daemon):
    cid, token = daemon.token("viewer")
    s = web.login(token)
    daemon.call("qledge.credential.revoke", {"id": cid})
    status, body = s.call("qledge.status")
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    assert web.request("GET", "/api/session", headers={"Cookie": s.cookie})[0] == 401


def test_every_answer_carries_the_security_headers(web):
    for path in ("/", "/static/app.js", "/api/session", "/nothing"):
        status, headers, _ = web.request("GET", path)
        assert headers["content-security-policy"] == CSP, path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
        assert headers["x-frame-options"] == "DENY"
    status, headers, body = web.request("GET", "/static/app.js", headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert headers["content-type"].startswith("text/javascript")
    assert web.request("GET", "/static/app.js", headers={"If-None-Match": headers["etag"]})[0] == 304


def test_luci_may_frame_the_panel_when_configured(daemon):
    w = WebProcess(daemon, ["--luci-origin", "http://192.168.1.1"])
    try:
        headers = w.request("GET", "/")[1]
        assert headers["content-security-policy"].endswith("frame-ancestors 'self' http://192.168.1.1")
        assert "x-frame-options" not in headers
    finally:
        w.stop()


def test_unknown_host_names_are_refused(web):
    status, _, body = web.request("GET", "/", headers={"Host": "attacker.example:5700"})
    assert status == 421 and b"--allow-host" in body
    assert web.request("GET", "/", headers={"Host": f"localhost:{web.port}"})[0] == 200


def test_language_comes_from_the_cookie_or_accept_language(web):
    page = web.request("GET", "/", headers={"Accept-Language": "fr;q=1, zh-TW;q=0.8, en;q=0.5"})[2]
    assert b'<html lang="zh-CN">' in page
    page = web.request("GET", "/", headers={"Accept-Language": "zh-CN", "Cookie": "qledge_lang=en"})[2]
    assert b'<html lang="en">' in page


def _raw(web: WebProcess, data: bytes, wait_s: float = 15.0) -> bytes:
    with socket.create_connection(("127.0.0.1", web.port), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks += chunk
        return chunks


def test_oversized_requests_are_refused_and_the_panel_keeps_serving(web):
    head = _raw(web, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    body = _raw(web, b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 999999\r\n\r\n")
    assert body.startswith(b"HTTP/1.1 413 ")
    chunked = _raw(web, b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 501 ")
    assert _raw(web, b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert web.request("GET", "/")[0] == 200


def test_connections_beyond_the_cap_are_answered_busy(web):
    held = []
    try:
        for _ in range(16):  # one client address may hold 16
            s = socket.create_connection(("127.0.0.1", web.port), timeout=10)
            s.sendall(b"G")  # a request begun, never finished
            held.append(s)
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as extra:
            assert extra.recv(4096).startswith(b"HTTP/1.1 503 ")  # at once, before it asks anything
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 15
    while web.request("GET", "/")[0] != 200:  # the held ones are gone: served again
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_waiting_log_read_returns_as_soon_as_output_lands(daemon):
    """What live logs rest on: qledge.run.log.read with waitMs answers with the first new
    output, not when the log stops growing."""
    daemon.call("qledge.task.create", {"taskId": "slow", "spec": {"command": {
        "kind": "shell", "command": "echo one; sleep 3; echo two"}}})
    run = daemon.call("qledge.run.start", {"taskId": "slow"})
    offset, parts = 0, []
    while True:
        chunk = daemon.call("qledge.run.log.read", {"runId": run["id"], "offset": offset, "waitMs": 20_000})
        if chunk["data"]:
            parts.append(chunk["data"])
        offset += len(chunk["data"])
        if chunk["final"] and chunk["eof"]:
            break
    assert parts[:2] == [b"one\n", b"two\n"], parts
