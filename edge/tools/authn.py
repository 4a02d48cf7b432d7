"""Authentication: an API credential token, or the socket peer's uid for owners."""

from __future__ import annotations

from collections.abc import Iterable

from edge.core.auth import Principal, allows, digest_matches, parse_token, role_permissions
from edge.core.ports.stores import CredentialStore
from edge.tools.context import Caller


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
    ) -> None:
        self._credentials = credentials
        self._pepper = pepper
        self._owner_uids = frozenset(owner_uids)
        self._project = project
        self._roles = {role: role_permissions(role, read_tools) for role in ("owner", "operator", "viewer")}

    async def authenticate(self, caller: Caller) -> Principal:
        if caller.token is not None:
            return await self._from_token(caller.token)
        if caller.peer_uid is not None and caller.peer_uid in self._owner_uids:
            return Principal(subject=f"uid:{caller.peer_uid}", role="owner", permissions=self._roles["owner"])
        subject = f"uid:{caller.peer_uid}" if caller.peer_uid is not None else "anonymous"
        raise AuthFailure("credential_missing", subject)

    async def _from_token(self, token: str) -> Principal:
        parsed = parse_token(token)
        if parsed is None:
            raise AuthFailure("credential_malformed", "anonymous")
        cid, secret = parsed
        subject = f"credential:{cid}" if len(cid) <= 32 and cid.isalnum() else "anonymous"
        found = await self._credentials.lookup(cid)
        if found is None:
            raise AuthFailure("credential_unknown", subject)
        cred, digest = found
        if not digest_matches(digest, self._pepper, secret):
            raise AuthFailure("credential_mismatch", subject)
        if cred.revoked_at_ms is not None:
            raise AuthFailure("credential_revoked", subject)
        if cred.project_id != self._project:
            raise AuthFailure("credential_other_project", subject)
        granted = self._roles.get(cred.role, frozenset())
        if cred.permissions is not None:
            # An explicit list narrows the role; it can never widen it.
            granted = frozenset(p for p in cred.permissions if allows(granted, p))
        return Principal(subject=subject, role=cred.role, permissions=granted, credential_id=cid)

    async def still_valid(self, principal: Principal) -> bool:
        """The chain's last step: a credential revoked since authentication fails here."""
        if principal.credential_id is None:
            return True
        found = await self._credentials.lookup(principal.credential_id)
        return found is not None and found[0].revoked_at_ms is None

