"""Secret tools: values go in and never come out (runs get them in their environment,
and their output shows `***` in their place)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.errors import ToolError, not_found
from edge.core.ports import SecretInfo, SecretStore
from edge.core.text import Name
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, Empty, Tool

# An environment value: no NUL, bounded like any other env value of a task.
_Value = Annotated[str, msgspec.Meta(min_length=1, max_length=16384, pattern=r"^[^\x00]*$")]


class SetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name
    value: _Value


class NameArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name


class SecretList(msgspec.Struct, rename="camel"):
    secrets: list[SecretInfo]


class Deleted(msgspec.Struct, rename="camel"):
    name: str


def _store(ctx: ToolContext) -> SecretStore:
    if ctx.services.secrets is None:
        raise ToolError("unavailable", "this daemon has no secret store")
    return ctx.services.secrets


async def set_secret(ctx: ToolContext, args: SetArgs) -> SecretInfo:
    return await _store(ctx).set(ctx.project, args.name, args.value, ctx.now_ms())


async def list_secrets(ctx: ToolContext, args: Empty) -> SecretList:
    return SecretList(secrets=await _store(ctx).list(ctx.project))


async def delete(ctx: ToolContext, args: NameArgs) -> Deleted:
    if not await _store(ctx).delete(ctx.project, args.name):
        raise not_found(f"secret {args.name!r} not found")
    return Deleted(name=args.name)


def _tool(name: str, handler, args_type, result_type, effect: str, permission: str, title: str) -> Tool:
    return Tool(
        name=name, version="1.0.0", effect=effect, risk="high",  # type: ignore[arg-type]
        permissions=(permission,), args_type=args_type, result_type=result_type,
        handler=handler, deadline_s=WRITE_DEADLINE_S, title=title,
    )


TOOLS = [
    _tool("qledge.secret.set", set_secret, SetArgs, SecretInfo, "write", "secret.write",
          "Store a secret (create or replace); its value is never returned"),
    _tool("qledge.secret.list", list_secrets, Empty, SecretList, "read", "secret.read", "Secret names and dates"),
    _tool("qledge.secret.delete", delete, NameArgs, Deleted, "write", "secret.write", "Delete a secret"),
]
