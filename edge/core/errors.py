"""Stable error codes shared by every transport (socket, MCP, CLI)."""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal[
    "invalid_argument",
    "unauthenticated",
    "permission_denied",
    "not_found",
    "conflict",
    "unavailable",
    "deadline_exceeded",
    "resource_exhausted",
    "internal",
]

class ToolError(Exception):
    """An error with a stable code; its message is safe to show to the caller."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message

    def __repr__(self) -> str:
        return f"ToolError({self.code!r}, {self.message!r})"


def invalid(message: str) -> ToolError:
    return ToolError("invalid_argument", message)


def not_found(message: str) -> ToolError:
    return ToolError("not_found", message)


def conflict(message: str) -> ToolError:
    return ToolError("conflict", message)


def unavailable(message: str = "storage is unavailable") -> ToolError:
    return ToolError("unavailable", message)
