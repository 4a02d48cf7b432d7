"""Credentials, secrets and the security audit, once for both backends: only an HMAC digest
of a credential's secret is stored; secret values are readable only by the runner and
redaction; the audit is bounded on write (rows and age) per class, never by a sweeper.
Implements CredentialStore, SecretStore, AuditLog and AuditReader (edge.core.ports.stores).

The audit's three classes are bounded separately: allowed calls (`call`), allowed changes
of credentials and secrets (`change`), and refused calls (`refused`: denied or
unauthenticated), aggregated by edge.core.auth.RefusalTallies into a few rows a minute. No
volume of one class can push out the rows of another.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from edge.core.auth import (
    AuditBounds,
    AuditClass,
    AuditEntry,
    AuditRecord,
    Credential,
    RefusalTallies,
    SecretInfo,
    TallyUpdate,
    audit_class,
)
from edge.core.errors import conflict
from edge.core.handoff import Background
from edge.core.ports.stores import AuditPage, AuditTicket
from edge.core.reads import SEARCH_BUDGET
from edge.core.tasks import SecretImport
from edge.storage.tx import NO_ROW, Db, Row, Tx, one_statement

if TYPE_CHECKING:
    from edge.core.ports.runtime import Timers

log = logging.getLogger("qledge.store")

PRUNE_BATCH = 64  # audit rows one write may delete: bounded cost per call, converges over calls


class SecuritySql(msgspec.Struct, frozen=True, kw_only=True):
    """The statements of this module, in a backend's dialect."""

    credential_insert: str  # ON CONFLICT DO NOTHING
    credential_get: str
    credentials: str
    credential_revoke: str  # RETURNING the row
    secret_set: str  # an upsert RETURNING created_at_ms, updated_at_ms
    secret_insert: str  # ON CONFLICT DO NOTHING
    secret_exists: str
    secret_value: str
    secret_names: str
    secret_values: str
    secret_delete: str
    import_exists: str
    import_claim: str  # ON CONFLICT DO NOTHING
    import_drop: str
    audit_insert: str  # named parameters (the backends' columns differ), RETURNING id (but audit_insert_id)
    audit_oldest_call: str
    audit_prune_calls: str
    audit_count: str  # {cls}: a literal class, so that its partial index serves it
    audit_prune: str  # {cls}
    audit_add: str
    audit_page: str
    # Over a bound, the oldest go down to the bound less this (at most a quarter of it) at
    # once: deleting one row per call rebalances a B-tree's oldest pages on every call
    # (about two more pages written per call, on flash).
    audit_trim: int
    # Allowed calls are trimmed on every this many of them (the check itself reads the
    # oldest batch of calls), as if that many more were there already, so the bound holds
    # between checks too. 1: on every one (several nodes write one audit).
    audit_trim_every: int
    # audit_insert takes its values by position (`?`), in the order of POSITIONAL_ORDER:
    # binding a dozen values by name costs a driver that looks each name up in the mapping
    # about as much as the insert itself. False: by name.
    audit_by_position: bool = False
    # audit_insert without RETURNING (by position too), for a call's row whose id nothing reads.
    audit_insert_call: str = ""
    # Where set, audit_insert returns nothing and this reads the new row's id after it (SQLite:
    # RETURNING gathers its rows in a temporary B-tree made at every execution).
    audit_insert_id: str = ""


# -- credentials --------------------------------------------------------------------

_perm_encoder = msgspec.json.Encoder()
_perm_decoder = msgspec.json.Decoder(list[str] | None)


def _credential(row: Row) -> Credential:
    cid, project, name, role, perms, created, revoked = row
    return Credential(id=cid, project_id=project, name=name, role=role,
                      permissions=_perm_decoder.decode(perms) if perms else None,
                      created_at_ms=created, revoked_at_ms=revoked)


def create_credential(tx: Tx, q: SecuritySql, cred: Credential, digest: bytes) -> None:
    perms = _perm_encoder.encode(cred.permissions).decode() if cred.permissions is not None else None
    if not tx.execute(q.credential_insert,
                      (cred.id, cred.project_id, cred.name, cred.role, perms, cred.created_at_ms, None, digest)):
        raise conflict("credential id collision; try again")


def lookup_credential(tx: Tx, q: SecuritySql, credential_id: str) -> tuple[Credential, bytes] | None:
    row = tx.row(q.credential_get, (credential_id,))
    return (_credential(row[:-1]), bytes(row[-1])) if row else None


def credentials(tx: Tx, q: SecuritySql, project: str) -> list[Credential]:
    return [_credential(r) for r in tx.rows(q.credentials, (project,))]


def revoke_credential(tx: Tx, q: SecuritySql, project: str, credential_id: str, now: int) -> Credential | None:
    row = tx.row(q.credential_revoke, (now, credential_id, project))
    return _credential(row) if row else None


class SqlCredentialStore:
    """CredentialStore on `db`, in its dialect `q`."""

    def __init__(self, db: Db, q: SecuritySql) -> None:
        self._db = db
        self._q = q

    async def create(self, credential: Credential, digest: bytes) -> None:
        await self._db.write(create_credential, self._q, credential, digest)

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None:
        return await self._db.read(lookup_credential, self._q, credential_id)

    async def for_project(self, project: str) -> list[Credential]:
        return await self._db.read(credentials, self._q, project)

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None:
        return await self._db.write(revoke_credential, self._q, project, credential_id, now_ms)


# -- secrets ------------------------------------------------------------------------


def set_secret(tx: Tx, q: SecuritySql, project: str, name: str, value: str, now: int) -> SecretInfo:
    created, updated = tx.one(q.secret_set, (project, name, value, now, now))
    return SecretInfo(name=name, created_at_ms=created, updated_at_ms=updated)


def import_secret(tx: Tx, q: SecuritySql, project: str, key: str, name: str, value: str, now: int) -> SecretImport:
    """Store the secret under its import key, unless the key is on record (`exists`) or a
    secret of that name is there already (`taken`: never replaced by an import). Read
    first, so that nothing is written for either; then the record is claimed before the
    secret: a second node importing the same key waits on its primary key."""
    if tx.row(q.import_exists, (project, key)):
        return "exists"
    if tx.row(q.secret_exists, (project, name)):
        return "taken"
    if not tx.execute(q.import_claim, (project, key, "secret", name, now)):
        return "exists"
    if not tx.execute(q.secret_insert, (project, name, value, now, now)):
        tx.execute(q.import_drop, (project, key))
        return "taken"
    return "created"


def secrets(tx: Tx, q: SecuritySql, project: str) -> list[SecretInfo]:
    return [SecretInfo(name=n, created_at_ms=c, updated_at_ms=u) for n, c, u in tx.rows(q.secret_names, (project,))]


def delete_secret(tx: Tx, q: SecuritySql, project: str, name: str) -> bool:
    return tx.execute(q.secret_delete, (project, name)) > 0


def resolve_secrets(tx: Tx, q: SecuritySql, project: str, names: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in names:
        row = tx.row(q.secret_value, (project, name))
        if row is not None:
            found[name] = row[0]
    return found


def secret_values(tx: Tx, q: SecuritySql, project: str) -> list[str]:
    return [v for (v,) in tx.rows(q.secret_values, (project,))]


class SqlSecretStore:
    """SecretStore on `db`, in its dialect `q`."""

    def __init__(self, db: Db, q: SecuritySql) -> None:
        self._db = db
        self._q = q

    async def set(self, project: str, name: str, value: str, now_ms: int) -> SecretInfo:
        return await self._db.write(set_secret, self._q, project, name, value, now_ms)

    async def import_secret(self, project: str, key: str, name: str, value: str, now_ms: int) -> SecretImport:
        return await self._db.write(import_secret, self._q, project, key, name, value, now_ms)

    async def for_project(self, project: str) -> list[SecretInfo]:
        return await self._db.read(secrets, self._q, project)

    async def delete(self, project: str, name: str) -> bool:
        return await self._db.write(delete_secret, self._q, project, name)

    async def resolve(self, project: str, names: list[str]) -> dict[str, str]:
        return await self._db.read(resolve_secrets, self._q, project, names)

    async def values(self, project: str) -> list[str]:
        return await self._db.read(secret_values, self._q, project)


# -- the security audit ---------------------------------------------------------------

_reasons = msgspec.json.Encoder()
_reasons_decoder = msgspec.json.Decoder(list[str])


def trim_audit(
    tx: Tx, q: SecuritySql, cls: AuditClass, newest: int, max_rows: int, min_at_ms: int, ahead: int = 0,
) -> None:
    """Allowed calls are the bulk: the oldest batch of them by id (only the rows of the small
    classes are passed over on the way), those up to the cut or too old; between those ids
    lie rows of the other classes too, so at most `max_rows` calls are kept, `ahead` more
    calls included (those written before the next check). A small class is counted exactly:
    over its bound, the first of its oldest batch go, and any whose last call is older than
    the age bound."""
    trim = min(q.audit_trim, max_rows // 4)
    if cls == "call":
        cut = newest + ahead - max_rows
        if trim:
            oldest = tx.row(q.audit_oldest_call)
            cut = cut + trim if oldest is not None and oldest[0] <= cut else 0
        tx.execute(q.audit_prune_calls, (PRUNE_BATCH, cut, min_at_ms))
        return
    excess = int(tx.one(q.audit_count.format(cls=cls))[0]) - max_rows
    tx.execute(q.audit_prune.format(cls=cls), (PRUNE_BATCH, excess + trim if excess > 0 else 0, min_at_ms))


def _insert(
    tx: Tx, q: SecuritySql, record: AuditRecord, cls: AuditClass, count: int, last_at_ms: int | None, node: str | None,
) -> int:
    if q.audit_by_position:
        if q.audit_insert_id:
            tx.execute(q.audit_insert, _positional(record, cls, count, last_at_ms))
            (row_id,) = tx.one(q.audit_insert_id)
        else:
            (row_id,) = tx.one(q.audit_insert, _positional(record, cls, count, last_at_ms))
        return int(row_id)
    params = {
        "at_ms": record.at_ms, "project_id": record.project_id, "principal": record.principal, "tool": record.tool,
        "outcome": record.outcome, "reasons": _reasons.encode(record.reasons).decode(),
        "transport": record.transport, "request_id": record.request_id, "class": cls, "count": count,
        "last_at_ms": last_at_ms if cls == "refused" else None, "node_id": node}
    (row_id,) = tx.one(q.audit_insert, params)
    return int(row_id)


def _positional(record: AuditRecord, cls: AuditClass, count: int, last_at_ms: int | None) -> tuple[object, ...]:
    """audit_insert's values by position (POSITIONAL_ORDER; a dialect by position has no node column)."""
    return (record.at_ms, record.project_id, record.principal, record.tool, record.outcome,
            _reasons.encode(record.reasons).decode(), record.transport, record.request_id, cls, count,
            last_at_ms if cls == "refused" else None)


# The columns of a dialect's audit_insert by position, in the order _positional gives them.
POSITIONAL_ORDER = ("at_ms", "project_id", "principal", "tool", "outcome", "reasons", "transport", "request_id",
                    "class", "count", "last_at_ms")


@one_statement
def insert_call(tx: Tx, q: SecuritySql, record: AuditRecord, node: str | None) -> None:
    """An allowed call's row alone, between the checks that trim (`append_audit`); where
    the dialect has a statement for it (audit_insert_call), without reading its id back."""
    if q.audit_insert_call:
        tx.execute(q.audit_insert_call, _positional(record, "call", 1, None))
    else:
        _insert(tx, q, record, "call", 1, None, node)


def append_audit(
    tx: Tx, q: SecuritySql, record: AuditRecord, count: int, last_at_ms: int | None, bounds: AuditBounds,
    node: str | None, check: bool = True, ahead: int = 0,
) -> int:
    """Insert one row (`node`: the node that answered, on a cluster) and trim its class (a
    little per write, until its bounds hold); allowed calls only when `check`, keeping room
    for the `ahead` written before the next check. Its id."""
    cls = audit_class(record)
    row_id = _insert(tx, q, record, cls, count, last_at_ms, node)
    if cls != "call":
        trim_audit(tx, q, cls, row_id, bounds.rows(cls), record.at_ms - bounds.max_age_ms)
    elif check:
        trim_audit(tx, q, cls, row_id, bounds.rows(cls), record.at_ms - bounds.max_age_ms, ahead)
    return int(row_id)


class _Written:
    """An AuditTicket for a row written already."""

    __slots__ = ()

    async def committed(self) -> None:
        return None


_WRITTEN = _Written()


def add_counts(tx: Tx, q: SecuritySql, updates: list[TallyUpdate]) -> None:
    for row_id, count, last_at, mixed, cause in updates:
        tx.execute(q.audit_add, (count, last_at, mixed, mixed, _reasons.encode([cause]).decode(), row_id))


class SqlAuditLog:
    """AuditLog on `db`, in its dialect `q`; `node`: the node whose answers it records."""

    def __init__(self, db: Db, q: SecuritySql, bounds: AuditBounds | None = None, timers: Timers | None = None,
                 node: str | None = None) -> None:
        self._db = db
        self._q = q
        self._node = node
        self._bounds = bounds or AuditBounds()
        self._calls = 0  # allowed calls written: every `_every`-th trims, keeping room for the rest
        # At most a quarter of the bound between checks, so a check never reaches the newest rows.
        self._every = max(1, min(q.audit_trim_every, self._bounds.calls // 4))
        self._tallies = RefusalTallies(self._write, self._add, timers, Background(log))

    async def append(self, record: AuditRecord) -> None:
        if audit_class(record) == "refused":
            return await self._tallies.append(record)
        await self._write(record, 1, None)

    async def ahead(self, record: AuditRecord) -> AuditTicket:
        """An allowed call's row rides on the database's next hop where it can (SQLite's
        worker: the row's transaction, then the read, in one hop); written now elsewhere."""
        if audit_class(record) == "call":
            ride: AuditTicket | None
            if self._calls % self._every == 0:  # this one trims
                ride = self._db.ride(append_audit, self._q, record, 1, None, self._bounds, self._node, True,
                                     self._every - 1)
            else:
                ride = self._db.ride(insert_call, self._q, record, self._node)
            if ride is not None:
                self._calls += 1
                return ride
        await self.append(record)
        return _WRITTEN

    async def before_change(self, record: AuditRecord) -> AuditTicket:
        await self.append(record)
        return _WRITTEN

    def _check(self) -> bool:
        """Whether this allowed call's write trims (every `_every`-th, the first included)."""
        due = self._calls % self._every == 0
        self._calls += 1
        return due

    async def _write(self, record: AuditRecord, count: int, last_at_ms: int | None) -> int | None:
        """The row's id (None: it went where it cannot be added to)."""
        check = self._check() if audit_class(record) == "call" else True
        return await self._db.write(append_audit, self._q, record, count, last_at_ms, self._bounds, self._node, check,
                                    self._every - 1)

    async def _add(self, updates: list[TallyUpdate]) -> None:
        await self._db.write(add_counts, self._q, updates)

    async def flush(self) -> None:
        await self._tallies.flush()

    async def close(self) -> None:
        await self._tallies.close()


def _entry(row: Row) -> AuditEntry:
    rid, at, proj, principal, tool, outcome, reasons, transport, request_id, cls, count, last = row
    return AuditEntry(
        id=rid, at_ms=at, project_id=proj, principal=principal, tool=tool, outcome=outcome,
        reasons=_reasons_decoder.decode(reasons), transport=transport, request_id=request_id,
        change=cls == "change", count=int(count), last_at_ms=last)


def audit_page(
    tx: Tx, q: SecuritySql, project: str, since_ms: int | None, before_id: int | None, limit: int, budget: int,
) -> AuditPage:
    """Newest first along the row id (insertion order): no index of its own, so an audited
    call writes no more than before; `since` is checked on each row (an aggregate's last
    call), within the page's budget."""
    entries: list[AuditEntry] = []
    scanned, last = 0, None
    for row in tx.each(q.audit_page, (NO_ROW if before_id is None else before_id, project, budget)):
        scanned, last = scanned + 1, row[0]
        if since_ms is not None and (row[11] or row[1]) < since_ms:
            continue
        if len(entries) == limit:
            return AuditPage(entries=entries, next=entries[-1].id)
        entries.append(_entry(row))
    return AuditPage(entries=entries, next=last if scanned == budget else None)


class SqlAuditReader:
    """AuditReader on `db`, in its dialect `q`."""

    def __init__(self, db: Db, q: SecuritySql, budget: int = SEARCH_BUDGET) -> None:
        self._db = db
        self._q = q
        self._budget = budget

    async def page(self, project: str, since_ms: int | None, before_id: int | None, limit: int) -> AuditPage:
        return await self._db.read(audit_page, self._q, project, since_ms, before_id, limit, self._budget)
