"""Malformed input gets a stable code; the daemon keeps serving everyone else."""

from __future__ import annotations

import time

import pytest

from support import RawConnection


def _still_serving(daemon) -> None:
    assert daemon.call("qledge.status")["pid"] == daemon.pid


def test_oversize_frame_is_refused_then_closed(daemon):
    other = RawConnection(daemon.socket)
    raw = RawConnection(daemon.socket)
    raw.send_raw((10 * 1024 * 1024).to_bytes(4, "big") + b"x" * 1024)
    reply = raw.recv()
    assert reply["ok"] is False and reply["error"]["code"] == "resource_exhausted"
    assert "262144" in reply["error"]["message"]
    assert raw.closed_by_peer()
    other.send({"id": 1, "tool": "qledge.status"})
    assert other.recv()["ok"] is True
    _still_serving(daemon)


def test_garbage_bytes_are_refused_then_closed(daemon):
    raw = RawConnection(daemon.socket)
    raw.send_raw((5).to_bytes(4, "big") + b"\xc1\xc1\xc1\xc1\xc1")
    reply = raw.recv()
    error = {"code": "invalid_argument", "message": "frame is not a msgpack request"}
    assert reply == {"id": None, "ok": False, "error": error}
    assert raw.closed_by_peer()
    _still_serving(daemon)


def test_truncated_frame_then_hangup_does_not_hurt(daemon):
    raw = RawConnection(daemon.socket)
    raw.send_raw((100).to_bytes(4, "big") + b"\x80")
    raw.close()
    _still_serving(daemon)


@pytest.mark.parametrize(
    "request_, code, fragment",
    [
        ({"id": 7, "tool": "qledge.nope"}, "invalid_argument", "unknown tool"),
        ({"id": 7, "tool": "qledge.run.get", "args": {"runId": "x", "extra": 1}}, "invalid_argument",
         "unknown field `extra`"),
        ({"id": 7, "tool": "qledge.run.get", "args": {"runId": 5}}, "invalid_argument", "Expected `str`"),
        ({"id": 7, "tool": "qledge.run.list", "args": {"limit": 65}}, "invalid_argument", "<= 64"),
        ({"id": 7, "tool": "qledge.run.get", "args": {"runId": "a\x00b"}}, "invalid_argument", "$.runId"),
        ({"id": 7, "tool": "qledge.status", "bogus": True}, "invalid_argument", "invalid request"),
        ({"id": 7, "tool": "qledge.status", "args": [1, 2]}, "invalid_argument", "Expected `object`"),
    ],
)
def test_bad_requests_get_codes_and_the_connection_stays_open(daemon, request_, code, fragment):
    raw = RawConnection(daemon.socket)
    raw.send(request_)
    reply = raw.recv()
    assert reply["id"] == 7 and reply["ok"] is False
    assert reply["error"]["code"] == code and fragment in reply["error"]["message"], reply
    raw.send({"id": 8, "tool": "qledge.status"})
    assert raw.recv()["id"] == 8


def test_request_that_is_not_a_map(daemon):
    raw = RawConnection(daemon.socket)
    raw.send_raw(b"\x00\x00\x00\x01\x01")  # msgpack integer 1
    reply = raw.recv()
    assert reply["id"] is None and reply["error"]["code"] == "invalid_argument"
    raw.send({"id": 2, "tool": "qledge.status"})
    assert raw.recv()["ok"] is True


def test_many_requests_in_flight_on_one_connection(daemon):
    daemon.cli("task", "add", "slow", "--", "sleep", "60")
    run = daemon.call("qledge.run.start", {"taskId": "slow"})
    raw = RawConnection(daemon.socket)
    # A long wait first, then quick calls: answers arrive out of order, matched by id.
    raw.send({"id": "wait", "tool": "qledge.run.wait", "args": {"runId": run["id"], "timeoutMs": 3000}})
    for i in range(5):
        raw.send({"id": i, "tool": "qledge.status"})
    ids = [raw.recv()["id"] for _ in range(6)]
    assert sorted(ids[:5]) == [0, 1, 2, 3, 4]
    assert ids[-1] == "wait"
    daemon.call("qledge.run.cancel", {"runId": run["id"]})


def _until_audited(daemon, request_id: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        with daemon.db() as db:
            if db.execute("SELECT 1 FROM security_audit WHERE request_id = ?", (request_id,)).fetchone():
                return
        assert time.monotonic() < deadline, f"call {request_id} was never audited"
        time.sleep(0.02)


def test_calls_asked_while_one_is_in_flight_alone_run_beside_it(daemon):
    """A call alone on its connection is answered in the connection's own task; what is
    asked while it runs is still read and answered at once, round after round."""
    daemon.cli("task", "add", "slow", "--", "sleep", "60")
    raw = RawConnection(daemon.socket)
    for round_ in range(2):
        run = daemon.call("qledge.run.start", {"taskId": "slow"})
        wait = f"wait{round_}"
        raw.send({"id": wait, "tool": "qledge.run.wait", "args": {"runId": run["id"], "timeoutMs": 30000}})
        _until_audited(daemon, wait)  # in flight, and nothing else was asked
        for i in range(3):
            raw.send({"id": i, "tool": "qledge.status"})
            assert raw.recv()["id"] == i  # answered while the wait goes on
        daemon.call("qledge.run.cancel", {"runId": run["id"]})
        assert raw.recv()["id"] == wait
    raw.send({"id": "last", "tool": "qledge.status"})
    assert raw.recv()["id"] == "last"


def test_results_are_msgpack_maps_with_camel_case_fields(daemon):
    raw = RawConnection(daemon.socket)
    raw.send({"id": 1, "tool": "qledge.status", "args": {}})
    reply = raw.recv()
    assert set(reply) == {"id", "ok", "result"}
    assert "moduleCount" in reply["result"] and "module_count" not in reply["result"]
