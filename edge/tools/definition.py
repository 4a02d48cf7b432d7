"""What a tool is: name@version, effect, risk, permissions, deadline and typed args/result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import msgspec

Effect = Literal["read", "write"]
Risk = Literal["low", "medium", "high"]

READ_DEADLINE_S = 5.0
WRITE_DEADLINE_S = 15.0


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: str
    effect: Effect
    risk: Risk
    permissions: tuple[str, ...]  # domain permissions, checked after tool.call:<name>
    args_type: type
    result_type: type
    handler: Callable[[Any, Any], Awaitable[Any]]
    deadline_s: float = READ_DEADLINE_S
    title: str = ""
    description: str = ""
    ai: bool = False  # offered to AI clients (read-only, low-sensitivity projection)


class Entry:
    """A registered tool with its argument decoders, built once."""

    __slots__ = ("tool", "msgpack_args", "json_args")

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.msgpack_args = msgspec.msgpack.Decoder(tool.args_type)
        self.json_args = msgspec.json.Decoder(tool.args_type)

    def decode_args(self, raw: bytes, fmt: str) -> Any:
        decoder = self.json_args if fmt == "json" else self.msgpack_args
        return decoder.decode(raw)


class Registry:
    def __init__(self, tools: Iterable[Tool]) -> None:
        self._entries: dict[str, Entry] = {}
        for tool in tools:
            if tool.name in self._entries:
                raise ValueError(f"tool {tool.name} registered twice")
            self._entries[tool.name] = Entry(tool)

    def get(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def tools(self) -> list[Tool]:
        return [e.tool for e in self._entries.values()]

    def read_tool_names(self) -> list[str]:
        return [t.name for t in self.tools() if t.effect == "read"]


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of a tool that takes none."""
