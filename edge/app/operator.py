"""Composition of the AI operator's side of the daemon, imported by edge.app.graph only when
`[agent]` is enabled: the configuration checked (one clear line for each problem), the
specialists (the defaults with `[agent.specialists.NAME]` over them), and the parts
(edge.operator) wired through their constructors, returned for the graph."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from edge.app.config import AgentConfig, AgentProfile, Config, SpecialistConfig
from edge.app.home import StartupError
from edge.core.agent_settings import PROFILES, Limits, ProviderSettings, SpecialistSpec, detect_provider, endpoint
from edge.core.errors import ToolError
from edge.core.ports.runtime import Clock, TaskUsers
from edge.core.ports.stores import SecretStore, TaskStore
from edge.core.runs import ActorType, Run, RunStatus, RunUpdate
from edge.core.tasks import Task
from edge.operator.offer import Offer
from edge.operator.settings import OperatorSettings, child_user
from edge.operator.tools import HISTORY_INFOS, deferred_tools
from edge.tools.context import ToolInfo
from edge.tools.definition import Deferred, Tool, first_use

if TYPE_CHECKING:
    import socket

    from edge.core.agent import AgentLaunch
    from edge.core.auth import Principal
    from edge.core.ports.agent import AgentEvidenceStore, AgentRuns, MissionLedger, RunCredentials
    from edge.operator.evidence import Evidence
    from edge.operator.missions import Missions
    from edge.operator.roster import Roster

SPECIALISTS_MAX = 8
SPECIALIST_OUTPUT_TOKENS = 1024  # a specialist's reply reserve unless configured (never above [agent]'s)
# Built in; their descriptions and system texts are the child's (edge.airun.specialists), so
# the daemon never holds them.
DEFAULT_SPECIALISTS = ("log-analyst", "schedule-advisor")


BAD = "invalid_argument"  # a configuration problem: the start fails with exit code 2


def specialists(configured: dict[str, SpecialistConfig], max_output_tokens: int) -> list[SpecialistSpec]:
    """The default specialists with the configuration over them, in name order; one clear
    line for each problem."""
    found: list[SpecialistSpec] = []
    for name in sorted({*DEFAULT_SPECIALISTS, *configured}):
        given = configured.get(name, SpecialistConfig())
        if not given.enabled:
            continue
        if name not in DEFAULT_SPECIALISTS and (given.description is None or given.system is None):
            raise StartupError(f"[agent.specialists.{name}] needs description and system (it is not a default one)",
                               BAD)
        found.append(SpecialistSpec(
            name=name, description=" ".join(given.description.split()) if given.description else None,
            system=given.system.strip() if given.system else None,
            max_output_tokens=given.max_output_tokens or min(SPECIALIST_OUTPUT_TOKENS, max_output_tokens)))
    if len(found) > SPECIALISTS_MAX:
        raise StartupError(f"[agent.specialists] enables {len(found)} specialists; at most {SPECIALISTS_MAX}", BAD)
    return found


def _checked(provider: ProviderSettings, where: str) -> ProviderSettings:
    """One clear line for each problem of a provider ([agent], or a profile over it)."""
    url = provider.base_url
    if not url:
        raise StartupError(f"{where} base_url is required (e.g. https://api.openai.com/v1)", BAD)
    if endpoint(url) is None:
        raise StartupError(f"{where} base_url {url!r} must be http(s)://host[:port][/path]", BAD)
    if not provider.model:
        raise StartupError(f"{where} model is required (e.g. gpt-4o-mini)", BAD)
    if provider.proxy is not None:
        proxy = endpoint(provider.proxy)
        if proxy is None or proxy.scheme != "http" or proxy.path:
            raise StartupError(f"{where} proxy {provider.proxy!r} must be http://host:port", BAD)
    for key, path in (("api_key_file", provider.api_key_file), ("ca_file", provider.ca_file)):
        if path is None:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise StartupError(f"{where} {key} {path}: {exc.strerror}", BAD) from None
        if key == "api_key_file" and mode & 0o077:
            raise StartupError(f"{where} api_key_file {path} has mode {mode & 0o777:04o}; it must be 0600", BAD)
    return provider


def _resolved(provider: ProviderSettings, named: str | None, param: str | None) -> ProviderSettings:
    """The provider profile (`provider`, else what base_url's host names) and the parameter
    that bounds the reply (`max_tokens_param`, else the profile's)."""
    name = named or detect_provider(provider.base_url)
    return msgspec.structs.replace(provider, provider=name, max_tokens_param=param or PROFILES[name].max_tokens_param)


def _overlay(provider: ProviderSettings, profile: AgentProfile, param: str | None) -> ProviderSettings:
    given = {k: v for k, v in msgspec.structs.asdict(profile).items()
             if v is not None and k not in ("provider", "max_tokens_param")}
    merged = msgspec.structs.replace(provider, **given)
    # A profile on another host is another provider: detected anew unless it names one.
    named = profile.provider or (None if "base_url" in given else provider.provider)
    return _resolved(merged, named, profile.max_tokens_param or param)


def settings(config: Config, users: TaskUsers, missions: bool) -> OperatorSettings:
    """The [agent] section, checked. Without `missions` (a cluster node: there is no mission
    ledger in PostgreSQL) its runs are attempts of no mission: no specialists are offered,
    and [agent] attempts are refused."""
    a: AgentConfig = config.agent
    provider = _checked(_resolved(ProviderSettings(
        base_url=a.base_url or "", model=a.model or "", api_key_file=a.api_key_file, ca_file=a.ca_file, proxy=a.proxy,
        request_timeout_s=a.request_timeout_s, max_output_tokens=a.max_output_tokens,
        context_window_tokens=a.context_window_tokens,
        input_usd_per_mtok=a.input_usd_per_mtok, output_usd_per_mtok=a.output_usd_per_mtok, retries=a.retries,
    ), a.provider, a.max_tokens_param), "[agent]")
    profiles = {name: _checked(_overlay(provider, p, a.max_tokens_param), f"[agent.profiles.{name}]")
                for name, p in a.profiles.items()}
    try:
        child_user(users, a.user)
    except ToolError as exc:
        message = exc.message if exc.message.startswith("[agent]") else f"[agent] user: {exc.message}"
        raise StartupError(message, BAD) from None
    limits = Limits(rounds=a.budget_rounds, input_tokens=a.budget_input_tokens, output_tokens=a.budget_output_tokens,
                    cost_usd=a.budget_cost_usd, wall_clock_s=a.budget_wall_clock_s,
                    tool_calls_per_round=a.tool_calls_per_round)
    roles = specialists(a.specialists, a.max_output_tokens)  # checked even where none is offered
    if not missions and a.attempts > 1:
        raise StartupError(f"[agent] attempts = {a.attempts}: a cluster node keeps no mission ledger, so its AI runs"
                           " are never attempts of a mission; set it to 1", BAD)
    return OperatorSettings(provider=provider, profiles=profiles, limits=limits, read_logs=a.read_logs,
                            concurrency=a.concurrency, user=a.user, attempts=a.attempts,
                            specialists=roles if missions else [])


class FirstUseRuns:
    """AgentRuns, made by `make` at the first AI run (or the first run recovered as lost):
    an idle daemon keeps how AI runs start and end unloaded, and answers only how many may
    run at once."""

    def __init__(self, concurrency: int, make: Callable[[], AgentRuns]) -> None:
        self._concurrency = concurrency
        self._runs = first_use(make)

    @property
    def concurrency(self) -> int:
        return self._concurrency

    async def launch(self, task: Task, run: Run) -> AgentLaunch:
        return await self._runs().launch(task, run)

    def exited(self, run_id: str, status: RunStatus, update: RunUpdate) -> RunStatus:
        return self._runs().exited(run_id, status, update)

    async def ended(self, run: Run, task: Task | None) -> None:
        await self._runs().ended(run, task)


class FirstUseCredentials:
    """RunCredentials, made at the first AI run's launch: until then none is live, so an
    idle daemon answers every look-up with None without loading them."""

    def __init__(self, pepper: bytes) -> None:
        self._pepper = pepper
        self._made: RunCredentials | None = None

    def mint(self, run_id: str, permissions: frozenset[str]) -> str:
        if self._made is None:
            from edge.operator.credentials import RunCredentialRegistry

            self._made = RunCredentialRegistry(self._pepper)
        return self._made.mint(run_id, permissions)

    def revoke(self, run_id: str) -> bool:
        return self._made is not None and self._made.revoke(run_id)

    def lookup(self, credential_id: str) -> tuple[bytes, Principal] | None:
        return self._made.lookup(credential_id) if self._made is not None else None


class Operator(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's side of the AI operator, as the graph plugs it in."""

    runs: AgentRuns  # for the runner
    credentials: RunCredentials  # for the chain's authentication
    deferred: list[Deferred]  # its tools
    status: Callable[[], dict[str, str]]


def build_operator(
    config: Config, *, tasks: TaskStore, secrets: SecretStore, clock: Clock, pepper: bytes, users: TaskUsers,
    evidence: Callable[[], AgentEvidenceStore], ledger: Callable[[], MissionLedger] | None, infos: list[ToolInfo],
    ai_tools: Callable[[], list[Tool]], start_run: Callable[[Task, ActorType], Awaitable[Run]],
    connect: Callable[[socket.socket], None], credentials: RunCredentials | None = None,
) -> Operator:
    """The AI operator's side of the daemon, its configuration checked. `evidence` and
    `ledger` (None: none is kept) are made at their first use; `infos` are the daemon's own
    tools, whose AI read tools (and the operator's) its runs are offered, and `ai_tools`
    all the AI tools with their types, asked for at the first launch; `start_run` starts the
    next attempt of a mission; `connect` serves a child's own tool connection."""
    s = settings(config, users, ledger is not None)
    credentials = credentials or FirstUseCredentials(pepper)

    def make_roster() -> Roster:
        from edge.operator.roster import Roster

        return Roster()

    def make_evidence() -> Evidence:
        from edge.operator.evidence import Evidence

        return Evidence(evidence, secrets, clock)

    def make_missions() -> Missions:
        from edge.operator.missions import Missions

        return Missions(ledger=ledger, roster=roster(), tasks=tasks, clock=clock, start_run=start_run,
                        attempts=s.attempts, specialists=frozenset(spec.name for spec in s.specialists))

    roster, writer, missions = first_use(make_roster), first_use(make_evidence), first_use(make_missions)
    try:
        offer = Offer([*infos, *HISTORY_INFOS], s.read_logs, s.specialists, ai_tools)
    except ValueError as exc:  # two tools that would share one name on the wire
        raise StartupError(f"[agent] {exc}", BAD) from None
    deferred = deferred_tools(settings=s, offer=offer, roster=roster, store=evidence, evidence=writer,
                              missions=missions)
    def make_runs() -> AgentRuns:
        from edge.operator.runs import AiRuns

        return AiRuns(settings=s, credentials=credentials, offer=offer, roster=roster(), evidence=writer,
                      missions=missions if ledger is not None else None, tasks=tasks, users=users, clock=clock,
                      connect=connect)

    runs = FirstUseRuns(s.concurrency, make_runs)
    who = f"its runs are {s.user}" if users.can_switch else "its runs are the daemon's user"
    line = {"agent": f"{s.provider.model} at {s.provider.base_url}; {who}"}
    return Operator(runs=runs, credentials=credentials, deferred=deferred, status=lambda: line)
