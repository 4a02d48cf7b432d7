"""The credentials of AI runs: minted when a run's child starts, for that run alone, revoked
when it is gone; kept in the daemon's memory only."""

from __future__ import annotations

import os

from edge.core.auth import TOKEN_PREFIX, Grant, Principal, token_digest


class RunCredentialRegistry:
    """RunCredentials (edge.core.ports.agent): tokens minted for one run each, kept in
    memory only (their HMAC digest, as for stored credentials). Nothing is written, so no
    credential of a run outlives the daemon, and nothing is left to revoke after a crash."""

    def __init__(self, pepper: bytes) -> None:
        self._pepper = pepper
        self._live: dict[str, tuple[bytes, Principal]] = {}  # credential id -> (digest, principal)

    def mint(self, run_id: str, permissions: frozenset[str]) -> str:
        self.revoke(run_id)  # one live credential per run
        cid = "r" + os.urandom(10).hex()  # never the 12 hex digits of a stored credential's id
        secret = os.urandom(20).hex()
        principal = Principal(subject=f"agent:{run_id}", role="viewer", permissions=Grant(permissions),
                              credential_id=cid, run_id=run_id)
        self._live[cid] = (token_digest(self._pepper, secret), principal)
        return f"{TOKEN_PREFIX}{cid}_{secret}"

    def revoke(self, run_id: str) -> bool:
        gone = [cid for cid, (_, p) in self._live.items() if p.run_id == run_id]
        for cid in gone:
            del self._live[cid]
        return bool(gone)

    def lookup(self, credential_id: str) -> tuple[bytes, Principal] | None:
        return self._live.get(credential_id)
