"""How an AI run starts and ends, for the runner (AgentRuns): the run's credential minted at
launch, for that run alone, and revoked when its child is gone, whatever the outcome; its
record opened then and written once, whole, at its terminal state (edge.operator.evidence,
loaded by the first AI run); the run bound as an attempt of its mission
(edge.operator.missions, likewise); and the child's argv, job and own tool connection.

The child itself (edge.airun) is never imported here: it is started as a process."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

import edge
from edge.core.agent_settings import Limits
from edge.core.errors import ToolError, invalid
from edge.core.ports.runtime import Clock, TaskUsers
from edge.core.ports.stores import TaskStore
from edge.core.runs import Run, RunStatus, RunUpdate, summary
from edge.core.tasks import AgentBudget, AgentInstruction, Task
from edge.operator.offer import Offer
from edge.operator.roster import ActiveRun, Roster
from edge.operator.settings import OperatorSettings, child_user

if TYPE_CHECKING:  # the job's shapes load with the first AI run
    from edge.core.agent import AgentLaunch
    from edge.core.ports.agent import RunCredentials
    from edge.operator.evidence import Evidence
    from edge.operator.missions import Missions

log = logging.getLogger("qledge.agent")

# The child is started like this, not with `python -m`: -I keeps the environment and the
# working directory (where tasks may write) out of its import path.
_BOOT = "import sys; sys.path.insert(0, {root!r}); from edge.airun.__main__ import main; sys.exit(main())"
_job = msgspec.json.Encoder()
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(edge.__file__)))  # a directory, or a .pyz


def lowered(limits: Limits, budget: AgentBudget | None) -> Limits:
    """A task's budget overrides, never above the configured maxima."""
    if budget is None:
        return limits

    def low(configured: int | float, override: int | float | None) -> int | float:
        return configured if override is None else min(configured, override)

    return Limits(
        rounds=int(low(limits.rounds, budget.rounds)), input_tokens=int(low(limits.input_tokens, budget.input_tokens)),
        output_tokens=int(low(limits.output_tokens, budget.output_tokens)),
        cost_usd=float(low(limits.cost_usd, budget.cost_usd)),
        wall_clock_s=int(low(limits.wall_clock_s, budget.wall_clock_s)),
        tool_calls_per_round=limits.tool_calls_per_round,
    )


class AiRuns:
    """AgentRuns (edge.core.ports.agent). `evidence` and `missions` are made at their first
    use (`missions` None: this daemon keeps no ledger, so its runs are attempts of no
    mission); `connect` has the tool server serve one end of a new connection, trusting it
    by its token only."""

    def __init__(
        self, *, settings: OperatorSettings, credentials: RunCredentials, offer: Offer, roster: Roster,
        evidence: Callable[[], Evidence], missions: Callable[[], Missions] | None, tasks: TaskStore,
        users: TaskUsers, clock: Clock, connect: Callable[[socket.socket], None],
    ) -> None:
        self._settings = settings
        self._credentials = credentials
        self._offer = offer
        self._roster = roster
        self._evidence = evidence
        self._missions = missions
        self._tasks = tasks
        self._users = users
        self._clock = clock
        self._connect = connect

    @property
    def concurrency(self) -> int:
        return self._settings.concurrency

    async def launch(self, task: Task, run: Run) -> AgentLaunch:
        from edge.core.agent import AgentJob, AgentLaunch, MissionJob

        spec = task.spec.command
        if not isinstance(spec, AgentInstruction):
            raise invalid(f"task {task.id} is not an AI task")
        settings = self._settings
        provider = settings.provider_for(spec.profile)
        user = child_user(self._users, settings.user)  # checked again: the system may have changed
        limits = lowered(settings.limits, spec.budget)
        evidence = self._evidence()
        pin, pout = provider.input_usd_per_mtok, provider.output_usd_per_mtok
        now = self._clock.now_ms()
        state = ActiveRun(evidence.opening(task, run, provider, limits), limits,
                          (pin, pout) if pin is not None and pout is not None else None, now)
        token = self._credentials.mint(run.id, self._offer.permissions)
        roster = self._roster
        roster.active[run.id] = state
        await evidence.opened(state, now)
        async with roster.naming:  # `qledge agent check` names its run under this lock, as a retry does
            state.check = run.id in roster.checking
            roster.checking.discard(run.id)
        if self._missions is not None and not state.check:  # a check is one request: no mission, no retries
            state.attempt = await self._missions().bind(run, spec.instruction)
        mission = None
        if state.attempt is not None:
            mission = MissionJob(mission_id=state.attempt.mission_id, attempt=state.attempt.attempt,
                                 specialists=settings.specialists)
        job = AgentJob(
            run_id=run.id, task_id=task.id, token=token, instruction=spec.instruction, provider=provider,
            limits=limits, tools=self._offer.specs(), user=user, mission=mission, check=state.check,
        )
        return AgentLaunch(
            argv=[settings.python, "-I", "-c", _BOOT.format(root=_ROOT)], job=_job.encode(job),
            timeout_s=float(limits.wall_clock_s), uid=user.uid if user is not None else os.geteuid(),
            tool_fd=self._connection(),
        )

    def _connection(self) -> int:
        """A new connection to the tool server; the child's end, as a descriptor."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connect(ours)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        return theirs.detach()

    def exited(self, run_id: str, status: RunStatus, update: RunUpdate) -> RunStatus:
        self._credentials.revoke(run_id)
        state = self._roster.active.get(run_id)
        reported = state.outcome if state is not None else None
        if status == "failed" and reported is not None and reported.outcome != "succeeded" and reported.error_code:
            update.error_code = reported.error_code
            update.error_summary = summary(reported.message or reported.error_code)
        return status

    async def ended(self, run: Run, task: Task | None) -> None:
        self._credentials.revoke(run.id)
        state = self._roster.forget(run.id)
        if state is None:  # it never started (or its daemon died): only the task tells if it is an AI run
            try:
                task = task or await self._tasks.get(run.project_id, run.task_id, run.task_revision)
            except ToolError as exc:
                log.warning("run %s: its task could not be read for its evidence (%s); the run is unaffected",
                            run.id, exc.message)
                return
            if task is None or not isinstance(task.spec.command, AgentInstruction):
                return
            try:
                provider = self._settings.provider_for(task.spec.command.profile)
            except ToolError:
                provider = self._settings.provider  # a profile that is not configured: the run failed for it
            state = ActiveRun(self._evidence().opening(task, run, provider), self._settings.limits, None)
        await self._evidence().finish(run, state)
        if state.attempt is not None and run.status == "failed" and (run.error_code or "").startswith("provider_"):
            assert self._missions is not None
            await self._missions().next_attempt(run, state.attempt, task)
