"""Missions on the daemon's side (seed 003), loaded at the first AI run or call: binding a run
that starts to its mission as an attempt, the next attempt after a provider failure, the
ledger's tools an AI run's child calls for its specialists, `qledge.agent.retry` (the next
attempt of a mission) and `qledge.agent.mission` (a mission for its owner).

The ledger's tools accept an active AI run's own credential only, and act on that run's
mission alone, as that attempt: no other principal, and no run on another mission, can
read or change it, and nothing of an earlier attempt is reused but the ledger itself.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from edge.core.errors import ToolError, conflict, invalid, not_found
from edge.core.ledger import (
    ATTEMPTS_MAX,
    Attempt,
    AttemptStart,
    CommitArgs,
    CorrectArgs,
    DelegateArgs,
    ItemDraft,
    ItemsArgs,
    MissionView,
    PrepareArgs,
    RevokeArgs,
    WithdrawArgs,
)
from edge.core.runs import Run
from edge.core.tasks import AgentInstruction, Task
from edge.core.text import ReadId, normalize
from edge.tools.agent import ActiveRun, AgentService
from edge.tools.context import ToolContext

log = logging.getLogger("qledge.agent")


class RetryArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId


class Retried(msgspec.Struct, rename="camel"):
    run: Run
    mission_id: str
    attempt: int


class MissionArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId  # any attempt of the mission


def _args(raw: dict[str, Any], kind: type[msgspec.Struct]) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise invalid(str(exc)) from None


# -- attempts -------------------------------------------------------------------------------


async def bind_attempt(service: AgentService, run: Run, goal: str) -> Attempt | None:
    """The run as an attempt of its mission; None (logged) when the ledger cannot say: the run
    goes on without specialists."""
    async with service.binding:  # a retry names the mission of its run before releasing this
        mission_id = service.retrying.pop(run.id, None)
    start = AttemptStart(project_id=run.project_id, run_id=run.id, task_id=run.task_id,
                         task_revision=run.task_revision, goal=goal, mission_id=mission_id)
    try:
        return await service.ledger.begin_attempt(start, service.clock.now_ms())
    except ToolError as exc:
        log.warning("AI run %s: its mission could not be recorded (%s); it runs without specialists",
                    run.id, exc.message)
        return None


async def next_attempt(service: AgentService, run: Run, at: Attempt, task: Task | None) -> None:
    """The next attempt of a mission whose attempt the provider failed, up to [agent] attempts."""
    runner = service.runner
    if runner is None or at.attempt >= service.settings.attempts:
        return
    try:
        task = task or await service.tasks.get(run.project_id, run.task_id, run.task_revision)
        if task is None:
            return
        async with service.binding:
            if at.mission_id in service.retrying.values():
                return
            started = await runner.start(task, "runner")
            service.retrying[started.id] = at.mission_id
        log.info("AI run %s failed (%s): attempt %d of mission %s is run %s", run.id, run.error_code,
                 at.attempt + 1, at.mission_id, started.id)
    except ToolError as exc:
        log.warning("AI run %s: the next attempt of mission %s could not start (%s)", run.id, at.mission_id,
                    exc.message)


# -- the ledger's tools ----------------------------------------------------------------------

_ARGS: dict[str, type[msgspec.Struct]] = {
    "delegate": DelegateArgs, "correct": CorrectArgs, "revoke": RevokeArgs, "items": ItemsArgs,
    "prepare": PrepareArgs, "commit": CommitArgs, "withdraw": WithdrawArgs,
}


def _caller(ctx: ToolContext, service: AgentService) -> tuple[ActiveRun, Attempt]:
    run_id = ctx.principal.run_id
    if run_id is None:
        raise ToolError("permission_denied", "only an AI run's own credential may use its mission's ledger")
    state = service.active(run_id)
    if state is None:
        raise conflict(f"run {run_id} is not an active AI run")
    if state.attempt is None:
        raise ToolError("unavailable", f"run {run_id} has no mission ledger (it could not be recorded)")
    return state, state.attempt


def _text(value: str) -> str:
    text = normalize(value).strip()
    if not text:
        raise invalid("the text is empty")
    return text


def _drafts(drafts: list[ItemDraft]) -> list[ItemDraft]:
    return [ItemDraft(_text(d.text), _text(d.acceptance) if d.acceptance else None) for d in drafts]


async def ledger_call(service: AgentService, op: str, ctx: ToolContext, raw: dict[str, Any]) -> Any:
    state, at = _caller(ctx, service)
    args = _args(raw, _ARGS[op])
    child = getattr(args, "child", None)
    if child is not None and child not in service.specialist_names:
        raise invalid(f"there is no specialist {child!r}")
    if not 1 <= args.round <= len(state.rounds):  # a round this run has reported
        raise invalid(f"round {args.round} has not been reported (the run is at round {len(state.rounds)})")
    ledger, now = service.ledger, ctx.now_ms()
    if isinstance(args, DelegateArgs):
        return await ledger.delegate(at, msgspec.structs.replace(
            args, instruction=_text(args.instruction), work_items=_drafts(args.work_items)), now)
    if isinstance(args, CorrectArgs):
        return await ledger.correct(at, msgspec.structs.replace(args, text=_text(args.text)), now)
    if isinstance(args, RevokeArgs):
        return await ledger.revoke(at, args, now)
    if isinstance(args, ItemsArgs):
        return await ledger.items(at, msgspec.structs.replace(args, add=_drafts(args.add)), now)
    if isinstance(args, PrepareArgs):
        return await ledger.prepare(at, msgspec.structs.replace(args, message=_text(args.message)), now)
    if isinstance(args, WithdrawArgs):
        return await ledger.withdraw(at, args, now)
    assert isinstance(args, CommitArgs)
    return await ledger.commit(at, msgspec.structs.replace(args, reply=_text(args.reply)), now)


# -- retry and the mission view ----------------------------------------------------------------


async def retry_run(service: AgentService, ctx: ToolContext, raw: dict[str, Any]) -> Retried:
    """The next attempt of a run's mission: a new run of the same task revision, its own
    credential, budgets and receipts; refused while an attempt of the mission is active."""
    run_id = _args(raw, RetryArgs).run_id
    project, services = ctx.project, ctx.services
    run = await services.runs.get(project, run_id)
    if run is None:
        raise not_found(f"run {run_id} not found")
    if not run.terminal:
        raise conflict(f"run {run_id} is still {run.status}: wait for it or cancel it first")
    at = await service.ledger.attempt_of(project, run_id)
    if at is None:
        raise conflict(f"run {run_id} is not an attempt of a mission (it is not an AI run, it never started,"
                       " or its mission was removed by retention)")
    task = await services.tasks.get(project, run.task_id, run.task_revision)
    if task is None or not isinstance(task.spec.command, AgentInstruction):
        raise not_found(f"task {run.task_id} revision {run.task_revision} is gone")
    async with service.binding:
        if at.mission_id in service.retrying.values():
            raise conflict(f"the next attempt of mission {at.mission_id} is starting already")
        latest = await service.ledger.latest_attempt(project, at.mission_id)
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
        service.retrying[started.id] = at.mission_id
    return Retried(run=started, mission_id=at.mission_id, attempt=latest.attempt + 1)


async def mission_view(service: AgentService, ctx: ToolContext, raw: dict[str, Any]) -> MissionView:
    run_id = _args(raw, MissionArgs).run_id
    at = await service.ledger.attempt_of(ctx.project, run_id)
    found = await service.ledger.mission(ctx.project, at.mission_id) if at is not None else None
    if found is None:
        raise not_found(f"run {run_id} is not an attempt of a mission")
    return found
