"""The daemon as the child sees it: the read tools the model may call, the two tools the
run reports through and the mission ledger's tools, all on the daemon's socket with the
run's credential, so every call goes through the daemon's whole chain (authentication,
policy, audit as `agent:<run id>`).

The loop (edge.airun.operator) sees tools through `Toolbox`, the daemon's reporting through
`Reporter`, and the specialists (edge.airun.specialists) reach the ledger through `Ledger`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec

from edge.transports.client import BadReply, CallFailed, Client, Unreachable
from edge.core.agent import OfferedTool, OutcomeReport, RoundMeta

T = TypeVar("T")
LEDGER_PREFIX = "qledge.agent.specialist."


class ToolFailure(Exception):
    """A tool answered with an error; `code` is the daemon's stable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonGone(Exception):
    """The daemon's socket is unreachable: the run cannot go on."""


class Toolbox(Protocol):
    def offered(self) -> list[OfferedTool]:
        """The tools the model may call, with their JSON schemas."""
        ...

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call one offered tool; its result as plain values. Raises ToolFailure or DaemonGone."""
        ...


class Reporter(Protocol):
    def round(self, meta: RoundMeta) -> None:
        """Record one round in the run's evidence. Raises ToolFailure or DaemonGone."""
        ...

    def outcome(self, report: OutcomeReport) -> None:
        """Say how the run ended. Raises ToolFailure or DaemonGone."""
        ...


class Ledger(Protocol):
    def ledger(self, op: str, args: msgspec.Struct, result: type[T]) -> T:
        """One call of the mission ledger (`qledge.agent.specialist.<op>`), its result decoded
        as `result`. Raises ToolFailure or DaemonGone."""
        ...


class DaemonTools:
    """Toolbox, Reporter and Ledger over one connection to the daemon's tool socket."""

    def __init__(self, client: Client, offered: list[OfferedTool]) -> None:
        self._client = client
        self._offered = offered

    def offered(self) -> list[OfferedTool]:
        return self._offered

    def _call(self, name: str, args: Any) -> Any:
        try:
            return self._client.call(name, args)
        except CallFailed as exc:
            raise ToolFailure(exc.code, exc.message) from None
        except Unreachable as exc:
            raise DaemonGone(str(exc)) from None

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        return self._call(name, arguments)

    def round(self, meta: RoundMeta) -> None:
        self._call("qledge.agent.round", meta)

    def outcome(self, report: OutcomeReport) -> None:
        self._call("qledge.agent.outcome", report)

    def ledger(self, op: str, args: msgspec.Struct, result: type[T]) -> T:
        try:
            return self._client.typed(LEDGER_PREFIX + op, args, result)
        except CallFailed as exc:
            raise ToolFailure(exc.code, exc.message) from None
        except BadReply as exc:
            raise ToolFailure("internal", str(exc)) from None
        except Unreachable as exc:
            raise DaemonGone(str(exc)) from None
