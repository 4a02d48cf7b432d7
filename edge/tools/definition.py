"""What a tool is: name@version, effect, risk, permissions, deadline and typed args/result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import msgspec

from edge.tools.context import ToolContext, ToolInfo

Effect = Literal["read", "write"]
Risk = Literal["low", "medium", "high"]

READ_DEADLINE_S = 5.0
WRITE_DEADLINE_S = 15.0

# Handlers differ in their argument and result types; the Tool records both, and the
# registry decodes into the former, so the registry itself holds them untyped.
Handler = Callable[[ToolContext, Any], Awaitable[Any]]


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: str
    effect: Effect
    risk: Risk
    permissions: tuple[str, ...]  # domain permissions, checked after tool.call:<name>
    args_type: type
    result_type: type
    handler: Handler
    deadline_s: float = READ_DEADLINE_S
    title: str = ""
    description: str = ""
    ai: bool = False  # offered to AI clients (read-only, low-sensitivity projection)

    def info(self) -> ToolInfo:
        return ToolInfo(name=self.name, version=self.version, effect=self.effect, risk=self.risk,
                        permissions=list(self.permissions), deadline_s=self.deadline_s, title=self.title, ai=self.ai)


def tool(
    name: str, handler: Handler, args_type: type, result_type: type, *, effect: Effect, risk: Risk,
    permission: str | tuple[str, ...], title: str, deadline_s: float | None = None, description: str = "",
    ai: bool = False,
    version: str = "1.0.0",
) -> Tool:
    """The one way tools are defined: their domain permission (or several, all needed), and
    the deadline of their effect unless they say otherwise (reads 5 s, writes 15 s)."""
    if deadline_s is None:
        deadline_s = READ_DEADLINE_S if effect == "read" else WRITE_DEADLINE_S
    return Tool(
        name=name, version=version, effect=effect, risk=risk,
        permissions=(permission,) if isinstance(permission, str) else permission, args_type=args_type,
        result_type=result_type, handler=handler, title=title, description=description, ai=ai, deadline_s=deadline_s,
    )


class Entry:
    """A registered tool with its argument decoders, each built once, on the tool's first
    call in that format: most tools of an idle daemon are never called, and only MCP
    speaks JSON."""

    __slots__ = ("tool", "_msgpack_args", "_json_args")

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self._msgpack_args: msgspec.msgpack.Decoder[Any] | None = None
        self._json_args: msgspec.json.Decoder[Any] | None = None

    def decode_args(self, raw: bytes, fmt: str) -> Any:
        if fmt == "json":
            if self._json_args is None:
                self._json_args = msgspec.json.Decoder(self.tool.args_type)
            return self._json_args.decode(raw)
        if self._msgpack_args is None:
            self._msgpack_args = msgspec.msgpack.Decoder(self.tool.args_type)
        return self._msgpack_args.decode(raw)


class Registry:
    def __init__(self, tools: Iterable[Tool]) -> None:
        self._entries: dict[str, Entry] = {}
        for t in tools:
            if t.name in self._entries:
                raise ValueError(f"tool {t.name} registered twice")
            self._entries[t.name] = Entry(t)

    def get(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def tools(self) -> list[Tool]:
        return [e.tool for e in self._entries.values()]

    def infos(self) -> list[ToolInfo]:
        return sorted((t.info() for t in self.tools()), key=lambda info: info.name)

    def read_tool_names(self) -> list[str]:
        return [t.name for t in self.tools() if t.effect == "read"]


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of a tool that takes none."""


def object_schema(struct_type: type) -> dict[str, Any]:
    """msgspec's JSON Schema with every `$ref` inlined: MCP and chat-completions function
    parameters want `type: object` at the root, and several clients and servers do not
    resolve `$ref`/`$defs`."""
    schema = msgspec.json.schema(struct_type)
    defs = schema.pop("$defs", {})
    root = _inline(schema, defs, ())
    if root.get("type") != "object":
        raise ValueError(f"{struct_type.__name__}: a tool schema must describe an object")
    return root


def _inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return {key: _inline(value, defs, seen) for key, value in node.items()}
    name = ref.rpartition("/")[2]
    if name in seen:
        raise ValueError(f"recursive schema {name} cannot be inlined")
    rest = {key: _inline(value, defs, seen) for key, value in node.items() if key != "$ref"}
    return {**_inline(defs[name], defs, (*seen, name)), **rest}
