"""The per-call security chain, identical for every transport, and its first step,
authentication (an API credential token, or the socket peer's uid for owners).

authenticate → policy `tool.call:<name>` → domain permissions → durable audit →
confirm the credential is still valid → execute under the tool's deadline.
Nothing executes unless the allowed-audit row was written; a read's row is written in the
same worker hop as its first read, and nothing it read is answered before the row is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from edge.core.auth import (
    CHANGE_PERMISSIONS,
    AuditRecord,
    Grant,
    Outcome,
    Principal,
    digest_matches,
    first_missing,
    missing_permission,
    parse_token,
    role_permissions,
    tool_reason,
)
from edge.core.errors import ToolError, invalid
from edge.core.ports.stores import AuditTicket, CredentialStore
from edge.tools.context import Caller, Services, ToolContext
from edge.tools.definition import Entry, Registry

if TYPE_CHECKING:
    from edge.core.ports.agent import RunCredentials

log = logging.getLogger("qledge.tools")

_NOT_AUDITED = "the security audit could not be written; nothing was done"
_CHECKED_MAX = 4096  # remembered permission checks (Chain._missing); beyond it they start afresh


class AuthFailure(Exception):
    def __init__(self, reason: str, subject: str) -> None:
        super().__init__(reason)
        self.reason = reason  # stable audit reason, e.g. "credential_revoked"
        self.subject = subject


class Authenticator:
    def __init__(
        self,
        credentials: CredentialStore,
        pepper: bytes,
        owner_uids: Iterable[int],
        project: str,
        read_tools: Iterable[str],
        run_credentials: RunCredentials | None = None,
    ) -> None:
        self._credentials = credentials
        self._pepper = pepper
        self._owner_uids = frozenset(owner_uids)
        self._project = project
        self._read_tools = list(read_tools)
        self._roles = {role: role_permissions(role, self._read_tools) for role in ("owner", "operator", "viewer")}
        self._runs = run_credentials
        # An owner is who its uid is, by configuration: one Principal per owner uid.
        self._owners = {uid: Principal(subject=f"uid:{uid}", role="owner", permissions=Grant(self._roles["owner"]))
                        for uid in self._owner_uids}

    def owner(self, caller: Caller) -> Principal | None:
        """An owner by its uid (no token): who it is needs no lookup. None: `authenticate`."""
        if caller.token is None and caller.peer_uid is not None:
            return self._owners.get(caller.peer_uid)
        return None

    async def authenticate(self, caller: Caller) -> Principal:
        # A refusal names the peer, or a credential that exists: never an id the caller
        # made up, so a flood of invented ids cannot spread over many audit rows.
        owner = self.owner(caller)
        if owner is not None:
            return owner
        peer = f"uid:{caller.peer_uid}" if caller.peer_uid is not None else "anonymous"
        if caller.token is not None:
            return await self._from_token(caller.token, peer)
        raise AuthFailure("credential_missing", peer)

    async def _from_token(self, token: str, peer: str) -> Principal:
        parsed = parse_token(token)
        if parsed is None:
            raise AuthFailure("credential_malformed", peer)
        cid, secret = parsed
        minted = self._runs.lookup(cid) if self._runs is not None else None
        if minted is not None:
            if not digest_matches(minted[0], self._pepper, secret):
                raise AuthFailure("credential_mismatch", minted[1].subject)
            return minted[1]
        found = await self._credentials.lookup(cid) if len(cid) <= 32 and cid.isalnum() else None
        if found is None:
            raise AuthFailure("credential_unknown", peer)
        subject = f"credential:{cid}"
        cred, digest = found
        if not digest_matches(digest, self._pepper, secret):
            raise AuthFailure("credential_mismatch", subject)
        if cred.revoked_at_ms is not None:
            raise AuthFailure("credential_revoked", subject)
        if cred.project_id != self._project:
            raise AuthFailure("credential_other_project", subject)
        if cred.permissions is None:
            grant = Grant(self._roles.get(cred.role, frozenset()))
        else:
            # An explicit list narrows the role; it widens it only by what the role may be
            # given by name (an operator's task.privileged, secret.use[:name]).
            role = role_permissions(cred.role, self._read_tools, cred.permissions)
            grant = Grant(role, frozenset(cred.permissions))
        return Principal(subject=subject, role=cred.role, permissions=grant, credential_id=cid)

    async def still_valid(self, principal: Principal) -> bool:
        """The chain's last step: a credential revoked since authentication fails here."""
        if principal.credential_id is None:
            return True
        if principal.run_id is not None:
            return self._runs is not None and self._runs.lookup(principal.credential_id) is not None
        found = await self._credentials.lookup(principal.credential_id)
        return found is not None and found[0].revoked_at_ms is None


class Chain:
    def __init__(self, registry: Registry, auth: Authenticator, services: Services) -> None:
        self.registry = registry
        self._auth = auth
        self._services = services
        self._deadlines = _Deadlines()
        self._checked: dict[tuple[Grant, Entry], str | None] = {}

    async def call(self, name: str, raw_args: bytes, fmt: str, caller: Caller) -> Any:
        """Run one call through the chain; returns the result Struct or raises ToolError.

        `name` may pin a version, `name@version`: a caller written against one version of a
        tool is refused rather than silently given another.
        """
        name, _, version = name.partition("@")
        reason = tool_reason(name)
        principal = self._auth.owner(caller) or await self.authenticate(caller, name, reason)
        entry = self.registry.get(name)
        if entry is None:
            await self._audit(principal.subject, name, "denied", ["tool_unknown", reason], caller)
            raise invalid(f"unknown tool {name!r}")
        if version and version != entry.tool.version:
            await self._audit(principal.subject, name, "denied", ["tool_version_mismatch", reason], caller)
            raise invalid(f"{name} is at version {entry.tool.version}, not {version}")
        missing = self._missing(principal.permissions, entry)
        if missing is not None:
            why = "tool_policy_denied" if missing.startswith("tool.call:") else "domain_permission_denied"
            await self._audit(principal.subject, name, "denied", [why, reason], caller)
            raise ToolError("permission_denied", f"{name} requires permission {_grantable(principal, entry, missing)}")
        allowed = ["tool_invocation_allowed", reason]
        # A read's row rides ahead of its first storage work (one worker hop for both on
        # SQLite); a change's is durable before its first change (AuditLog.before_change).
        # Either way nothing the call did or read, not even an error, leaves before the row
        # is durable.
        audit = self._services.audit
        if entry.tool.effect == "read":
            sent = audit.ahead(self._record(principal.subject, name, "allowed", allowed, caller))
        else:
            change = not CHANGE_PERMISSIONS.isdisjoint(entry.tool.permissions)
            sent = audit.before_change(self._record(principal.subject, name, "allowed", allowed, caller, change))
        try:
            ticket = await sent
        except ToolError as exc:
            raise ToolError("unavailable", _NOT_AUDITED) from exc
        try:
            result = await self._checked_run(entry, raw_args, fmt, principal, caller, reason)
        except ToolError:
            await self._committed(ticket)
            raise
        await self._committed(ticket)
        return result

    async def _checked_run(
        self, entry: Entry, raw_args: bytes, fmt: str, principal: Principal, caller: Caller, reason: str,
    ) -> Any:
        """The credential checked again (revoked since authentication: refused), then the tool."""
        name = entry.tool.name
        if principal.credential_id is not None and not await self._auth.still_valid(principal):
            await self._audit(principal.subject, name, "unauthenticated", ["credential_revoked", reason], caller)
            raise ToolError("unauthenticated", "credential was revoked")
        try:
            return await self._execute(entry, raw_args, fmt, ToolContext(self._services, principal, caller))
        except ToolError as exc:
            if exc.code == "permission_denied":  # refused by what the call would do (ToolContext.may_run)
                await self._audit(principal.subject, name, "denied", ["domain_permission_denied", reason], caller)
            raise

    def _missing(self, grant: Grant, entry: Entry) -> str | None:
        """missing_permission, remembered per grant (its content) and tool: a connection's
        calls, and every owner's, ask the same again and again. A changed role or credential
        list is another grant, so nothing remembered outlives what it was worked out from."""
        key = (grant, entry)
        try:
            return self._checked[key]
        except KeyError:
            pass
        missing = missing_permission(grant, entry.tool.name, entry.tool.permissions)
        if len(self._checked) >= _CHECKED_MAX:
            self._checked.clear()
        self._checked[key] = missing
        return missing

    async def authenticate(self, caller: Caller, target: str, reason: str) -> Principal:
        """The chain's first step alone (a transport's session check uses it too); failures are audited.

        `target` is what the audit row names as its tool (a tool, or e.g. `mcp.session`).
        """
        try:
            return await self._auth.authenticate(caller)
        except AuthFailure as failure:
            await self._audit(failure.subject, target, "unauthenticated", [failure.reason, reason], caller)
            raise ToolError(
                "unauthenticated", "authentication required: invalid, revoked or missing credential") from None

    async def refuse(self, name: str, caller: Caller, why: str) -> None:
        """Audit a call the transport will not make (e.g. a tool it does not offer).

        Every call leaves a row, refused ones included; an unauthenticated caller's row
        says so. Raises ToolError("unavailable") only when the audit cannot be written.
        """
        reason = tool_reason(name)
        try:
            principal = await self.authenticate(caller, name, reason)
        except ToolError as exc:
            if exc.code == "unavailable":
                raise
            return
        await self._audit(principal.subject, name, "denied", [why, reason], caller)

    def _record(
        self, subject: str, tool: str, outcome: Outcome, reasons: list[str], caller: Caller, change: bool = False,
    ) -> AuditRecord:
        return AuditRecord(
            at_ms=self._services.clock.now_ms(),
            project_id=self._services.project,
            principal=subject,
            tool=tool[:128],
            outcome=outcome,
            reasons=reasons,
            transport=caller.transport,
            request_id=caller.request_id,
            change=change,
        )

    async def _audit(
        self, subject: str, tool: str, outcome: Outcome, reasons: list[str], caller: Caller, change: bool = False,
    ) -> None:
        try:
            await self._services.audit.append(self._record(subject, tool, outcome, reasons, caller, change))
        except ToolError as exc:
            raise ToolError("unavailable", _NOT_AUDITED) from exc

    async def _committed(self, ticket: AuditTicket) -> None:
        try:
            await ticket.committed()
        except ToolError as exc:
            raise ToolError("unavailable", _NOT_AUDITED) from exc

    async def _execute(self, entry: Entry, raw_args: bytes, fmt: str, ctx: ToolContext) -> Any:
        tool = entry.tool
        if tool.caller is not None:  # before its arguments: they are no business of a caller refused
            tool.caller(ctx)
        try:
            args = entry.decode_args(raw_args, fmt)
        except msgspec.ValidationError as exc:
            raise invalid(f"invalid arguments for {tool.name}: {exc}") from None
        except msgspec.DecodeError:
            raise invalid(f"arguments for {tool.name} could not be decoded") from None
        except RecursionError:  # hostile nesting: answered, never logged
            raise invalid(f"arguments for {tool.name} nest too deeply") from None
        call = self._deadlines.enter(tool.deadline_s)
        try:
            return await tool.handler(ctx, args)
        except ToolError:
            raise
        except asyncio.CancelledError:
            if not call.expired:
                raise
            raise ToolError("deadline_exceeded", f"{tool.name} did not finish within {tool.deadline_s:g}s") from None
        except TimeoutError:
            raise ToolError("deadline_exceeded", f"{tool.name} did not finish within {tool.deadline_s:g}s") from None
        except Exception:
            log.exception("tool %s failed", tool.name)
            raise ToolError("internal", f"{tool.name} failed unexpectedly; see the daemon log") from None
        finally:
            self._deadlines.leave(call)


class _Call:
    """A call under its deadline (`_Deadlines`)."""

    __slots__ = ("task", "at", "expired")

    def __init__(self, task: asyncio.Task[Any], at: float) -> None:
        self.task, self.at, self.expired = task, at, False


class _Deadlines:
    """The tools' deadlines on one loop timer instead of one per call. A call is entered
    with its task and deadline; the timer, armed for the soonest deadline entered, cancels
    the calls past theirs when it fires and is armed again for the soonest left. A stream
    of calls of the same deadline thus costs a set entry per call and a timer every few
    seconds (asyncio.timeout schedules and cancels a timer per call). The cancelled call
    sees CancelledError with `expired` set, as asyncio.timeout's would see TimeoutError."""

    def __init__(self) -> None:
        self._calls: set[_Call] = set()
        self._timer: asyncio.TimerHandle | None = None

    def enter(self, seconds: float) -> _Call:
        task = asyncio.current_task()
        assert task is not None  # a tool runs in a task
        loop = task.get_loop()
        call = _Call(task, loop.time() + seconds)
        self._calls.add(call)
        if self._timer is None or call.at < self._timer.when():
            self._arm(loop, call.at)
        return call

    def leave(self, call: _Call) -> None:
        self._calls.discard(call)
        if call.expired:
            call.task.uncancel()
        # The timer stays armed when the last call leaves: calls one after another then cost
        # no timer each (a handle made, pushed, cancelled and popped), only one every
        # deadline. It fires once more after the last of them, finds nothing and is not
        # armed again: an idle daemon keeps no timer (its wake-ups are budgeted).

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now, soonest = loop.time(), None
        for call in self._calls:
            if call.at <= now:
                if not call.expired:
                    call.expired = True
                    call.task.cancel()
            elif soonest is None or call.at < soonest:
                soonest = call.at
        if soonest is not None:
            self._arm(loop, soonest)


def _grantable(principal: Principal, entry: Entry, missing: str) -> str:
    """What a refusal names: the permission a person would grant (`task.write`) first, and the
    tool's policy (`tool.call:qledge.task.create`) beside it when that is missing too."""
    domain = first_missing(principal.permissions, entry.tool.permissions) if missing.startswith("tool.call:") else None
    return missing if domain is None else f"{domain} (and {missing}, the tool's policy)"
