"""The MCP server in this test's own process: real SQLite stores, the real per-call chain, a real
Unix socket, and a few tools defined here (one slow enough to cancel, one write tool that must
stay invisible). The official SDK reaches it through the real `qledge mcp` bridge process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from typing import Annotated

import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import (
    DaemonFacts,
    build_chain,
    build_services,
    build_stores,
    build_workers,
    builtin_tools,
    deferred_tools,
)
from edge.core.clock import SystemClock
from edge.core.ports.stores import AuditLog
from edge.mcp.protocol import Catalog, object_schema
from edge.mcp.server import McpServer
from edge.runner.supervisor import Runner
from edge.storage.sqlite.db import Database
from edge.tools.context import Caller, ToolContext
from edge.tools.definition import Registry, Tool
from mcp_support import INITIALIZE, AsyncLineClient, bridge_env, request
from support import short_tmpdir


class Cursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    item_id: Annotated[str, msgspec.Meta(min_length=1, max_length=16)]


class EchoArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    text: Annotated[str, msgspec.Meta(max_length=64)]
    after: Cursor | None = None


class EchoResult(msgspec.Struct, rename="camel", omit_defaults=True):
    text: str
    length: int
    cursors: list[Cursor] = []


class SlowArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


class SlowResult(msgspec.Struct):
    done: bool


class Observed:
    """What the tools saw, for assertions about work that must (not) happen."""

    def __init__(self) -> None:
        self.slow_started = asyncio.Event()
        self.slow_cancelled = False
        self.slow_finished = False
        self.write_ran = False


async def _echo(ctx: ToolContext, args: EchoArgs) -> EchoResult:
    return EchoResult(text=args.text, length=len(args.text), cursors=[args.after] if args.after else [])


def _tools(seen: Observed) -> list[Tool]:
    async def slow(ctx: ToolContext, args: SlowArgs) -> SlowResult:
        seen.slow_started.set()
        try:
            await asyncio.sleep(4)
        except asyncio.CancelledError:
            seen.slow_cancelled = True
            raise
        seen.slow_finished = True
        return SlowResult(done=True)

    async def write(ctx: ToolContext, args: SlowArgs) -> SlowResult:
        seen.write_ran = True
        return SlowResult(done=True)

    common = {"version": "1.0.0", "risk": "low", "permissions": ("run.read",)}
    return [
        Tool(name="test.slow", effect="read", args_type=SlowArgs, result_type=SlowResult, handler=slow,
             title="Slow", ai=True, **common),
        Tool(name="test.echo", effect="read", args_type=EchoArgs, result_type=EchoResult, handler=_echo,
             title="Echo", description="Echo the text back.", ai=True, **common),
        Tool(name="test.write", effect="write", args_type=SlowArgs, result_type=SlowResult, handler=write,
             ai=True, **common),
        Tool(name="test.hidden", effect="read", args_type=EchoArgs, result_type=EchoResult, handler=_echo, **common),
    ]


class Graph:
    def __init__(self, home: str, server: McpServer, db: Database, runner: Runner, seen: Observed,
                 audit: AuditLog) -> None:
        self.audit = audit
        self.home = home
        self.server = server
        self.db = db
        self.runner = runner
        self.seen = seen

    @property
    def path(self) -> str:
        return self.server.path


@pytest.fixture
async def graph():
    home = short_tmpdir()
    seen = Observed()
    db = await Database.open(os.path.join(home, "qledge.db"))
    config, clock = Config(), SystemClock()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    # The daemon's deferred management tools; the AI tools listed are this test's own.
    management = [d for d in deferred_tools() if not any(i.ai for i in d.infos)]
    registry = Registry([*builtin_tools(), *_tools(seen)], management)
    facts = DaemonFacts(db.path, "asyncio", clock, stores.counts, workers.settings, "/")
    services = build_services(config, stores, workers, facts, registry, b"p" * 32, clock)
    server = McpServer(build_chain(config, services, registry), os.path.join(home, "mcp.sock"), 64 * 1024)
    await server.start()
    try:
        yield Graph(home, server, db, workers.runner, seen, stores.audit)
    finally:
        await server.stop()
        await workers.runner.shutdown()
        await db.close()
        shutil.rmtree(home, ignore_errors=True)


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def test_only_ai_read_tools_are_offered_in_name_order():
    catalog = Catalog([*builtin_tools(), *_tools(Observed())])
    listed = json.loads(bytes(catalog.listing))
    assert [t["name"] for t in listed] == ["test.echo", "test.slow"]
    assert sorted(catalog.tools) == ["test.echo", "test.slow"]
    echo = listed[0]
    assert echo["title"] == "Echo" and echo["description"] == "Echo the text back."
    assert echo["annotations"] == {
        "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


def test_schemas_are_inlined_objects_that_forbid_unknown_fields():
    inputs = object_schema(EchoArgs)
    assert inputs["type"] == "object" and inputs["additionalProperties"] is False
    assert inputs["required"] == ["text"] and inputs["properties"]["text"]["maxLength"] == 64
    after = inputs["properties"]["after"]["anyOf"][0]
    assert after["type"] == "object" and after["additionalProperties"] is False
    assert after["properties"]["itemId"]["maxLength"] == 16
    outputs = object_schema(EchoResult)
    assert outputs["type"] == "object" and outputs["properties"]["cursors"]["items"]["type"] == "object"
    for schema in (inputs, outputs):
        assert not any(isinstance(n, dict) and ("$ref" in n or "$defs" in n) for n in _walk(schema))


def test_a_tool_that_accepts_unknown_fields_is_refused():
    class Loose(msgspec.Struct):
        text: str

    loose = Tool(name="test.loose", version="1.0.0", effect="read", risk="low", permissions=(),
                 args_type=Loose, result_type=EchoResult, handler=_echo, ai=True)
    with pytest.raises(ValueError, match="forbid unknown fields"):
        Catalog([loose])


async def test_call_returns_structured_content_and_the_same_json_as_text(graph):
    client = await AsyncLineClient.open(graph.path)
    args = {"text": "héllo", "after": {"itemId": "a1"}}
    modern = await client.ask(request(1, "tools/call", {"name": "test.echo", "arguments": args}, modern=True))
    result = modern["result"]
    assert result["isError"] is False and result["resultType"] == "complete"
    assert result["structuredContent"] == {"text": "héllo", "length": 5, "cursors": [{"itemId": "a1"}]}
    assert [c["type"] for c in result["content"]] == ["text"]
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "qledge"

    assert (await client.ask(INITIALIZE))["result"]["protocolVersion"] == "2025-11-25"
    legacy = (await client.ask(request(2, "tools/call", {"name": "test.echo", "arguments": args})))["result"]
    assert legacy["structuredContent"] == result["structuredContent"]
    assert "resultType" not in legacy and "_meta" not in legacy
    await client.close()


async def test_tool_errors_are_results_with_the_stable_code(graph):
    client = await AsyncLineClient.open(graph.path)
    bad = await client.ask(request(1, "tools/call", {"name": "test.echo", "arguments": {"text": "x", "extra": 1}},
                                   modern=True))
    assert bad["result"]["isError"] is True and "structuredContent" not in bad["result"]
    assert bad["result"]["content"][0]["text"].startswith("invalid_argument: ")
    missing_args = await client.ask(request(2, "tools/call", {"name": "test.echo"}, modern=True))
    assert missing_args["result"]["content"][0]["text"].startswith("invalid_argument: ")
    not_object = await client.ask(request(3, "tools/call", {"name": "test.echo", "arguments": [1]}, modern=True))
    assert not_object["error"]["code"] == -32602
    await client.close()


async def test_write_and_unlisted_tools_are_unknown_over_mcp(graph):
    client = await AsyncLineClient.open(graph.path)
    for rid, name in enumerate(("test.write", "test.hidden", "qledge.task.create", "qledge.status")):
        answer = await client.ask(request(rid, "tools/call", {"name": name, "arguments": {}}, modern=True))
        assert answer["error"] == {"code": -32602, "message": f"Unknown tool: {name}"}
    assert graph.seen.write_ran is False
    await client.close()
    query = "SELECT tool, outcome, reasons, count FROM security_audit WHERE transport = 'mcp' ORDER BY id"
    rows = await graph.db.run(lambda conn: list(conn.execute(query)))
    # Refused calls are audited too: the first at once, then counted on its row (one row a
    # minute per principal and cause), which names no tool once they differ.
    assert rows == [("test.write", "denied", '["tool_not_offered","tool_test_write"]', 1)]
    await graph.audit.flush()
    rows = await graph.db.run(lambda conn: list(conn.execute(query)))
    if len(rows) == 1:
        assert rows == [("*", "denied", '["tool_not_offered"]', 4)]
    else:  # the minute turned during the calls: a second row
        assert len(rows) == 2 and sum(r[3] for r in rows) == 4 and {r[1] for r in rows} == {"denied"}


async def test_cancellation_stops_the_work_and_sends_no_response(graph):
    client = await AsyncLineClient.open(graph.path)
    await client.send(request(7, "tools/call", {"name": "test.slow", "arguments": {}}, modern=True))
    await asyncio.wait_for(graph.seen.slow_started.wait(), 5)
    await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999}})
    await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": 7, "reason": "user gave up"}})
    # The next line on the stream answers the next request: nothing for 7, nothing for the notifications.
    assert (await client.ask(request(8, "tools/list", modern=True)))["id"] == 8
    for _ in range(50):
        if graph.seen.slow_cancelled:
            break
        await asyncio.sleep(0.02)
    assert graph.seen.slow_cancelled and not graph.seen.slow_finished
    with pytest.raises(TimeoutError):
        await client.recv(timeout=0.5)
    # The same id may be used again once its call is gone.
    again = await client.ask(request(7, "tools/call", {"name": "test.echo", "arguments": {"text": "x"}}, modern=True))
    assert again["result"]["structuredContent"]["text"] == "x"
    await client.close()


async def test_end_of_input_still_answers_calls_in_flight(graph):
    client = await AsyncLineClient.open(graph.path)
    await client.send(request(1, "tools/call", {"name": "test.echo", "arguments": {"text": "last"}}, modern=True))
    client.writer.write_eof()
    assert (await client.recv())["result"]["structuredContent"]["text"] == "last"
    assert await client.recv() is None  # then the server closes
    await client.close()


async def test_every_call_is_authenticated_and_audited_so_revocation_bites_at_once(graph):
    chain = graph.server.chain
    owner = Caller(transport="socket", peer_uid=os.getuid())
    created = await chain.call("qledge.credential.create", b'{"role": "viewer"}', "json", owner)
    client = await AsyncLineClient.open(graph.path)
    assert await client.ask({"qledge": {"token": created.token}}) == {"qledge": {"ok": True}}
    echo = {"name": "test.echo", "arguments": {"text": "a"}}
    assert (await client.ask(request("first", "tools/call", echo, modern=True)))["result"]["isError"] is False
    await chain.call("qledge.credential.revoke", json.dumps({"id": created.credential.id}).encode(), "json", owner)
    second = (await client.ask(request("second", "tools/call", echo, modern=True)))["result"]
    assert second["isError"] is True and second["content"][0]["text"].startswith("unauthenticated: ")
    await client.close()
    rows = await graph.db.run(lambda conn: list(conn.execute(
        "SELECT principal, tool, outcome, reasons, request_id FROM security_audit WHERE transport = 'mcp'"
        " ORDER BY id")))
    subject = f"credential:{created.credential.id}"
    assert rows == [
        (subject, "test.echo", "allowed", '["tool_invocation_allowed","tool_test_echo"]', "first"),
        (subject, "test.echo", "unauthenticated", '["credential_revoked","tool_test_echo"]', "second"),
    ]


async def test_official_sdk_through_the_bridge(graph):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client import Client
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "edge", "mcp", "--mcp-socket", graph.path], env=bridge_env(graph.home))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.server_info.name == "qledge" and init.protocol_version == "2025-11-25"
        await session.send_ping()
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == ["test.echo", "test.slow"]
        assert listed.tools[0].annotations.read_only_hint is True
        # The SDK validates structuredContent against the advertised outputSchema.
        echoed = await session.call_tool("test.echo", {"text": "sdk", "after": {"itemId": "z"}})
        assert not echoed.is_error
        assert echoed.structured_content == {"text": "sdk", "length": 3, "cursors": [{"itemId": "z"}]}
        refused = await session.call_tool("test.echo", {"text": 5})
        assert refused.is_error and refused.content[0].text.startswith("invalid_argument: ")

    began = time.monotonic()
    async with Client(params) as client:  # default mode "auto": server/discover first
        assert client.session.discover_result is not None
        tools = await client.list_tools()
        assert [t.name for t in tools.tools] == ["test.echo", "test.slow"]
        echoed = await client.call_tool("test.echo", {"text": "auto"})
        assert echoed.structured_content["length"] == 4
    assert time.monotonic() - began < 5
