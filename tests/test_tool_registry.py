"""The tool registry: tools loaded with the daemon, and tools declared now whose modules
load on their first call (export and import, credentials, secrets, notifications)."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from edge.notify.handle import TOOL_INFOS
from edge.app.graph import daemon_tools, deferred_tools
from edge.tools.context import ToolContext
from edge.tools.definition import Deferred, Empty, Registry, Tool, declared, info


async def _ok(ctx: ToolContext, args: Empty) -> Empty:
    return Empty()


def test_deferred_tools_are_listed_before_and_loaded_by_their_first_call():
    loads: list[int] = []
    infos = (info("x.read", effect="read", risk="low", permission="task.read", title="read"),
             info("x.write", effect="write", risk="medium", permission=("task.write", "run.write"), title="write"))

    def load() -> list[Tool]:
        loads.append(1)
        return declared(infos, {"x.read": (_ok, Empty, Empty), "x.write": (_ok, Empty, Empty)})

    registry = Registry([], [Deferred(infos=infos, load=load)])
    assert [i.name for i in registry.infos()] == ["x.read", "x.write"] and loads == []
    assert registry.read_tool_names() == ["x.read"]
    assert registry.tools() == []
    entry = registry.get("x.write")
    assert entry is not None and entry.tool.permissions == ("task.write", "run.write") and loads == [1]
    assert entry.tool.deadline_s == 15.0 and registry.get("x.read") is not None and loads == [1]
    assert entry.decode_args(b"{}", "json") == Empty() == entry.decode_args(msgspec.msgpack.encode({}), "msgpack")
    with pytest.raises(msgspec.ValidationError):
        entry.decode_args(b'{"extra": 1}', "json")  # decoders are built on first use, with the same checks
    assert registry.get("x.nope") is None


def test_a_module_that_differs_from_its_declaration_is_refused():
    infos = (info("x.read", effect="read", risk="low", permission="task.read", title="read"),)
    other = (info("x.read", effect="read", risk="high", permission="task.read", title="read"),)
    registry = Registry([], [Deferred(infos=infos, load=lambda: declared(other, {"x.read": (_ok, Empty, Empty)}))])
    with pytest.raises(ValueError, match="differ"):
        registry.get("x.read")
    with pytest.raises(ValueError, match="differ"):
        declared(infos, {"x.other": (_ok, Empty, Empty)})
    with pytest.raises(ValueError, match="twice"):
        Registry([], [Deferred(infos=infos, load=list), Deferred(infos=infos, load=list)])


def test_every_deferred_group_loads_as_declared():
    """The groups composition declares and the notify tools: each module builds exactly
    what was declared (what the daemon listed before loading it)."""
    resident, groups = daemon_tools()
    registry = Registry(resident, groups)
    assert len(groups) == len(deferred_tools()) + 1  # and the run tools
    for group in groups:
        for declared_info in group.infos:
            entry = registry.get(declared_info.name)
            assert entry is not None and entry.tool.info() == declared_info
    from edge.notify.tools import notify_tools

    assert sorted(t.info().name for t in notify_tools(None, None, None)) == sorted(i.name for i in TOOL_INFOS)  # type: ignore[arg-type]
    assert [t.info() for t in notify_tools(None, None, None)] == list(TOOL_INFOS)  # type: ignore[arg-type]


def test_rarely_used_tool_modules_stay_unloaded():
    code = ("import sys; from edge.app.graph import builtin_tools, deferred_tools;"
            " from edge.tools.definition import Registry;"
            " r = Registry(builtin_tools(), deferred_tools()); r.infos();"
            " print(sorted(m for m in sys.modules if m.startswith(('edge.tools.builtin', 'edge.tools.ai'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "backup" not in out and "credentials" not in out and "secrets" not in out and "tasks" in out
    assert "edge.tools.ai" not in out  # the AI read tools: until an AI client calls or lists them
    code = ("import sys; from edge.app.graph import daemon_tools; from edge.tools.definition import Registry;"
            " r = Registry(*daemon_tools()); r.infos(); print('edge.tools.builtin.runs' in sys.modules);"
            " r.get('qledge.run.get'); print('edge.tools.builtin.runs' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]  # the run tools: until the first run.* call
