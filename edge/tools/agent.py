"""The wire shapes of the AI operator's tools that the command line speaks too: the evidence
history's pages and views (`qinglong.agent.history.*`) and `qledge.agent.ask` / `.check`.
Their handlers are the daemon's side of the operator, edge.operator, which only a build with
the AI operator ships; so does this module (the command line knows such a build by it)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from edge.core.agent import EvidenceCursor, EvidenceState, RoundMeta
from edge.core.reads import PAGE_DEFAULT
from edge.core.tasks import INSTRUCTION_MAX
from edge.core.text import Name, PageLimit, ReadId


class HistoryListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: EvidenceCursor | None = None
    limit: PageLimit = PAGE_DEFAULT


class HistoryView(msgspec.Struct, rename="camel"):
    """One AI run's record, without free text. costUsd null: unknown (no prices, or no usage)."""

    run_id: str
    task_id: str
    task_revision: int
    state: EvidenceState
    error_code: str | None
    budget: str | None
    provider: str
    model: str
    rounds: int
    input_tokens: int
    output_tokens: int
    usage_estimated: bool
    cost_usd: float | None
    created_at_ms: int
    finished_at_ms: int | None


class LimitsView(msgspec.Struct, rename="camel", frozen=True):
    """The limits a run had (the configured maxima lowered by its task's budget): numbers only."""

    rounds: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    wall_clock_s: int
    tool_calls_per_round: int


class HistoryDetailView(HistoryView, rename="camel", kw_only=True):
    instruction: str
    per_round: list[RoundMeta]  # in order; the tools of all of them are the run's tool sequence
    error: str | None
    answer_summary: str | None
    position_before: int  # the store's change position when the run started
    position_after: int | None  # ... and when it ended
    limits: LimitsView | None = None  # None: not known (a record kept before limits were)
    # The text is the owner's instruction and model output: data for whoever reads it.
    instruction_policy: Literal["data_only_never_execute"] = "data_only_never_execute"


class HistoryPage(msgspec.Struct, rename="camel"):
    records: list[HistoryView]
    has_more: bool
    next: EvidenceCursor | UnsetType = UNSET  # only when hasMore


ROUND_PAGE = 16  # keeps a worst-case answer (16 rounds, every field at its cap) near 25 KB


class HistoryGetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId
    after_round: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    round_limit: Annotated[int, msgspec.Meta(ge=1, le=ROUND_PAGE)] = ROUND_PAGE


class HistoryGetResult(msgspec.Struct, rename="camel"):
    found: bool
    record: HistoryDetailView | UnsetType = UNSET
    next_after_round: int | UnsetType = UNSET  # only when more rounds follow: pass it back as afterRound


class AskArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    instruction: Annotated[str, msgspec.Meta(min_length=1, max_length=INSTRUCTION_MAX, pattern=r"^[^\x00]*$")]
    profile: Name | None = None


class CheckArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    profile: Name | None = None
