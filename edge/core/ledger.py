"""The mission ledger's shapes (seed 003), shared by an AI run's child (edge.airun) and the
daemon's side of the operator: what survives history truncation, retries and restarts.

An AI run is one attempt of a mission. Per mission and specialist (child) the ledger keeps
constraints (the delegation and the parent's corrections: active until superseded or
revoked, delivered with every request while active), work items (open until closed,
delivered while open), the parent's messages (pending until a request that carried them
was answered: consumed means delivered, never "no longer in force") with a receipt per
consumption bound to the attempt that made it, and the child's replies. Loaded only where
the operator is, never by the default daemon.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from edge.core.text import MAX_SAFE_INT

CONSTRAINT_TEXT_MAX = 2000  # characters, like an instruction
ITEM_TEXT_MAX = 500
MESSAGE_MAX = 8000  # a parent's message or a child's reply, in characters
ITEMS_PER_CALL = 8
ACTIVE_CONSTRAINTS_MAX = 64  # per child: every one is required content of every request
CONSTRAINTS_MAX = 256  # per child, superseded and revoked ones included
OPEN_ITEMS_MAX = 32  # per child
ITEMS_MAX = 256  # per child, closed ones included
PENDING_MAX = 8  # parent messages of one child waiting for delivery
ATTEMPTS_MAX = 16  # per mission
HISTORY_MESSAGES_MAX = 12  # the recent-history window of a specialist request ...
HISTORY_BYTES_MAX = 64 * 1024  # ... and its byte budget (UTF-8 bytes of the messages' text)
HISTORY_KEEP = 64  # consumed messages and replies kept per child (each), beyond the window

ChildName = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]*$")]
CallId = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
LedgerId = Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]
Round = Annotated[int, msgspec.Meta(ge=1, le=1000)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
_NoNul = r"^[^\x00]*$"
ConstraintText = Annotated[str, msgspec.Meta(min_length=1, max_length=CONSTRAINT_TEXT_MAX, pattern=_NoNul)]
ItemText = Annotated[str, msgspec.Meta(min_length=1, max_length=ITEM_TEXT_MAX, pattern=_NoNul)]
MessageText = Annotated[str, msgspec.Meta(min_length=1, max_length=MESSAGE_MAX, pattern=_NoNul)]
ConstraintKind = Literal["delegation", "correction"]
ConstraintStatus = Literal["active", "superseded", "revoked"]
ItemStatus = Literal["open", "done"]


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One AI run as an attempt of its mission (the daemon's own record of the binding)."""

    project_id: str
    mission_id: str  # the run id of the mission's first attempt
    mission: int  # the mission's row, which every ledger row refers to
    attempt: int  # 1, 2, ... in the order they started
    run_id: str
    goal: str  # the instruction of the mission's first attempt


class AttemptStart(msgspec.Struct, frozen=True, kw_only=True):
    """What binds a run that starts to a mission: `mission_id` None begins a new one."""

    project_id: str
    run_id: str
    task_id: str
    task_revision: int
    goal: str
    mission_id: str | None = None


class Source(msgspec.Struct, rename="camel", frozen=True, forbid_unknown_fields=True):
    """Where a ledger entry came from: the attempt, its round and the model's tool-call id."""

    attempt: Annotated[int, msgspec.Meta(ge=1, le=ATTEMPTS_MAX)]
    round: Round
    call: CallId


# -- what the child sends (the daemon adds the attempt from the run's credential) ------------


class _Call(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    round: Round  # the parent's round whose tool call this is
    call: CallId


class ItemDraft(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    text: ItemText
    acceptance: ItemText | None = None


class DelegateArgs(_Call, frozen=True, kw_only=True):
    child: ChildName
    instruction: ConstraintText
    work_items: Annotated[list[ItemDraft], msgspec.Meta(max_length=ITEMS_PER_CALL)] = []


class CorrectArgs(_Call, frozen=True, kw_only=True):
    child: ChildName
    text: ConstraintText
    replaces: LedgerId | None = None  # an active correction of the same child


class RevokeArgs(_Call, frozen=True, kw_only=True):
    constraint: LedgerId


class ItemsArgs(_Call, frozen=True, kw_only=True):
    child: ChildName
    add: Annotated[list[ItemDraft], msgspec.Meta(max_length=ITEMS_PER_CALL)] = []
    close: Annotated[list[LedgerId], msgspec.Meta(max_length=ITEMS_PER_CALL)] = []


class PrepareArgs(_Call, frozen=True, kw_only=True):
    child: ChildName
    message: MessageText  # recorded pending before anything is sent


class WithdrawArgs(_Call, frozen=True, kw_only=True):
    child: ChildName
    message: LedgerId  # pending, recorded by this attempt, carried by no request


class CommitArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    child: ChildName
    request_id: CallId
    round: Round  # the specialist round that carried the request
    messages: Annotated[list[LedgerId], msgspec.Meta(max_length=PENDING_MAX)]  # what the request carried
    reply: MessageText


# -- what the daemon answers -------------------------------------------------------------


class ConstraintView(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    id: LedgerId
    child: ChildName
    kind: ConstraintKind
    text: str
    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]
    status: ConstraintStatus
    replaces: LedgerId | None
    superseded_by: LedgerId | None
    source: Source
    created_at_ms: _Count
    updated_at_ms: _Count


class ItemView(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    id: LedgerId
    child: ChildName
    text: str
    acceptance: str | None
    status: ItemStatus
    source: Source


class HistoryEntry(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    id: LedgerId
    sender: Literal["parent", "child"]
    text: str


class PendingMessage(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    id: LedgerId
    text: str
    source: Source


class SpecialistContext(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """Everything the ledger holds for one specialist request, the message just recorded
    among the pending ones: the runtime builds the request from this alone."""

    mission_id: str
    attempt: int
    goal: str
    constraints: list[ConstraintView]  # every active one of this child, oldest first
    items: list[ItemView]  # every open one of this child, oldest first
    history: Annotated[list[HistoryEntry], msgspec.Meta(max_length=HISTORY_MESSAGES_MAX)]  # newest, in order
    history_total: _Count  # consumed messages and replies of this child the ledger keeps
    pending: Annotated[list[PendingMessage], msgspec.Meta(min_length=1, max_length=PENDING_MAX)]  # oldest first


class LedgerChange(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """What a delegate, correct, revoke or items call changed."""

    constraint: ConstraintView | None = None  # the one created or revoked
    superseded: LedgerId | None = None  # the one the new constraint replaced
    items: list[ItemView] = []  # the items added or closed


class CommitResult(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    consumed: list[LedgerId]  # consumed by this request (a message already consumed never is again)
    reply: LedgerId
    repeated: bool  # this request was committed before: nothing changed


class MissionView(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """A mission as its owner sees it: attempts, the ledger's constraints and items, and counts."""

    mission_id: str
    task_id: str
    task_revision: int
    goal: str
    attempts: list[str]  # run ids, attempt 1 first
    constraints: list[ConstraintView]  # all of them, superseded and revoked included
    items: list[ItemView]
    messages_pending: _Count
    messages_consumed: _Count
    replies: _Count
    created_at_ms: _Count
