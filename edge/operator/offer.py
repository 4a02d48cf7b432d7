"""What an AI run's child is offered and what its credential grants: exactly the AI read
tools (the log excerpt only when logs may be read) under their wire names, the two reporting
tools, and with specialists the operator model's own specialist tools and the ledger's
tools the child calls for them."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from edge.core.agent import PARENT_TOOLS, OfferedTool, SpecialistSpec, wire_names
from edge.tools.definition import Tool, object_schema

LOG_EXCERPT = "qinglong.run.log.excerpt"
REPORT_TOOLS = ("qledge.agent.round", "qledge.agent.outcome")
REPORT_PERMISSION = "agent.report"  # held by run credentials only (owners hold `*`; the tools check the run)
LEDGER_OPS = ("delegate", "correct", "revoke", "items", "prepare", "commit", "withdraw")
LEDGER_TOOLS = tuple(f"qledge.agent.specialist.{op}" for op in LEDGER_OPS)
LEDGER_PERMISSION = "agent.ledger"  # like REPORT_PERMISSION: run credentials only


class Offer:
    """The tools the model of every AI run may call, and its credential's permissions,
    settled once at start. Raises ValueError (a start-up error) for two tools whose wire
    names would be one."""

    def __init__(self, tools: Iterable[Tool], read_logs: bool, specialists: list[SpecialistSpec]) -> None:
        self._tools = sorted((t for t in tools if t.ai and t.effect == "read" and (read_logs or t.name != LOG_EXCERPT)),
                             key=lambda t: t.name)
        names = {t.name for t in self._tools}
        granted = {f"tool.call:{name}" for name in (*names, *REPORT_TOOLS)}
        granted |= {p for t in self._tools for p in t.permissions} | {REPORT_PERMISSION}
        if specialists:  # the child's own tools, and the ledger's it calls for them
            names |= set(PARENT_TOOLS)
            granted |= {f"tool.call:{name}" for name in LEDGER_TOOLS} | {LEDGER_PERMISSION}
        wire_names(sorted(names))  # ValueError: two tools would share a name on the wire
        self.names = frozenset(names)  # what a round may report it asked for
        self.permissions = frozenset(granted)
        self.specialists = frozenset(spec.name for spec in specialists)
        self._specs: list[OfferedTool] | None = None

    def specs(self) -> list[OfferedTool]:
        """The offered tools as the child describes them to the model (made at the first launch)."""
        if self._specs is None:
            self._specs = [
                OfferedTool(name=t.name, description=t.description or t.title,
                            parameters=msgspec.Raw(msgspec.json.encode(object_schema(t.args_type))))
                for t in self._tools
            ]
        return self._specs
