"""`qledge.agent.ask` (an ad-hoc question: a new revision of the `ask` task, and its run) and
`qledge.agent.check` (one request to the provider, and a diagnosis), loaded by their first
call."""

from __future__ import annotations

from collections.abc import Callable

from edge.core.errors import ToolError, conflict
from edge.core.runs import Run
from edge.core.tasks import AgentInstruction, TaskSpec
from edge.operator.evidence import Evidence
from edge.operator.roster import Roster
from edge.operator.settings import OperatorSettings
from edge.tools.agent import AskArgs, CheckArgs
from edge.tools.context import ToolContext
from edge.tools.definition import Handler

ASK_TASK = "ask"  # where `qledge ask` keeps its runs: one AI task, a revision per question
CHECK_INSTRUCTION = "qledge agent check: one request to the provider that exercises tool calling"


async def ask_revision(ctx: ToolContext, instruction: str, profile: str | None,
                       started: Callable[[Run], None] | None = None) -> Run:
    """A new revision of the `ask` task (created on first use) holding `instruction`, and a
    run of it, so the question stays with its run; `started` sees the run before any other
    call can (under the roster's naming lock, held by the caller)."""
    tasks, project = ctx.services.tasks, ctx.project
    spec = TaskSpec(command=AgentInstruction(instruction=instruction, profile=profile), overlap="allow")
    for _ in range(8):  # another ask may move the head between our read and our write
        head = await tasks.get(project, ASK_TASK)
        if head is not None and not isinstance(head.spec.command, AgentInstruction):
            raise conflict(f"task {ASK_TASK!r} exists and is not an AI task; `qledge ask` needs that name")
        privileged = ctx.may_run(f"task {ASK_TASK}", spec)  # what any AI task's writer needs
        try:
            if head is None:
                task = await tasks.create(project, ASK_TASK, "questions asked with qledge ask", spec, ctx.now_ms(),
                                          privileged=privileged)
            else:
                task = await tasks.update(project, ASK_TASK, head.revision, spec, None, ctx.now_ms(),
                                          privileged=privileged)
        except ToolError as exc:
            if exc.code == "conflict":  # created or moved meanwhile: read the head again
                continue
            raise
        if not task.enabled:
            raise conflict(f"task {ASK_TASK!r} is disabled (qledge task enable {ASK_TASK})")
        run = await ctx.services.runner.start(task, "user")
        if started is not None:
            started(run)
        return run
    raise conflict("too many questions at once; try again")


class Ask:
    def __init__(self, settings: OperatorSettings, roster: Roster, evidence: Callable[[], Evidence]) -> None:
        self._settings = settings
        self._roster = roster
        self._evidence = evidence

    async def ask(self, ctx: ToolContext, args: AskArgs) -> Run:
        """An ad-hoc instruction, masked for the project's secrets before it is stored
        anywhere (the task revision, the evidence, the log)."""
        instruction = await self._evidence().clean_instruction(ctx.project, args.instruction)
        return await ask_revision(ctx, instruction, args.profile)

    async def check(self, ctx: ToolContext, args: CheckArgs) -> Run:
        """A run of the `ask` task whose child sends one request and says what it found."""
        self._settings.provider_for(args.profile)  # named, or refused
        roster = self._roster
        async with roster.naming:  # its launch reads `checking` under this lock: it cannot miss it
            return await ask_revision(ctx, CHECK_INSTRUCTION, args.profile, lambda run: roster.checking.add(run.id))

    def handlers(self) -> dict[str, tuple[Handler, type, type]]:
        return {"qledge.agent.ask": (self.ask, AskArgs, Run), "qledge.agent.check": (self.check, CheckArgs, Run)}
