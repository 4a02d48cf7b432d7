"""Missions on the daemon's side (seed 003), loaded at the first AI run or mission call:
binding a run that starts to its mission as an attempt, the next attempt after a provider
failure, the ledger's tools an AI run's child calls for its specialists,
`qledge.agent.retry` (the next attempt of a mission) and `qledge.agent.mission` (a mission
for its owner).

The ledger's tools accept an active AI run's own credential only, and act on that run's
mission alone, as that attempt: no other principal, and no run on another mission, can
read or change it, and nothing of an earlier attempt is reused but the ledger itself. A
daemon without a ledger (a cluster node) binds no attempts; retry and the mission view
answer it in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec

from edge.core.errors import ToolError, conflict, invalid, not_found, unavailable
from edge.core.ledger import (
    ATTEMPTS_MAX,
    Attempt,
    AttemptStart,
    CommitArgs,
    CommitResult,
    CorrectArgs,
    DelegateArgs,
    ItemDraft,
    ItemsArgs,
    LedgerChange,
    MissionView,
    PrepareArgs,
    RevokeArgs,
    SpecialistContext,
    WithdrawArgs,
)
from edge.core.ports.agent import MissionLedger
from edge.core.ports.runtime import Clock
from edge.core.ports.stores import TaskStore
from edge.core.runs import ActorType, Run
from edge.core.tasks import AgentInstruction, Task
from edge.core.text import normalize
from edge.operator.roster import Roster
from edge.tools.context import ToolContext
from edge.tools.definition import Handler
from edge.tools.missions import MissionArgs, Retried, RetryArgs

log = logging.getLogger("qledge.agent")

_OWN_ONLY = "only an AI run's own credential may use its mission's ledger"
NO_MISSIONS = ("a cluster node keeps no mission ledger: its AI runs have no specialists and cannot be retried"
               " as attempts of a mission")


def _text(value: str) -> str:
    text = normalize(value).strip()
    if not text:
        raise invalid("the text is empty")
    return text


def _drafts(drafts: list[ItemDraft]) -> list[ItemDraft]:
    return [ItemDraft(_text(d.text), _text(d.acceptance) if d.acceptance else None) for d in drafts]


class Missions:
    """The mission of every AI run, on the missions' ledger (`ledger`, made at its first
    use; None: this daemon keeps none). `start_run` starts the next attempt's run."""

    def __init__(self, *, ledger: Callable[[], MissionLedger] | None, roster: Roster, tasks: TaskStore, clock: Clock,
                 start_run: Callable[[Task, ActorType], Awaitable[Run]], attempts: int,
                 specialists: frozenset[str]) -> None:
        self._ledger = ledger
        self._roster = roster
        self._tasks = tasks
        self._clock = clock
        self._start_run = start_run
        self._attempts = attempts  # [agent] attempts
        self._specialists = specialists

    @property
    def ledger(self) -> MissionLedger:
        """The missions' ledger. Raises unavailable on a daemon that keeps none (a cluster node)."""
        if self._ledger is None:
            raise unavailable(NO_MISSIONS)
        return self._ledger()

    # -- attempts -------------------------------------------------------------------------

    async def bind(self, run: Run, goal: str) -> Attempt | None:
        """The run as an attempt of its mission; None (logged) when the ledger cannot say: the
        run goes on without specialists."""
        async with self._roster.naming:  # a retry names the mission of its run before releasing this
            mission_id = self._roster.retrying.pop(run.id, None)
        start = AttemptStart(project_id=run.project_id, run_id=run.id, task_id=run.task_id,
                             task_revision=run.task_revision, goal=goal, mission_id=mission_id)
        try:
            return await self.ledger.begin_attempt(start, self._clock.now_ms())
        except ToolError as exc:
            log.warning("AI run %s: its mission could not be recorded (%s); it runs without specialists",
                        run.id, exc.message)
            return None

    async def next_attempt(self, run: Run, at: Attempt, task: Task | None) -> None:
        """The next attempt of a mission whose attempt the provider failed, up to [agent] attempts."""
        if at.attempt >= self._attempts:
            return
        roster = self._roster
        try:
            task = task or await self._tasks.get(run.project_id, run.task_id, run.task_revision)
            if task is None:
                return
            async with roster.naming:
                if at.mission_id in roster.retrying.values():
                    return
                started = await self._start_run(task, "runner")
                roster.retrying[started.id] = at.mission_id
            log.info("AI run %s failed (%s): attempt %d of mission %s is run %s", run.id, run.error_code,
                     at.attempt + 1, at.mission_id, started.id)
        except ToolError as exc:
            log.warning("AI run %s: the next attempt of mission %s could not start (%s)", run.id, at.mission_id,
                        exc.message)

    # -- the ledger's tools --------------------------------------------------------------

    def ledger_caller(self, ctx: ToolContext) -> None:
        """Refuses (permission_denied) every principal but an active AI run's own credential,
        before a ledger tool's arguments are read."""
        self._roster.own(ctx.principal.run_id, _OWN_ONLY)

    def _caller(self, ctx: ToolContext, round_: int, child: str | None) -> Attempt:
        """The attempt an active AI run's own call acts as, its round and child checked."""
        state = self._roster.own(ctx.principal.run_id, _OWN_ONLY)
        if state.attempt is None:
            raise unavailable(f"run {state.record.run_id} has no mission ledger (it could not be recorded)")
        if child is not None and child not in self._specialists:
            raise invalid(f"there is no specialist {child!r}")
        if not 1 <= round_ <= len(state.rounds):  # a round this run has reported
            raise invalid(f"round {round_} has not been reported (the run is at round {len(state.rounds)})")
        return state.attempt

    async def delegate(self, ctx: ToolContext, args: DelegateArgs) -> LedgerChange:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.delegate(at, msgspec.structs.replace(
            args, instruction=_text(args.instruction), work_items=_drafts(args.work_items)), ctx.now_ms())

    async def correct(self, ctx: ToolContext, args: CorrectArgs) -> LedgerChange:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.correct(at, msgspec.structs.replace(args, text=_text(args.text)), ctx.now_ms())

    async def revoke(self, ctx: ToolContext, args: RevokeArgs) -> LedgerChange:
        at = self._caller(ctx, args.round, None)
        return await self.ledger.revoke(at, args, ctx.now_ms())

    async def items(self, ctx: ToolContext, args: ItemsArgs) -> LedgerChange:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.items(at, msgspec.structs.replace(args, add=_drafts(args.add)), ctx.now_ms())

    async def prepare(self, ctx: ToolContext, args: PrepareArgs) -> SpecialistContext:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.prepare(at, msgspec.structs.replace(args, message=_text(args.message)),
                                         ctx.now_ms())

    async def commit(self, ctx: ToolContext, args: CommitArgs) -> CommitResult:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.commit(at, msgspec.structs.replace(args, reply=_text(args.reply)), ctx.now_ms())

    async def withdraw(self, ctx: ToolContext, args: WithdrawArgs) -> bool:
        at = self._caller(ctx, args.round, args.child)
        return await self.ledger.withdraw(at, args, ctx.now_ms())

    def ledger_handlers(self) -> dict[str, tuple[Handler, type, type]]:
        """Each ledger operation's handler, arguments and result (edge.operator.offer.LEDGER_OPS)."""
        return {
            "delegate": (self.delegate, DelegateArgs, LedgerChange),
            "correct": (self.correct, CorrectArgs, LedgerChange),
            "revoke": (self.revoke, RevokeArgs, LedgerChange), "items": (self.items, ItemsArgs, LedgerChange),
            "prepare": (self.prepare, PrepareArgs, SpecialistContext),
            "commit": (self.commit, CommitArgs, CommitResult), "withdraw": (self.withdraw, WithdrawArgs, bool),
        }

    # -- retry and the mission view -------------------------------------------------------

    async def retry(self, ctx: ToolContext, args: RetryArgs) -> Retried:
        """The next attempt of a run's mission: a new run of the same task revision, its own
        credential, budgets and receipts; refused while an attempt of the mission is active."""
        run_id, ledger = args.run_id, self.ledger
        project, services = ctx.project, ctx.services
        run = await services.runs.get(project, run_id)
        if run is None:
            raise not_found(f"run {run_id} not found")
        if not run.terminal:
            raise conflict(f"run {run_id} is still {run.status}: wait for it or cancel it first")
        at = await ledger.attempt_of(project, run_id)
        if at is None:
            raise conflict(f"run {run_id} is not an attempt of a mission (it is not an AI run, it never started,"
                           " or its mission was removed by retention)")
        task = await services.tasks.get(project, run.task_id, run.task_revision)
        if task is None or not isinstance(task.spec.command, AgentInstruction):
            raise not_found(f"task {run.task_id} revision {run.task_revision} is gone")
        roster = self._roster
        async with roster.naming:
            if at.mission_id in roster.retrying.values():
                raise conflict(f"the next attempt of mission {at.mission_id} is starting already")
            latest = await ledger.latest_attempt(project, at.mission_id)
            if latest is None:
                raise conflict(f"mission {at.mission_id} was removed by retention")
            if latest.run_id != run_id:
                newest = await services.runs.get(project, latest.run_id)
                if newest is not None and not newest.terminal:
                    raise conflict(f"attempt {latest.attempt} of this mission (run {latest.run_id}) is still"
                                   f" {newest.status}")
            if latest.attempt >= ATTEMPTS_MAX:
                raise ToolError("resource_exhausted", f"mission {at.mission_id} has had {ATTEMPTS_MAX} attempts")
            started = await services.runner.start(task, "user")
            roster.retrying[started.id] = at.mission_id
        return Retried(run=started, mission_id=at.mission_id, attempt=latest.attempt + 1)

    async def mission(self, ctx: ToolContext, args: MissionArgs) -> MissionView:
        ledger = self.ledger
        at = await ledger.attempt_of(ctx.project, args.run_id)
        found = await ledger.mission(ctx.project, at.mission_id) if at is not None else None
        if found is None:
            raise not_found(f"run {args.run_id} is not an attempt of a mission")
        return found

    def mission_handlers(self) -> dict[str, tuple[Handler, type, type]]:
        return {"qledge.agent.retry": (self.retry, RetryArgs, Retried),
                "qledge.agent.mission": (self.mission, MissionArgs, MissionView)}
