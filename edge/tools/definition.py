"""What a tool is: name@version, effect, risk, permissions, deadline and typed args/result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar

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
    # Who may call it beyond its permissions, checked before its arguments are read: raises
    # ToolError (e.g. permission_denied for any principal but an AI run's own credential).
    caller: Callable[[ToolContext], None] | None = None

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


def info(
    name: str, *, effect: Effect, risk: Risk, permission: str | tuple[str, ...], title: str,
    deadline_s: float | None = None, version: str = "1.0.0", ai: bool = False,
) -> ToolInfo:
    """What a tool is, without its handler and types, with `tool`'s defaults: to declare a
    tool whose module is loaded by its first call (Deferred)."""
    if deadline_s is None:
        deadline_s = READ_DEADLINE_S if effect == "read" else WRITE_DEADLINE_S
    return ToolInfo(name=name, version=version, effect=effect, risk=risk,
                    permissions=[permission] if isinstance(permission, str) else list(permission),
                    deadline_s=deadline_s, title=title, ai=ai)


def declared(
    infos: Iterable[ToolInfo], handlers: dict[str, tuple[Handler, type, type]],
    descriptions: dict[str, str] | None = None, caller: Callable[[ToolContext], None] | None = None,
) -> list[Tool]:
    """The tools `infos` declare (see Deferred), each with its (handler, args type, result
    type) from `handlers`, which must name exactly those tools, its description (what an AI
    tool is offered with) from `descriptions`, and `caller` (see Tool)."""
    found = list(infos)
    if sorted(i.name for i in found) != sorted(handlers):
        raise ValueError("declared tools and their handlers differ")
    told = descriptions or {}
    return [Tool(name=i.name, version=i.version, effect=i.effect, risk=i.risk,  # type: ignore[arg-type]
                 permissions=tuple(i.permissions), args_type=handlers[i.name][1], result_type=handlers[i.name][2],
                 handler=handlers[i.name][0], deadline_s=i.deadline_s, title=i.title,
                 description=told.get(i.name, ""), ai=i.ai, caller=caller) for i in found]


class Entry:
    """A registered tool with its argument decoders, each built once, when first needed (an
    idle daemon builds none for the tools nobody calls)."""

    __slots__ = ("tool", "_msgpack", "_json")

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self._msgpack: msgspec.msgpack.Decoder[Any] | None = None
        self._json: msgspec.json.Decoder[Any] | None = None

    def decode_args(self, raw: bytes, fmt: str) -> Any:
        if fmt == "json":
            if self._json is None:
                self._json = msgspec.json.Decoder(self.tool.args_type)
            return self._json.decode(raw)
        if self._msgpack is None:
            self._msgpack = msgspec.msgpack.Decoder(self.tool.args_type)
        return self._msgpack.decode(raw)


class Deferred(msgspec.Struct, frozen=True):
    """Tools whose module is loaded by their first call: what they are now (`infos`, for
    listings and permissions), their handlers and types when `load` is called. A group that
    declares AI tools is loaded when their schemas are asked for too (Registry.ai_tools)."""

    infos: tuple[ToolInfo, ...]
    load: Callable[[], list[Tool]]


T = TypeVar("T")


def first_use(make: Callable[[], T]) -> Callable[[], T]:
    """`make`, called once, at the first call of what is returned: the one way a part that an
    idle daemon never needs (a store, a writer, the notifier's queue) is made when first
    needed. Tools have Deferred for the same."""
    made: list[T] = []

    def get() -> T:
        if not made:
            made.append(make())
        return made[0]

    return get


class Registry:
    def __init__(self, tools: Iterable[Tool], deferred: Iterable[Deferred] = ()) -> None:
        self._entries: dict[str, Entry] = {}
        self._deferred: dict[str, tuple[Deferred, ToolInfo]] = {}
        for t in tools:
            if t.name in self._entries:
                raise ValueError(f"tool {t.name} registered twice")
            self._entries[t.name] = Entry(t)
        for group in deferred:
            for info in group.infos:
                if info.name in self._entries or info.name in self._deferred:
                    raise ValueError(f"tool {info.name} registered twice")
                self._deferred[info.name] = (group, info)

    def get(self, name: str) -> Entry | None:
        entry = self._entries.get(name)
        if entry is None and name in self._deferred:
            self._load(self._deferred[name][0])
            entry = self._entries.get(name)
        return entry

    def _load(self, group: Deferred) -> None:
        tools = group.load()
        if sorted((t.info() for t in tools), key=_by_name) != sorted(group.infos, key=_by_name):
            raise ValueError("deferred tools differ from what they were declared as")
        for t in tools:
            self._entries[t.name] = Entry(t)
            del self._deferred[t.name]

    def tools(self) -> list[Tool]:
        """The tools loaded so far."""
        return [e.tool for e in self._entries.values()]

    def ai_tools(self) -> list[Tool]:
        """Every AI tool, with its types (what their schemas are made of): the deferred groups
        that declare one are loaded now."""
        groups = {id(group): group for group, i in self._deferred.values() if i.ai}
        for group in groups.values():
            self._load(group)
        return [t for t in self.tools() if t.ai]

    def infos(self) -> list[ToolInfo]:
        return sorted([*(t.info() for t in self.tools()), *(info for _, info in self._deferred.values())],
                      key=_by_name)

    def read_tool_names(self) -> list[str]:
        return [i.name for i in self.infos() if i.effect == "read"]


def _by_name(info: ToolInfo) -> str:
    return info.name


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
