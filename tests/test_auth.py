"""The per-call security chain: every outcome, every audit row, fail closed."""

from __future__ import annotations

import hashlib
import hmac
import json
import os

import pytest

from edge.cli.client import CallFailed
from edge.core.auth import digest_matches, token_digest
from edge.core.ids import digests_equal, hmac_sha256, random_fraction, sha256, token_hex
from support import IS_ROOT


def _audit(daemon) -> list[tuple]:
    db = daemon.db()
    rows = db.execute("SELECT principal, tool, outcome, reasons, transport FROM security_audit ORDER BY id").fetchall()
    return [(p, t, o, json.loads(r), tr) for p, t, o, r, tr in rows]


def test_owner_uid_is_allowed_and_audited(daemon):
    daemon.call("qledge.status")
    principal, tool, outcome, reasons, transport = _audit(daemon)[-1]
    assert principal.startswith("uid:") and tool == "qledge.status" and outcome == "allowed"
    assert reasons == ["tool_invocation_allowed", "tool_qledge_status"] and transport == "socket"


def test_non_owner_uid_without_token_is_unauthenticated(daemon_factory):
    d = daemon_factory(config="[auth]\nowner_uids = [4242]\n").start()
    with pytest.raises(CallFailed) as err:
        d.call("qledge.status")
    assert err.value.code == "unauthenticated"
    assert _audit(d)[-1][2:4] == ("unauthenticated", ["credential_missing", "tool_qledge_status"])


def test_valid_token_and_viewer_denied_a_write(daemon_factory):
    d = daemon_factory(config="[auth]\nowner_uids = []\n").start()
    # No owner uid: bootstrap a credential through the database's own tool path is
    # impossible, so start a second daemon config with our uid as owner to mint one.
    d.stop()
    d2 = daemon_factory(home=d.home).start()
    cid, viewer = d2.token("viewer")
    _, operator = d2.token("operator")
    d2.stop()
    d.start()
    assert d.call("qledge.status", token=viewer)["counts"]["credentials"] == 2
    with pytest.raises(CallFailed) as err:
        d.call("qledge.task.create", {"taskId": "x", "spec": {"command": {"kind": "argv", "file": "true"}}},
               token=viewer)
    assert err.value.code == "permission_denied"
    # The permission a person would grant first, the tool's policy beside it.
    assert err.value.message == ("qledge.task.create requires permission task.write"
                                 " (and tool.call:qledge.task.create, the tool's policy)")
    assert _audit(d)[-1] == (f"credential:{cid}", "qledge.task.create", "denied",
                             ["tool_policy_denied", "tool_qledge_task_create"], "socket")
    spec = {"command": {"kind": "argv", "file": "true"}}
    if IS_ROOT:  # the task runs as nobody, a task user
        assert d.call("qledge.task.create", {"taskId": "x", "spec": spec}, token=operator)["id"] == "x"
    else:  # a daemon that cannot switch users: every task is privileged
        with pytest.raises(CallFailed) as err:
            d.call("qledge.task.create", {"taskId": "x", "spec": spec}, token=operator)
        assert err.value.code == "permission_denied" and "task.privileged" in err.value.message
    with pytest.raises(CallFailed) as err:
        d.call("qledge.credential.list", token=operator)
    assert err.value.code == "permission_denied"
    assert _audit(d)[-1][3] == ["domain_permission_denied", "tool_qledge_credential_list"]
    # Every refused row says why, before the tool's own reason.
    refused = [r for _, _, outcome, r, _ in _audit(d) if outcome != "allowed"]
    assert refused
    assert all(len(r) == 2 and r[0].endswith("_denied") and r[1].startswith("tool_qledge_") for r in refused)


def test_explicit_permissions_narrow_a_role(daemon):
    _, token = daemon.token("operator", ["tool.call:qledge.status", "status.read"])
    assert daemon.call("qledge.status", token=token)["pid"] == daemon.pid
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.run.list", token=token)
    assert err.value.code == "permission_denied"


def test_revoked_token_is_refused_on_the_next_call_of_the_same_connection(daemon):
    cid, token = daemon.token("viewer")
    with daemon.client(token) as c:
        assert c.call("qledge.status")["pid"] == daemon.pid
        daemon.call("qledge.credential.revoke", {"id": cid})
        with pytest.raises(CallFailed) as err:
            c.call("qledge.status")
    assert err.value.code == "unauthenticated"
    assert _audit(daemon)[-1][2:4] == ("unauthenticated", ["credential_revoked", "tool_qledge_status"])


@pytest.mark.parametrize("token", ["qle_nope_nope", "not-a-token", "qle_"])
def test_bad_tokens_are_unauthenticated(daemon, token):
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.status", token=token)
    assert err.value.code == "unauthenticated"
    assert _audit(daemon)[-1][2] == "unauthenticated"


def test_wrong_secret_for_a_real_id_is_refused(daemon):
    cid, token = daemon.token("owner")
    forged = f"qle_{cid}_{'0' * 40}"
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.status", token=forged)
    assert err.value.code == "unauthenticated"
    assert _audit(daemon)[-1][3] == ["credential_mismatch", "tool_qledge_status"]


def test_token_secret_is_never_stored(daemon):
    _, token = daemon.token("viewer")
    secret = token.split("_", 2)[2]
    with open(f"{daemon.home}/qledge.db", "rb") as f:
        assert secret.encode() not in f.read()
    import os
    assert oct(os.stat(f"{daemon.home}/pepper").st_mode & 0o777) == "0o600"


def test_audit_failure_means_nothing_is_executed(daemon):
    db = daemon.db()
    # A real storage failure: the audit table refuses inserts.
    db.execute("CREATE TRIGGER audit_down BEFORE INSERT ON security_audit BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
    spec = {"command": {"kind": "argv", "file": "true"}}
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.task.create", {"taskId": "never", "spec": spec})
    assert err.value.code == "unavailable"
    assert db.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0
    db.execute("DROP TRIGGER audit_down")
    assert daemon.call("qledge.task.create", {"taskId": "now", "spec": spec})["id"] == "now"


def test_a_pinned_version_must_match(daemon):
    assert daemon.call("qledge.status@1.0.0")["pid"] == daemon.pid
    with pytest.raises(CallFailed) as err:
        daemon.call("qledge.status@2.0.0")
    assert (err.value.code, err.value.message) == ("invalid_argument", "qledge.status is at version 1.0.0, not 2.0.0")
    assert _audit(daemon)[-1][2:4] == ("denied", ["tool_version_mismatch", "tool_qledge_status"])


def test_tools_list_shows_only_what_the_caller_may_call(daemon):
    everything = {t["name"]: t for t in daemon.call("qledge.tools.list")["tools"]}
    assert {"qledge.task.create", "qledge.credential.create", "qinglong.task.runs.compare"} <= set(everything)
    assert everything["qinglong.run.log.excerpt"] == {
        "name": "qinglong.run.log.excerpt", "version": "1.0.0", "effect": "read", "risk": "medium",
        "permissions": ["artifact.read"], "deadlineS": 5.0, "title": everything["qinglong.run.log.excerpt"]["title"],
        "ai": True,
    }
    _, viewer = daemon.token("viewer")
    seen = {t["name"] for t in daemon.call("qledge.tools.list", token=viewer)["tools"]}
    assert "qledge.task.create" not in seen and "qinglong.run.log.excerpt" not in seen
    assert {"qledge.status", "qinglong.task.list", "qinglong.run.list"} <= seen


@pytest.mark.parametrize("key_size", [0, 1, 32, 63, 64, 65, 200])
def test_token_digests_are_hmac_sha256(key_size):
    """The daemon digests without hashlib or hmac (they map modules it does not use): the
    same bytes as theirs, whatever the key's size against SHA-256's 64-byte block."""
    key, message = os.urandom(key_size), os.urandom(41)
    assert hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()
    assert token_digest(key, "s3cret") == hmac.new(key, b"s3cret", hashlib.sha256).digest()
    assert digest_matches(token_digest(key, "s3cret"), key, "s3cret")
    assert not digest_matches(token_digest(key, "s3cret"), key, "s3creT")
    assert sha256(message).hexdigest() == hashlib.sha256(message).hexdigest()
    assert digests_equal(b"ab", b"ab") and not digests_equal(b"ab", b"ac")


def test_tokens_and_jitter_fractions_come_from_the_kernel_rng():
    tokens = {token_hex(20) for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) == 40 and int(t, 16) >= 0 for t in tokens)
    fractions = [random_fraction() for _ in range(2000)]
    assert all(0 <= f < 1 for f in fractions)
    assert 0.4 < sum(fractions) / len(fractions) < 0.6 and len(set(fractions)) == len(fractions)
