"""Credentials never ride in names: a crontab line that carries URL userinfo, a token query
parameter and a bearer header becomes a task named after its program, and every free-text
field that leaves the daemon at low sensitivity is masked as log text is — checked against a
real daemon through every way out: `qledge task get` as a viewer, the `qinglong.*` tools, the
official MCP SDK over `qledge mcp`, a notification to a loopback webhook, and the requests the
AI operator sends a (fake) provider."""

from __future__ import annotations

import json
import os
import sys

import pytest

from agent_support import agent_config, no_refusals
from fake_provider import FakeProvider, answer, tool_call
from mcp_support import bridge_env
from notify_support import Loopback

USERINFO, TOKEN, BEARER = "S3cretPass", "T0kenValue123", "BearerValue456"
VALUES = (USERINFO, TOKEN, BEARER)
LINE = (f"* * * * * false http://admin:{USERINFO}@router.lan/cgi?token={TOKEN}"
        f" -H 'Authorization: Bearer {BEARER}'\n")


def _clean(what: str, text: str) -> None:
    for value in VALUES:
        assert value not in text, f"{value} in {what}: {text[:400]}"


@pytest.fixture
def provider():
    # One family: the subject is what leaves the daemon through every way out, the same for
    # each; the operator's own tests run against every family.
    p = FakeProvider()
    yield p
    p.close()
    no_refusals(p)


@pytest.fixture
def webhook():
    s = Loopback()
    yield s
    s.close()


async def test_a_credential_in_a_command_line_reaches_no_low_sensitivity_field(daemon_factory, provider, webhook,
                                                                                tmp_path):
    d = daemon_factory(config=agent_config(provider, "[mcp]\nenabled = true\n")).start()
    crontab = tmp_path / "crontab"
    crontab.write_text(LINE)
    done = d.cli("import", "crontab", str(crontab), "--user", "nobody")
    assert done.returncode == 0, done.stderr
    # An owner's own name for a task is masked as well, and so is one on record from before.
    named = d.call("qledge.task.create", {"taskId": "named", "name": f"sync https://bob:{USERINFO}@nas/?token={TOKEN}",
                                          "spec": {"command": {"kind": "argv", "file": "false"}}})
    assert named["name"] == "sync https://[REDACTED]@nas/?token=[REDACTED]"
    d.cli("task", "add", "older", "--", "true")
    conn = d.db()
    conn.execute("UPDATE tasks SET name = ? WHERE id = 'older'", (f"push with Authorization: Bearer {BEARER}",))
    conn.close()
    [imported] = [t for t in json.loads(d.cli("task", "list", "--json").stdout) if t["id"] not in ("named", "older")]
    assert imported["id"] == "false" and imported["name"] == "false"  # its program, no arguments
    assert USERINFO in json.dumps(imported["spec"])  # the command itself is kept, behind task.inspect

    _, viewer = d.token("viewer")
    for task in ("false", "named", "older"):
        shown = d.cli("task", "get", task, token=viewer)
        assert shown.returncode == 0, shown.stderr
        _clean(f"task get {task} as a viewer", shown.stdout + shown.stderr)
        _clean("qinglong.task.get", json.dumps(d.call("qinglong.task.get", {"taskId": task}, token=viewer)))
    _clean("qinglong.task.list", json.dumps(d.call("qinglong.task.list", {}, token=viewer)))
    _clean("task list as a viewer", d.cli("task", "list", token=viewer).stdout)

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "edge", "mcp"], env=bridge_env(d.home, None))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.call_tool("qinglong.task.list", {})
        got = await session.call_tool("qinglong.task.get", {"taskId": "older"})
    assert not listed.is_error and not got.is_error
    _clean("an MCP call", json.dumps(listed.structured_content) + listed.content[0].text + got.content[0].text)

    d.call("qledge.notify.channel.set", {"name": "w", "spec": {"kind": "webhook", "url": webhook.url + "/hook"}})
    d.call("qledge.notify.rules.set", {"rules": [{"channels": ["w"], "on": ["failure"]}]})
    for task in ("false", "named"):
        d.cli("run", "start", task, "--wait")
    requests = webhook.wait(2)
    for request in requests:
        _clean("a notification", request.body.decode())
    assert {r.json()["taskId"] for r in requests} == {"false", "named"}

    provider.add(tool_call("qinglong.task.list", {}),
                 lambda req: tool_call("qinglong.task.get", {"taskId": "older"}, call_id="call_2"),
                 answer("three tasks"))
    asked = d.cli("ask", "which", "tasks", "are", "there?", "--wait")
    assert asked.returncode == 0, asked.stderr
    assert len(provider.requests) == 3
    for request in provider.requests:
        _clean("the AI provider's request", request.raw.decode())
    tool_results = [m["content"] for m in provider.requests[-1].body["messages"] if m["role"] == "tool"]
    assert any('"older"' in content for content in tool_results)  # it did see the tasks
    assert os.path.isdir(d.home)
