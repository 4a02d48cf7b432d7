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
from typing import TYPE_CHECKING

import msgspec

from edge.app.config import AgentConfig, AgentProfile, Config, default_zone
from edge.core.clock import SystemClock
from edge.core.ports.runtime import AgentRuns, Clock
from edge.core.ports.stores import AuditLog, CountsReader, CredentialStore, Readers, SecretStore
from edge.core.reads import Counts
from edge.core.schedule import ScheduleError, load_zone
from edge.runner.supervisor import Runner, RunnerSettings
from edge.scheduler.loop import Scheduler, Triggers
from edge.storage.run_logs import RunLogs
from edge.storage.sqlite.admission import SqliteAdmission
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
from edge.tools.chain import Authenticator, Chain, RunCredentialRegistry
from edge.tools.context import Services
from edge.tools.definition import Registry, Tool
from edge.transports.tool_socket import ToolServer
from edge.transports.unix import UnixListener

if TYPE_CHECKING:
    from edge.core.tasks import ProviderSettings
    from edge.tools.agent import AgentService

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
        audit=SqliteAuditLog(db, keep.audit_max_rows, keep.audit_max_age_days),
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


def build_workers(config: Config, home: str, stores: Stores, clock: Clock, agents: AgentRuns | None = None) -> Workers:
    settings = runner_settings(config, home)
    runner = Runner(runs=stores.runs, tasks=stores.tasks, admission=stores.admission, secrets=stores.secrets,
                    logs=stores.logs, clock=clock, settings=settings, agents=agents)
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


def build_chain(
    config: Config, services: Services, registry: Registry, run_credentials: RunCredentialRegistry | None = None
) -> Chain:
    owners = config.auth.owner_uids if config.auth.owner_uids is not None else sorted({os.getuid(), 0})
    auth = Authenticator(services.credentials, services.pepper, owners, config.project, registry.read_tool_names(),
                         run_credentials)
    return Chain(registry, auth, services)


# -- the AI operator (edge.tools.agent, edge.storage.sqlite.evidence; its child edge.agent is never imported) --


def _checked(provider: ProviderSettings, where: str) -> ProviderSettings:
    """One clear line for each problem of a provider ([agent], or a profile over it)."""
    from edge.core.tasks import endpoint

    url = provider.base_url
    if not url:
        raise StartupError(f"{where} base_url is required (e.g. https://api.openai.com/v1)")
    if endpoint(url) is None:
        raise StartupError(f"{where} base_url {url!r} must be http(s)://host[:port][/path]")
    if not provider.model:
        raise StartupError(f"{where} model is required (e.g. gpt-4o-mini)")
    if provider.proxy is not None:
        proxy = endpoint(provider.proxy)
        if proxy is None or proxy.scheme != "http" or proxy.path:
            raise StartupError(f"{where} proxy {provider.proxy!r} must be http://host:port")
    for key, path in (("api_key_file", provider.api_key_file), ("ca_file", provider.ca_file)):
        if path is None:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise StartupError(f"{where} {key} {path}: {exc.strerror}") from None
        if key == "api_key_file" and mode & 0o077:
            raise StartupError(f"{where} api_key_file {path} has mode {mode & 0o777:04o}; it must be 0600")
    return provider


def _overlay(provider: ProviderSettings, profile: AgentProfile) -> ProviderSettings:
    given = {k: v for k, v in msgspec.structs.asdict(profile).items() if v is not None}
    return msgspec.structs.replace(provider, **given)


def agent_service(
    config: Config, socket_path: str, db: Database, stores: Stores, clock: Clock, credentials: RunCredentialRegistry
) -> AgentService:
    """The AI operator's side of the daemon ([agent] enabled), its configuration checked."""
    import importlib.util

    if importlib.util.find_spec("edge.agent") is None:  # finds it without importing it
        raise StartupError("the AI operator is not included in this build")
    from edge.core.tasks import Limits, ProviderSettings
    from edge.storage.sqlite.evidence import SqliteEvidenceStore
    from edge.tools.agent import AgentService, AgentSettings

    a: AgentConfig = config.agent
    provider = _checked(ProviderSettings(
        base_url=a.base_url or "", model=a.model or "", api_key_file=a.api_key_file, ca_file=a.ca_file, proxy=a.proxy,
        request_timeout_s=a.request_timeout_s, max_output_tokens=a.max_output_tokens,
        max_tokens_param=a.max_tokens_param, context_window_tokens=a.context_window_tokens,
        input_usd_per_mtok=a.input_usd_per_mtok, output_usd_per_mtok=a.output_usd_per_mtok, retries=a.retries,
    ), "[agent]")
    profiles = {name: _checked(_overlay(provider, p), f"[agent.profiles.{name}]") for name, p in a.profiles.items()}
    limits = Limits(rounds=a.budget_rounds, input_tokens=a.budget_input_tokens, output_tokens=a.budget_output_tokens,
                    cost_usd=a.budget_cost_usd, wall_clock_s=a.budget_wall_clock_s,
                    tool_calls_per_round=a.tool_calls_per_round)
    settings = AgentSettings(provider=provider, profiles=profiles, limits=limits, read_logs=a.read_logs,
                             concurrency=a.concurrency, socket=socket_path)
    return AgentService(settings=settings, credentials=credentials, evidence=SqliteEvidenceStore(db),
                        tasks=stores.tasks, secrets=stores.secrets, clock=clock)


def agent_tools(agent: AgentService | None) -> list[Tool]:
    if agent is None:
        return []
    from edge.tools.agent import agent_tools as tools

    return tools(agent)


def build_listeners(
    config: Config, home: str, socket_path: str, chain: Chain, facts: DaemonFacts
) -> list[UnixListener]:
    """The tool socket, then MCP's when enabled (edge.mcp is imported here and only here)."""
    listeners: list[UnixListener] = [ToolServer(chain, socket_path, config.max_frame_bytes)]
    if config.mcp.enabled:
        listeners.append(mcp_server(config, home, chain, facts))
    return listeners


def mcp_server(config: Config, home: str, chain: Chain, facts: DaemonFacts) -> UnixListener:
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


# -- the daemon's graph -------------------------------------------------------------


class Graph:
    """Everything the daemon runs. Start: runner recovery → scheduler → listeners."""

    def __init__(
        self, config: Config, home: str, socket_path: str, loop: str, db: Database, pepper: bytes,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or SystemClock()
        self.stores = build_stores(db, config, home)
        credentials = RunCredentialRegistry(pepper) if config.agent.enabled else None
        agent = agent_service(config, socket_path, db, self.stores, clock, credentials) if credentials else None
        self.workers = build_workers(config, home, self.stores, clock, agent)
        self.facts = DaemonFacts(db.path, loop, clock, self.stores.counts)
        self.facts.add_extra(self.workers.scheduler.status)
        registry = Registry([*builtin_tools(), *ai_tools(), *agent_tools(agent)])
        if agent is not None:
            agent.offer(registry.tools())
            provider = agent.settings.provider
            self.facts.add_extra(lambda: {"agent": f"{provider.model} at {provider.base_url}"})
        services = build_services(config, self.stores, self.workers, self.facts, registry, pepper, clock)
        self.chain = build_chain(config, services, registry, credentials)
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
