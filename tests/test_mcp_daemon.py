"""MCP against real daemon processes: the default stays lean, the raw protocol on the socket, the
bridge's credential line and failure lines, and the official SDK over `qledge mcp` with real data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mcp_support import INITIALIZE, MODERN_META, LineClient, bridge_env, proc_status, request, run_bridge
from support import DaemonProcess

MCP_ON = "[mcp]\nenabled = true\nmax_line_bytes = 4096\n"
NOT_ENABLED = "qledge: unavailable: MCP is not enabled on this daemon (set [mcp] enabled = true)\n"


@pytest.fixture
def mcp_daemon(daemon_factory) -> DaemonProcess:
    return daemon_factory(config=MCP_ON).start()


def _modules(d: DaemonProcess) -> list[str]:
    return d.call("qledge.status", {"includeModules": True})["modules"]


# -- the default stays lean ---------------------------------------------------------------


def test_default_daemon_loads_no_mcp_and_has_no_mcp_socket(daemon, mcp_daemon):
    assert not [m for m in _modules(daemon) if m == "edge.mcp" or m.startswith("edge.mcp.")]
    assert not os.path.exists(os.path.join(daemon.home, "mcp.sock"))
    assert "mcp" not in daemon.call("qledge.status").get("extra", {})
    # The same question tells the difference when MCP is on.
    assert "edge.mcp.server" in _modules(mcp_daemon)
    assert mcp_daemon.call("qledge.status")["extra"]["mcp"] == os.path.join(mcp_daemon.home, "mcp.sock")


def test_bridge_says_mcp_is_not_enabled(daemon):
    result = run_bridge(daemon.home, stdin=json.dumps(INITIALIZE).encode() + b"\n", timeout=10)
    assert result.returncode == 3
    assert result.stderr.decode() == NOT_ENABLED
    assert result.stdout == b""


def test_bridge_says_the_daemon_is_not_running(home):
    result = run_bridge(home, timeout=10)
    assert result.returncode == 3
    assert result.stderr.decode() == f"qledge: unavailable: daemon not running at {home}/qledge.sock\n"
    assert result.stdout == b""


def test_a_build_without_mcp_refuses_to_start_with_one_line(home):
    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write(MCP_ON)
    # A build without edge/mcp: the import fails exactly as it would if the package were absent.
    code = "import sys; sys.modules['edge.mcp'] = None; from edge.cli.main import main; raise SystemExit(main())"
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", "--config", config], env={**os.environ, "QLEDGE_HOME": home},
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2  # a configuration this build cannot serve
    assert result.stderr == "qledge: invalid_argument: MCP is not included in this build\n"
    assert not os.path.exists(os.path.join(home, "qledge.sock"))


def test_bridge_imports_nothing_heavy(home):
    code = (
        "import sys; from edge.cli.main import main; main(['mcp', '--home', sys.argv[1]]);"
        "print(' '.join(sorted(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code, home], capture_output=True, text=True, timeout=30)
    loaded = set(result.stdout.split())
    assert "edge.cli.mcp_bridge" in loaded
    for heavy in ("msgspec", "apsw", "asyncio", "argparse", "typing", "json", "socket", "edge.tools.chain", "edge.mcp"):
        assert heavy not in loaded, heavy


# -- the raw protocol on the MCP socket --------------------------------------------------------


def test_raw_protocol_errors_leave_the_daemon_and_other_clients_serving(mcp_daemon):
    other = LineClient(os.path.join(mcp_daemon.home, "mcp.sock"))
    assert other.ask(INITIALIZE)["result"]["serverInfo"]["name"] == "qledge"

    def other_still_works(rid: int) -> None:
        assert other.ask(request(rid, "ping")) == {"jsonrpc": "2.0", "id": rid, "result": {}}

    c = LineClient(os.path.join(mcp_daemon.home, "mcp.sock"))
    assert c.ask(b"this is not json\n")["error"]["code"] == -32700
    assert c.ask(b"\xff\xfe{\n")["error"]["code"] == -32700
    other_still_works(1)
    batch = c.ask([request(1, "ping"), request(2, "ping")])
    assert batch["id"] is None and batch["error"]["code"] == -32600 and "batch" in batch["error"]["message"]
    assert c.ask({"id": 3, "method": "ping"})["error"]["code"] == -32600  # no jsonrpc member
    assert c.ask({"jsonrpc": "2.0", "id": None, "method": "ping"})["error"]["code"] == -32600
    assert c.ask(b"42\n")["error"]["code"] == -32600
    unknown = c.ask(request(4, "resources/list"))
    assert unknown["id"] == 4 and unknown["error"]["code"] == -32601
    assert c.ask(request(5, "prompts/get", modern=True))["error"]["code"] == -32601
    assert c.ask(request(6, "ping", modern=True))["error"]["code"] == -32601  # no ping in 2026-07-28
    other_still_works(2)

    # 2026-07-28 envelope rules.
    no_meta = c.ask(request(7, "tools/list"))  # neither an envelope nor a handshake
    assert no_meta["id"] == 7 and no_meta["error"]["code"] == -32602
    assert c.ask(request(8, "server/discover"))["error"]["code"] == -32602
    half = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    missing_caps = c.ask(request(9, "tools/list", half))
    assert missing_caps["error"]["code"] == -32602
    assert "io.modelcontextprotocol/clientCapabilities" in missing_caps["error"]["message"]
    assert c.ask(request(10, "tools/list", {"_meta": "nope"}))["error"]["code"] == -32602
    future = {"_meta": {**MODERN_META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}
    unsupported = c.ask(request(11, "tools/call", {**future, "name": "x"}))
    assert unsupported["error"]["code"] == -32022
    assert unsupported["error"]["data"] == {"supported": ["2026-07-28", "2025-11-25", "2025-06-18"],
                                            "requested": "2099-01-01"}
    assert c.ask(request(12, "tools/list", {"cursor": "x"}, modern=True))["error"]["code"] == -32602
    discovered = c.ask(request(13, "server/discover", modern=True))["result"]
    assert discovered["supportedVersions"][0] == "2026-07-28" and discovered["resultType"] == "complete"
    assert discovered["ttlMs"] > 0 and discovered["cacheScope"] == "public"
    assert discovered["capabilities"] == {"tools": {"listChanged": False}}
    assert discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "qledge"
    listed = c.ask(request(14, "tools/list", modern=True))["result"]
    assert {"tools", "ttlMs", "cacheScope", "resultType", "_meta"} <= set(listed)
    other_still_works(3)

    # Notifications are never answered, known or not; responses to nothing are ignored.
    c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    c.send({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {}})
    c.send({"jsonrpc": "2.0", "id": 99, "result": {}})
    assert c.ask(request(15, "tools/list", modern=True))["id"] == 15

    # A line over the cap: -32600, then the connection closes.
    oversize = c.ask(request(16, "tools/list", {"pad": "x" * 5000}, modern=True))
    assert oversize["id"] is None and oversize["error"]["code"] == -32600
    assert c.recv() is None
    c.close()
    other_still_works(4)
    assert mcp_daemon.proc.poll() is None
    assert mcp_daemon.cli("status").returncode == 0
    other.close()


def test_initialize_answers_the_handshake_versions(mcp_daemon):
    c = LineClient(os.path.join(mcp_daemon.home, "mcp.sock"))
    for asked, answered in (("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"), ("2024-11-05", "2025-11-25"),
                            ("2026-07-28", "2025-11-25")):
        init = {**INITIALIZE, "params": {**INITIALIZE["params"], "protocolVersion": asked}}
        result = c.ask(init)["result"]
        assert result["protocolVersion"] == answered
        assert result["capabilities"] == {"tools": {"listChanged": False}}
        assert "resultType" not in result
    assert c.ask(request(1, "tools/list"))["result"] == {"tools": c.ask(request(2, "tools/list"))["result"]["tools"]}
    c.close()


# -- the credential line --------------------------------------------------------------------


def test_hello_with_a_bad_token_is_refused_and_audited(mcp_daemon):
    c = LineClient(os.path.join(mcp_daemon.home, "mcp.sock"))
    answer = c.ask({"qledge": {"token": "qle_nope_nope"}})
    assert answer["qledge"]["ok"] is False and answer["qledge"]["code"] == "unauthenticated"
    assert c.recv() is None
    c.close()
    rows = list(mcp_daemon.db().execute(
        "SELECT tool, outcome, reasons, transport FROM security_audit WHERE tool = 'mcp.session'"))
    assert rows == [("mcp.session", "unauthenticated", '["credential_unknown","mcp_session_open"]', "mcp")]


def test_bridge_presents_the_token_and_writes_only_protocol_lines(mcp_daemon):
    _, token = mcp_daemon.token("viewer")
    lines = [INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"}, request(1, "ping")]
    result = run_bridge(mcp_daemon.home, stdin=b"".join(json.dumps(m).encode() + b"\n" for m in lines), token=token)
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [m["id"] for m in out] == ["init", 1]
    assert result.stderr == b""

    refused = run_bridge(mcp_daemon.home, stdin=b"", token="qle_abc_wrong")
    assert refused.returncode == 1 and refused.stdout == b""
    assert refused.stderr.decode().startswith("qledge: unauthenticated: ")
    token_file = os.path.join(mcp_daemon.home, "token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    from_file = run_bridge(mcp_daemon.home, "--token-file", token_file, stdin=json.dumps(INITIALIZE).encode() + b"\n")
    assert from_file.returncode == 0 and json.loads(from_file.stdout)["id"] == "init"


@pytest.mark.emulated("memory (the bridge's VmHWM)")
def test_bridge_rss_while_connected(mcp_daemon):
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge", "mcp"], env=bridge_env(mcp_daemon.home),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == "init"
        status = proc_status(proc.pid)
        bare = _bare_interpreter_hwm()
        print(f"bridge connected: VmHWM {status['VmHWM']} KiB, RssAnon {status['RssAnon']} KiB;"
              f" this interpreter alone: VmHWM {bare} KiB")
        # The budget is 12 MiB on a plain install (bare interpreter 8.8 MiB); editable installs and
        # site hooks inflate the bare figure, so what is ours is bounded relative to it.
        assert status["VmHWM"] - bare <= 3 * 1024
    finally:
        proc.stdin.close()
        assert proc.wait(10) == 0


def _bare_interpreter_hwm() -> int:
    out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                         capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[1]) for line in out.splitlines() if line.startswith("VmHWM:"))


def test_bridge_exits_when_the_daemon_goes_away(mcp_daemon):
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge", "mcp"], env=bridge_env(mcp_daemon.home),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == "init"
    mcp_daemon.stop()
    assert proc.wait(10) == 1
    assert proc.stderr.read().decode() == "qledge: unavailable: the daemon closed the connection\n"
    proc.stdin.close()


# -- the official SDK against real data --------------------------------------------------------


def _real_data(d: DaemonProcess) -> dict[str, str]:
    """A task with a succeeded and a failed run, another with only a success, and two triggers."""
    work = d.scratch  # outside the home: no run starts inside it
    assert d.cli("task", "add", "flaky", "--cwd", work, "--shell", "--", "test ! -f broken").returncode == 0
    assert d.cli("task", "add", "steady", "--", "true").returncode == 0
    ok = json.loads(d.cli("run", "start", "flaky", "--wait", "--json").stdout)
    with open(os.path.join(work, "broken"), "w"):
        pass
    bad = json.loads(d.cli("run", "start", "flaky", "--wait", "--json").stdout)
    steady = json.loads(d.cli("run", "start", "steady", "--wait", "--json").stdout)
    assert (ok["status"], bad["status"], steady["status"]) == ("succeeded", "failed", "succeeded")
    conn = d.db()  # no tool creates triggers yet: they are written as the schema stores them
    for trigger_id, task_id, enabled in (("nightly", "flaky", 1), ("paused", "steady", 0)):
        conn.execute(
            "INSERT INTO triggers (project_id, id, revision, task_id, task_revision, enabled, created_at_ms,"
            " updated_at_ms) VALUES ('default', ?, 1, ?, 1, ?, 1000, 1000)", (trigger_id, task_id, enabled))
        conn.execute(
            "INSERT INTO trigger_revisions (project_id, trigger_id, revision, task_id, task_revision, enabled,"
            " spec_schema, spec, content_digest, created_at_ms) VALUES ('default', ?, 1, ?, 1, ?,"
            " 'qinglong/cron@v1', '{\"expression\":\"17 3 * * *\",\"timezone\":\"UTC\"}', 'sha256:00', 1000)",
            (trigger_id, task_id, enabled))
    conn.close()
    return {"succeeded": ok["id"], "failed": bad["id"], "steady": steady["id"]}


def _params(d: DaemonProcess, token: str | None = None):
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=["-m", "edge", "mcp"], env=bridge_env(d.home, token))


async def test_sdk_client_session_over_stdio(mcp_daemon):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    runs = _real_data(mcp_daemon)
    async with stdio_client(_params(mcp_daemon)) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.protocol_version == "2025-11-25" and init.server_info.name == "qledge"
        await session.send_ping()
        listed = await session.list_tools()
        names = [t.name for t in listed.tools]
        assert names == sorted(names) and {"qinglong.task.runs.compare", "qinglong.trigger.list"} <= set(names)
        assert all(t.name.startswith("qinglong.") for t in listed.tools)
        for tool in listed.tools:
            assert tool.input_schema["type"] == "object" and tool.input_schema["additionalProperties"] is False
            assert tool.annotations.read_only_hint and tool.annotations.idempotent_hint
            assert tool.annotations.destructive_hint is False and tool.annotations.open_world_hint is False

        compared = await session.call_tool("qinglong.task.runs.compare", {"taskId": "flaky"})
        assert not compared.is_error
        got = compared.structured_content
        assert got["selection"] == {"windowLimit": 64, "searchedRunCount": 2, "hasOlderRuns": False,
                                    "complete": True, "order": got["selection"]["order"]}
        assert got["baseline"]["id"] == runs["succeeded"] and got["candidate"]["id"] == runs["failed"]
        assert got["consistency"] == "bounded_task_window_then_ordered_point_reads"
        assert json.loads(compared.content[0].text) == got
        assert got == mcp_daemon.call("qinglong.task.runs.compare", {"taskId": "flaky"})

        triggers = await session.call_tool("qinglong.trigger.list", {})
        assert not triggers.is_error
        page = triggers.structured_content
        assert [(t["triggerId"], t["enabled"]) for t in page["triggers"]] == [("nightly", True), ("paused", False)]
        assert page["hasMore"] is False
        assert "17 3" not in triggers.content[0].text and "UTC" not in triggers.content[0].text
        assert page == mcp_daemon.call("qinglong.trigger.list", {})
    reasons = [json.loads(r) for (r,) in mcp_daemon.db().execute(
        "SELECT reasons FROM security_audit WHERE transport = 'mcp' ORDER BY id")]
    assert ["tool_invocation_allowed", "tool_qinglong_task_runs_compare"] in reasons


async def test_sdk_client_auto_mode_is_quick(mcp_daemon):
    from mcp.client import Client

    _real_data(mcp_daemon)
    began = time.monotonic()
    async with Client(_params(mcp_daemon)) as client:
        assert client.session.discover_result is not None  # it probed server/discover and stayed modern
        compared = await client.call_tool("qinglong.task.runs.compare", {"taskId": "flaky"})
        assert compared.structured_content["selection"]["complete"] is True
    elapsed = time.monotonic() - began
    assert elapsed < 5, elapsed


async def test_sdk_revoked_token_fails_the_next_call(mcp_daemon):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    _real_data(mcp_daemon)
    cred_id, token = mcp_daemon.token("viewer")
    async with stdio_client(_params(mcp_daemon, token)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        first = await session.call_tool("qinglong.trigger.list", {})
        assert not first.is_error
        mcp_daemon.call("qledge.credential.revoke", {"id": cred_id})
        second = await session.call_tool("qinglong.trigger.list", {})
        assert second.is_error and second.content[0].text.startswith("unauthenticated: ")


async def test_sdk_viewer_cannot_read_log_excerpts(mcp_daemon):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError

    runs = _real_data(mcp_daemon)
    _, token = mcp_daemon.token("viewer")
    async with stdio_client(_params(mcp_daemon, token)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        denied = await session.call_tool("qinglong.run.log.excerpt", {"runId": runs["failed"]})
        assert denied.is_error
        assert denied.content[0].text == "permission_denied: qinglong.run.log.excerpt requires permission artifact.read"
    # The AI guide's assistant credential may read it.
    created = mcp_daemon.call("qledge.credential.create", {"role": "operator", "permissions": [
        "tool.call:*", "task.read", "trigger.read", "run.read", "artifact.read"]})
    async with stdio_client(_params(mcp_daemon, created["token"])) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        excerpt = await session.call_tool("qinglong.run.log.excerpt", {"runId": runs["failed"]})
        assert not excerpt.is_error and excerpt.structured_content["trust"]["actionAuthority"] == "none"
        with pytest.raises(MCPError) as refused:  # a write tool is an unknown tool over MCP
            await session.call_tool("qledge.task.create", {"taskId": "x"})
        assert refused.value.code == -32602
