"""Every tool the AI operator adds to the daemon, declared here and loaded by its first call
(edge.tools.definition.Deferred): the evidence history's read tools (AI tools: loaded too
when their schemas are asked for), the reporting tools, ask and check, retry and the mission
view, and with specialists one narrow tool per ledger operation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edge.operator.offer import LEDGER_OPS, LEDGER_PERMISSION, LEDGER_TOOLS, REPORT_PERMISSION, Offer
from edge.operator.settings import OperatorSettings
from edge.tools.context import ToolInfo
from edge.tools.definition import Deferred, Tool, declared, info

if TYPE_CHECKING:
    from edge.core.ports.agent import AgentEvidenceStore
    from edge.operator.evidence import Evidence
    from edge.operator.missions import Missions
    from edge.operator.roster import Roster

HISTORY_INFOS: tuple[ToolInfo, ...] = (
    info("qinglong.agent.history.list", effect="read", risk="low", permission="run.read", ai=True,
         title="List the AI operator's past runs, newest first"),
    info("qinglong.agent.history.get", effect="read", risk="low", permission="run.read", ai=True,
         title="Get one AI run's evidence record"),
)
REPORT_INFOS: tuple[ToolInfo, ...] = (
    info("qledge.agent.round", effect="write", risk="low", permission=REPORT_PERMISSION,
         title="An AI run reports one model round (its own credential only)"),
    info("qledge.agent.outcome", effect="write", risk="low", permission=REPORT_PERMISSION,
         title="An AI run reports how it ended (its own credential only)"),
)
ASK_INFOS: tuple[ToolInfo, ...] = (
    info("qledge.agent.ask", effect="write", risk="medium", permission=("task.write", "run.write"),
         title="Ask the AI operator a question (a new revision of the `ask` task, and its run)"),
    info("qledge.agent.check", effect="write", risk="medium", permission=("task.write", "run.write"),
         title="Check the provider with one request (a run of the `ask` task, recorded like any AI run)"),
)
MISSION_INFOS: tuple[ToolInfo, ...] = (
    info("qledge.agent.retry", effect="write", risk="medium", permission="run.write",
         title="Start the next attempt of an AI run's mission (a new run of the same task revision)"),
    info("qledge.agent.mission", effect="read", risk="low", permission="run.read",
         title="An AI run's mission: its attempts and its specialists' ledger"),
)
LEDGER_INFOS: tuple[ToolInfo, ...] = tuple(
    info(name, effect="write", risk="low", permission=LEDGER_PERMISSION,
         title=f"An AI run's {op} on its mission's ledger")
    for op, name in zip(LEDGER_OPS, LEDGER_TOOLS, strict=True))


def deferred_tools(
    *, settings: OperatorSettings, offer: Offer, roster: Callable[[], Roster], store: Callable[[], AgentEvidenceStore],
    evidence: Callable[[], Evidence], missions: Callable[[], Missions],
) -> list[Deferred]:
    """The operator's tools, each group loaded by its first call (`roster` too is made at its first use)."""

    def history() -> list[Tool]:
        from edge.operator.history import DESCRIPTIONS, history_handlers

        return declared(HISTORY_INFOS, history_handlers(store), DESCRIPTIONS)

    def reports() -> list[Tool]:
        from edge.operator.reports import Reports

        return declared(REPORT_INFOS, Reports(roster(), offer, evidence).handlers())

    def ask() -> list[Tool]:
        from edge.operator.ask import Ask

        return declared(ASK_INFOS, Ask(settings, roster(), evidence).handlers())

    def mission_tools() -> list[Tool]:
        return declared(MISSION_INFOS, missions().mission_handlers())

    def ledger_tools() -> list[Tool]:
        handlers = missions().ledger_handlers()
        return declared(LEDGER_INFOS, {name: handlers[op] for op, name in zip(LEDGER_OPS, LEDGER_TOOLS, strict=True)},
                        caller=missions().ledger_caller)

    deferred = [Deferred(infos=HISTORY_INFOS, load=history), Deferred(infos=REPORT_INFOS, load=reports),
                Deferred(infos=ASK_INFOS, load=ask), Deferred(infos=MISSION_INFOS, load=mission_tools)]
    if settings.specialists:
        deferred.append(Deferred(infos=LEDGER_INFOS, load=ledger_tools))
    return deferred
