"""Security audit records: one per tool call, allowed or not."""

from __future__ import annotations

from typing import Literal

import msgspec

Outcome = Literal["allowed", "denied", "unauthenticated"]


class AuditRecord(msgspec.Struct, rename="camel"):
    at_ms: int
    project_id: str
    principal: str
    tool: str
    outcome: Outcome
    reasons: list[str]
    transport: str
    request_id: str | None = None


def tool_reason(tool_name: str) -> str:
    """`qinglong.task.list` → `tool_qinglong_task_list`."""
    return "tool_" + "".join(c if c.isalnum() else "_" for c in tool_name)
