"""What an AI run's child is offered and what its credential grants: exactly the AI read
tools (the log excerpt only when logs may be read) under their wire names, the two reporting
tools, and with specialists the operator model's own specialist tools and the ledger's
tools the child calls for them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec

from edge.core.agent_settings import PARENT_TOOLS, SpecialistSpec, wire_names
from edge.tools.context import ToolInfo
from edge.tools.definition import Tool, object_schema

if TYPE_CHECKING:  # the job's shapes load with the first AI run
    from edge.core.agent import OfferedTool

LOG_EXCERPT = "qinglong.run.log.excerpt"
REPORT_TOOLS = ("qledge.agent.round", "qledge.agent.outcome")
REPORT_PERMISSION = "agent.report"  # held by run credentials only (owners hold `*`; the tools check the run)
LEDGER_OPS = ("delegate", "correct", "revoke", "items", "prepare", "commit", "withdraw")
LEDGER_TOOLS = tuple(f"qledge.agent.specialist.{op}" for op in LEDGER_OPS)
LEDGER_PERMISSION = "agent.ledger"  # like REPORT_PERMISSION: run credentials only


class Offer:
    """The tools the model of every AI run may call, and its credential's permissions,
    settled once at start from what the daemon's tools are (`infos`); `tools` gives them
    with their types when the first run is offered them. Raises ValueError (a start-up
    error) for two tools whose wire names would be one."""

    def __init__(self, infos: Iterable[ToolInfo], read_logs: bool, specialists: list[SpecialistSpec],
                 tools: Callable[[], list[Tool]]) -> None:
        offered = (i for i in infos if i.ai and i.effect == "read" and (read_logs or i.name != LOG_EXCERPT))
        self._chosen = sorted(offered, key=lambda i: i.name)
        self._tools = tools
        self._ledger = bool(specialists)  # the child's own tools, and the ledger's it calls for them
        self.specialists = frozenset(spec.name for spec in specialists)
        self._specs: list[OfferedTool] | None = None
        wire_names(sorted(self._names()))  # ValueError: two tools would share a name on the wire

    def _names(self) -> frozenset[str]:
        return frozenset([*(i.name for i in self._chosen), *(PARENT_TOOLS if self._ledger else ())])

    # Made at the first AI run: an idle daemon holds neither set.
    @functools.cached_property
    def names(self) -> frozenset[str]:
        """What a round may report it asked for."""
        return self._names()

    @functools.cached_property
    def permissions(self) -> frozenset[str]:
        """What the credential of every AI run is granted."""
        granted = {f"tool.call:{name}" for name in (*(i.name for i in self._chosen), *REPORT_TOOLS)}
        granted |= {p for i in self._chosen for p in i.permissions} | {REPORT_PERMISSION}
        if self._ledger:
            granted |= {f"tool.call:{name}" for name in LEDGER_TOOLS} | {LEDGER_PERMISSION}
        return frozenset(granted)

    def specs(self) -> list[OfferedTool]:
        """The offered tools as the child describes them to the model (made at the first launch)."""
        if self._specs is None:
            from edge.core.agent import OfferedTool

            tools = {t.name: t for t in self._tools()}
            self._specs = [
                OfferedTool(name=t.name, description=t.description or t.title,
                            parameters=msgspec.Raw(msgspec.json.encode(object_schema(t.args_type))))
                for t in (tools[i.name] for i in self._chosen)
            ]
        return self._specs
