"""Principals, roles, permissions, credentials and the audit record of every call.
Permission checks fail closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
from functools import lru_cache
from typing import Any, Literal, Protocol

import msgspec

from edge.core.errors import ToolError
from edge.core.ids import digests_equal, hmac_sha256



class Later(Protocol):
    """What the tallies need of the loop's timers (edge.core.ports.runtime.Timers has it);
    spelled here so that this module, which the ports import, imports no port."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> object:
        """Run `callback` once, on the loop, after at least `delay_s` seconds."""
        ...


class Spawner(Protocol):
    """What the tallies need of edge.core.handoff.Background: tasks kept alive until done."""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str | None = None) -> object:
        """Run `coro` as a task that is referenced until it finishes; its failure is logged."""
        ...

    async def wait(self) -> None:
        """Until every task has finished."""
        ...

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


class AuditEntry(AuditRecord, rename="camel", kw_only=True):
    """An audit row as read back: the record and its id (its place in the log). A row of
    refused calls counts every such call of its principal, cause, outcome, transport and
    minute: `at_ms` is the first, `last_at_ms` the last; with more than one tool among them
    it names none (`*`), and it names no request."""

    id: int
    count: int = 1
    last_at_ms: int | None = None


AuditClass = Literal["call", "change", "refused"]
MINUTE_MS = 60_000  # refused calls of one minute share a row
FLUSH_S = 2.0  # how long counts of refused calls may wait in memory
MAX_PENDING = 256  # aggregate rows counted in memory at once; more are written at once
_TallyKey = tuple[str, str, str, str, str, int]  # project, principal, outcome, cause, transport, minute
TallyUpdate = tuple[int, int, int, bool, str]  # row id, calls to add, last call's time, several tools, cause


class AuditBounds(msgspec.Struct, frozen=True, kw_only=True):
    """Rows kept per class of the audit, and the age beyond which any row goes: allowed
    calls, allowed changes of credentials and secrets, aggregates of refused calls."""

    calls: int = 10_000
    changes: int = 1_000
    refused: int = 1_000
    max_age_days: int = 30

    def rows(self, cls: AuditClass) -> int:
        return self.calls if cls == "call" else self.changes if cls == "change" else self.refused

    @property
    def max_age_ms(self) -> int:
        return self.max_age_days * 86_400_000


def audit_class(record: AuditRecord) -> AuditClass:
    if record.outcome != "allowed":
        return "refused"
    return "change" if record.change else "call"


class _Tally:
    """An aggregate row of refused calls: where it is, and what is not written yet."""

    __slots__ = ("record", "row_id", "placed", "count", "first_at_ms", "last_at_ms", "mixed")

    def __init__(self, record: AuditRecord) -> None:
        self.record = record  # its first call
        self.row_id: int | None = None  # None: being written, or placed where it cannot be added to
        self.placed = False  # its first call is written (in the database, or a spool)
        self.count = 0  # calls counted since
        self.first_at_ms = record.at_ms  # the first of those (once there are some)
        self.last_at_ms = record.at_ms
        self.mixed = False  # calls of more than one tool: the row names none

    @property
    def cause(self) -> str:
        return self.record.reasons[0] if self.record.reasons else ""

    def aggregate(self) -> AuditRecord:
        """The row that holds the counted calls, when they cannot be added to the first's."""
        r = self.record
        return AuditRecord(at_ms=self.first_at_ms, project_id=r.project_id, principal=r.principal,
                           tool="*" if self.mixed else r.tool, outcome=r.outcome,
                           reasons=[self.cause] if self.mixed else r.reasons, transport=r.transport)


class RefusalTallies:
    """Refused calls (denied, unauthenticated), aggregated for the audit log of either
    backend: one row per project, principal, cause (the first reason), outcome, transport
    and minute, with a count and its first and last time. Nothing runs for a refused call,
    so only the first of a row is written before the caller is answered; the calls after it
    are counted here and added at most `FLUSH_S` later, all rows in one write. A flood of
    refused calls thus writes a few rows a minute.

    The backend supplies `insert(record, count, last_at_ms)`, which writes a row durably and
    returns its id, or None when the row went where it cannot be added to (a spool while the
    database is unreachable); and `add(updates)`, which adds counts to rows in one write.
    Counts for a row that cannot be added to become a row of their own once its minute is
    over (or at close). Both raise ToolError when they cannot write; counts are kept then.
    """

    def __init__(
        self, insert: Callable[[AuditRecord, int, int], Awaitable[int | None]],
        add: Callable[[list[TallyUpdate]], Awaitable[None]], timers: Later | None, background: Spawner,
    ) -> None:
        self._insert = insert
        self._add = add
        self._timers = timers
        self._tallies: dict[_TallyKey, _Tally] = {}
        self._armed = False
        self._background = background

    async def append(self, record: AuditRecord) -> None:
        cause = record.reasons[0] if record.reasons else ""
        key = (record.project_id, record.principal, record.outcome, cause, record.transport, record.at_ms // MINUTE_MS)
        tally = self._tallies.get(key)
        if tally is not None:  # counted now, written with the next flush
            if not tally.count:
                tally.first_at_ms = record.at_ms
            tally.count += 1
            tally.last_at_ms = max(tally.last_at_ms, record.at_ms)
            tally.mixed = tally.mixed or record.tool != tally.record.tool
            self._arm()
            return
        if len(self._tallies) >= MAX_PENDING:
            await self.flush(everything=True)
            self._tallies = {k: t for k, t in self._tallies.items() if not t.placed}
        tally = self._tallies[key] = _Tally(record)
        try:
            tally.row_id = await self._insert(record, 1, record.at_ms)
        except BaseException:
            if self._tallies.get(key) is tally:
                del self._tallies[key]
            raise
        tally.placed = True

    def _arm(self) -> None:
        if self._armed or self._timers is None:
            return
        self._armed = True
        self._timers.call_later(FLUSH_S, self._flush_later)

    def _flush_later(self) -> None:
        self._background.spawn(self._timed_flush(), "audit flush")

    async def _timed_flush(self) -> None:
        try:
            await self.flush()
        except ToolError:  # logged by the store; the counts wait for the next flush
            self._arm()

    async def flush(self, everything: bool = False) -> None:
        """Write the counts held in memory; forget rows of past minutes. Counts for a row
        that cannot be added to wait for the end of its minute, unless `everything`."""
        self._armed = False
        current = max((key[5] for key in self._tallies), default=0)
        updates: list[TallyUpdate] = []
        taken: list[tuple[_Tally, int]] = []
        apart: list[_Tally] = []
        for key, t in self._tallies.items():
            if not t.count:
                continue
            if t.row_id is not None:
                updates.append((t.row_id, t.count, t.last_at_ms, t.mixed, t.cause))
                taken.append((t, t.count))
                t.count = 0
            elif t.placed and (everything or key[5] < current):
                apart.append(t)
        if updates:
            try:
                await self._add(updates)
            except BaseException:
                for t, count in taken:  # not written: counted again with the next flush
                    t.count += count
                raise
        for t in apart:
            count, t.count = t.count, 0
            try:
                t.row_id = await self._insert(t.aggregate(), count, t.last_at_ms)
            except BaseException:
                t.count += count
                raise
        for key in [k for k, t in self._tallies.items() if k[5] < current and t.placed and not t.count]:
            del self._tallies[key]
        if any(t.count for t in self._tallies.values()):
            self._arm()  # what waits for the end of its minute

    async def close(self) -> None:
        """Write everything held in memory (at stop). Counts that cannot be added to their
        rows become rows of their own (which a spool may take)."""
        await self._background.wait()
        try:
            await self.flush(everything=True)
        except ToolError:
            for t in self._tallies.values():
                if t.count and t.row_id is not None:
                    t.row_id = None
            await self.flush(everything=True)


@lru_cache(maxsize=512)  # the tools called are few; made up names only pass through
def tool_reason(tool_name: str) -> str:
    """`qinglong.task.list` → `tool_qinglong_task_list`."""
    return "tool_" + "".join(c if c.isalnum() else "_" for c in tool_name)
