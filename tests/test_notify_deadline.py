"""One bad channel cannot starve the others: a webhook that trickles its answer a byte at a
time (so no single read ever waits long) is cut at the attempt's deadline, the channel's
later messages are not tried (and not charged), and a healthy channel in the same batch
is delivered while the bad one is still trickling. The real sender child against real
loopback servers, and a real daemon."""

from __future__ import annotations

import time

import pytest

from notify_support import Drip, TelegramApi, run_sender

TOKEN = "123456:ABC-def"


@pytest.fixture
def drip():
    d = Drip(interval=0.4)
    yield d
    d.close()


@pytest.fixture
def telegram():
    t = TelegramApi(TOKEN)
    yield t
    t.close()


def test_a_trickling_answer_is_cut_at_the_deadline(drip, telegram):
    hook = {"kind": "webhook", "url": drip.url + "/hook"}
    phone = {"kind": "telegram", "baseUrl": telegram.url, "token": {"secret": "TG"}, "chatId": "42"}
    began = time.monotonic()
    cut, healthy = run_sender([hook, phone], {"TG": TOKEN}, timeout_s=2)
    assert not cut.ok and cut.timed_out and cut.tried and not cut.permanent
    port = drip.url.rsplit(":", 1)[1]
    assert cut.detail == f"timed out after 2 s waiting for 127.0.0.1:{port}'s answer", cut.detail
    assert cut.elapsed_ms >= 1900  # the whole deadline, though every read got a byte within 0.4 s
    assert healthy.ok, healthy
    # The other channel went at once, not after the one that hangs.
    assert telegram.received_at and telegram.received_at[0] - began < cut.elapsed_ms / 1000
    assert len(drip.connected) == 1


def test_a_channel_that_timed_out_has_its_later_messages_not_tried(drip):
    hook = {"kind": "webhook", "url": drip.url + "/hook"}
    first, second, third = run_sender([hook, hook, hook], timeout_s=1, channel="hook")
    assert first.timed_out and first.tried
    for later in (second, third):
        assert (later.ok, later.tried, later.timed_out) == (False, False, False), later
        assert later.detail == "not tried: the channel timed out on the message before it"
    assert len(drip.connected) == 1  # one connection: the later messages never reached it


def _wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_one_hanging_channel_does_not_hold_up_another_on_a_real_daemon(daemon_factory, drip, telegram):
    d = daemon_factory(config="[notify]\ntimeout_s = 3\n").start()
    try:
        d.call("qledge.secret.set", {"name": "TG", "value": TOKEN})
        # "a-hook" sorts first: it is the first message of the batch.
        d.call("qledge.notify.channel.set", {"name": "a-hook", "spec": {"kind": "webhook", "url": drip.url + "/x"}})
        d.call("qledge.notify.channel.set", {"name": "b-phone", "spec": {
            "kind": "telegram", "baseUrl": telegram.url, "token": {"secret": "TG"}, "chatId": "42"}})
        d.call("qledge.task.create", {"taskId": "backup", "spec": {
            "command": {"kind": "shell", "command": "echo 'disk full'; exit 3"},
            "notify": [{"channels": ["a-hook", "b-phone"]}]}})
        assert d.cli("run", "start", "backup", "--wait").returncode == 1
        assert _wait(lambda: telegram.sent)
        assert drip.connected and not drip.cut, "the healthy channel waited for the hanging one"
        body = telegram.requests[0].json()
        assert "[qledge] backup failed" in body["text"] and "Status: failed (exit 3)" in body["text"]

        def recorded():
            records = {r["channel"]: r for r in d.call("qledge.notify.log")["records"]}
            return records if records.get("a-hook", {}).get("attempts") else None

        records = _wait(recorded)
        assert records is not None
        hook, phone = records["a-hook"], records["b-phone"]
        assert (phone["state"], phone["attempts"]) == ("sent", 1)
        assert (hook["state"], hook["attempts"]) == ("pending", 1)  # tried once, charged once, retried later
        port = drip.url.rsplit(":", 1)[1]
        assert hook["lastError"] == f"timed out after 3 s waiting for 127.0.0.1:{port}'s answer"
        status = d.call("qledge.status")["extra"]["notify"]
        assert status.startswith("1 channel failing: a-hook (1 failed attempts in a row since")
    finally:
        d.stop()


def test_a_mail_server_that_trickles_its_greeting_is_cut_too(drip):
    port = int(drip.url.rsplit(":", 1)[1])
    mail = {"kind": "smtp", "host": "127.0.0.1", "port": port, "security": "none", "sender": "q@router.lan",
            "to": ["me@example.org"]}
    (result,) = run_sender([mail], timeout_s=2)
    assert not result.ok and result.timed_out and result.elapsed_ms >= 1900
    assert result.detail == f"timed out after 2 s talking to 127.0.0.1:{port}", result.detail
