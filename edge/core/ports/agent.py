"""The AI operator's ports: what the runner needs from it (AgentRuns), the run-scoped
credentials the chain and the operator share (RunCredentials), and the evidence history's
storage (AgentEvidenceStore). Adapters: edge.tools.agent, edge.storage.sqlite.evidence.

Imported for type checking only: nothing loads this module at run time, so neither the
default daemon nor one with [agent] enabled pays for these Protocol classes.
"""

from __future__ import annotations

from typing import Protocol

from edge.core.agent import (
    AgentLaunch,
    EvidenceCursor,
    EvidenceDetail,
    EvidenceEnd,
    EvidenceOpen,
    EvidenceSummary,
    RoundMeta,
)
from edge.core.auth import Principal
from edge.core.runs import Run, RunStatus, RunUpdate
from edge.core.tasks import Task


class RunCredentials(Protocol):
    """Credentials minted for one run, held in memory only: a daemon that dies takes them
    with it, so nothing outlives the run it was made for."""

    def mint(self, run_id: str, permissions: frozenset[str]) -> str:
        """A new token for `run_id` alone, granting exactly `permissions`; its principal is
        `agent:<run id>`."""
        ...

    def revoke(self, run_id: str) -> bool:
        """The run's credential stops working at once, for the next call and for the chain's
        re-check of calls in flight. True when one was live."""
        ...

    def lookup(self, credential_id: str) -> tuple[bytes, Principal] | None:
        """For authentication: the HMAC digest of a live credential's secret and its principal."""
        ...


class AgentRuns(Protocol):
    """AI runs (tasks whose command is an agent instruction) as the runner sees them."""

    @property
    def concurrency(self) -> int:
        """How many AI runs may execute at once: they have slots of their own, beside the
        runner's, so they never hold up commands."""
        ...

    async def launch(self, task: Task, run: Run) -> AgentLaunch:
        """Mint the run's credential, open its evidence record, and say how to start its
        child. Raises ToolError (e.g. a profile that is not configured): the run then fails
        with error code `agent_config` and that message."""
        ...

    def exited(self, run_id: str, status: RunStatus, update: RunUpdate) -> RunStatus:
        """The child is gone: revoke its credential now, and fold in the outcome it reported
        (a failure it explained keeps its own error code and summary). Updates `update`;
        returns the status to record."""
        ...

    async def ended(self, run: Run, task: Task | None) -> None:
        """Finish the evidence of an AI run that reached a terminal status, whatever the path
        (runs that never started and runs recovered as `lost` too; `task` None: look it up,
        and do nothing for a command task), and revoke its credential if still live. Never
        raises: a record that cannot be written is logged once and changes nothing else."""
        ...


class AgentEvidenceStore(Protocol):
    """The evidence history of AI runs (seed 001): one bounded record per run, a projection
    and never a trace. Retention is applied by the writes that insert (`open`, and `end`
    when it has to insert): the newest `max_records` and none created more than `max_age`
    before the insert's clock, both; each insert deletes at most a few of the oldest
    records, so its cost is bounded and the table converges. Nothing points at these rows:
    a record pruned early or late changes nothing else."""

    async def open(self, record: EvidenceOpen, now_ms: int) -> None:
        """Insert the record of an AI run that starts (state `running`), with the store's
        change position; a record that exists is left as it is."""
        ...

    async def add_round(self, project: str, run_id: str, meta: RoundMeta, cost_usd: float | None) -> bool:
        """Append one round's metadata and add its usage to the totals; `cost_usd` None makes
        the record's cost unknown for good. False when there is no such open record."""
        ...

    async def end(self, end: EvidenceEnd, started: EvidenceOpen, now_ms: int) -> None:
        """Set a record's terminal state, error, answer summary, finish time and the change
        position after; when there is no record (its open failed, or it never started),
        insert it from `started` first."""
        ...

    async def page(self, project: str, after: EvidenceCursor | None, limit: int) -> list[EvidenceSummary]:
        """Records strictly after `after` in (created_at_ms DESC, run_id DESC) order, on an index."""
        ...

    async def get(self, project: str, run_id: str) -> EvidenceDetail | None: ...
