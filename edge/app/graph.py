"""The object graph of `qledge serve`, built from the configuration by small builders
that tests reuse; and reload, the one place live configuration keys are applied.

Building is synchronous and does no I/O beyond creating the state directories; the
daemon (edge.app.daemon) owns the order in which the parts start and stop. Optional
capabilities are imported here and only here, when their section enables them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

from edge.app.capabilities import CAPABILITIES, CLUSTER, Capability
from edge.app.config import Config, default_zone, run_timezone
from edge.app.home import StartupError, private_dir
from edge.core.auth import AuditBounds
from edge.core.clock import EPOCH_FLOOR_MS, LoopTimers, SteadyClock, SystemClock
from edge.core.notices import Notices
from edge.core.ports.runtime import Clock, RunController
from edge.core.ports.stores import (
    AuditLog,
    AuditReader,
    CountsReader,
    CredentialStore,
    Readers,
    RunAdmission,
    RunLogReader,
    RunStore,
    SecretStore,
    TaskStore,
    TriggerStore,
)
from edge.core.reads import Counts
from edge.core.runs import ActorType, Followers, Run, RunDefaults
from edge.core.schedule import ScheduleError, load_zone
from edge.core.tasks import Task
from edge.runner.process import DEFAULT_LANG, SystemUsers
from edge.runner.supervisor import Runner, RunnerSettings
from edge.scheduler.loop import Scheduler, Triggers
from edge.storage.run_logs import LocalLogReader, RunLogs
from edge.storage.sqlite.db import Ballast, Database
from edge.storage.admission import SqlAdmission
from edge.storage.catalog import SqlTaskStore, SqlTriggerStore
from edge.storage.reads import SqlCountsReader, readers
from edge.storage.runs import Policy, SqlRunStore
from edge.storage.security import SqlAuditLog, SqlAuditReader, SqlCredentialStore, SqlSecretStore
from edge.storage.sqlite import sql
from edge.tools.builtin import status, tasks, triggers
from edge.tools.chain import Authenticator, Chain
from edge.tools.context import Services, ToolInfo
from edge.tools.definition import WRITE_DEADLINE_S, Deferred, Registry, Tool, first_use, info
from edge.transports.tool_socket import ToolServer
from edge.transports.unix import Limits, Shared, UnixListener, descriptor_allowance

if TYPE_CHECKING:  # cluster, agent and notify ports are loaded only where they are used
    import socket

    from edge.core.ports.agent import AgentEvidenceStore, AgentRuns, MissionLedger, RunCredentials
    from edge.core.ports.cluster import ClusterNode
    from edge.core.ports.notify import NotifyStore
    from edge.notify.dispatch import Notifier

log = logging.getLogger("qledge")

# Config keys that take effect on SIGHUP (Graph.reload); any other change waits for a restart.
LIVE_KEYS = frozenset({
    "log_level", "runner.queue_limit", "runner.kill_grace_s", "runner.log_cap_bytes", "runner.disk_reserve_bytes",
})
# How long a reload waits for the scheduler to read the triggers again before it says it is
# done without them (PostgreSQL down: the scheduler keeps trying).
REREAD_WAIT_S = 10


StatusLines = Callable[[], dict[str, str]]  # a part's lines in `qledge status`


class DaemonFacts:
    """StatusFacts (edge.core.ports.runtime): what `qledge.status` reports about the daemon,
    the lines of its parts (`extra`) included."""

    def __init__(
        self, db_path: str, loop: str, clock: Clock, counts: CountsReader, settings: RunnerSettings, work_dir: str,
        extra: Sequence[StatusLines] = (),
    ) -> None:
        self.loop = loop
        self.db_path = db_path
        self.started_monotonic = clock.monotonic()
        self._counts = counts
        self._settings = settings  # the runner's, changed in place on reload
        self._work_dir = work_dir  # [runner] work_dir: where a run starts when its task names no directory
        self._extra = tuple(extra)

    async def counts(self, project: str) -> Counts:
        return await self._counts.counts(project)

    def run_defaults(self) -> RunDefaults:
        return RunDefaults(work_dir=self._work_dir, log_cap_bytes=self._settings.log_cap_bytes)

    def extra(self) -> dict[str, str]:
        lines: dict[str, str] = {}
        for provider in self._extra:
            lines.update(provider())
        return lines


# -- builders -----------------------------------------------------------------------


class Stores(msgspec.Struct, frozen=True, kw_only=True):
    """Every storage adapter, on one database (SQLite, or a cluster's PostgreSQL) and one
    log directory."""

    location: str  # the database, for status
    logs: RunLogs
    log_reader: RunLogReader
    tasks: TaskStore
    runs: RunStore
    triggers: TriggerStore
    admission: RunAdmission
    credentials: CredentialStore
    secrets: SecretStore
    audit: AuditLog
    audit_reader: AuditReader
    readers: Readers
    counts: CountsReader
    followers: Followers = msgspec.field(default_factory=Followers)  # told what a finished run set in motion
    # The stores of optional capabilities, each made at its first use (their adapters ship
    # with the capability): the notify queue; the AI runs' evidence; the missions' ledger
    # (None: this storage keeps none, as a cluster's).
    notify: Callable[[], NotifyStore] | None = None
    evidence: Callable[[], AgentEvidenceStore] | None = None
    ledger: Callable[[], MissionLedger] | None = None


def capacity(config: Config) -> int:
    """How many runs may be queued or running at once: the runner's slots and its queue."""
    return config.runner.concurrency + config.runner.queue_limit


def run_logs(home: str, on_full: Callable[[], bool] | None = None) -> RunLogs:
    return RunLogs(private_dir(os.path.join(home, "logs")), on_full)


def audit_bounds(config: Config) -> AuditBounds:
    keep = config.retention
    return AuditBounds(calls=keep.audit_max_rows, changes=keep.audit_change_max_rows,
                       refused=keep.audit_refused_max_rows, max_age_days=keep.audit_max_age_days)


def build_stores(db: Database, config: Config, home: str) -> Stores:
    keep = config.retention
    logs = run_logs(home, db.ballast.release if db.ballast else None)
    policy = Policy(runs_per_task=keep.runs_per_task, max_age_ms=keep.run_max_age_days * 86_400_000,
                    log_quota_bytes=keep.log_quota_bytes)
    followers = Followers()
    return Stores(
        location=db.path, logs=logs, log_reader=LocalLogReader(logs),
        tasks=SqlTaskStore(db, sql.CATALOG, logs), runs=SqlRunStore(db, sql.RUNS, policy, logs, followers),
        triggers=SqlTriggerStore(db, sql.CATALOG),
        admission=SqlAdmission(db, sql.ADMISSION, capacity(config), followers),
        credentials=SqlCredentialStore(db, sql.SECURITY), secrets=SqlSecretStore(db, sql.SECURITY),
        audit=SqlAuditLog(db, sql.SECURITY, audit_bounds(config), LoopTimers()),
        audit_reader=SqlAuditReader(db, sql.SECURITY),
        readers=readers(db, sql.READS), counts=SqlCountsReader(db, sql.READS), followers=followers,
        notify=first_use(lambda: sqlite_notify_store(db)), evidence=first_use(lambda: sqlite_evidence_store(db)),
        ledger=first_use(lambda: sqlite_ledger(db)),
    )


# The adapters of optional stores, asked for only where their capability is available.
def sqlite_notify_store(db: Database) -> NotifyStore:
    from edge.storage.sqlite.notify import SqliteNotifyStore

    return SqliteNotifyStore(db)


def sqlite_evidence_store(db: Database) -> AgentEvidenceStore:
    from edge.storage.sqlite.evidence import SqliteEvidenceStore

    return SqliteEvidenceStore(db)


def sqlite_ledger(db: Database) -> MissionLedger:
    from edge.storage.sqlite.ledger import SqliteMissionLedger

    return SqliteMissionLedger(db)


def runner_settings(config: Config, home: str) -> RunnerSettings:
    r = config.runner
    return RunnerSettings(
        state_dir=home, concurrency=r.concurrency,
        kill_grace_s=r.kill_grace_s, log_cap_bytes=r.log_cap_bytes, disk_reserve_bytes=r.disk_reserve_bytes,
        timezone=run_timezone(config), lang=os.environ.get("LANG") or DEFAULT_LANG,
    )


def task_users(config: Config, home: str) -> SystemUsers:
    r = config.runner
    dynamic = (r.dynamic_uids[0], r.dynamic_uids[-1]) if r.dynamic_uids else None
    return SystemUsers(r.task_users, r.default_user, home, r.work_dir, dynamic)


class Workers(msgspec.Struct, frozen=True, kw_only=True):
    """What runs in the background: the runner and the scheduler that feeds it, and the
    system-log lines both write about runs and fires (one rate limit per task). `controller`
    is the runner as tools and the scheduler see it: the runner itself, or on a cluster
    node the cluster's runner, which hands runs to whichever node claims them."""

    runner: Runner
    scheduler: Scheduler
    settings: RunnerSettings
    controller: RunController
    users: SystemUsers
    notices: Notices


def build_workers(
    config: Config, home: str, stores: Stores, clock: Clock,
    distribute: Callable[[Runner, Notices], RunController] | None = None, wall: Clock | None = None,
    agents: AgentRuns | None = None, users: SystemUsers | None = None,
) -> Workers:
    """`clock` stamps what the runner records; the scheduler plans fires on `wall` (the
    wall clock itself, which it holds on while that is behind; default: `clock`)."""
    settings = runner_settings(config, home)
    users = users or task_users(config, home)
    users.attach(stores.tasks, clock)  # where the uids of tasks that run as their own are recorded
    notices = Notices(clock, LoopTimers())
    runner = Runner(runs=stores.runs, tasks=stores.tasks, admission=stores.admission, secrets=stores.secrets,
                    logs=stores.logs, clock=clock, settings=settings, users=users, notices=notices, agents=agents)
    controller = runner if distribute is None else distribute(runner, notices)
    scheduler = Scheduler(stores.admission, stores.runs, controller, wall or clock, config.project, notices=notices)
    stores.followers.retry = scheduler.retry_due
    return Workers(runner=runner, scheduler=scheduler, settings=settings, controller=controller, users=users,
                   notices=notices)


def resident_tools() -> list[Tool]:
    """The `qledge.*` management tools the daemon loads with itself."""
    return [*tasks.TOOLS, *triggers.TOOLS, *status.TOOLS]


def builtin_tools() -> list[Tool]:
    """Every `qledge.*` management tool the CLI uses but the rarely used ones (deferred_tools),
    loaded: the resident tools and the run tools."""
    return [*resident_tools(), *_run_tools()]


# The run tools: the scheduler starts runs without them, so a daemon on its triggers alone
# never loads their module; the first `qledge run …` call does.
_WAIT_DEADLINE_S = 60 + 5  # edge.tools.builtin.runs: WAIT_MAX_MS, and 5 s to answer
_FOLLOW_DEADLINE_S = 30 + 5  # FOLLOW_MAX_MS, and 5 s to answer
RUN_TOOLS: tuple[ToolInfo, ...] = (
    info("qledge.run.start", effect="write", risk="medium", permission="run.write", title="Start a run of a task now"),
    info("qledge.run.cancel", effect="write", risk="medium", permission="run.write",
         title="Cancel a queued or running run"),
    info("qledge.run.get", effect="read", risk="low", permission="run.read", title="A run"),
    info("qledge.run.list", effect="read", risk="low", permission="run.read", title="Runs, newest first"),
    info("qledge.run.events", effect="read", risk="low", permission="run.read", title="A run's events"),
    info("qledge.run.wait", effect="read", risk="low", permission="run.read", title="Wait for a run to finish",
         deadline_s=_WAIT_DEADLINE_S),
    info("qledge.run.log.read", effect="read", risk="low", permission="artifact.read",
         title="A byte range of a run's log (waitMs: wait for more of a running run's output)",
         deadline_s=_FOLLOW_DEADLINE_S),
)


def _run_tools() -> list[Tool]:
    from edge.tools.builtin import runs

    return runs.TOOLS


def daemon_tools() -> tuple[list[Tool], list[Deferred]]:
    """What the daemon's registry starts with: the resident tools loaded, the run tools and
    deferred_tools() declared."""
    return resident_tools(), [Deferred(infos=RUN_TOOLS, load=_run_tools), *deferred_tools()]


# The `qinglong.*` read tools offered to AI clients: declared here, their modules loaded by
# their first call or when their schemas are asked for (MCP's listing, an AI run's offer), so
# a daemon that no AI client talks to never builds their projections.
AI_TOOLS: tuple[ToolInfo, ...] = (
    *(info(name, effect="read", risk="low", permission="task.read", title=title, ai=True)
      for name, title in (("qinglong.task.list", "List tasks"), ("qinglong.task.get", "Get a task"))),
    info("qinglong.trigger.list", effect="read", risk="low", permission="trigger.read", title="List triggers", ai=True),
    *(info(name, effect="read", risk="low", permission="run.read", title=title, ai=True)
      for name, title in (("qinglong.run.list", "List runs, newest first"), ("qinglong.run.get", "Get a run"),
                          ("qinglong.run.events.list", "List a run's events"),
                          ("qinglong.run.compare", "Compare two runs"),
                          ("qinglong.task.runs.compare", "Compare a task's latest success with its latest failure"))),
    info("qinglong.run.log.excerpt", effect="read", risk="medium", permission="artifact.read",
         title="Read the end of a run's log (redacted)", ai=True),
)


def ai_tools() -> list[Tool]:
    """The `qinglong.*` read tools offered to AI clients (AI_TOOLS), loaded."""
    from edge.tools.ai import log_excerpt, projections, runs, task_runs_compare

    return [*projections.TOOLS, *runs.TOOLS, *task_runs_compare.TOOLS, *log_excerpt.TOOLS]


# Management tools an idle daemon rarely needs (export and import, API credentials and the
# audit, secrets): declared here, their modules loaded by their first call (Deferred). The
# registry checks each module's tools against these when it loads them (a test loads all).
_IMPORT_DEADLINE_S = 4 * WRITE_DEADLINE_S
BACKUP_TOOLS: tuple[ToolInfo, ...] = (
    info("qledge.export", effect="read", risk="high", permission=("task.inspect", "trigger.inspect"),
         title="Tasks and triggers at their heads, for an export"),
    info("qledge.secret.export", effect="read", risk="high", permission="secret.export",
         title="Secret values, for an export made with secrets"),
    info("qledge.import", effect="write", risk="high", permission=("task.write", "trigger.write"),
         deadline_s=_IMPORT_DEADLINE_S, title="Create or (with replace) overwrite tasks and triggers from an export"),
    info("qledge.secret.import", effect="write", risk="high", permission="secret.write",
         deadline_s=_IMPORT_DEADLINE_S, title="Store secrets from an export"),
)
CREDENTIAL_TOOLS: tuple[ToolInfo, ...] = (
    info("qledge.credential.create", effect="write", risk="high", permission="credential.admin",
         title="Create an API credential"),
    info("qledge.credential.list", effect="read", risk="high", permission="credential.admin",
         title="API credentials", deadline_s=WRITE_DEADLINE_S),
    info("qledge.credential.revoke", effect="write", risk="high", permission="credential.admin",
         title="Revoke an API credential"),
    info("qledge.audit.list", effect="read", risk="high", permission="audit.read",
         title="The security audit, newest first"),
)
SECRET_TOOLS: tuple[ToolInfo, ...] = (
    info("qledge.secret.set", effect="write", risk="high", permission="secret.write",
         title="Store a secret (create or replace); its value is never returned"),
    info("qledge.secret.list", effect="read", risk="high", permission="secret.read", title="Secret names and dates",
         deadline_s=WRITE_DEADLINE_S),
    info("qledge.import.secret", effect="write", risk="high", permission="secret.write",
         title="Store a secret from an import, once per import key; never replaces one"),
    info("qledge.secret.delete", effect="write", risk="high", permission="secret.write", title="Delete a secret"),
)


def _backup_tools() -> list[Tool]:
    from edge.tools.builtin import backup

    return backup.TOOLS


def _credential_tools() -> list[Tool]:
    from edge.tools.builtin import credentials

    return credentials.TOOLS


def deferred_tools() -> list[Deferred]:
    """The daemon's own tools loaded by their first call: the AI read tools and the rarely used
    management tools."""
    # The secret tools share the credential tools' module.
    return [Deferred(infos=AI_TOOLS, load=ai_tools), Deferred(infos=BACKUP_TOOLS, load=_backup_tools),
            Deferred(infos=CREDENTIAL_TOOLS + SECRET_TOOLS, load=_credential_tools)]


# -- the optional capabilities (edge.app.capabilities): what each adds to the daemon ----------


class Service(Protocol):
    """A part with a life of its own: started after the runner's recovery, before the
    scheduler; stopped once the listeners have stopped, before the scheduler."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


ListenerFactory = Callable[[Chain, Limits, Shared], UnixListener]  # a listener, once the chain exists


class Contribution(msgspec.Struct, frozen=True, kw_only=True):
    """What an enabled capability adds to the daemon, returned to the graph, which plugs each
    part in where it belongs: tools into the registry, listeners beside the tool socket, status
    lines into `qledge status`, services into the start and stop order, `wake` into the
    stores' Followers (messages were queued), the AI runs into the runner and their
    credentials into the chain's authentication."""

    tools: list[Tool] = []
    deferred: list[Deferred] = []
    listeners: list[ListenerFactory] = []
    status: list[StatusLines] = []
    services: list[Service] = []
    wake: Callable[[], None] | None = None
    agents: AgentRuns | None = None
    credentials: RunCredentials | None = None


class Host(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon offers a capability's daemon side while the graph is built. The
    runner, the registry and the tool server are made after the capabilities (they take what
    these add), so those are reached through `start_run`, `ai_tools` and `connect`, called
    only once they exist."""

    config: Config
    home: str
    stores: Stores
    clock: Clock
    pepper: bytes
    users: SystemUsers
    infos: list[ToolInfo]  # what the daemon's own tools are (management and AI read tools, loaded or not)
    ai_tools: Callable[[], list[Tool]]  # every AI tool with its types, once the registry exists
    start_run: Callable[[Task, ActorType], Awaitable[Run]]  # the local runner's start
    connect: Callable[[socket.socket], None]  # the tool server serves this end, trusting its token only
    cluster: Cluster | None = None


def notify_side(config: Config, stores: Stores, clock: Clock) -> Contribution:
    """The notifier, dormant until needed, and its tools, loaded by their first call, where
    the storage keeps a queue."""
    store = stores.notify
    if store is None:
        return Contribution()
    from edge.notify.handle import TOOL_INFOS, NotifierHandle

    def build() -> Notifier:
        import sys

        from edge.notify.dispatch import Notifier, NotifySettings

        n = config.notify
        settings = NotifySettings(
            device=n.device or os.uname().nodename or "qledge", language=n.language, max_attempts=n.max_attempts,
            backoff_s=n.backoff_s, max_backoff_s=n.max_backoff_s, per_minute=n.per_minute, timeout_s=n.timeout_s,
            repeat_s=n.repeat_s, repeat_factor=n.repeat_factor, max_repeat_s=n.max_repeat_s,
            python=n.python or sys.executable)
        return Notifier(store=store(), secrets=stores.secrets, logs=stores.logs, clock=clock, timers=LoopTimers(),
                        project=config.project, settings=settings)

    handle = NotifierHandle(build, store, lambda: stores.runs.notices_waiting(config.project), config.project)

    def tools() -> list[Tool]:
        from edge.notify.tools import notify_tools

        return notify_tools(handle, store(), stores.secrets)

    return Contribution(deferred=[Deferred(infos=TOOL_INFOS, load=tools)], status=[handle.status], services=[handle],
                        wake=handle.wake)


def operator_side(host: Host, credentials: RunCredentials | None = None) -> Contribution:
    """The AI operator's side of the daemon (edge.app.operator; its child, edge.airun, is
    never imported: the runner starts it as a process). `credentials`: the run credentials'
    registry (default: a new one)."""
    from edge.app.operator import build_operator

    stores = host.stores
    assert stores.evidence is not None  # every storage keeps the evidence (a cluster in PostgreSQL)
    op = build_operator(host.config, tasks=stores.tasks, secrets=stores.secrets, clock=host.clock, pepper=host.pepper,
                        users=host.users, evidence=stores.evidence, ledger=stores.ledger,
                        infos=host.infos, ai_tools=host.ai_tools, start_run=host.start_run,
                        connect=host.connect, credentials=credentials)
    return Contribution(deferred=op.deferred, status=[op.status], agents=op.runs,
                        credentials=op.credentials)


def mcp_side(config: Config, home: str) -> Contribution:
    """MCP's listener on a second socket; every tools/call runs the same chain."""
    from edge.mcp.server import McpServer

    path = os.path.abspath(config.mcp.socket or os.path.join(home, "mcp.sock"))

    def listener(chain: Chain, limits: Limits, shared: Shared) -> UnixListener:
        try:
            return McpServer(chain, path, config.mcp.max_line_bytes, limits, shared)
        except ValueError as exc:  # a tool that cannot be described to MCP clients
            raise StartupError(f"MCP: {exc}", "internal") from None

    return Contribution(listeners=[listener], status=[lambda: {"mcp": path}])


def cluster_side(host: Host) -> Contribution:
    """A cluster node's line in `qledge status` (its storage, clock and runner are the graph's
    own: opened before it, Cluster)."""
    cluster = host.cluster
    assert cluster is not None

    def status() -> dict[str, str]:
        return cluster.node.status() if cluster.node is not None else {}

    return Contribution(status=[status])


# Each capability's daemon side (edge.app.capabilities.CAPABILITIES names every capability;
# tests/test_architecture.py checks that these are exactly those with one).
SIDES: dict[str, Callable[[Host], Contribution]] = {
    "cluster": cluster_side,
    "notify": lambda host: notify_side(host.config, host.stores, host.clock),
    "agent": operator_side,
    "mcp": lambda host: mcp_side(host.config, host.home),
}


def required(capability: Capability) -> bool:
    """Whether this build has a capability the configuration turns on. Raises StartupError
    (its one line) where it cannot do without it."""
    if capability.available():
        return True
    if capability.missing is None:
        log.debug("%s: not included in this build", capability.name)
        return False
    code, line = capability.missing
    raise StartupError(line, code)


def enabled(config: Config) -> list[Capability]:
    """The capabilities with a daemon side this configuration turns on and this build has,
    in their order."""
    return [c for c in CAPABILITIES if c.daemon and c.enabled(config) and required(c)]


def contributions(host: Host) -> list[Contribution]:
    """What each enabled capability adds, in the order of CAPABILITIES."""
    return [SIDES[capability.name](host) for capability in enabled(host.config)]


def trigger_zone(configured: str | None) -> str:
    zone = default_zone(configured)
    try:
        load_zone(zone)
    except ScheduleError as exc:  # manual runs still work; new triggers must name a zone
        log.warning("default timezone: %s", exc)
    return zone


def build_services(
    config: Config, stores: Stores, workers: Workers, facts: DaemonFacts, registry: Registry, pepper: bytes,
    clock: Clock,
) -> Services:
    return Services(
        project=config.project, clock=clock, pepper=pepper, tasks=stores.tasks, runs=stores.runs,
        triggers=Triggers(stores.triggers, workers.scheduler, trigger_zone(config.timezone), stores.tasks),
        credentials=stores.credentials, secrets=stores.secrets, audit=stores.audit, audit_reader=stores.audit_reader,
        logs=stores.logs, log_reader=stores.log_reader, readers=stores.readers, runner=workers.controller,
        users=workers.users, facts=facts, catalog=registry.infos(),
    )


def build_chain(
    config: Config, services: Services, registry: Registry, run_credentials: RunCredentials | None = None
) -> Chain:
    owners = config.auth.owner_uids if config.auth.owner_uids is not None else sorted({os.getuid(), 0})
    auth = Authenticator(services.credentials, services.pepper, owners, config.project, registry.read_tool_names(),
                         run_credentials)
    return Chain(registry, auth, services)


def build_listeners(
    config: Config, socket_path: str, chain: Chain, extra: Sequence[ListenerFactory] = ()
) -> list[UnixListener]:
    """The tool socket, then the listeners capabilities add (MCP's), under one shared budget
    of partial-frame bytes and descriptors."""
    limits, shared = connection_limits(config)
    listeners: list[UnixListener] = [ToolServer(chain, socket_path, config.max_frame_bytes, limits, shared)]
    listeners += [make(chain, limits, shared) for make in extra]
    return listeners


def connection_limits(config: Config) -> tuple[Limits, Shared]:
    c = config.connections
    limits = Limits(max_connections=c.max_per_socket, frame_timeout_s=c.frame_timeout_s,
                    idle_timeout_s=c.idle_timeout_s, session_idle_timeout_s=c.session_idle_timeout_s)
    # One frame or line of the largest size allowed always fits.
    largest = max(config.max_frame_bytes, config.mcp.max_line_bytes if config.mcp.enabled else 0)
    allowance = descriptor_allowance(c.fd_reserve)
    if allowance < c.max_per_socket:
        log.warning("connections: %d descriptors left after the reserve of %d for runs; at most %d connections",
                    allowance + c.fd_reserve, c.fd_reserve, allowance)
    return limits, Shared(partial_bytes=max(c.partial_bytes, largest), max_connections=allowance)


def _disk_line(ballast: Ballast) -> str:
    ballast.poll()
    try:
        return ballast.describe()
    except OSError as exc:
        return f"cannot check free space: {exc.strerror}"


# -- cluster mode (edge.storage.postgres is imported here and only here) ---------------


class Cluster:
    """A cluster node's storage and runtime, opened before the graph is built."""

    def __init__(self, config: Config, home: str) -> None:
        self.config = config
        self.home = home
        self.node_id = config.cluster.node or default_node_id(home)
        self.stores: Stores | None = None
        self.node: ClusterNode | None = None
        self.clock: Clock | None = None
        self._adapters: object = None

    async def open(self) -> None:
        required(CLUSTER)
        from edge.core.errors import ToolError
        from edge.storage.postgres.cluster import ClusterOptions, NodeSettings, Policy, open_cluster

        cfg, c = self.config, self.config.cluster
        if c.heartbeat_s * 2 > c.lease_s:
            raise StartupError("[cluster] heartbeat_s must be at most half of lease_s")
        keep = cfg.retention
        settings = NodeSettings(
            node_id=self.node_id, project=cfg.project, slots=cfg.runner.concurrency, lease_s=c.lease_s,
            heartbeat_s=c.heartbeat_s, poll_s=c.poll_s,
            cancel_wait_s=cfg.runner.kill_grace_s + c.lease_s + 2 * c.heartbeat_s + 5)
        options = ClusterOptions(
            dsn=c.dsn or "", node=settings, capacity=capacity(cfg), pool_size=c.pool_size,
            connect_timeout_s=c.connect_timeout_s, write_retry_s=c.write_retry_s,
            audit=audit_bounds(cfg), audit_spool=os.path.join(self.home, "audit-spool.jsonl"))
        policy = Policy(runs_per_task=keep.runs_per_task, max_age_ms=keep.run_max_age_days * 86_400_000,
                        log_quota_bytes=keep.log_quota_bytes)
        logs = run_logs(self.home)
        try:
            pg = await open_cluster(options, policy, logs)
        except ToolError as exc:
            raise StartupError(exc.message) from None
        self._adapters = pg
        self.clock = pg.clock
        self.stores = Stores(
            location=pg.location, logs=logs, log_reader=pg.log_reader, tasks=pg.tasks, runs=pg.runs,
            triggers=pg.triggers, admission=pg.admission, credentials=pg.credentials, secrets=pg.secrets,
            audit=pg.audit, audit_reader=pg.audit_reader, readers=pg.readers, counts=pg.counts,
            followers=pg.followers, notify=first_use(pg.notify_store), evidence=first_use(self.evidence))

    def evidence(self) -> AgentEvidenceStore:
        """The AI operator's evidence history in PostgreSQL ([agent] enabled on a node)."""
        from edge.storage.postgres.cluster import PgCluster
        from edge.storage.postgres.evidence import PgEvidenceStore

        assert isinstance(self._adapters, PgCluster)
        return PgEvidenceStore(self._adapters.db)

    def distribute(self, runner: Runner, notices: Notices, agents: AgentRuns | None = None) -> RunController:
        from edge.storage.postgres.cluster import PgCluster

        assert isinstance(self._adapters, PgCluster)
        self.node, controller = self._adapters.runtime(runner, notices, agents)
        return controller

    async def close(self) -> None:
        from edge.storage.postgres.cluster import PgCluster

        if isinstance(self._adapters, PgCluster):
            await self._adapters.close()


def default_node_id(home: str) -> str:
    """The host name and a digest of the home: stable across restarts of one daemon (its
    previous life's runs are then its own to reconcile), distinct for two homes."""
    import hashlib
    import socket

    host = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in socket.gethostname())[:40] or "node"
    return f"{host}:{hashlib.sha256(os.path.abspath(home).encode()).hexdigest()[:8]}"


# -- the daemon's graph -------------------------------------------------------------


T = TypeVar("T")


def _one(found: Sequence[T | None]) -> T | None:
    """The one part that fills a place only one may (the AI runs, their credentials, the
    notifier's wake-up)."""
    given = [f for f in found if f is not None]
    assert len(given) <= 1, given
    return given[0] if given else None


class Graph:
    """Everything the daemon runs, with what the enabled capabilities add. Start:
    `hold_clock` → runner recovery → services → cluster node → scheduler → listeners."""

    def __init__(
        self, config: Config, home: str, socket_path: str, loop: str, db: Database | None, pepper: bytes,
        clock: Clock | None = None, cluster: Cluster | None = None,
    ) -> None:
        if cluster is not None and cluster.stores is not None:
            clock = cluster.clock
            self.stores = cluster.stores
        else:
            assert db is not None
            self.stores = build_stores(db, config, home)
        wall = clock or SystemClock()
        self._project = config.project
        self.cluster = cluster
        # Records are stamped on the steady clock; the scheduler alone reads the wall clock
        # (on a cluster node, PostgreSQL's).
        # Not on a cluster node: every node holds on its own, from the newest time it saw,
        # so the ranges they would move overlap; their stamps keep their order.
        self.stamps = SteadyClock(wall, self._clock_jumped if cluster is None else None)
        users = task_users(config, home)
        own_tools, own_deferred = daemon_tools()
        host = Host(config=config, home=home, stores=self.stores, clock=self.stamps, pepper=pepper, users=users,
                    infos=[*(t.info() for t in own_tools), *(i for d in own_deferred for i in d.infos)],
                    ai_tools=self._ai_tools, start_run=self._start_run, connect=self._connect,
                    cluster=cluster)
        parts = contributions(host)
        agents = _one([p.agents for p in parts])
        credentials = _one([p.credentials for p in parts])
        self.wake = _one([p.wake for p in parts])  # messages were queued (a node hears so from the others too)
        if self.wake is not None:
            self.stores.followers.notify = self.wake
        self.services = [service for p in parts for service in p.services]
        distribute = None
        if cluster is not None:
            distribute = functools.partial(cluster.distribute, agents=agents)
        self.workers = build_workers(config, home, self.stores, self.stamps, distribute, wall, agents, users)
        status: list[StatusLines] = [self.workers.scheduler.status, lambda: {"task users": users.describe()}]
        ballast = db.ballast if db is not None else None
        if ballast is not None:
            status.append(lambda: {"disk": _disk_line(ballast)})
        self.facts = DaemonFacts(self.stores.location, loop, self.stamps, self.stores.counts, self.workers.settings,
                                 config.runner.work_dir, [*status, *(line for p in parts for line in p.status)])
        registry = Registry([*own_tools, *(t for p in parts for t in p.tools)],
                            [*own_deferred, *(d for p in parts for d in p.deferred)])
        services = build_services(config, self.stores, self.workers, self.facts, registry, pepper, self.stamps)
        self.chain = build_chain(config, services, registry, credentials)
        self.listeners = build_listeners(config, socket_path, self.chain, [f for p in parts for f in p.listeners])

    def _ai_tools(self) -> list[Tool]:
        return self.chain.registry.ai_tools()

    async def _start_run(self, task: Task, actor: ActorType) -> Run:
        return await self.workers.runner.start(task, actor)

    def _connect(self, sock: socket.socket) -> None:
        """Each AI run's child gets a connection of its own to the tool server."""
        tool_server = self.listeners[0]
        assert isinstance(tool_server, ToolServer)
        tool_server.attach(sock)

    async def hold_clock(self) -> None:
        """Before anything is stamped: while the wall clock is behind the newest time on
        record (or EPOCH_FLOOR_MS), stamps count on from that time."""
        newest = await self.stores.admission.newest_time(self._project)
        self.stamps.hold_from(max(newest, EPOCH_FLOOR_MS))

    def _clock_jumped(self, after_ms: int, upto_ms: int, shift_ms: int) -> None:
        # Called inside the stamp that saw the jump, before that stamp's write is queued.
        self.stores.admission.restamp(after_ms, upto_ms, shift_ms)

    @property
    def runner(self) -> Runner:
        return self.workers.runner

    @property
    def scheduler(self) -> Scheduler:
        return self.workers.scheduler

    async def reload(self, config: Config) -> None:
        """Apply every live key of `config` (LIVE_KEYS), and read the triggers again (another
        writer may have changed the database): returns once they are read, or after
        REREAD_WAIT_S with a warning when the store does not answer (the scheduler reads
        them as soon as it does)."""
        logging.getLogger().setLevel(config.log_level.upper())
        self.stores.admission.set_capacity(capacity(config))
        settings = self.workers.settings
        settings.kill_grace_s = config.runner.kill_grace_s
        settings.log_cap_bytes = config.runner.log_cap_bytes
        settings.disk_reserve_bytes = config.runner.disk_reserve_bytes
        try:
            await asyncio.wait_for(self.workers.scheduler.reread(), REREAD_WAIT_S)
        except TimeoutError:
            log.warning("reload: the triggers are not read again yet (the store did not answer within %d s);"
                        " the scheduler reads them when it does", REREAD_WAIT_S)
