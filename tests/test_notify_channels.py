"""Each channel's request, as its API documents it, sent by the real sender child to a real
loopback server: paths, headers, bodies, and DingTalk's and Feishu's signatures computed
here from their documented algorithms."""

from __future__ import annotations

import base64
import hashlib
import hmac
import shutil
import urllib.parse

import pytest

from edge.notify.send import dingtalk_sign, feishu_sign
from notify_support import (
    Loopback,
    NtfyApi,
    TelegramApi,
    TunnelProxy,
    WeComBot,
    message,
    run_sender,
    self_signed,
    tmpdir,
)

NOW_MS = 1_700_000_000_123
TEXT = message().text
TITLE = message().title
PLAIN = f"{TITLE}\n\n{TEXT}"


@pytest.fixture
def server():
    s = Loopback()
    yield s
    s.close()


def one(server: Loopback, spec: dict, secrets: dict[str, str] | None = None, **kw):
    results = run_sender([spec], secrets, now_ms=NOW_MS, **kw)
    assert len(results) == 1
    return results[0], server.requests[-1] if server.requests else None


def test_the_message_says_what_happened():
    assert TITLE == "[qledge] backup failed"
    assert TEXT.splitlines() == ["Task: backup", "Status: failed (exit 3)", "exited with code 3", "Duration: 1.5s",
                                 "Run: 01a2b3c4-d5e6", "Device: router", "", "Last lines of the log:", "line 1",
                                 "line 2"]
    from edge.notify.channels import Facts, render

    zh = render(Facts(channel="c", event="recovery", device="路由器", task="备份", status="succeeded", exit_code=0),
                "zh")
    assert zh.title == "[qledge] 备份 已恢复"
    assert "状态: 成功 (退出码 0)" in zh.text
    assert "设备: 路由器" in zh.text


def test_webhook_with_a_body_template_and_a_secret_header(server):
    spec = {"kind": "webhook", "url": server.url + "/hooks/qledge?x=1", "method": "PUT",
            "headers": {"Authorization": {"secret": "HOOK"}, "X-Plain": "yes"},
            "body": {"text": "{task} {status}", "code": "{exitCode}", "nested": ["{device}", 7]}}
    result, req = one(server, spec, {"HOOK": "Bearer s3cret-value"})
    assert result.ok, result
    assert (req.method, req.path) == ("PUT", "/hooks/qledge?x=1")
    assert req.headers["Authorization"] == "Bearer s3cret-value" and req.headers["X-Plain"] == "yes"
    assert req.headers["Content-Type"] == "application/json; charset=utf-8"
    assert req.json() == {"text": "backup failed", "code": 3, "nested": ["router", 7]}


def test_webhook_default_body_has_every_field(server):
    result, req = one(server, {"kind": "webhook", "url": {"secret": "URL"}}, {"URL": server.url + "/in"})
    assert result.ok and req.path == "/in"
    body = req.json()
    assert body["task"] == "backup" and body["exitCode"] == 3 and body["runId"] == "01a2b3c4-d5e6"
    assert body["title"] == TITLE and body["text"] == TEXT and body["log"] == "line 1\nline 2"


def test_ntfy_publishes_json_to_the_root_with_a_bearer_token():
    server = NtfyApi(token="tk_abc")
    try:
        spec = {"kind": "ntfy", "baseUrl": server.url, "topic": {"secret": "TOPIC"}, "token": {"secret": "TK"},
                "priority": 4, "tags": ["warning"]}
        result, req = one(server, spec, {"TOPIC": "my-topic-x7", "TK": "tk_abc"})
        assert result.ok, result
        assert (req.method, req.path) == ("POST", "/")
        assert req.headers["Authorization"] == "Bearer tk_abc"
        assert req.json() == {"topic": "my-topic-x7", "title": TITLE, "message": TEXT, "priority": 4,
                              "tags": ["warning"]}
        # What ntfy refuses, as it says it: a token it does not take.
        refused, _ = one(server, spec, {"TOPIC": "my-topic-x7", "TK": "tk_other"})
        assert not refused.ok and refused.permanent and "HTTP 403" in refused.detail
        assert "tk_other" not in refused.detail
    finally:
        server.close()


def test_telegram_send_message():
    server = TelegramApi("123456:ABC-def")
    try:
        spec = {"kind": "telegram", "baseUrl": server.url, "token": {"secret": "TG"}, "chatId": "-1001234"}
        result, req = one(server, spec, {"TG": "123456:ABC-def"})
        assert result.ok, result
        assert req.path == "/bot123456:ABC-def/sendMessage"
        assert req.json() == {"chat_id": "-1001234", "text": PLAIN, "disable_web_page_preview": True}
    finally:
        server.close()


def test_telegram_refusal_is_reported_without_the_token():
    server = TelegramApi("123456:ABC-def")
    try:
        spec = {"kind": "telegram", "baseUrl": server.url, "token": {"secret": "TG"}, "chatId": "1"}
        result, _ = one(server, spec, {"TG": "999999:XYZ-other"})
        assert not result.ok and result.permanent
        assert "HTTP 401" in result.detail and "Unauthorized" in result.detail and "XYZ-other" not in result.detail
        long = run_sender([spec], {"TG": "123456:ABC-def"}, msg=message(detail="x" * 5000))  # under 4096 characters
        assert long[0].ok, long
    finally:
        server.close()


def test_bark_posts_json_and_takes_a_whole_push_url(server):
    server.default = {"code": 200, "message": "success"}
    spec = {"kind": "bark", "deviceKey": {"secret": "BARK"}, "sound": "alarm", "level": "timeSensitive"}
    result, req = one(server, spec, {"BARK": server.url + "/DxHcxxxxxRxxxxxxcm/"})
    assert result.ok, result
    assert (req.method, req.path) == ("POST", "/push")  # never the GET URL form: long bodies broke it
    assert req.json() == {"device_key": "DxHcxxxxxRxxxxxxcm", "title": TITLE, "body": TEXT, "group": "qledge",
                          "sound": "alarm", "level": "timeSensitive"}


def test_wecom_bot():
    server = WeComBot("693a-91f6")
    try:
        result, req = one(server, {"kind": "wecom", "baseUrl": server.url, "key": {"secret": "K"}}, {"K": "693a-91f6"})
        assert result.ok, result
        assert req.path == "/cgi-bin/webhook/send?key=693a-91f6"
        assert req.json() == {"msgtype": "text", "text": {"content": PLAIN}}
        # A long message in Chinese is cut to the bot's 2048 bytes, not refused.
        long = message(detail="磁盘空间不足" * 400)
        (cut,) = run_sender([{"kind": "wecom", "baseUrl": server.url, "key": {"secret": "K"}}], {"K": "693a-91f6"},
                            msg=long)
        assert cut.ok, cut
        content = server.requests[-1].json()["text"]["content"]
        assert len(content.encode()) <= 2048 and content.endswith("…")
        wrong, _ = one(server, {"kind": "wecom", "baseUrl": server.url, "key": {"secret": "K"}}, {"K": "nope"})
        assert not wrong.ok and "errcode 93000" in wrong.detail and "nope" not in wrong.detail
    finally:
        server.close()


def test_wecom_app_gets_a_token_then_sends(server):
    server.replies = [(200, {"errcode": 0, "errmsg": "ok", "access_token": "ACCESS-1", "expires_in": 7200}, {}),
                      (200, {"errcode": 0, "errmsg": "ok"}, {})]
    spec = {"kind": "wecom_app", "baseUrl": server.url, "corpId": "ww123", "corpSecret": {"secret": "CS"},
            "agentId": 1000002}
    result, _ = one(server, spec, {"CS": "corp-secret-9"})
    assert result.ok, result
    token, send = server.requests
    assert (token.method, token.path) == ("GET", "/cgi-bin/gettoken?corpid=ww123&corpsecret=corp-secret-9")
    assert send.path == "/cgi-bin/message/send?access_token=ACCESS-1"
    assert send.json() == {"touser": "@all", "msgtype": "text", "agentid": 1000002, "text": {"content": PLAIN}}


def test_pushplus(server):
    server.default = {"code": 200, "msg": "请求成功", "data": "x"}
    result, req = one(server, {"kind": "pushplus", "baseUrl": server.url, "token": {"secret": "PP"}, "topic": "ops"},
                      {"PP": "be8652e98bd0"})
    assert result.ok, result
    assert req.path == "/send"
    assert req.json() == {"token": "be8652e98bd0", "title": TITLE, "content": TEXT, "template": "txt", "topic": "ops"}


@pytest.mark.parametrize("key,path", [("SCT12345TabcDEF", "/SCT12345TabcDEF.send"),
                                      ("sctp42tXYZ", "/send/sctp42tXYZ.send")])
def test_serverchan_turbo_and_sc3(server, key, path):
    server.default = {"code": 0, "message": "", "data": {}}
    result, req = one(server, {"kind": "serverchan", "baseUrl": server.url, "sendKey": {"secret": "SC"}}, {"SC": key})
    assert result.ok, result
    assert req.path == path
    assert req.json() == {"title": TITLE, "desp": TEXT}


def test_dingtalk_signature_matches_the_documented_algorithm(server):
    # The documented example: timestamp 1700000000000 and secret "secret" sign as below.
    assert dingtalk_sign("secret", 1_700_000_000_000) == (
        "1700000000000", "OuzzJR5%2BxZ4%2FEYwqtNt6sMYZQMTa%2FHEGvc9miJe7XzY%3D")
    server.default = {"errcode": 0, "errmsg": "ok"}
    spec = {"kind": "dingtalk", "baseUrl": server.url, "accessToken": {"secret": "DT"},
            "signSecret": {"secret": "DS"}}
    result, req = one(server, spec, {"DT": "token-1", "DS": "SECabc"})
    assert result.ok, result
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(req.path).query))
    assert urllib.parse.urlsplit(req.path).path == "/robot/send"
    assert query["access_token"] == "token-1" and query["timestamp"] == str(NOW_MS)
    expected = base64.b64encode(hmac.new(b"SECabc", f"{NOW_MS}\nSECabc".encode(), hashlib.sha256).digest()).decode()
    assert query["sign"] == expected
    assert req.json() == {"msgtype": "text", "text": {"content": PLAIN}}


def test_feishu_signature_matches_the_documented_algorithm(server):
    server.default = {"code": 0, "msg": "success", "data": {}}
    spec = {"kind": "feishu", "baseUrl": server.url, "hook": {"secret": "FH"}, "signSecret": {"secret": "FS"}}
    result, req = one(server, spec, {"FH": "b9d2-uuid", "FS": "fs-secret"})
    assert result.ok, result
    assert req.path == "/open-apis/bot/v2/hook/b9d2-uuid"
    ts = str(NOW_MS // 1000)
    key = f"{ts}\nfs-secret".encode()  # the string to sign is the key; the message is empty
    sign = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert req.json() == {"msg_type": "text", "content": {"text": PLAIN}, "timestamp": ts, "sign": sign}
    assert feishu_sign("fs-secret", NOW_MS) == (ts, sign)


def test_gotify(server):
    result, req = one(server, {"kind": "gotify", "baseUrl": server.url + "/", "token": {"secret": "GT"},
                               "priority": 8}, {"GT": "AgOtify"})
    assert result.ok, result
    assert req.path == "/message" and req.headers["X-Gotify-Key"] == "AgOtify"
    assert req.json() == {"title": TITLE, "message": TEXT, "priority": 8}


def test_http_errors_permanent_and_transient(server):
    server.replies = [(401, {"message": "unauthorized"}, {}), (503, {}, {}), (429, {}, {})]
    spec = {"kind": "gotify", "baseUrl": server.url, "token": {"secret": "GT"}}
    results = run_sender([spec, spec, spec], {"GT": "tok-xyz"}, channel="gotify")  # one channel: in order
    assert [(r.ok, r.permanent) for r in results] == [(False, True), (False, False), (False, False)]
    assert "HTTP 401" in results[0].detail and "tok-xyz" not in results[0].detail


def test_redirects_are_refused(server):
    server.replies = [(302, {}, {"Location": "http://elsewhere.invalid/x"})]
    result, _ = one(server, {"kind": "webhook", "url": server.url + "/r"})
    assert not result.ok and result.permanent and "redirect" in result.detail
    assert len(server.requests) == 1  # never followed


def test_a_missing_secret_is_a_permanent_failure_and_unreachable_is_not(server):
    result, _ = one(server, {"kind": "pushplus", "baseUrl": server.url, "token": {"secret": "NOPE"}})
    assert not result.ok and result.permanent and "NOPE" in result.detail
    port = server.httpd.server_port
    server.close()
    result, _ = one(server, {"kind": "webhook", "url": f"http://127.0.0.1:{port}/"})
    assert not result.ok and not result.permanent


def test_https_is_verified():
    work = tmpdir()
    try:
        pair = self_signed(work)
        if pair is None:
            pytest.skip("no openssl command to make a certificate")
        server = Loopback(default={"ok": True}, tls=pair)
        try:
            spec = {"kind": "webhook", "url": server.url + "/tls", "caFile": pair[0]}
            ok, = run_sender([spec])
            assert ok.ok, ok
            untrusted, = run_sender([{"kind": "webhook", "url": server.url + "/tls"}])
            assert not untrusted.ok and untrusted.permanent and "TLS" in untrusted.detail
            assert [r.path for r in server.requests] == ["/tls"]
        finally:
            server.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_plain_proxy_is_given_the_absolute_url(server):
    """Telegram behind an HTTP proxy: the proxy gets the whole URL of the API (and the
    environment's proxy variables are never read: the sender's environment is empty)."""
    server.default = {"ok": True}
    spec = {"kind": "telegram", "token": {"secret": "TG"}, "chatId": "42", "baseUrl": "http://api.telegram.invalid",
            "proxy": server.url}
    result, request = one(server, spec, {"TG": "123:abc"})
    assert result.ok, result
    assert (request.method, request.path) == ("POST", "http://api.telegram.invalid:80/bot123:abc/sendMessage")
    assert request.json()["chat_id"] == "42"


def test_https_through_a_proxy_is_tunnelled_and_verified():
    work = tmpdir()
    try:
        pair = self_signed(work)
        if pair is None:
            pytest.skip("no openssl command to make a certificate")
        server = Loopback(default={"ok": True}, tls=pair)
        proxy = TunnelProxy()
        try:
            spec = {"kind": "telegram", "token": {"secret": "TG"}, "chatId": "42", "baseUrl": server.url,
                    "proxy": proxy.url, "caFile": pair[0]}
            result, = run_sender([spec], {"TG": "123:abc"})
            assert result.ok, result
            port = server.url.rsplit(":", 1)[1]
            assert [line.rsplit(" ", 1)[0] for line in proxy.lines] == [f"CONNECT 127.0.0.1:{port}"]
            assert [r.path for r in server.requests] == ["/bot123:abc/sendMessage"]  # only inside the tunnel
            untrusted, = run_sender([{**spec, "caFile": None}], {"TG": "123:abc"})
            assert not untrusted.ok and untrusted.permanent and "TLS" in untrusted.detail
        finally:
            proxy.close()
            server.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")  # implicit TLS: it is TLS
def test_smtp_mail_over_tls_and_starttls_with_a_login():
    """The mail channel's default (implicit TLS, 465-style) and STARTTLS, each with a login,
    against a real SMTP server (aiosmtpd) that verifies the password."""
    import socket
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    work = tmpdir()
    try:
        pair = self_signed(work)
        if pair is None:
            pytest.skip("no openssl command to make a certificate")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*pair)
        mail: list = []
        logins: list[tuple[str, str]] = []

        class Inbox:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
                mail.append(envelope)
                return "250 OK"

        def check(server, session, envelope, mechanism, auth_data):
            logins.append((auth_data.login.decode(), auth_data.password.decode()))
            return AuthResult(success=auth_data.password == b"app-password", handled=False)

        def free_port() -> int:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                return probe.getsockname()[1]

        implicit_port, starttls_port = free_port(), free_port()
        # Implicit TLS is TLS from the first byte: aiosmtpd is told AUTH needs no STARTTLS there.
        implicit = Controller(Inbox(), hostname="127.0.0.1", port=implicit_port, ssl_context=context,
                              authenticator=check, auth_required=True, auth_require_tls=False)
        starttls = Controller(Inbox(), hostname="127.0.0.1", port=starttls_port, tls_context=context,
                              require_starttls=True, authenticator=check, auth_required=True)
        implicit.start()
        starttls.start()
        try:
            base = {"kind": "smtp", "host": "127.0.0.1", "sender": "me@example.org", "to": ["me@example.org"],
                    "username": "me@example.org", "password": {"secret": "MAIL"}, "caFile": pair[0]}
            results = run_sender([{**base, "port": implicit_port},
                                  {**base, "port": starttls_port, "security": "starttls"}], {"MAIL": "app-password"})
            assert [r.ok for r in results] == [True, True], results
            assert len(mail) == 2 and logins == [("me@example.org", "app-password")] * 2
            wrong, = run_sender([{**base, "port": implicit_port}], {"MAIL": "not-it"})
            assert not wrong.ok and wrong.permanent and "refused the login" in wrong.detail
            assert "not-it" not in wrong.detail
        finally:
            implicit.stop()
            starttls.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_smtp_mail_through_a_real_server():
    from aiosmtpd.controller import Controller

    class Inbox:
        def __init__(self) -> None:
            self.mail: list = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
            self.mail.append(envelope)
            return "250 OK"

    import socket

    with socket.socket() as probe:  # a free port: the controller checks it by connecting
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        spec = {"kind": "smtp", "host": "127.0.0.1", "port": port, "security": "none", "sender": "qledge@router.lan",
                "to": ["me@example.org", "ops@example.org"]}
        result, = run_sender([spec])
        assert result.ok, result
        envelope, = inbox.mail
        assert envelope.mail_from == "qledge@router.lan"
        assert envelope.rcpt_tos == ["me@example.org", "ops@example.org"]
        import email

        mail = email.message_from_bytes(envelope.original_content)
        assert mail["Subject"] == TITLE and mail["To"] == "me@example.org, ops@example.org"
        assert mail.get_payload(decode=True).decode().replace("\r\n", "\n").strip() == TEXT
    finally:
        controller.stop()


@pytest.mark.parametrize("status, code, detail, line, language", [
    ("timed_out", -15, "timed out after 3s", "Status: timed out after 3 s, stopped with SIGTERM", "en"),
    ("timed_out", -9, "timed out after 2.5s", "Status: timed out after 2.5 s, stopped with SIGKILL", "en"),
    ("timed_out", 0, "timed out after 3s", "Status: timed out after 3 s, it exited with code 0 when stopped", "en"),
    ("failed", -9, "killed by SIGKILL", "Status: failed: killed by SIGKILL", "en"),
    ("failed", -11, "killed by SIGSEGV", "Status: failed: killed by SIGSEGV", "en"),
    ("failed", 3, "exited with code 3", "Status: failed (exit 3)", "en"),
    ("timed_out", -15, "timed out after 3s", "状态: 超时（3 秒），已用 SIGTERM 终止", "zh"),
    ("failed", -9, "killed by SIGKILL", "状态: 失败：被 SIGKILL 终止", "zh"),
])
def test_the_status_says_what_happened_in_words(status, code, detail, line, language):
    from edge.notify.channels import Facts, render

    facts = Facts(channel="c", event="failure", device="router", task="backup", status=status, exit_code=code,
                  detail=detail, duration_ms=3050)
    rendered = render(facts, language)
    assert line in rendered.text.splitlines(), rendered.text
    assert "exit -" not in rendered.text and rendered.fields["outcome"] == line.split(": ", 1)[1]
    if code < 0:  # the runner's own words say the same: not twice
        assert detail not in rendered.text.replace(line, "")


@pytest.mark.parametrize("language, title, lines", [
    ("en", "[qledge] backup still failing", ["Still failing: 12 times since 2023-11-14 22:13:20 UTC",
                                             "Next reminder in 40 min if it still fails"]),
    ("zh", "[qledge] backup 仍在失败", ["仍在失败：自 2023-11-14 22:13:20 UTC 起共 12 次",
                                       "若仍失败，40 分钟后再次提醒"]),
])
def test_a_reminder_says_how_long_and_how_often(language, title, lines):
    from edge.notify.channels import Facts, render

    facts = Facts(channel="c", event="failure", device="router", task="backup", status="failed", exit_code=1,
                  failures=12, failing_since_ms=1_700_000_000_000, next_reminder_ms=2_400_000)
    rendered = render(facts, language)
    assert rendered.title == title
    assert all(line in rendered.text.splitlines() for line in lines), rendered.text
    recovered = render(Facts(channel="c", event="recovery", device="router", task="backup", status="succeeded",
                             exit_code=0, failures=12, failing_since_ms=1_700_000_000_000), "en")
    assert "Recovered after 12 failures since 2023-11-14 22:13:20 UTC" in recovered.text.splitlines()
