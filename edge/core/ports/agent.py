"""The AI operator's ports: what the runner needs from it (AgentRuns), the run-scoped
credentials the chain and the operator share (RunCredentials), the evidence history's
storage (AgentEvidenceStore) and the missions' ledger (MissionLedger). Adapters:
edge.tools.agent, edge.storage.sqlite.evidence, edge.storage.sqlite.ledger.

Imported for type checking only: nothing loads this module at run time, so neither the
default daemon nor one with [agent] enabled pays for these Protocol classes.
"""

from __future__ import annotations

from typing import Protocol

from edge.core.agent import (
    AgentLaunch,
    EvidenceCursor,
    EvidenceDetail,
    EvidenceOpen,
    EvidenceRecord,
    EvidenceSummary,
)
from edge.core.auth import Principal
from edge.core.ledger import (
    Attempt,
    AttemptStart,
    CommitArgs,
    CommitResult,
    CorrectArgs,
    DelegateArgs,
    ItemsArgs,
    LedgerChange,
    MissionView,
    PrepareArgs,
    RevokeArgs,
    SpecialistContext,
    WithdrawArgs,
)
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
    and never a trace, written whole once its run has reached its terminal state (the
    daemon holds its rounds in memory until then). Retention is applied by the write that
    inserts a record: the newest `max_records` and none created more than `max_age` before
    the insert's clock, both; each insert deletes at most a few of the oldest records, so
    its cost is bounded and the table converges. Nothing points at these rows: a record
    pruned early or late changes nothing else."""

    async def start(self, record: EvidenceOpen, now_ms: int) -> int:
        """An AI run starts: the store's change position now, for the record's
        `position_before`. Writes nothing where it can (SQLite); an adapter whose other
        nodes must be able to end the record of a run its node lost (PostgreSQL) inserts it
        `running` here."""
        ...

    async def finish(self, record: EvidenceRecord, now_ms: int) -> None:
        """Write the whole record of a run that reached its terminal state, with the change
        position after, in one transaction (retention in it too); a record that exists
        already ended is left as it is."""
        ...

    async def page(self, project: str, after: EvidenceCursor | None, limit: int) -> list[EvidenceSummary]:
        """Records strictly after `after` in (created_at_ms DESC, run_id DESC) order, on an index."""
        ...

    async def get(self, project: str, run_id: str) -> EvidenceDetail | None: ...


class MissionLedger(Protocol):
    """The durable state of missions (seed 003): which runs are attempts of which mission,
    and per mission and specialist (child) the constraints, work items, the parent's
    messages with their receipts, and the child's replies. It outlives attempts and daemon
    restarts; nothing of an attempt's credential or delivery state is kept for the next.
    Every method is scoped by project (through the `Attempt`, which only `begin_attempt`
    and `attempt_of` make); every write is one transaction that checks the ledger's bounds
    (edge.core.ledger) inside it, raising ToolError("resource_exhausted") past one; storage
    faults surface as ToolError("unavailable"). Ledger ids are unique per mission."""

    async def begin_attempt(self, start: AttemptStart, now_ms: int) -> Attempt:
        """Bind a run that starts to its mission: `start.mission_id` None makes a new mission
        (its id the run's id, its goal the instruction; retention of the oldest missions in
        the same transaction), otherwise the run is that mission's next attempt. A run bound
        before gets its attempt back unchanged. Raises not_found (the mission is gone) or
        resource_exhausted (ATTEMPTS_MAX reached)."""
        ...

    async def attempt_of(self, project: str, run_id: str) -> Attempt | None:
        """The attempt a run is; None when it never started one (or its mission is gone)."""
        ...

    async def latest_attempt(self, project: str, mission_id: str) -> Attempt | None:
        """The mission's newest attempt; None when there is no such mission."""
        ...

    async def delegate(self, at: Attempt, args: DelegateArgs, now_ms: int) -> LedgerChange:
        """Give `args.child` a delegation: it supersedes the child's active delegation (its
        version one higher) and adds the work items, all with the source (attempt, round,
        call). Raises resource_exhausted past a bound."""
        ...

    async def correct(self, at: Attempt, args: CorrectArgs, now_ms: int) -> LedgerChange:
        """Add a correction; with `replaces`, it supersedes that active correction of the same
        child (version one higher). Raises not_found (no such constraint of that child),
        conflict (it is superseded or revoked already), invalid_argument (it is a
        delegation), resource_exhausted."""
        ...

    async def revoke(self, at: Attempt, args: RevokeArgs, now_ms: int) -> LedgerChange:
        """Revoke an active constraint of the mission: it is never delivered again. Raises
        not_found or conflict (not active)."""
        ...

    async def items(self, at: Attempt, args: ItemsArgs, now_ms: int) -> LedgerChange:
        """Close open work items of the child (done) and add new ones. Raises not_found,
        conflict (closed already) or resource_exhausted; nothing changes then."""
        ...

    async def prepare(self, at: Attempt, args: PrepareArgs, now_ms: int) -> SpecialistContext:
        """Record the parent's message to the child as pending, then read what the child's
        next request is built from: the goal, every active constraint and open item of that
        child alone, its newest HISTORY_MESSAGES_MAX history entries (consumed messages and
        replies, in order), and every pending message of it (a message left pending by an
        earlier attempt included). Raises resource_exhausted when PENDING_MAX are waiting."""
        ...

    async def commit(self, at: Attempt, args: CommitArgs, now_ms: int) -> CommitResult:
        """A request to the child was answered: its messages that are still pending become
        consumed, each with one receipt (the attempt, the request id, the time), and the
        reply is kept; consumed history beyond HISTORY_KEEP is pruned. Idempotent by request
        id: the same request again changes nothing and returns what it did; a message
        consumed already is never consumed again."""
        ...

    async def withdraw(self, at: Attempt, args: WithdrawArgs, now_ms: int) -> bool:
        """Delete a message that no request carried (its request did not fit the context
        window), so it is never delivered: only a pending message of that child recorded by
        this attempt. False when there is none such (withdrawn already, consumed, another
        child's or another attempt's): nothing changes then."""
        ...

    async def mission(self, project: str, mission_id: str) -> MissionView | None:
        """The mission for its owner: attempts, every constraint and item, message counts."""
        ...
