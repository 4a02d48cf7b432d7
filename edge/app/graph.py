"""The object graph of `qledge serve`, wired from the configuration.

Building is synchronous and does no I/O beyond creating the state directories; the
daemon (edge.app.daemon) owns the order in which the parts start and stop.
"""

from __future__ import annotations

import logging
import os

from edge.app.config import Config
from edge.core.clock import Clock
from edge.core.ports import Counts
from edge.core.schedule import ScheduleError, default_zone, load_zone
from edge.runner.supervisor import Runner, RunnerSettings
from edge.scheduler.loop import Scheduler, Triggers
from edge.server.unix_server import ToolServer, UnixListener
from edge.storage.sqlite import stats
from edge.storage.sqlite.audit import SqliteAuditLog
from edge.storage.sqlite.credentials import SqliteCredentialStore
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.reads import sqlite_readers
from edge.storage.sqlite.retention import Policy
from edge.storage.sqlite.runs import SqliteRunStore
from edge.storage.sqlite.secrets import SqliteSecretStore
from edge.storage.sqlite.tasks import SqliteTaskStore
from edge.storage.sqlite.triggers import SqliteTriggerStore
from edge.tools.ai.catalog import ai_tools
from edge.tools.authn import Authenticator
from edge.tools.builtin.catalog import builtin_tools
from edge.tools.chain import Chain
from edge.tools.context import Services
from edge.tools.definition import Registry

log = logging.getLogger("qledge")


class StartupError(Exception):
    """One clear line; the daemon exits non-zero without a traceback."""


class DaemonFacts:
    """What `qledge.status` reports about the daemon itself."""

    def __init__(self, db: Database, loop: str, clock: Clock) -> None:
        self.loop = loop
        self.db_path = db.path
        self.started_monotonic = clock.monotonic()
        self._db = db
        self._extra: list = []  # callables returning {name: value}, added by capabilities

    async def counts(self, project: str) -> Counts:
        return await stats.read_counts(self._db, project)

    def add_extra(self, provider) -> None:
        self._extra.append(provider)

    def extra(self) -> dict[str, str]:
        lines: dict[str, str] = {}
        for provider in self._extra:
            lines.update(provider())
        return lines


def private_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def runner_settings(config: Config, home: str) -> RunnerSettings:
    r = config.runner
    return RunnerSettings(
        logs_dir=private_dir(os.path.join(home, "logs")),
        work_dir=private_dir(os.path.join(home, "work")),
        concurrency=r.concurrency,
        queue_limit=r.queue_limit,
        kill_grace_s=r.kill_grace_s,
        log_cap_bytes=r.log_cap_bytes,
        disk_reserve_bytes=r.disk_reserve_bytes,
    )


def _trigger_zone(configured: str | None) -> str:
    zone = default_zone(configured)
    try:
        load_zone(zone)
    except ScheduleError as exc:  # manual runs still work; new triggers must name a zone
        log.warning("default timezone: %s", exc)
    return zone


class Graph:
    """Everything the daemon runs. Start: runner recovery → scheduler → listeners."""

    def __init__(
        self, config: Config, home: str, socket_path: str, loop: str, clock: Clock, db: Database, pepper: bytes
    ) -> None:
        keep = config.retention
        self.settings = runner_settings(config, home)
        tasks = SqliteTaskStore(db)
        runs = SqliteRunStore(db, Policy(
            runs_per_task=keep.runs_per_task, max_age_ms=keep.run_max_age_days * 86_400_000,
            log_quota_bytes=keep.log_quota_bytes,
        ), self.settings.logs_dir)
        credentials, secrets = SqliteCredentialStore(db), SqliteSecretStore(db)
        self.runner = Runner(runs, tasks, clock, secrets=secrets, settings=self.settings)
        self.triggers = SqliteTriggerStore(db, capacity=config.runner.concurrency + config.runner.queue_limit)
        self.runner.admission = self.triggers
        self.scheduler = Scheduler(self.triggers, runs, self.runner, clock, config.project)
        registry = Registry([*builtin_tools(), *ai_tools()])
        owners = config.auth.owner_uids if config.auth.owner_uids is not None else sorted({os.getuid(), 0})
        auth = Authenticator(credentials, pepper, owners, config.project, registry.read_tool_names())
        self.facts = DaemonFacts(db, loop, clock)
        services = Services(
            project=config.project, clock=clock, tasks=tasks, runs=runs, credentials=credentials,
            audit=SqliteAuditLog(db, keep.audit_max_rows, keep.audit_max_age_days),
            runner=self.runner, pepper=pepper, facts=self.facts,
        )
        services.secrets = secrets
        services.readers = sqlite_readers(db)
        services.catalog = registry
        services.triggers = Triggers(self.triggers, self.scheduler, _trigger_zone(config.timezone))
        self.facts.add_extra(self.scheduler.status)
        self.chain = Chain(registry, auth, services)
        self.server = ToolServer(self.chain, socket_path, config.max_frame_bytes)
        self.mcp = mcp_server(config, home, self.chain, self.facts) if config.mcp.enabled else None

    async def reload(self, config: Config) -> None:
        """SIGHUP: queue_limit is live, and triggers are re-read (another writer may have
        changed the database)."""
        self.triggers.capacity = config.runner.concurrency + config.runner.queue_limit
        self.scheduler.changed()


def mcp_server(config: Config, home: str, chain: Chain, facts: DaemonFacts) -> UnixListener:
    """edge.mcp is imported here and only here, when [mcp] enabled = true."""
    try:
        from edge.mcp.server import McpServer
    except ImportError as exc:
        if exc.name is not None and (exc.name == "edge.mcp" or exc.name.startswith("edge.mcp.")):
            raise StartupError("MCP is not included in this build") from None
        raise
    path = os.path.abspath(config.mcp.socket or os.path.join(home, "mcp.sock"))
    try:
        server = McpServer(chain, path, config.mcp.max_line_bytes)
    except ValueError as exc:  # a tool that cannot be described to MCP clients
        raise StartupError(f"MCP: {exc}") from None
    facts.add_extra(lambda: {"mcp": path})
    return server
