"""The two narrow tools an AI run's child reports through (its own credential only), loaded
by their first call: each model round (`qledge.agent.round`) and how the run ended
(`qledge.agent.outcome`). The daemon holds both in memory; the run's record is written
once, at its end (edge.operator.evidence)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from edge.core.agent import UNKNOWN_TOOL, OutcomeReport, RoundMeta
from edge.core.errors import invalid
from edge.operator.evidence import Evidence
from edge.operator.offer import Offer
from edge.operator.roster import ActiveRun, Roster
from edge.tools.context import ToolContext
from edge.tools.definition import Handler


class Ack(msgspec.Struct, rename="camel"):
    recorded: bool  # kept for the run's record (written when the run ends)


class Reports:
    def __init__(self, roster: Roster, offer: Offer, evidence: Callable[[], Evidence]) -> None:
        self._roster = roster
        self._offer = offer
        self._evidence = evidence

    def _reporter(self, ctx: ToolContext) -> ActiveRun:
        return self._roster.own(ctx.principal.run_id, "only an AI run's own credential may report on it")

    async def round(self, ctx: ToolContext, args: RoundMeta) -> Ack:
        state = self._reporter(ctx)
        if args.round != len(state.rounds) + 1:
            raise invalid(f"round {args.round} reported; expected round {len(state.rounds) + 1}")
        if args.round > state.limits.rounds:
            raise invalid(f"round {args.round} is beyond the run's budget of {state.limits.rounds}")
        strange = [name for name in args.tools if name not in self._offer.names and name != UNKNOWN_TOOL]
        if strange:
            raise invalid(f"{strange[0][:64]!r} was not offered (record it as {UNKNOWN_TOOL!r})")
        if args.specialist is not None and args.specialist.child not in self._offer.specialists:
            raise invalid(f"there is no specialist {args.specialist.child!r}")
        meta = msgspec.structs.replace(args, plan=await self._evidence().clean(ctx.project, args.plan))
        cost = None
        if state.prices is not None and not args.usage_estimated:
            cost = (args.input_tokens * state.prices[0] + args.output_tokens * state.prices[1]) / 1e6
        state.add(meta, cost)  # held in memory: the record is written once, at the run's end
        return Ack(recorded=True)

    async def outcome(self, ctx: ToolContext, args: OutcomeReport) -> Ack:
        state = self._reporter(ctx)
        evidence = self._evidence()
        state.outcome = msgspec.structs.replace(
            args, message=await evidence.clean(ctx.project, args.message),
            answer_summary=await evidence.clean(ctx.project, args.answer_summary))
        return Ack(recorded=True)

    def handlers(self) -> dict[str, tuple[Handler, type, type]]:
        return {"qledge.agent.round": (self.round, RoundMeta, Ack),
                "qledge.agent.outcome": (self.outcome, OutcomeReport, Ack)}
