"""What the AI operator's parts share about runs: the job the runner hands an AI run's child,
and the shapes of the evidence history (seed 001). Loaded only where the operator is: by
its child (edge.airun) and by the daemon's side of it at the first AI run, report or history
read (edge.operator, edge.storage.sqlite.evidence); the default daemon never imports it.
What both agree on before any run (settings, profiles, wire names) is
edge.core.agent_settings'."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# Named here too, for the child (edge.airun imports them from this module).
from edge.core.agent_settings import (  # noqa: F401
    PARENT_TOOLS,
    PROFILES,
    ChildUser,
    Endpoint,
    Limits,
    Profile,
    ProviderName,
    ProviderSettings,
    SpecialistSpec,
    detect_provider,
    endpoint,
    wire_name,
    wire_names,
)
from edge.core.text import MAX_SAFE_INT, SAFE_TEXT, Millis, Revision

# -- what the runner hands the child of an AI run --------------------------------------


class OfferedTool(msgspec.Struct, kw_only=True):
    """A tool the model may call: the daemon's name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: msgspec.Raw  # a JSON object


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


class EvidenceLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The limits a run had: the configured maxima lowered by its task's budget (numbers only)."""

    rounds: _Count
    input_tokens: _Count
    output_tokens: _Count
    cost_usd: Annotated[float, msgspec.Meta(ge=0)]
    wall_clock_s: _Count
    tool_calls_per_round: _Count


def evidence_limits(limits: Limits) -> EvidenceLimits:
    return EvidenceLimits(
        rounds=limits.rounds, input_tokens=limits.input_tokens, output_tokens=limits.output_tokens,
        cost_usd=limits.cost_usd, wall_clock_s=limits.wall_clock_s, tool_calls_per_round=limits.tool_calls_per_round,
    )


class EvidenceDetail(EvidenceSummary, frozen=True):
    instruction: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    round_meta: Annotated[list[RoundMeta], msgspec.Meta(max_length=1000)]
    error: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None
    answer_summary: Annotated[str, msgspec.Meta(max_length=EVIDENCE_TEXT_MAX)] | None
    position_before: _Count
    position_after: _Count | None
    limits: EvidenceLimits | None = None  # None: not known (a record written before limits were kept)


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
    limits: EvidenceLimits | None = None


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
