"""What the AI operator's parts share: the job the runner hands an AI run's child, and the
shapes of the evidence history (seed 001). Loaded only where the operator is: by its child
(edge.agent) and, when `[agent]` is enabled, by the daemon's side of it (edge.tools.agent,
edge.storage.sqlite.evidence); the default daemon never imports it."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from edge.core.text import MAX_SAFE_INT, SAFE_TEXT, Millis, Revision

# -- what the runner hands the child of an AI run --------------------------------------

_URL = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[^?#\s]*)?$"
)


class Endpoint(msgspec.Struct, frozen=True, array_like=True):
    scheme: str
    host: str
    port: int
    path: str  # without a trailing slash

    @property
    def where(self) -> str:
        """host, or host:port when the port is not the scheme's own."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def endpoint(url: str) -> Endpoint | None:
    """`http(s)://host[:port][/path]`, nothing else (no user info, query or fragment); None otherwise."""
    m = _URL.match(url)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        return None
    default = 443 if m["scheme"] == "https" else 80
    return Endpoint(m["scheme"], m["host"].strip("[]"), int(m["port"] or default), (m["path"] or "").rstrip("/"))


# -- provider profiles: every difference in request shape between providers, in one table --
#
# What each service documents (the tests' conformance fakes, tests/fake_provider.py, cite the
# pages): OpenAI refuses unknown fields, `max_tokens` on reasoning models (o-series, gpt-5) and
# function names outside ^[a-zA-Z0-9_-]{1,64}$; DeepSeek's thinking mode wants
# `reasoning_content` back on the assistant messages that called tools; Qwen3 on DashScope
# refuses a non-streaming call unless `enable_thinking` is false; the others take the
# OpenAI shape with `max_tokens`. Everything the child sends differently is one field here.

ProviderName = Literal["openai", "deepseek", "qwen", "gemini", "ollama", "llamacpp", "vllm", "generic"]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    label: str  # as the owner knows it
    hosts: tuple[str, ...] = ()  # base_url hosts (or their parent domains) that name this profile
    port: int | None = None  # ... or this port on any host (Ollama's own)
    max_tokens_param: str = "max_tokens"
    reasoning_echo: bool = False  # pass `reasoning_content` back on assistant messages with tool calls
    thinking_off: bool = False  # send `enable_thinking: false` (non-streaming calls need it)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    # max_completion_tokens: every current chat model takes it; the reasoning models refuse max_tokens.
    Profile(name="openai", label="OpenAI", hosts=("api.openai.com",), max_tokens_param="max_completion_tokens"),
    Profile(name="deepseek", label="DeepSeek", hosts=("api.deepseek.com",), reasoning_echo=True),
    Profile(name="qwen", label="Qwen (DashScope)", hosts=("dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com"),
            thinking_off=True),
    Profile(name="gemini", label="Gemini (OpenAI-compatible)", hosts=("generativelanguage.googleapis.com",)),
    Profile(name="ollama", label="Ollama", port=11434),
    Profile(name="llamacpp", label="llama.cpp server"),
    Profile(name="vllm", label="vLLM"),
    Profile(name="generic", label="an OpenAI-compatible server"),
)}


def detect_provider(base_url: str) -> str:
    """The profile `base_url` names unambiguously (its host, or Ollama's port), else generic."""
    found = endpoint(base_url)
    if found is None:
        return "generic"
    host = found.host.lower()
    for profile in PROFILES.values():
        if any(host == h or host.endswith("." + h) for h in profile.hosts) or found.port == profile.port:
            return profile.name
    return "generic"


# -- tool names on the wire --------------------------------------------------------------

def wire_name(name: str) -> str:
    """`name` as every provider accepts it, [A-Za-z][A-Za-z0-9_-]{0,63}: letters, digits, `_`
    and `-`, starting with a letter, at most 64 characters (qinglong.run.get -> qinglong_run_get)."""
    wire = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)
    if not wire[:1].isascii() or not wire[:1].isalpha():
        wire = "t" + wire
    return wire[:64]


def wire_names(names: list[str]) -> dict[str, str]:
    """Each tool name's wire name, unique: ValueError names two tools that would share one."""
    found: dict[str, str] = {}
    for name in names:
        wire = wire_name(name)
        if wire in found and found[wire] != name:
            raise ValueError(f"the tools {found[wire]!r} and {name!r} would both be offered to the model as"
                             f" {wire!r}: rename one")
        found[wire] = name
    return {name: wire for wire, name in found.items()}


class ProviderSettings(msgspec.Struct, kw_only=True):
    """One OpenAI-compatible chat-completions endpoint (the [agent] section or a profile)."""

    base_url: str
    model: str
    provider: str = "generic"  # a key of PROFILES
    api_key_file: str | None = None  # read by the child, never by the daemon
    ca_file: str | None = None  # None: the system's trust store
    proxy: str | None = None  # None: direct (the environment's proxy variables are never used)
    request_timeout_s: float = 120.0
    max_output_tokens: int = 4096
    max_tokens_param: str = "max_tokens"
    context_window_tokens: int = 65536
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    retries: int = 2


class Limits(msgspec.Struct, kw_only=True):
    """The budgets of one AI run, after its overrides were lowered to the configured maxima."""

    rounds: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    wall_clock_s: int
    tool_calls_per_round: int


class OfferedTool(msgspec.Struct, kw_only=True):
    """A tool the model may call: the daemon's name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: msgspec.Raw  # a JSON object


class ChildUser(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Whom the child becomes once it has read its job (`[agent] user`, on a daemon that can
    switch users): never root, the daemon's user or their groups, so it cannot read the
    state directory; changing credentials also leaves it undumpable (no same-user tracing)."""

    uid: int
    gid: int
    groups: list[int]


# The operator model's specialist tools (seed 003): handled in the child, offered nowhere else.
PARENT_TOOLS = ("specialist.delegate", "specialist.correct", "specialist.revoke", "specialist.ask",
                "specialist.items")


class SpecialistSpec(msgspec.Struct, kw_only=True):
    """A no-tool role the operator may consult: [agent.specialists.NAME], defaults included."""

    name: str
    description: str | None  # one line for the operator's tool descriptions; None: the default's
    system: str | None  # its system text; None: the default's (edge.agent.specialists holds them)
    max_output_tokens: int  # the reply reserved in its context window and budgets


class MissionJob(msgspec.Struct, kw_only=True):
    """The run as an attempt of its mission, and the specialists it may consult."""

    mission_id: str
    attempt: int
    specialists: list[SpecialistSpec]


class AgentJob(msgspec.Struct, kw_only=True):
    """Everything the child needs, passed on an inherited descriptor (never argv or the
    environment): the run's credential, the instruction, the provider, the budgets, the
    tools it may offer the model, the user it is to become and, as an attempt of its
    mission, the specialists it may consult. It calls tools (the ledger's too) on another
    inherited descriptor: a connection of its own to the tool server, which trusts it by
    its token only."""

    run_id: str
    task_id: str
    token: str
    instruction: str
    provider: ProviderSettings
    limits: Limits
    tools: list[OfferedTool]
    user: ChildUser | None = None  # None: it stays the daemon's user (a daemon that is not root)
    mission: MissionJob | None = None  # None: no mission ledger (unreachable, or a cluster node); no specialists
    check: bool = False  # `qledge agent check`: one request that exercises tool calling, and a diagnosis


class AgentLaunch(msgspec.Struct, kw_only=True):
    """How the runner starts the child of an AI run."""

    argv: list[str]
    job: bytes  # the encoded AgentJob, handed over on an inherited descriptor
    timeout_s: float  # the wall-clock budget: the runner kills the child when it is spent
    uid: int  # the user the child becomes: its run has that user's login environment
    tool_fd: int  # the child's end of its tool connection; the runner passes it, then closes it (-1: closed)


# -- the evidence history of AI runs (seed 001) --------------------------------------
# A projection, not a trace: identity and outcome, the instruction, provider and model,
# usage and cost, per-round metadata, tool names, bounded error and answer summary, and
# the store's change position before and after. Never tool results, logs, prompts or secrets.

EVIDENCE_TEXT_MAX = 500  # plan, error and answer summary, in characters
ROUND_TOOLS_MAX = 16
UNKNOWN_TOOL = "unknown_tool"  # what a round records for a tool name that was not offered
EvidenceState = Literal["running", "succeeded", "failed", "cancelled", "budget_exhausted", "timed_out", "lost"]
BudgetName = Literal["rounds", "input_tokens", "output_tokens", "cost_usd", "wall_clock"]
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
_RowText = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=SAFE_TEXT)]
_ShortText = Annotated[str, msgspec.Meta(min_length=1, max_length=EVIDENCE_TEXT_MAX, pattern=SAFE_TEXT)]
_ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
_Code = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
_Model = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=SAFE_TEXT)]


class SpecialistRound(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """What a specialist round delivered: counts only, never the text."""

    child: Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]*$")]
    constraints: _Count  # active constraints delivered (all of them, always)
    history_sent: _Count
    history_trimmed: _Count  # history entries of the child not sent (window, bytes, context)


class RoundMeta(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """One model round as the evidence keeps it: what the child reports after each response.
    A specialist's round counts like the operator's and says whose it was."""

    round: Annotated[int, msgspec.Meta(ge=1, le=1000)]
    model: _Model
    input_tokens: _Count
    output_tokens: _Count
    usage_estimated: bool  # the server sent no usage: conservative estimates
    response_chars: _Count
    tools: Annotated[list[_ToolName], msgspec.Meta(max_length=ROUND_TOOLS_MAX)] = []  # calls asked for, in order
    plan: _ShortText | None = None  # the model's own one-line plan
    specialist: SpecialistRound | None = None  # a specialist's round: its child and what it was sent


class OutcomeReport(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """How an AI run's child says it ended (the runner still decides the run's status)."""

    outcome: Literal["succeeded", "failed", "budget_exhausted"]
    error_code: _Code | None = None
    budget: BudgetName | None = None
    message: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None = None
    answer_summary: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None = None


class EvidenceSummary(msgspec.Struct, frozen=True):
    """The low-sensitivity columns of one record: no free text."""

    project_id: _RowText
    run_id: _RowText
    task_id: _RowText
    task_revision: Revision
    state: EvidenceState
    error_code: _Code | None
    budget: BudgetName | None
    provider: _RowText
    model: _Model
    rounds: _Count
    input_tokens: _Count
    output_tokens: _Count
    usage_estimated: bool
    cost_usd: Annotated[float, msgspec.Meta(ge=0)] | None  # None: unknown, never zero for lack of prices
    created_at_ms: Millis
    finished_at_ms: Millis | None


class EvidenceDetail(EvidenceSummary, frozen=True):
    instruction: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    round_meta: Annotated[list[RoundMeta], msgspec.Meta(max_length=1000)]
    error: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None
    answer_summary: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None
    position_before: _Count
    position_after: _Count | None


class EvidenceOpen(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of an AI run when it starts (or ends without having started)."""

    project_id: str
    run_id: str
    task_id: str
    task_revision: int
    instruction: str
    provider: str
    model: str
    cost_known: bool  # prices are configured: the cost starts at zero, else it is unknown


class EvidenceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A whole record, as it is written once, at the run's terminal state (seed 001): what
    the run started with, the rounds the daemon held for it, and how it ended."""

    started: EvidenceOpen
    state: EvidenceState
    rounds: list[RoundMeta] = []
    input_tokens: int = 0
    output_tokens: int = 0
    usage_estimated: bool = False
    cost_usd: float | None = None  # None: unknown (no prices, or a round without usage)
    position_before: int | None = None  # None: not known (a run recovered after a crash)
    created_at_ms: int | None = None  # when the run started; None: not known (the write's time)
    error_code: str | None = None
    budget: BudgetName | None = None
    error: str | None = None
    answer_summary: str | None = None


class EvidenceCursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    """A position in (createdAtMs DESC, runId DESC) order."""

    created_at_ms: Millis
    run_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=SAFE_TEXT)]
