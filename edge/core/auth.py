"""Principals, roles, permissions, credentials and the audit record of every call.
Permission checks fail closed."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Literal

import msgspec

Role = Literal["owner", "operator", "viewer"]
Outcome = Literal["allowed", "denied", "unauthenticated"]

TOKEN_PREFIX = "qle_"

# Domain permissions. Tools name the ones they need; roles grant sets of them.
DOMAIN_PERMISSIONS: tuple[str, ...] = (
    "task.read",  # low-sensitivity task projections
    "task.inspect",  # full task specs (commands, env)
    "task.write",
    "trigger.read",
    "trigger.inspect",
    "trigger.write",
    "run.read",
    "run.write",
    "artifact.read",  # run logs
    "secret.read",  # secret names and dates, never values
    "secret.write",
    "credential.admin",
    "status.read",
)

_VIEWER = frozenset({"task.read", "trigger.read", "run.read", "status.read"})
_OPERATOR = frozenset(DOMAIN_PERMISSIONS) - {"credential.admin", "secret.write"}


class Principal(msgspec.Struct, frozen=True):
    """Who is calling. `subject` is what the audit log records (never a secret)."""

    subject: str  # "uid:1000" or "credential:<id>"
    role: Role
    permissions: frozenset[str]
    credential_id: str | None = None


class Credential(msgspec.Struct, rename="camel"):
    id: str
    project_id: str
    name: str
    role: Role
    permissions: list[str] | None
    created_at_ms: int
    revoked_at_ms: int | None = None


def role_permissions(role: str, read_tools: Iterable[str]) -> frozenset[str]:
    """The permissions a role grants, given the names of the read-effect tools."""
    if role == "owner":
        return frozenset({"*"})
    if role == "operator":
        return _OPERATOR | {"tool.call:*"}
    if role == "viewer":
        return _VIEWER | {f"tool.call:{name}" for name in read_tools}
    return frozenset()  # unknown role: nothing


class SecretInfo(msgspec.Struct, rename="camel"):
    """What may be shown about a secret: never its value."""

    name: str
    created_at_ms: int
    updated_at_ms: int


def allows(granted: frozenset[str], needed: str) -> bool:
    if needed in granted or "*" in granted:
        return True
    return needed.startswith("tool.call:") and "tool.call:*" in granted


def missing_permission(granted: frozenset[str], tool_name: str, permissions: Iterable[str]) -> str | None:
    """The first permission a call of `tool_name` needs and `granted` lacks: the tool
    policy `tool.call:<name>` first, then the tool's domain permissions. None: allowed.
    The one place the rule is written (the chain, and what tools.list discloses)."""
    for needed in (f"tool.call:{tool_name}", *permissions):
        if not allows(granted, needed):
            return needed
    return None


def parse_token(token: str) -> tuple[str, str] | None:
    """Split `qle_<id>_<secret>`; None when it is not shaped like a token."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
        return None
    parts = token[len(TOKEN_PREFIX) :].split("_", 1)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def token_digest(pepper: bytes, secret: str) -> bytes:
    return hmac.new(pepper, secret.encode(), hashlib.sha256).digest()


def digest_matches(expected: bytes, pepper: bytes, secret: str) -> bool:
    return hmac.compare_digest(expected, token_digest(pepper, secret))


# -- audit ---------------------------------------------------------------------------


class AuditRecord(msgspec.Struct, rename="camel"):
    """One tool call for the security audit: every call leaves one, allowed or not.
    Refused ones (denied, unauthenticated) may be stored as a count on an aggregate row."""

    at_ms: int
    project_id: str
    principal: str
    tool: str
    outcome: Outcome
    reasons: list[str]  # the cause first, then tool_<name>
    transport: str
    request_id: str | None = None
    change: bool = False  # an allowed change of credentials or secrets: kept in a class of its own


CHANGE_PERMISSIONS = frozenset({"credential.admin", "secret.write"})


def tool_reason(tool_name: str) -> str:
    """`qinglong.task.list` → `tool_qinglong_task_list`."""
    return "tool_" + "".join(c if c.isalnum() else "_" for c in tool_name)
