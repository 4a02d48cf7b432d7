"""The wire shapes of `qledge.agent.retry` (the next attempt of a mission) and
`qledge.agent.mission` (a mission for its owner), which the command line speaks too; the
mission view itself is edge.core.ledger's. Their handlers are edge.operator.missions'."""

from __future__ import annotations

import msgspec

from edge.core.runs import Run
from edge.core.text import ReadId


class RetryArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId


class Retried(msgspec.Struct, rename="camel"):
    run: Run
    mission_id: str
    attempt: int


class MissionArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId  # any attempt of the mission
