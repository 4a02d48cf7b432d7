"""Security tools: API credentials (a token's secret is shown once, at creation, and never
stored), secrets (values go in and never come out: runs get them in their environment, and
their output is redacted), and the security audit for owners."""

from __future__ import annotations

import contextlib
from typing import Annotated

import msgspec

from edge.core.auth import (
    DOMAIN_PERMISSIONS,
    TOKEN_PREFIX,
    AuditEntry,
    Credential,
    Role,
    SecretInfo,
    parse_token,
    token_digest,
    valid_permission,
)
from edge.core.errors import ToolError, invalid, not_found
from edge.core.ids import token_hex
from edge.core.tasks import ImportKey, SecretImport
from edge.core.text import Id, Label, Limit, Millis, Name, NonNegative
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, Empty, tool

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


class AuditArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    since_ms: Millis | None = None
    before: NonNegative | None = None  # `next` of the previous page
    limit: Limit = 32


class AuditList(msgspec.Struct, rename="camel", omit_defaults=True):
    entries: list[AuditEntry]
    next: int | None = None


VALID_PERMISSIONS = (*DOMAIN_PERMISSIONS, "secret.use:<secret>", "tool.call:<tool>", "tool.call:<prefix>*", "*")


def _check_permission(permission: str) -> None:
    if not valid_permission(permission):
        raise invalid(f"unknown permission {permission!r}; valid: {', '.join(VALID_PERMISSIONS)}")


async def create(ctx: ToolContext, args: CreateArgs) -> Created:
    for permission in args.permissions or ():
        _check_permission(permission)
    cid = token_hex(6)
    secret = token_hex(20)
    cred = Credential(
        id=cid, project_id=ctx.project, name=args.name or f"{args.role}-{cid}", role=args.role,
        permissions=args.permissions, created_at_ms=ctx.now_ms(),
    )
    await ctx.services.credentials.create(cred, token_digest(ctx.services.pepper, secret))
    return Created(credential=cred, token=f"{TOKEN_PREFIX}{cid}_{secret}")


async def list_credentials(ctx: ToolContext, args: Empty) -> CredentialList:
    return CredentialList(credentials=await ctx.services.credentials.for_project(ctx.project))


async def revoke(ctx: ToolContext, args: RevokeArgs) -> Credential:
    # A whole token is accepted for its id, and never repeated back: its secret stays unsaid.
    parsed = parse_token(args.id)
    cid = parsed[0] if parsed else args.id
    cred = await ctx.services.credentials.revoke(ctx.project, cid, ctx.now_ms())
    if cred is None:
        shown = cid if cid.isalnum() and len(cid) <= 32 else "with that id"
        raise not_found(f"no credential {shown}")
    return cred


async def audit(ctx: ToolContext, args: AuditArgs) -> AuditList:
    # Counts of refused calls still in memory first, so the page shows them (another
    # node's are written within a few seconds).
    with contextlib.suppress(ToolError):
        await ctx.services.audit.flush()
    found = await ctx.services.audit_reader.page(ctx.project, args.since_ms, args.before, args.limit)
    return AuditList(entries=found.entries, next=found.next)


# -- secrets ----------------------------------------------------------------------

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


async def delete_secret(ctx: ToolContext, args: NameArgs) -> Deleted:
    if not await ctx.services.secrets.delete(ctx.project, args.name):
        raise not_found(f"secret {args.name!r} not found")
    return Deleted(name=args.name)


async def import_secret(ctx: ToolContext, args: ImportArgs) -> Imported:
    status = await ctx.services.secrets.import_secret(ctx.project, args.key, args.name, args.value, ctx.now_ms())
    return Imported(name=args.name, status=status)


TOOLS = [
    tool("qledge.credential.create", create, CreateArgs, Created, effect="write", risk="high",
         permission="credential.admin", title="Create an API credential"),
    tool("qledge.credential.list", list_credentials, Empty, CredentialList, effect="read", risk="high",
         permission="credential.admin", title="API credentials", deadline_s=WRITE_DEADLINE_S),
    tool("qledge.credential.revoke", revoke, RevokeArgs, Credential, effect="write", risk="high",
         permission="credential.admin", title="Revoke an API credential"),
    tool("qledge.audit.list", audit, AuditArgs, AuditList, effect="read", risk="high", permission="audit.read",
         title="The security audit, newest first"),
    tool("qledge.secret.set", set_secret, SetArgs, SecretInfo, effect="write", risk="high", permission="secret.write",
         title="Store a secret (create or replace); its value is never returned"),
    tool("qledge.secret.list", list_secrets, Empty, SecretList, effect="read", risk="high", permission="secret.read",
         title="Secret names and dates", deadline_s=WRITE_DEADLINE_S),
    tool("qledge.import.secret", import_secret, ImportArgs, Imported, effect="write", risk="high",
         permission="secret.write", title="Store a secret from an import, once per import key; never replaces one"),
    tool("qledge.secret.delete", delete_secret, NameArgs, Deleted, effect="write", risk="high",
         permission="secret.write", title="Delete a secret"),
]
