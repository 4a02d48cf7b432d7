"""The evidence history as AI runs write it (seed 001): a record opened when a run's child
starts, written once, whole, when the run reaches its terminal state (the rounds its child
reported held in memory until then), for every outcome; a record that cannot be written is
logged once per run and changes nothing else. And the masking of the text a record (or a
question) holds: every configured secret and credential pattern, on one bounded line.
Loaded at the first AI run or report."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from edge.core.agent import (
    EVIDENCE_TEXT_MAX, EvidenceOpen, EvidenceRecord, EvidenceState, Limits, ProviderSettings, endpoint, evidence_limits,
)
from edge.core.ports.runtime import Clock
from edge.core.ports.stores import SecretStore
from edge.core.runs import Run
from edge.core.tasks import INSTRUCTION_MAX, AgentInstruction, Task
from edge.core.text import normalize
from edge.operator.roster import ActiveRun

if TYPE_CHECKING:
    from edge.core.ports.agent import AgentEvidenceStore

log = logging.getLogger("qledge.agent")


def provider_name(base_url: str) -> str:
    """What the evidence says about the provider: the endpoint's host (and port), never a path or user info."""
    found = endpoint(base_url)
    return found.where if found is not None else "?"


def _state(run: Run) -> EvidenceState:
    if run.status == "failed" and run.error_code == "budget_exhausted":
        return "budget_exhausted"
    if run.status in ("succeeded", "failed", "cancelled", "timed_out", "lost"):
        return run.status
    return "lost"  # not terminal: never called so, but a record must not claim it is running


class Evidence:
    """Writes the records of AI runs to the evidence store (made at its first use)."""

    def __init__(self, store: Callable[[], AgentEvidenceStore], secrets: SecretStore, clock: Clock) -> None:
        self._store = store
        self._secrets = secrets
        self._clock = clock

    def opening(self, task: Task, run: Run, provider: ProviderSettings, limits: Limits | None = None) -> EvidenceOpen:
        """What is known of an AI run (of this AI task) when it starts, or ends without having
        started; `limits`: the run's own (None: not known, as for a run that never launched)."""
        spec = task.spec.command
        assert isinstance(spec, AgentInstruction)
        prices = provider.input_usd_per_mtok is not None and provider.output_usd_per_mtok is not None
        return EvidenceOpen(
            project_id=run.project_id, run_id=run.id, task_id=run.task_id, task_revision=run.task_revision,
            instruction=spec.instruction, provider=provider_name(provider.base_url), model=provider.model,
            cost_known=prices, limits=evidence_limits(limits) if limits is not None else None,
        )

    async def opened(self, state: ActiveRun, now_ms: int) -> None:
        """A run's child starts: its record keeps the store's change position now."""

        async def start() -> None:
            state.position = await self._store().start(state.record, now_ms)

        await self._written(state, start())

    async def finish(self, run: Run, state: ActiveRun) -> None:
        """Write the whole record of a run that reached its terminal state."""
        reported = state.outcome
        record = EvidenceRecord(
            started=msgspec.structs.replace(state.record, instruction=await self.clean_instruction(
                run.project_id, state.record.instruction)),
            state=_state(run), rounds=state.rounds, input_tokens=state.input_tokens,
            output_tokens=state.output_tokens, usage_estimated=state.usage_estimated, cost_usd=state.cost_usd,
            position_before=state.position, created_at_ms=state.started_ms, error_code=run.error_code,
            budget=reported.budget if reported is not None and run.error_code == "budget_exhausted" else None,
            error=run.error_summary[:EVIDENCE_TEXT_MAX] if run.error_summary and run.status != "succeeded" else None,
            answer_summary=reported.answer_summary if reported is not None and run.status == "succeeded" else None,
        )

        async def finish() -> None:
            await self._store().finish(record, self._clock.now_ms())

        await self._written(state, finish())

    async def _written(self, state: ActiveRun, write: Awaitable[object]) -> bool:
        """Await an evidence write; a failure is logged once per run and swallowed."""
        try:
            await write
            return True
        except Exception as exc:
            if not state.warned:
                state.warned = True
                log.warning("AI run %s: its evidence record could not be written (%s); the run's outcome is"
                            " unaffected", state.record.run_id, exc)
            return False

    async def clean_instruction(self, project: str, text: str) -> str:
        """An instruction with every configured secret (and credential pattern) masked, within
        the instruction's bound (a mask may be longer than what it hides)."""
        from edge.core.excerpt import redact

        return redact(text, await self._secrets.values(project)).text[:INSTRUCTION_MAX]

    async def clean(self, project: str, text: str | None) -> str | None:
        """Model-made text for the evidence: one bounded line, controls neutralized, secrets masked."""
        if not text:
            return None
        from edge.core.excerpt import redact  # its rules load at the first record, as the excerpt's

        line = " ".join(normalize(text).split())[:EVIDENCE_TEXT_MAX]
        return redact(line, await self._secrets.values(project)).text or None
