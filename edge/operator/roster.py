"""What the daemon holds for the AI runs it knows of until their records are written: each
active run (its child running, or about to), with the rounds its child reported; and what a
run was started as, named before it launches."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from edge.core.agent_settings import Limits
from edge.core.errors import ToolError, conflict

if TYPE_CHECKING:  # the shapes of runs load with the first AI run, the ledger's with the missions
    from edge.core.agent import EvidenceOpen, OutcomeReport, RoundMeta
    from edge.core.ledger import Attempt


class ActiveRun:
    """An AI run whose child is running (or about to): what the daemon knows of it, the
    rounds its child reported included, until its record is written at its end."""

    __slots__ = ("record", "limits", "prices", "rounds", "outcome", "warned", "attempt", "started_ms", "position",
                 "input_tokens", "output_tokens", "usage_estimated", "cost_usd", "check")

    def __init__(self, record: EvidenceOpen, limits: Limits, prices: tuple[float, float] | None,
                 started_ms: int | None = None) -> None:
        self.record = record
        self.limits = limits
        self.prices = prices
        self.rounds: list[RoundMeta] = []  # at most limits.rounds (the report tool refuses more)
        self.outcome: OutcomeReport | None = None
        self.warned = False  # a write of its record failed (and was logged)
        self.attempt: Attempt | None = None  # None: its mission could not be recorded (or there is none)
        self.started_ms = started_ms
        self.position: int | None = None  # the store's change position when it started
        self.input_tokens = 0
        self.output_tokens = 0
        self.usage_estimated = False
        self.cost_usd: float | None = 0.0 if prices is not None else None
        self.check = False  # a run of `qledge agent check`

    def add(self, meta: RoundMeta, cost: float | None) -> None:
        self.rounds.append(meta)
        self.input_tokens += meta.input_tokens
        self.output_tokens += meta.output_tokens
        self.usage_estimated = self.usage_estimated or meta.usage_estimated
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost


class Roster:
    """The active AI runs, and the names runs are given before they launch: the next attempt
    of a mission (`retrying`: run id -> mission id) or a run of `qledge agent check`
    (`checking`). A retry or a check holds `naming` from its admission until it has named
    its run, and a launch reads the names under it, so no launch can miss its own."""

    def __init__(self) -> None:
        self.active: dict[str, ActiveRun] = {}
        self.retrying: dict[str, str] = {}
        self.checking: set[str] = set()
        self.naming = asyncio.Lock()

    def own(self, run_id: str | None, refusal: str) -> ActiveRun:
        """The active run whose own credential made a call (`run_id`: the principal's).
        Raises permission_denied (`refusal`) for any other principal, conflict for a run
        that is not active."""
        if run_id is None:
            raise ToolError("permission_denied", refusal)
        state = self.active.get(run_id)
        if state is None:
            raise conflict(f"run {run_id} is not an active AI run")
        return state

    def forget(self, run_id: str) -> ActiveRun | None:
        """The run has ended: nothing more is held for it (a name it was given but never
        launched with included). Its state, if it was active."""
        self.retrying.pop(run_id, None)
        self.checking.discard(run_id)
        return self.active.pop(run_id, None)
