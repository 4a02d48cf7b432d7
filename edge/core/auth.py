"""Principals, roles, permissions, credentials and the audit record of every call.
Permission checks fail closed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from edge.core.ids import digests_equal, hmac_sha256

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
    "secret.export",  # secret values, for an export made with secrets
    "secret.use",  # reference any secret in a task's environment (per secret: secret.use:<name>)
    "task.privileged",  # tasks that run as root, as the daemon's user, or as a user not in task_users
    "credential.admin",
    "status.read",
    "notify.read",  # notification channels (never the secrets they name), rules and the delivery log
    "notify.write",  # default rules, test messages, deleting channels (setting one also needs secret.export)
    "audit.read",  # the security audit log
)
TASK_PRIVILEGED = "task.privileged"
SECRET_USE = "secret.use"
# Families whose bare name grants every `<family>:<name>` (secret.use grants secret.use:api).
_FAMILIES = frozenset({SECRET_USE})

_VIEWER = frozenset({"task.read", "trigger.read", "run.read", "status.read"})
# An operator holds none of these by default: a task that runs privileged, or reads a secret,
# would let it act as an owner; an export with secrets shows their values; the audit is the
# owners'. A credential's list may give the first two by name (never through `*`).
_OPERATOR = frozenset(DOMAIN_PERMISSIONS) - {
    "credential.admin", "secret.write", "secret.export", TASK_PRIVILEGED, SECRET_USE, "audit.read"}


class Grant(msgspec.Struct, frozen=True):
    """What a principal may do: what its role allows and, for a credential with its own
    list, also what that list allows (a list narrows the role; it never widens it).
    Entries are permissions or patterns (`tool.call:qinglong.*`, `*`)."""

    role: frozenset[str]
    only: frozenset[str] | None = None


class Principal(msgspec.Struct, frozen=True):
    """Who is calling. `subject` is what the audit log records (never a secret)."""

    subject: str  # "uid:1000", "credential:<id>" or "agent:<run id>"
    role: Role
    permissions: Grant
    credential_id: str | None = None
    run_id: str | None = None  # a run-scoped credential: the run it was minted for


class Credential(msgspec.Struct, rename="camel"):
    id: str
    project_id: str
    name: str
    role: Role
    permissions: list[str] | None
    created_at_ms: int
    revoked_at_ms: int | None = None


def grantable(permission: str) -> bool:
    """What an operator holds only when its credential's list names it."""
    return permission in (TASK_PRIVILEGED, SECRET_USE) or permission.startswith(SECRET_USE + ":")


def role_permissions(role: str, read_tools: Iterable[str], named: Iterable[str] = ()) -> frozenset[str]:
    """The permissions a role grants, given the names of the read-effect tools; `named`,
    a credential's own list, may add to an operator what is grantable to it by name."""
    if role == "owner":
        return frozenset({"*"})
    if role == "operator":
        return _OPERATOR | {"tool.call:*"} | {p for p in named if grantable(p)}
    if role == "viewer":
        return _VIEWER | {f"tool.call:{name}" for name in read_tools}
    return frozenset()  # unknown role: nothing


class SecretInfo(msgspec.Struct, rename="camel"):
    """What may be shown about a secret: never its value."""

    name: str
    created_at_ms: int
    updated_at_ms: int


def matches(entries: frozenset[str], needed: str) -> bool:
    """Whether a set of permissions and patterns covers one concrete permission: itself,
    `*`, a pattern ending in `*` (`tool.call:qinglong.*`), or a family's bare name
    (`secret.use` covers `secret.use:api`)."""
    if needed in entries or "*" in entries:
        return True
    for entry in entries:
        if entry.endswith("*") and needed.startswith(entry[:-1]):
            return True
    family, sep, _ = needed.partition(":")
    return bool(sep) and family in _FAMILIES and family in entries


def allows(grant: Grant, needed: str) -> bool:
    return matches(grant.role, needed) and (grant.only is None or matches(grant.only, needed))


def first_missing(grant: Grant, needed: Iterable[str]) -> str | None:
    for permission in needed:
        if not allows(grant, permission):
            return permission
    return None


def missing_permission(grant: Grant, tool_name: str, permissions: Iterable[str]) -> str | None:
    """The first permission a call of `tool_name` needs and `grant` lacks: the tool
    policy `tool.call:<name>` first, then the tool's domain permissions. None: allowed.
    The one place the rule is written (the chain, and what tools.list discloses)."""
    return first_missing(grant, (f"tool.call:{tool_name}", *permissions))


def task_permissions(privileged: bool, secrets: Iterable[str], reads: Iterable[str] = ()) -> list[str]:
    """What writing a task revision, or making one runnable (enabling the task, pointing a
    trigger at it), needs beyond task.write / trigger.write: task.privileged when it runs
    privileged, secret.use:<name> for each secret its environment references, and for an
    AI task what its runs' credential may do (`reads`: the permissions of the read tools
    its child is offered). A role's limits hold through the tasks it can write: a task can
    do what its writer could."""
    needed = [TASK_PRIVILEGED] if privileged else []
    return needed + [f"{SECRET_USE}:{name}" for name in sorted(set(secrets))] + list(reads)


def valid_permission(permission: str) -> bool:
    """Whether a credential may list `permission`: `*`, a domain permission, `tool.call:<tool>`
    or `secret.use:<secret>`, the last two also as a prefix pattern ending in `*`."""
    if permission == "*" or permission in DOMAIN_PERMISSIONS:
        return True
    family, sep, rest = permission.partition(":")
    if not sep or family not in ("tool.call", SECRET_USE) or not rest:
        return False
    return "*" not in rest[:-1]


def parse_token(token: str) -> tuple[str, str] | None:
    """Split `qle_<id>_<secret>`; None when it is not shaped like a token."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
        return None
    parts = token[len(TOKEN_PREFIX) :].split("_", 1)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def token_digest(pepper: bytes, secret: str) -> bytes:
    return hmac_sha256(pepper, secret.encode())


def digest_matches(expected: bytes, pepper: bytes, secret: str) -> bool:
    return digests_equal(expected, token_digest(pepper, secret))


# -- audit ---------------------------------------------------------------------------


class AuditRecord(msgspec.Struct, rename="camel"):
    """One security audit row: every tool call leaves one, allowed or not."""

    at_ms: int
    project_id: str
    principal: str
    tool: str
    outcome: Outcome
    reasons: list[str]
    transport: str
    request_id: str | None = None


class AuditEntry(AuditRecord, rename="camel", kw_only=True):
    """An audit row as read back: the record and its id (its place in the log)."""

    id: int


def tool_reason(tool_name: str) -> str:
    """`qinglong.task.list` → `tool_qinglong_task_list`."""
    return "tool_" + "".join(c if c.isalnum() else "_" for c in tool_name)
