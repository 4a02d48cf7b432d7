"""The mission ledger of AI runs (seed 003) on the daemon's database. Implements
MissionLedger (edge.core.ports.agent).

Every write is one `BEGIN IMMEDIATE` transaction and checks the ledger's bounds inside it,
so two writers can never pass a bound together. Ledger ids are one sequence per mission
(`agent_missions.next_id`): constraints, items, messages and replies share it, so an id
names one entry of a mission and the order of ids is the order things happened; a
message's place in the history is the id its consumption took.

Retention, on write only: inserting a mission deletes the oldest missions beyond
MISSIONS_MAX and those created more than MISSIONS_MAX_AGE_MS before (a few per insert, with
their whole ledger); committing a reply deletes consumed messages and replies of that
child beyond the newest HISTORY_KEEP of each (history the request window can never reach).
"""

from __future__ import annotations

import apsw

from edge.core.errors import ToolError, conflict, invalid, not_found
from edge.core.ledger import (
    ACTIVE_CONSTRAINTS_MAX,
    ATTEMPTS_MAX,
    CONSTRAINTS_MAX,
    HISTORY_KEEP,
    HISTORY_MESSAGES_MAX,
    ITEMS_MAX,
    OPEN_ITEMS_MAX,
    PENDING_MAX,
    Attempt,
    AttemptStart,
    CommitArgs,
    CommitResult,
    ConstraintView,
    CorrectArgs,
    DelegateArgs,
    HistoryEntry,
    ItemDraft,
    ItemsArgs,
    ItemView,
    LedgerChange,
    MissionView,
    PendingMessage,
    PrepareArgs,
    RevokeArgs,
    Source,
    SpecialistContext,
    WithdrawArgs,
)
from edge.storage.sqlite.db import Database, Row, immediate, one, rows

MISSIONS_MAX = 500
MISSIONS_MAX_AGE_MS = 90 * 86_400_000
PRUNE_BATCH = 4  # missions per insert (each takes its ledger along)
HISTORY_PRUNE_BATCH = 8

_ATTEMPT = (
    "SELECT m.project_id, m.id, m.seq, a.attempt, a.run_id, m.goal FROM agent_attempts a"
    " JOIN agent_missions m ON m.seq = a.mission"
)
SQL_ATTEMPT_OF = _ATTEMPT + " WHERE a.run_id = ? AND m.project_id = ?"
SQL_LATEST = _ATTEMPT + " WHERE m.project_id = ? AND m.id = ? ORDER BY a.attempt DESC LIMIT 1"
SQL_PRUNE_MISSIONS = (
    "DELETE FROM agent_missions WHERE seq IN (SELECT seq FROM (SELECT seq, created_at_ms FROM agent_missions"
    " ORDER BY seq LIMIT ?) WHERE seq <= ? OR created_at_ms < ?)"
)
_CONSTRAINT = (
    "SELECT id, child, kind, text, version, status, replaces, superseded_by, source_attempt, source_round,"
    " source_call, created_at_ms, updated_at_ms FROM agent_constraints"
)
_ITEM = (
    "SELECT id, child, text, acceptance, status, source_attempt, source_round, source_call FROM agent_work_items"
)
# The newest HISTORY_MESSAGES_MAX entries of a child's history: consumed messages at the id
# their consumption took, replies at their own; each branch walks an index.
SQL_HISTORY = (
    "SELECT * FROM (SELECT * FROM (SELECT consumed_seq AS at, id, 'parent', text FROM agent_messages"
    " WHERE mission = ?1 AND child = ?2 AND status = 'consumed' ORDER BY consumed_seq DESC LIMIT ?3)"
    " UNION ALL SELECT * FROM (SELECT id AS at, id, 'child', text FROM agent_replies"
    " WHERE mission = ?1 AND child = ?2 ORDER BY id DESC LIMIT ?3)) ORDER BY at DESC LIMIT ?3"
)
SQL_HISTORY_TOTAL = (
    "SELECT (SELECT count(*) FROM agent_messages WHERE mission = ?1 AND child = ?2 AND status = 'consumed')"
    " + (SELECT count(*) FROM agent_replies WHERE mission = ?1 AND child = ?2)"
)
SQL_PRUNE_MESSAGES = (
    "DELETE FROM agent_messages WHERE mission = ?1 AND id IN (SELECT id FROM agent_messages WHERE mission = ?1"
    " AND child = ?2 AND status = 'consumed' ORDER BY consumed_seq DESC LIMIT ?4 OFFSET ?3)"
)
SQL_PRUNE_REPLIES = (
    "DELETE FROM agent_replies WHERE mission = ?1 AND id IN (SELECT id FROM agent_replies WHERE mission = ?1"
    " AND child = ?2 ORDER BY id DESC LIMIT ?4 OFFSET ?3)"
)


def _attempt(row: Row) -> Attempt:
    project, mission_id, seq, attempt, run_id, goal = row
    return Attempt(project_id=project, mission_id=mission_id, mission=seq, attempt=attempt, run_id=run_id, goal=goal)


def _constraint(row: Row) -> ConstraintView:
    return ConstraintView(
        id=row[0], child=row[1], kind=row[2], text=row[3], version=row[4], status=row[5], replaces=row[6],
        superseded_by=row[7], source=Source(row[8], row[9], row[10]), created_at_ms=row[11], updated_at_ms=row[12],
    )


def _item(row: Row) -> ItemView:
    return ItemView(id=row[0], child=row[1], text=row[2], acceptance=row[3], status=row[4],
                    source=Source(row[5], row[6], row[7]))


def _next_ids(conn: apsw.Connection, mission: int, count: int) -> int:
    """Reserve `count` ledger ids of the mission; returns the first."""
    (first,) = one(conn, "UPDATE agent_missions SET next_id = next_id + ? WHERE seq = ? RETURNING next_id - ?",
                   (count, mission, count))
    return int(first)


def _source(at: Attempt, round_: int, call: str) -> tuple[int, int, str]:
    return (at.attempt, round_, call)


# -- attempts -----------------------------------------------------------------------------


def begin_attempt(conn: apsw.Connection, start: AttemptStart, now: int) -> Attempt:
    with immediate(conn):
        found = conn.execute(SQL_ATTEMPT_OF, (start.run_id, start.project_id)).fetchone()
        if found is not None:
            return _attempt(found)
        if start.mission_id is None:
            (seq,) = one(conn, "INSERT INTO agent_missions (project_id, id, task_id, task_revision, goal,"
                               " created_at_ms) VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
                         (start.project_id, start.run_id, start.task_id, start.task_revision, start.goal, now))
            conn.execute(SQL_PRUNE_MISSIONS, (PRUNE_BATCH, seq - MISSIONS_MAX, now - MISSIONS_MAX_AGE_MS))
            number = 1
        else:
            latest = conn.execute(SQL_LATEST, (start.project_id, start.mission_id)).fetchone()
            if latest is None:
                raise not_found(f"mission {start.mission_id} is gone (retention removed it)")
            seq, number = latest[2], latest[3] + 1
            if number > ATTEMPTS_MAX:
                raise ToolError("resource_exhausted", f"mission {start.mission_id} has had {ATTEMPTS_MAX} attempts")
        conn.execute("INSERT INTO agent_attempts (run_id, mission, attempt, started_at_ms) VALUES (?, ?, ?, ?)",
                     (start.run_id, seq, number, now))
        return _attempt(one(conn, SQL_ATTEMPT_OF, (start.run_id, start.project_id)))


def attempt_of(conn: apsw.Connection, project: str, run_id: str) -> Attempt | None:
    row = conn.execute(SQL_ATTEMPT_OF, (run_id, project)).fetchone()
    return _attempt(row) if row is not None else None


def latest_attempt(conn: apsw.Connection, project: str, mission_id: str) -> Attempt | None:
    row = conn.execute(SQL_LATEST, (project, mission_id)).fetchone()
    return _attempt(row) if row is not None else None


# -- constraints and items ----------------------------------------------------------------


def _constraint_by_id(conn: apsw.Connection, mission: int, cid: int) -> ConstraintView | None:
    row = conn.execute(_CONSTRAINT + " WHERE mission = ? AND id = ?", (mission, cid)).fetchone()
    return _constraint(row) if row is not None else None


def _room_for_constraint(conn: apsw.Connection, mission: int, child: str, replacing: bool) -> None:
    total, active = one(conn, "SELECT count(*), coalesce(sum(status = 'active'), 0) FROM agent_constraints"
                              " WHERE mission = ? AND child = ?", (mission, child))
    if total >= CONSTRAINTS_MAX:
        raise ToolError("resource_exhausted", f"{child} has {CONSTRAINTS_MAX} constraints in this mission")
    if not replacing and active >= ACTIVE_CONSTRAINTS_MAX:
        raise ToolError("resource_exhausted", f"{child} has {ACTIVE_CONSTRAINTS_MAX} active constraints: replace or"
                        " revoke one first")


def _add_constraint(
    conn: apsw.Connection, at: Attempt, child: str, kind: str, text: str, old: ConstraintView | None,
    source: tuple[int, int, str], now: int,
) -> ConstraintView:
    cid = _next_ids(conn, at.mission, 1)
    conn.execute(
        "INSERT INTO agent_constraints (mission, id, child, kind, text, version, status, replaces,"
        " source_attempt, source_round, source_call, created_at_ms, updated_at_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?)",
        (at.mission, cid, child, kind, text, old.version + 1 if old else 1, old.id if old else None, *source, now, now),
    )
    if old is not None:
        conn.execute("UPDATE agent_constraints SET status = 'superseded', superseded_by = ?, updated_at_ms = ?"
                     " WHERE mission = ? AND id = ?", (cid, now, at.mission, old.id))
    made = _constraint_by_id(conn, at.mission, cid)
    assert made is not None
    return made


def _add_items(
    conn: apsw.Connection, at: Attempt, child: str, drafts: list[ItemDraft], source: tuple[int, int, str], now: int,
) -> list[ItemView]:
    if not drafts:
        return []
    total, open_ = one(conn, "SELECT count(*), coalesce(sum(status = 'open'), 0) FROM agent_work_items"
                             " WHERE mission = ? AND child = ?", (at.mission, child))
    if open_ + len(drafts) > OPEN_ITEMS_MAX:
        raise ToolError("resource_exhausted", f"{child} would have more than {OPEN_ITEMS_MAX} open work items")
    if total + len(drafts) > ITEMS_MAX:
        raise ToolError("resource_exhausted", f"{child} has {ITEMS_MAX} work items in this mission")
    first = _next_ids(conn, at.mission, len(drafts))
    for offset, draft in enumerate(drafts):
        conn.execute(
            "INSERT INTO agent_work_items (mission, id, child, text, acceptance, status, source_attempt, source_round,"
            " source_call, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?, ?, ?)",
            (at.mission, first + offset, child, draft.text, draft.acceptance, *source, now, now),
        )
    found = rows(conn, _ITEM + " WHERE mission = ? AND id >= ? AND id < ? ORDER BY id",
                 (at.mission, first, first + len(drafts)))
    return [_item(row) for row in found]


def delegate(conn: apsw.Connection, at: Attempt, args: DelegateArgs, now: int) -> LedgerChange:
    source = _source(at, args.round, args.call)
    with immediate(conn):
        row = conn.execute(_CONSTRAINT + " WHERE mission = ? AND child = ? AND status = 'active'"
                           " AND kind = 'delegation'", (at.mission, args.child)).fetchone()
        old = _constraint(row) if row is not None else None
        _room_for_constraint(conn, at.mission, args.child, replacing=old is not None)
        made = _add_constraint(conn, at, args.child, "delegation", args.instruction, old, source, now)
        items = _add_items(conn, at, args.child, args.work_items, source, now)
        return LedgerChange(constraint=made, superseded=old.id if old else None, items=items)


def correct(conn: apsw.Connection, at: Attempt, args: CorrectArgs, now: int) -> LedgerChange:
    with immediate(conn):
        old = None
        if args.replaces is not None:
            old = _constraint_by_id(conn, at.mission, args.replaces)
            if old is None or old.child != args.child:
                raise not_found(f"{args.child} has no constraint c{args.replaces}")
            if old.status != "active":
                raise conflict(_inactive(old))
            if old.kind != "correction":
                raise invalid(f"c{old.id} is {args.child}'s delegation: delegate again to replace it")
        _room_for_constraint(conn, at.mission, args.child, replacing=old is not None)
        made = _add_constraint(conn, at, args.child, "correction", args.text, old, _source(at, args.round, args.call),
                               now)
        return LedgerChange(constraint=made, superseded=old.id if old else None)


def _inactive(c: ConstraintView) -> str:
    if c.status == "superseded":
        return f"c{c.id} was superseded by c{c.superseded_by}: it is no longer in force"
    return f"c{c.id} was revoked: it is no longer in force"


def revoke(conn: apsw.Connection, at: Attempt, args: RevokeArgs, now: int) -> LedgerChange:
    with immediate(conn):
        old = _constraint_by_id(conn, at.mission, args.constraint)
        if old is None:
            raise not_found(f"there is no constraint c{args.constraint} in this mission")
        if old.status != "active":
            raise conflict(_inactive(old))
        conn.execute("UPDATE agent_constraints SET status = 'revoked', updated_at_ms = ? WHERE mission = ? AND id = ?",
                     (now, at.mission, old.id))
        return LedgerChange(constraint=_constraint_by_id(conn, at.mission, old.id))


def items(conn: apsw.Connection, at: Attempt, args: ItemsArgs, now: int) -> LedgerChange:
    with immediate(conn):
        closed: list[ItemView] = []
        for iid in dict.fromkeys(args.close):
            row = conn.execute(_ITEM + " WHERE mission = ? AND id = ?", (at.mission, iid)).fetchone()
            if row is None or row[1] != args.child:
                raise not_found(f"{args.child} has no work item w{iid}")
            if row[4] != "open":
                raise conflict(f"work item w{iid} is already done")
            conn.execute("UPDATE agent_work_items SET status = 'done', updated_at_ms = ? WHERE mission = ? AND id = ?",
                         (now, at.mission, iid))
            closed.append(_item(one(conn, _ITEM + " WHERE mission = ? AND id = ?", (at.mission, iid))))
        added = _add_items(conn, at, args.child, args.add, _source(at, args.round, args.call), now)
        return LedgerChange(items=[*closed, *added])


# -- messages, requests, replies ----------------------------------------------------------


def prepare(conn: apsw.Connection, at: Attempt, args: PrepareArgs, now: int) -> SpecialistContext:
    with immediate(conn):
        (waiting,) = one(conn, "SELECT count(*) FROM agent_messages WHERE mission = ? AND child = ?"
                               " AND status = 'pending'", (at.mission, args.child))
        if waiting >= PENDING_MAX:
            raise ToolError("resource_exhausted", f"{PENDING_MAX} messages to {args.child} are waiting for delivery")
        mid = _next_ids(conn, at.mission, 1)
        conn.execute(
            "INSERT INTO agent_messages (mission, id, child, text, status, source_attempt, source_round, source_call,"
            " created_at_ms) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
            (at.mission, mid, args.child, args.message, *_source(at, args.round, args.call), now),
        )
        return _context(conn, at, args.child)


def _context(conn: apsw.Connection, at: Attempt, child: str) -> SpecialistContext:
    key = (at.mission, child)
    constraints = rows(conn, _CONSTRAINT + " WHERE mission = ? AND child = ? AND status = 'active' ORDER BY id", key)
    open_items = rows(conn, _ITEM + " WHERE mission = ? AND child = ? AND status = 'open' ORDER BY id", key)
    history = rows(conn, SQL_HISTORY, (*key, HISTORY_MESSAGES_MAX))
    (total,) = one(conn, SQL_HISTORY_TOTAL, key)
    pending = rows(conn, "SELECT id, text, source_attempt, source_round, source_call FROM agent_messages"
                         " WHERE mission = ? AND child = ? AND status = 'pending' ORDER BY id", key)
    return SpecialistContext(
        mission_id=at.mission_id, attempt=at.attempt, goal=at.goal,
        constraints=[_constraint(r) for r in constraints], items=[_item(r) for r in open_items],
        history=[HistoryEntry(id=r[1], sender=r[2], text=r[3]) for r in reversed(history)], history_total=total,
        pending=[PendingMessage(id=r[0], text=r[1], source=Source(r[2], r[3], r[4])) for r in pending],
    )


def commit(conn: apsw.Connection, at: Attempt, args: CommitArgs, now: int) -> CommitResult:
    """Consume what the request carried and keep its reply; the same request again changes nothing."""
    with immediate(conn):
        done = conn.execute("SELECT id FROM agent_replies WHERE mission = ? AND request_id = ?",
                            (at.mission, args.request_id)).fetchone()
        if done is not None:
            consumed = rows(conn, "SELECT message FROM agent_receipts WHERE mission = ? AND request_id = ?"
                                  " ORDER BY message", (at.mission, args.request_id))
            return CommitResult(consumed=[r[0] for r in consumed], reply=done[0], repeated=True)
        wanted = sorted(set(args.messages))
        first = _next_ids(conn, at.mission, len(wanted) + 1)
        consumed_ids: list[int] = []
        for offset, mid in enumerate(wanted):
            conn.execute("UPDATE agent_messages SET status = 'consumed', consumed_seq = ? WHERE mission = ? AND id = ?"
                         " AND child = ? AND status = 'pending'", (first + offset, at.mission, mid, args.child))
            if conn.changes():
                conn.execute("INSERT INTO agent_receipts (mission, message, request_id, attempt, run_id, at_ms)"
                             " VALUES (?, ?, ?, ?, ?, ?)",
                             (at.mission, mid, args.request_id, at.attempt, at.run_id, now))
                consumed_ids.append(mid)
        reply = first + len(wanted)
        conn.execute(
            "INSERT INTO agent_replies (mission, id, child, text, request_id, attempt, run_id, round, created_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (at.mission, reply, args.child, args.reply, args.request_id, at.attempt, at.run_id, args.round, now),
        )
        prune = (at.mission, args.child, HISTORY_KEEP, HISTORY_PRUNE_BATCH)
        conn.execute(SQL_PRUNE_MESSAGES, prune)
        conn.execute(SQL_PRUNE_REPLIES, prune)
        return CommitResult(consumed=consumed_ids, reply=reply, repeated=False)


def withdraw(conn: apsw.Connection, at: Attempt, args: WithdrawArgs, now: int) -> bool:
    with immediate(conn):
        conn.execute("DELETE FROM agent_messages WHERE mission = ? AND id = ? AND child = ? AND status = 'pending'"
                     " AND source_attempt = ?", (at.mission, args.message, args.child, at.attempt))
        return bool(conn.changes())


def mission(conn: apsw.Connection, project: str, mission_id: str) -> MissionView | None:
    row = conn.execute("SELECT seq, task_id, task_revision, goal, created_at_ms FROM agent_missions"
                       " WHERE project_id = ? AND id = ?", (project, mission_id)).fetchone()
    if row is None:
        return None
    seq = row[0]
    attempts = rows(conn, "SELECT run_id FROM agent_attempts WHERE mission = ? ORDER BY attempt", (seq,))
    constraints = rows(conn, _CONSTRAINT + " WHERE mission = ? ORDER BY id", (seq,))
    work = rows(conn, _ITEM + " WHERE mission = ? ORDER BY id", (seq,))
    pending, consumed = one(conn, "SELECT coalesce(sum(status = 'pending'), 0), coalesce(sum(status = 'consumed'), 0)"
                                  " FROM agent_messages WHERE mission = ?", (seq,))
    (replies,) = one(conn, "SELECT count(*) FROM agent_replies WHERE mission = ?", (seq,))
    return MissionView(
        mission_id=mission_id, task_id=row[1], task_revision=row[2], goal=row[3], attempts=[r[0] for r in attempts],
        constraints=[_constraint(r) for r in constraints], items=[_item(r) for r in work], messages_pending=pending,
        messages_consumed=consumed, replies=replies, created_at_ms=row[4],
    )


class SqliteMissionLedger:
    """MissionLedger on the daemon's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def begin_attempt(self, start: AttemptStart, now_ms: int) -> Attempt:
        return await self._db.run(begin_attempt, start, now_ms)

    async def attempt_of(self, project: str, run_id: str) -> Attempt | None:
        return await self._db.run(attempt_of, project, run_id)

    async def latest_attempt(self, project: str, mission_id: str) -> Attempt | None:
        return await self._db.run(latest_attempt, project, mission_id)

    async def delegate(self, at: Attempt, args: DelegateArgs, now_ms: int) -> LedgerChange:
        return await self._db.run(delegate, at, args, now_ms)

    async def correct(self, at: Attempt, args: CorrectArgs, now_ms: int) -> LedgerChange:
        return await self._db.run(correct, at, args, now_ms)

    async def revoke(self, at: Attempt, args: RevokeArgs, now_ms: int) -> LedgerChange:
        return await self._db.run(revoke, at, args, now_ms)

    async def items(self, at: Attempt, args: ItemsArgs, now_ms: int) -> LedgerChange:
        return await self._db.run(items, at, args, now_ms)

    async def prepare(self, at: Attempt, args: PrepareArgs, now_ms: int) -> SpecialistContext:
        return await self._db.run(prepare, at, args, now_ms)

    async def commit(self, at: Attempt, args: CommitArgs, now_ms: int) -> CommitResult:
        return await self._db.run(commit, at, args, now_ms)

    async def withdraw(self, at: Attempt, args: WithdrawArgs, now_ms: int) -> bool:
        return await self._db.run(withdraw, at, args, now_ms)

    async def mission(self, project: str, mission_id: str) -> MissionView | None:
        return await self._db.run(mission, project, mission_id)
