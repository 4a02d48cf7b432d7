"""Assembly of a cluster node's adapters, for composition (edge.app.graph) only: open the
pool, migrate, sample PostgreSQL's clock, build every adapter of the storage ports and the
node's runtime pieces."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from edge.core.auth import AuditBounds
from edge.core.clock import LoopTimers
from edge.core.errors import ToolError
from edge.core.notices import Notices
from edge.core.reads import Counts
from edge.core.ports.runtime import RunController
from edge.core.ports.stores import RunLogFiles
from edge.core.runs import Followers
from edge.storage.postgres.db import PgDatabase
from edge.storage.postgres.claims import PgClaims, PgRunLogReader
from edge.storage.postgres.node import (
    ClusterRunner, DbClock, Node, NodeSettings, PgAdmission, PgNodes, PgRunStore, server_ms,
)
from edge.storage.postgres.notify import PgNotifyStore
from edge.storage.postgres.schema import migrate
from edge.storage.postgres.security import PgAuditLog
from edge.storage.postgres.sql import CATALOG, READS, SECURITY
from edge.storage.reads import SqlCountsReader, readers
from edge.storage.runs import Fences, Policy
from edge.storage.catalog import SqlTaskStore, SqlTriggerStore
from edge.storage.security import SqlAuditReader, SqlCredentialStore, SqlSecretStore

if TYPE_CHECKING:
    from edge.core.ports.agent import AgentRuns

__all__ = ["ClusterOptions", "NodeSettings", "Policy", "PgCluster", "open_cluster"]


class ClusterOptions(msgspec.Struct, frozen=True, kw_only=True):
    dsn: str
    node: NodeSettings
    capacity: int  # this node's slots plus the shared queue
    pool_size: int = 4
    connect_timeout_s: int = 5
    write_retry_s: float = 30.0
    audit: AuditBounds = msgspec.field(default_factory=AuditBounds)
    audit_spool: str | None = None  # where audit rows wait while PostgreSQL is unreachable


class PgCountsReader(SqlCountsReader):
    """Counts for `qledge status`; while PostgreSQL is unreachable, the last ones read (status
    must still answer, to say that it is unreachable)."""

    def __init__(self, db: PgDatabase) -> None:
        super().__init__(db, READS)
        self._pg = db
        self._last: dict[str, Counts] = {}

    async def counts(self, project: str) -> Counts:
        try:
            self._last[project] = await super().counts(project)
        except ToolError:
            if self._pg.down_since is None:
                raise
            return self._last.get(project) or Counts(0, 0, 0, 0, 0)
        return self._last[project]


class PgCluster:
    """Every PostgreSQL adapter of one node, on one pool."""

    def __init__(self, db: PgDatabase, options: ClusterOptions, policy: Policy, files: RunLogFiles,
                 clock: DbClock) -> None:
        node = options.node
        fences = Fences(node.node_id)
        self.followers = Followers()  # what a write set in motion: this node's scheduler and notifier
        self.db = db
        self.clock = clock
        self.settings = node
        self.location = f"postgresql {db.location}"
        self.tasks = SqlTaskStore(db, CATALOG, files)
        self.runs = PgRunStore(db, policy, files, self.followers, fences, options.write_retry_s, node.lease_s)
        self.triggers = SqlTriggerStore(db, CATALOG)
        self.admission = PgAdmission(db, options.capacity, node.node_id, node.slots, node.lease_s, self.followers)
        self._notify: PgNotifyStore | None = None
        self.credentials = SqlCredentialStore(db, SECURITY)
        self.secrets = SqlSecretStore(db, SECURITY)
        self.audit = PgAuditLog(db, node.node_id, options.audit, options.audit_spool, LoopTimers())
        self.audit_reader = SqlAuditReader(db, SECURITY)
        self.readers = readers(db, READS)
        self.counts = PgCountsReader(db)
        self.log_reader = PgRunLogReader(db, files)
        self.claims = PgClaims(db, node.project, fences, node.lease_s)
        self.nodes = PgNodes(db, node)

    def notify_store(self) -> PgNotifyStore:
        """The notify store (made when the notifier or its tools first need it)."""
        if self._notify is None:
            self._notify = PgNotifyStore(self.db, self.settings.node_id)
        return self._notify

    def runtime(self, local: RunController, notices: Notices,
                agents: AgentRuns | None = None) -> tuple[Node, ClusterRunner]:
        """The node's background side and its runner as tools and the scheduler see it;
        `notices`: the daemon's system-log lines (runs this node records lost or cancels);
        `agents`: the AI runs' records, ended for runs cancelled before any node took them."""
        node = Node(self.db, self.claims, self.nodes, self.clock, self.settings, local, notices,
                    self.audit.move_spool)
        self.admission.claim_with(node, self.claims, self.settings.project)
        self.runs.claim_with(node, self.claims, self.settings.project)
        return node, ClusterRunner(local, node, self.admission, self.runs, self.claims, self.clock, self.settings,
                                   notices, agents)

    async def close(self) -> None:
        await self.db.close()


async def open_cluster(options: ClusterOptions, policy: Policy, files: RunLogFiles) -> PgCluster:
    """Connect, migrate and take PostgreSQL's time. Raises ToolError (unavailable) with one
    line that never contains the DSN."""
    db = PgDatabase(options.dsn, options.pool_size, options.connect_timeout_s,
                    application=f"qledge:{options.node.node_id}"[:63])
    try:
        await migrate(db)
        clock = DbClock()
        sent = time.monotonic()
        clock.sync(await db.read(server_ms), sent, time.monotonic())
    except ToolError as exc:
        await db.close()
        reason = db.down_reason or exc.message
        raise ToolError("unavailable", f"cannot use PostgreSQL {db.location}: {reason}") from None
    return PgCluster(db, options, policy, files, clock)
