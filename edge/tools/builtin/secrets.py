"""Secret tools: values go in and never come out (runs get them in their environment,
and their output shows `***` in their place)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edge.core.auth import SecretInfo
from edge.core.errors import not_found
from edge.core.tasks import ImportKey, SecretImport
from edge.core.text import Name
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, Empty, tool

# An environment value: no NUL, bounded like any other env value of a task.
Value = Annotated[str, msgspec.Meta(min_length=1, max_length=16384, pattern=r"^[^\x00]*$")]


class SetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name
    value: Value


class NameArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name


class SecretList(msgspec.Struct, rename="camel"):
    secrets: list[SecretInfo]


class Deleted(msgspec.Struct, rename="camel"):
    name: str


class ImportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    key: ImportKey
    name: Name
    value: Value


class Imported(msgspec.Struct, rename="camel"):
    name: str
    status: SecretImport


async def set_secret(ctx: ToolContext, args: SetArgs) -> SecretInfo:
    return await ctx.services.secrets.set(ctx.project, args.name, args.value, ctx.now_ms())


async def list_secrets(ctx: ToolContext, args: Empty) -> SecretList:
    return SecretList(secrets=await ctx.services.secrets.for_project(ctx.project))


async def delete(ctx: ToolContext, args: NameArgs) -> Deleted:
    if not await ctx.services.secrets.delete(ctx.project, args.name):
        raise not_found(f"secret {args.name!r} not found")
    return Deleted(name=args.name)


async def import_secret(ctx: ToolContext, args: ImportArgs) -> Imported:
    status = await ctx.services.secrets.import_secret(ctx.project, args.key, args.name, args.value, ctx.now_ms())
    return Imported(name=args.name, status=status)


TOOLS = [
    tool("qledge.secret.set", set_secret, SetArgs, SecretInfo, effect="write", risk="high", permission="secret.write",
         title="Store a secret (create or replace); its value is never returned"),
    tool("qledge.secret.list", list_secrets, Empty, SecretList, effect="read", risk="high", permission="secret.read",
         title="Secret names and dates", deadline_s=WRITE_DEADLINE_S),
    tool("qledge.import.secret", import_secret, ImportArgs, Imported, effect="write", risk="high",
         permission="secret.write", title="Store a secret from an import, once per import key; never replaces one"),
    tool("qledge.secret.delete", delete, NameArgs, Deleted, effect="write", risk="high", permission="secret.write",
         title="Delete a secret"),
]
