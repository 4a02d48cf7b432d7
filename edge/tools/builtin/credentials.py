"""API credential tools. A token's secret is shown once, at creation, and never stored."""

from __future__ import annotations

import secrets
from typing import Annotated

import msgspec

from edge.core.auth import TOKEN_PREFIX, Credential, Role, token_digest, valid_permission
from edge.core.errors import invalid, not_found
from edge.core.text import Id, Label
from edge.tools.context import ToolContext
from edge.tools import catalog
from edge.tools.definition import Empty, declared

_Permission = Annotated[str, msgspec.Meta(min_length=1, max_length=160, pattern=r"^[a-z*][a-zA-Z0-9_.:*-]*$")]


class CreateArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    role: Role
    name: Label | None = None
    permissions: Annotated[list[_Permission], msgspec.Meta(max_length=64)] | None = None


class Created(msgspec.Struct, rename="camel"):
    credential: Credential
    token: str  # shown once


class CredentialList(msgspec.Struct, rename="camel"):
    credentials: list[Credential]


class RevokeArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    id: Id


def _check_permission(permission: str) -> None:
    if not valid_permission(permission):
        raise invalid(f"unknown permission {permission!r}")


async def create(ctx: ToolContext, args: CreateArgs) -> Created:
    for permission in args.permissions or ():
        _check_permission(permission)
    cid = secrets.token_hex(6)
    secret = secrets.token_hex(20)
    cred = Credential(
        id=cid, project_id=ctx.project, name=args.name or f"{args.role}-{cid}", role=args.role,
        permissions=args.permissions, created_at_ms=ctx.now_ms(),
    )
    await ctx.services.credentials.create(cred, token_digest(ctx.services.pepper, secret))
    return Created(credential=cred, token=f"{TOKEN_PREFIX}{cid}_{secret}")


async def list_credentials(ctx: ToolContext, args: Empty) -> CredentialList:
    return CredentialList(credentials=await ctx.services.credentials.for_project(ctx.project))


async def revoke(ctx: ToolContext, args: RevokeArgs) -> Credential:
    cred = await ctx.services.credentials.revoke(ctx.project, args.id, ctx.now_ms())
    if cred is None:
        raise not_found(f"credential {args.id} not found")
    return cred


TOOLS = declared(catalog.CREDENTIALS, {
    "qledge.credential.create": (create, CreateArgs, Created),
    "qledge.credential.list": (list_credentials, Empty, CredentialList),
    "qledge.credential.revoke": (revoke, RevokeArgs, Credential),
})
