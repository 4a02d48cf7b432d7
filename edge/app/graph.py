"""The object graph of `qledge serve`, built from the configuration by small builders
that tests reuse; and reload, the one place live configuration keys are applied.

Building is synchronous and does no I/O beyond creating the state directories; the
daemon (edge.app.daemon) owns the order in which the parts start and stop. Optional
capabilities are imported here and only here, when their section enables them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import msgspec

from edge.app.config import Config, default_zone
from edge.core.clock import LoopTimers, SystemClock
from edge.core.ports.runtime import Clock
from edge.core.ports.stores import AuditLog, CountsReader, CredentialStore, Readers, SecretStore
from edge.core.reads import Counts
from edge.core.schedule import ScheduleError, load_zone
from edge.runner.supervisor import Runner, RunnerSettings
from edge.scheduler.loop import Scheduler, Triggers
from edge.storage.run_logs import RunLogs
from edge.storage.sqlite.admission import SqliteAdmission
from edge.storage.sqlite.audit import Bounds as AuditBounds
from edge.storage.sqlite.audit import SqliteAuditLog
from edge.storage.sqlite.credentials import SqliteCredentialStore
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.reads import SqliteCountsReader, sqlite_readers
from edge.storage.sqlite.retention import Policy
from edge.storage.sqlite.runs import SqliteRunStore
from edge.storage.sqlite.secrets import SqliteSecretStore
from edge.storage.sqlite.tasks import SqliteTaskStore
from edge.storage.sqlite.triggers import SqliteTriggerStore
from edge.tools.catalog import ai_tools, builtin_tools
from edge.tools.chain import Authenticator, Chain
from edge.tools.context import Services
from edge.tools.definition import Registry
from edge.transports.tool_socket import ToolServer
from edge.transports.unix import Limits, Shared, UnixListener, descriptor_allowance

log = logging.getLogger("qledge")

# Config keys that take effect on SIGHUP (Graph.reload); any other change waits for a restart.
LIVE_KEYS = frozenset({
    "log_level", "runner.queue_limit", "runner.kill_grace_s", "runner.log_cap_bytes", "runner.disk_reserve_bytes",
})


class StartupError(Exception):
    """One clear line; the daemon exits non-zero without a traceback."""


def private_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class DaemonFacts:
    """StatusFacts (edge.core.ports.runtime): what `qledge.status` reports about the daemon."""

    def __init__(self, db_path: str, loop: str, clock: Clock, counts: CountsReader) -> None:
        self.loop = loop
        self.db_path = db_path
        self.started_monotonic = clock.monotonic()
        self._counts = counts
        self._extra: list[Callable[[], dict[str, str]]] = []  # lines added by capabilities

    async def counts(self, project: str) -> Counts:
        return await self._counts.counts(project)

    def add_extra(self, provider: Callable[[], dict[str, str]]) -> None:
        self._extra.append(provider)

    def extra(self) -> dict[str, str]:
        lines: dict[str, str] = {}
        for provider in self._extra:
            lines.update(provider())
        return lines


# -- builders -----------------------------------------------------------------------


class Stores(msgspec.Struct, frozen=True, kw_only=True):
    """Every storage adapter, on one database and one log directory."""

    db: Database
    logs: RunLogs
    tasks: SqliteTaskStore
    runs: SqliteRunStore
    triggers: SqliteTriggerStore
    admission: SqliteAdmission
    credentials: CredentialStore
    secrets: SecretStore
    audit: AuditLog
    readers: Readers
    counts: CountsReader


def capacity(config: Config) -> int:
    """How many runs may be queued or running at once: the runner's slots and its queue."""
    return config.runner.concurrency + config.runner.queue_limit


def build_stores(db: Database, config: Config, home: str) -> Stores:
    keep = config.retention
    logs = RunLogs(private_dir(os.path.join(home, "logs")))
    policy = Policy(runs_per_task=keep.runs_per_task, max_age_ms=keep.run_max_age_days * 86_400_000,
                    log_quota_bytes=keep.log_quota_bytes)
    return Stores(
        db=db, logs=logs, tasks=SqliteTaskStore(db, logs), runs=SqliteRunStore(db, policy, logs),
        triggers=SqliteTriggerStore(db), admission=SqliteAdmission(db, capacity(config)),
        credentials=SqliteCredentialStore(db), secrets=SqliteSecretStore(db),
        audit=SqliteAuditLog(db, AuditBounds(
            calls=keep.audit_max_rows, changes=keep.audit_change_max_rows, refused=keep.audit_refused_max_rows,
            max_age_days=keep.audit_max_age_days), LoopTimers()),
        readers=sqlite_readers(db), counts=SqliteCountsReader(db),
    )


def runner_settings(config: Config, home: str) -> RunnerSettings:
    r = config.runner
    return RunnerSettings(
        work_dir=private_dir(os.path.join(home, "work")), state_dir=home, concurrency=r.concurrency,
        kill_grace_s=r.kill_grace_s, log_cap_bytes=r.log_cap_bytes, disk_reserve_bytes=r.disk_reserve_bytes,
    )


class Workers(msgspec.Struct, frozen=True, kw_only=True):
    """What runs in the background: the runner and the scheduler that feeds it."""

    runner: Runner
    scheduler: Scheduler
    settings: RunnerSettings


def build_workers(config: Config, home: str, stores: Stores, clock: Clock) -> Workers:
    settings = runner_settings(config, home)
    runner = Runner(runs=stores.runs, tasks=stores.tasks, admission=stores.admission, secrets=stores.secrets,
                    logs=stores.logs, clock=clock, settings=settings)
    scheduler = Scheduler(stores.admission, stores.runs, runner, clock, config.project)
    return Workers(runner=runner, scheduler=scheduler, settings=settings)


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
        triggers=Triggers(stores.triggers, workers.scheduler, trigger_zone(config.timezone)),
        credentials=stores.credentials, secrets=stores.secrets, audit=stores.audit, logs=stores.logs,
        readers=stores.readers, runner=workers.runner, facts=facts, catalog=registry.infos(),
    )


def build_chain(config: Config, services: Services, registry: Registry) -> Chain:
    owners = config.auth.owner_uids if config.auth.owner_uids is not None else sorted({os.getuid(), 0})
    auth = Authenticator(services.credentials, services.pepper, owners, config.project, registry.read_tool_names())
    return Chain(registry, auth, services)


def build_listeners(
    config: Config, home: str, socket_path: str, chain: Chain, facts: DaemonFacts
) -> list[UnixListener]:
    """The tool socket, then MCP's when enabled (edge.mcp is imported here and only here),
    under one shared budget of partial-frame bytes and descriptors."""
    limits, shared = connection_limits(config)
    listeners: list[UnixListener] = [ToolServer(chain, socket_path, config.max_frame_bytes, limits, shared)]
    if config.mcp.enabled:
        listeners.append(mcp_server(config, home, chain, facts, limits, shared))
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


def mcp_server(
    config: Config, home: str, chain: Chain, facts: DaemonFacts, limits: Limits | None = None,
    shared: Shared | None = None,
) -> UnixListener:
    try:
        from edge.mcp.server import McpServer
    except ImportError as exc:
        if exc.name is not None and (exc.name == "edge.mcp" or exc.name.startswith("edge.mcp.")):
            raise StartupError("MCP is not included in this build") from None
        raise
    path = os.path.abspath(config.mcp.socket or os.path.join(home, "mcp.sock"))
    try:
        server = McpServer(chain, path, config.mcp.max_line_bytes, limits, shared)
    except ValueError as exc:  # a tool that cannot be described to MCP clients
        raise StartupError(f"MCP: {exc}") from None
    facts.add_extra(lambda: {"mcp": path})
    return server


# -- the daemon's graph -------------------------------------------------------------


class Graph:
    """Everything the daemon runs. Start: runner recovery → scheduler → listeners."""

    def __init__(
        self, config: Config, home: str, socket_path: str, loop: str, db: Database, pepper: bytes,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or SystemClock()
        self.stores = build_stores(db, config, home)
        self.workers = build_workers(config, home, self.stores, clock)
        self.facts = DaemonFacts(db.path, loop, clock, self.stores.counts)
        self.facts.add_extra(self.workers.scheduler.status)
        registry = Registry([*builtin_tools(), *ai_tools()])
        services = build_services(config, self.stores, self.workers, self.facts, registry, pepper, clock)
        self.chain = build_chain(config, services, registry)
        self.listeners = build_listeners(config, home, socket_path, self.chain, self.facts)

    @property
    def runner(self) -> Runner:
        return self.workers.runner

    @property
    def scheduler(self) -> Scheduler:
        return self.workers.scheduler

    def reload(self, config: Config) -> None:
        """Apply every live key of `config` (LIVE_KEYS), and re-read the triggers: another
        writer may have changed the database."""
        logging.getLogger().setLevel(config.log_level.upper())
        self.stores.admission.set_capacity(capacity(config))
        settings = self.workers.settings
        settings.kill_grace_s = config.runner.kill_grace_s
        settings.log_cap_bytes = config.runner.log_cap_bytes
        settings.disk_reserve_bytes = config.runner.disk_reserve_bytes
        self.workers.scheduler.changed()
