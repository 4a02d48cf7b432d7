"""The panel's parts on their own: its msgpack against msgspec's, sessions and the login limit
on an injected clock, its HTTP reading under deadlines, live-log framing, the assets'
strings and budget."""

from __future__ import annotations

import ast
import os
import re
import socket
import threading
import zlib

import msgspec
import pytest

from edge.transports import tool_protocol as frames
from edge.web import http, panel, wire
from edge.web.sessions import LoginLimit, Sessions

STATIC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge", "web", "static")

VALUES = [None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63 - 1, 2**64 - 1, -1, -32, -33, -128,
          -129, -(2**31), -(2**63), 1.5, -0.0, "", "a" * 31, "b" * 32, "中文" * 100, "x" * 70000, b"", b"\x00" * 300,
          [], list(range(20)), {}, {f"k{i}": i for i in range(20)}, {"nested": [{"a": [1, {"b": None}]}]}]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:20])
def test_msgpack_agrees_with_msgspec_both_ways(value):
    assert msgspec.msgpack.decode(wire.encode(value)) == value
    assert wire.decode(msgspec.msgpack.encode(value)) == value


def test_a_request_is_what_the_daemon_decodes():
    body = wire.encode({"id": 7, "tool": "qledge.status", "args": wire.Raw(wire.encode({"includeModules": True})),
                        "token": "qle_a_b", "transport": "web"})
    request = frames.request_decoder.decode(body)
    assert (request.id, request.tool, request.token, request.transport) == (7, "qledge.status", "qle_a_b", "web")
    assert msgspec.msgpack.decode(bytes(request.args)) == {"includeModules": True}


def test_malformed_msgpack_is_one_clear_error():
    for bad in (b"\xc1", b"\x92\x01", b"\xd9\x05ab", b"\x91" * 100 + b"\x00", b"\x01\x02"):
        with pytest.raises(wire.WireError):
            wire.decode(bad)


def test_no_call_is_made_without_a_token():
    client = wire.ToolClient("/nonexistent.sock")
    with pytest.raises(wire.CallFailed) as failed:
        client.call("qledge.status", {}, "")
    assert failed.value.code == "unauthenticated"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_end_when_idle_at_their_absolute_limit_and_at_logout():
    clock = Clock()
    sessions = Sessions(clock=clock, idle_s=1800, max_s=12 * 3600)
    s = sessions.create("qle_a_b", frozenset(), "viewer")
    assert "qle_a_b" not in repr(s) and s.id not in repr(s)
    clock.now += 1799
    assert sessions.get(s.id) is s  # use restarts the idle time
    clock.now += 1799
    assert sessions.get(s.id) is s
    clock.now += 1800
    assert sessions.get(s.id) is None  # idle for 30 minutes
    s = sessions.create("qle_a_b", frozenset(), "viewer")
    for _ in range(30):
        clock.now += 1799.9
        if clock.now - s.created >= 12 * 3600:
            break
        assert sessions.get(s.id) is s
    assert sessions.get(s.id) is None  # 12 hours, however busy
    s = sessions.create("qle_a_b", frozenset(), "viewer")
    sessions.end(s)
    assert sessions.get(s.id) is None and len(sessions) == 0


def test_the_session_table_is_bounded():
    sessions = Sessions(clock=Clock(), limit=3)
    made = [sessions.create(f"qle_{i}_x", frozenset(), "viewer") for i in range(3)]
    sessions.get(made[0].id)  # the first is the most recently used now
    sessions.create("qle_9_x", frozenset(), "viewer")
    assert len(sessions) == 3 and sessions.get(made[1].id) is None and sessions.get(made[0].id) is made[0]


def test_login_limit_per_address_and_its_window():
    clock = Clock()
    limit = LoginLimit(clock=clock, failures=5, window_s=300, addresses=2)
    for _ in range(5):
        assert limit.wait_s("a") == 0
        limit.failed("a")
    assert limit.wait_s("a") == pytest.approx(300)
    assert limit.wait_s("b") == 0  # another address is not affected
    clock.now += 299
    assert limit.wait_s("a") == pytest.approx(1)
    clock.now += 1
    assert limit.wait_s("a") == 0
    limit.failed("b")
    limit.failed("c")
    limit.failed("d")
    assert len(limit._seen) <= 2  # the table forgets the oldest addresses


def test_utf8_prefix_never_splits_a_character():
    text = "日志 line é 🙂".encode()
    for cut in range(len(text) + 1):
        n = panel.utf8_prefix(text[:cut])
        text[:n].decode()  # whole characters
        assert cut - n < 4


def _reader_pair() -> tuple[socket.socket, http.Reader]:
    a, b = socket.socketpair()
    return a, http.Reader(b, "test")


def test_a_request_head_must_arrive_before_its_deadline(monkeypatch):
    monkeypatch.setattr(http, "HEAD_TIMEOUT_S", 0.3)
    peer, reader = _reader_pair()
    peer.sendall(b"GET / HTTP/1.1\r\n")  # begun, then silence
    with pytest.raises(http.BadRequest) as bad:
        reader.next(first=True)
    assert bad.value.status == 408
    peer.close()


def test_a_trickled_body_is_cut_off_at_its_deadline(monkeypatch):
    monkeypatch.setattr(http, "BODY_TIMEOUT_S", 0.3)
    peer, reader = _reader_pair()
    stop = threading.Event()

    def trickle() -> None:
        peer.sendall(b"POST /api/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        while not stop.wait(0.05):
            try:
                peer.sendall(b"x")
            except OSError:
                return

    t = threading.Thread(target=trickle)
    t.start()
    try:
        with pytest.raises(http.BadRequest) as bad:
            reader.next(first=True)
        assert bad.value.status == 408
    finally:
        stop.set()
        t.join()
        peer.close()


def test_keep_alive_requests_and_bodies_are_read_exactly():
    peer, reader = _reader_pair()
    peer.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                 b"GET /b?run=r%201 HTTP/1.1\r\nHost: x\r\n\r\n")
    first = reader.next(first=True)
    assert (first.method, first.path, first.body, first.keep_alive) == ("POST", "/a", b"{}", True)
    second = reader.next(first=False)
    assert (second.path, second.param("run")) == ("/b", "r 1")
    peer.close()
    assert reader.next(first=False) is None


# -- the front end's files ----------------------------------------------------------------


def _sources() -> dict[str, str]:
    """Each script without its comments."""
    found = {}
    for name in os.listdir(STATIC):
        if name.endswith(".js"):
            with open(os.path.join(STATIC, name), encoding="utf-8") as f:
                found[name] = re.sub(r"^\s*//.*$", "", f.read(), flags=re.M)
    return found


def test_the_asset_list_is_the_static_folder():
    assert sorted(panel.ASSETS) == sorted(os.listdir(STATIC))


def test_assets_fit_the_budget():
    raw = gz = 0
    for name in panel.ASSETS:
        with open(os.path.join(STATIC, name), "rb") as f:
            data = f.read()
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        raw += len(data)
        gz += len(packer.compress(data) + packer.flush())
    assert gz <= 64 * 1024, (raw, gz)


def test_no_script_writes_html_or_reaches_another_origin():
    for name, source in _sources().items():
        for bad in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                    "localStorage", "sessionStorage", "http://", "https://"):
            if bad in ("http://", "https://"):
                # Only the SVG namespace and the channel templates' example addresses.
                found = [u for u in re.findall(r"https?://[^\s\"'`]+", source)
                         if u != "http://www.w3.org/2000/svg" and ".example" not in u]
                assert found == [], (name, found)
            else:
                assert bad not in source, (name, bad)
    with open(os.path.join(STATIC, "index.html"), encoding="utf-8") as f:
        html = f.read()
    assert not re.search(r"\son\w+=", html)  # no inline handlers
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="/static/app.js">']


def _strings() -> dict[str, set[str]]:
    with open(os.path.join(STATIC, "strings.js"), encoding="utf-8") as f:
        source = f.read()
    body = source.split("=", 1)[1].strip().rstrip(";").replace("\n  en: {", '\n  "en": {')
    tree = ast.parse(body, mode="eval")  # the object literal, its keys quoted, reads as a Python dict
    data = ast.literal_eval(tree)
    return {lang: set(table) for lang, table in data.items()}


def test_both_languages_have_every_key_the_code_uses():
    strings = _strings()
    assert set(strings) == {"en", "zh-CN"}
    assert strings["en"] == strings["zh-CN"]
    used: set[str] = set()
    patterns: list[str] = []
    for name, source in _sources().items():
        if name == "strings.js":
            continue
        used |= set(re.findall(r"\bt\(\s*\"([^\"]+)\"", source))
        used |= set(re.findall(r"key: \"([a-z.]+)\"", source))
        used |= {v for v in re.findall(r"\"(sig\.[a-z]+)\"", source)}
        patterns += re.findall(r"\bt\(`([^`]+)`", source)
    assert used - strings["en"] == set()
    for pattern in patterns:  # t(`status.${s}`): some key must have that shape
        regex = re.escape(re.sub(r"\$\{[^}]+\}", "\0", pattern)).replace("\\\0", "\0").replace("\0", "[a-z_]+")
        assert any(re.fullmatch(regex, key) for key in strings["en"]), pattern
