"""Storage ports: what the tools, the runner and the scheduler need from storage, and
nothing more. Adapters (edge/storage) implement them; composition (edge/app) wires them.

Rules every adapter keeps, so each contract below can be short:
- Every method is scoped by project id; another project's rows look like missing ones.
- Each write method is one transaction: all of it happens or none of it does.
- Storage faults raise ToolError("unavailable"), never a driver exception; other
  ToolError codes are named where they can occur. Nothing is retried behind the caller.
- Pages are keysets: rows strictly after a cursor, in a fixed order, at most `limit`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import msgspec

from edge.core.auth import AuditEntry, AuditRecord, Credential, SecretInfo
from edge.core.tasks import ImportedTask, ImportRecord, ImportTask, SecretImport
from edge.core.reads import Counts, OutcomeRow, RunEventSummary, RunSummary, TaskDetail, TaskHead, TriggerHead
from edge.core.runs import ActorType, Run, RunCursor, RunEvent, RunProcess, RunQuery, RunSearch, RunStatus, RunUpdate
from edge.core.tasks import Task, TaskRef, TaskSpec
from edge.core.triggers import Admission, CronSpec, ImportPlan, ManualAdmission, PreparedImport, Trigger, TriggerEvent

# -- tasks, runs, triggers ----------------------------------------------------------


class TaskStore(Protocol):
    """Task heads and their immutable revisions."""

    async def create(
        self, project: str, task_id: str, name: str, spec: TaskSpec, now_ms: int, *, privileged: bool
    ) -> Task:
        """Insert revision 1, enabled; `privileged` records that its writer held
        task.privileged (Task.privileged). Raises conflict when the id exists."""
        ...

    async def update(
        self, project: str, task_id: str, expected_revision: int, spec: TaskSpec, name: str | None, now_ms: int,
        *, privileged: bool,
    ) -> Task:
        """Append a revision with `spec` (and `name`, when given) and its writer's
        `privileged` if the head is still at `expected_revision`; triggers pinned to the old
        head move to the new one in the same transaction. Raises not_found, or conflict
        when the head moved."""
        ...

    async def set_enabled(
        self, project: str, task_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Task:
        """A new revision with the flag (following triggers move with it) and the previous
        revision's spec and `privileged`; setting the flag it already has changes nothing
        and returns the head. `expected_revision` None skips the compare-and-set. Raises
        not_found or conflict."""
        ...

    async def get(self, project: str, task_id: str, revision: int | None = None) -> Task | None:
        """The head, or the given revision (with the head's name and times); None when missing."""
        ...

    async def page(self, project: str, after: str | None, limit: int) -> list[Task]:
        """Heads with id > after, ascending by id."""
        ...

    async def delete(self, project: str, task_id: str, expected_revision: int | None, with_triggers: bool) -> int:
        """Delete the task with its revisions, triggers and finished runs, then (after the
        commit) the logs of those runs. Raises not_found, or conflict when the revision
        moved, a run is still queued or running, or (without `with_triggers`) the task has
        triggers (the message says how many and names them). Returns how many runs went."""
        ...

    async def import_task(
        self, project: str, item: ImportTask, triggers: list[CronSpec], now_ms: int, *, privileged: bool
    ) -> ImportedTask:
        """Create the task (at the first free id from `item.task_id`: `x`, `x-2`, …), its
        triggers (`triggers[i]` with `item.triggers[i].enabled`) and the record of
        `item.key`, in one transaction; its revision records `privileged` (whether the
        writer held task.privileged). When the key is on record, nothing changes and the
        result is `exists` with the task it became. The record goes when its task is
        deleted. Raises invalid_argument for a spec that cannot be scheduled."""
        ...

    async def import_tasks(self, project: str, items: list[PreparedImport], now_ms: int) -> list[ImportedTask]:
        """import_task for each item, in order, all in one transaction (one item's failure
        writes none of them); one result per item."""
        ...

    async def imports(self, project: str, after: str | None, limit: int) -> list[ImportRecord]:
        """Import records (tasks and secrets) with key > after, ascending by key."""
        ...

    async def apply_import(self, project: str, plan: ImportPlan, now_ms: int) -> None:
        """Write every task of the plan, then every trigger (pinned to its task's head), in
        one transaction: all of it or nothing. Each revision is compare-and-set on the head
        it was planned against (conflict when one moved, not_found when one went, conflict
        when an id planned as new is taken); a trigger spec that cannot fire is
        invalid_argument. Triggers that followed a task's old head follow the new one."""
        ...

    async def task_uid(self, project: str, task_id: str) -> int | None:
        """The uid recorded as the task's own (TaskUsers.for_task), or None."""
        ...

    async def allocate_task_uid(self, project: str, task_id: str, low: int, high: int,
                                taken: frozenset[int], now_ms: int) -> int:
        """The uid recorded for the task, else the next of [low, high] after the last one
        handed out (wrapping around) that no task has and `taken` (the system's users and
        groups) does not hold, recorded now in one transaction: a uid is never two tasks',
        and one a deleted task had is handed out again only after the rest of the range.
        The record goes with the task. Raises not_found when the task is gone,
        resource_exhausted when no uid of the range is free."""
        ...


class RunStore(Protocol):
    """Runs and their events. Every status change appends its event in the same transaction."""

    async def create(self, run: Run, actor: ActorType) -> Run:
        """Insert a run with its first event. Raises conflict when its id or idempotency
        key exists. (Production runs enter through RunAdmission, which also applies the
        overlap policy and the queue bound.)"""
        ...

    async def transition(
        self, run_id: str, expected_version: int, status: RunStatus, now_ms: int, actor: ActorType,
        update: RunUpdate, detail: str | None = None, started: RunUpdate | None = None,
    ) -> Run:
        """Compare-and-set on `expected_version`: set `status` and the columns `update`
        names, append the `run.<status>` event. `started` (for a queued run whose start
        was not recorded yet): first record `running` by the runner at
        `started.started_at_ms` with the columns it names, in the same transaction, so
        a quick run costs one write instead of two. A run that reaches a terminal status also,
        in that transaction: gets its retry's due time (`retry_due_at_ms`, a
        `run.retry_scheduled` event) when it failed or timed out and its task revision
        retries it; keeps its task's failing mark and queues the notifications its rules
        ask for; applies retention (runs per task, age, log quota; bounded per write).
        After the commit it removes the logs of the runs retention deleted and tells its
        Followers (edge.core.runs) of a retry scheduled or messages queued. Raises
        not_found, or conflict when the version moved or the transition is not allowed.
        Returns the run as stored."""
        ...

    async def get(self, project: str, run_id: str) -> Run | None: ...

    async def page(self, project: str, task_id: str | None, after: RunCursor | None, limit: int) -> list[Run]:
        """Runs of the project (or of one task) strictly after `after` in
        (created_at_ms DESC, id DESC) order, on an index (no scan, no sort)."""
        ...

    async def search(self, project: str, query: RunQuery, after: RunCursor | None, limit: int) -> RunSearch:
        """Runs matching `query` strictly after `after` in (created_at_ms DESC, id DESC)
        order, at most `limit`. Each page walks the one index that serves the filter and
        examines at most SEARCH_BUDGET (edge.core.reads) of its entries: `next` is set when
        `limit` runs were found and more may follow, or when the budget ran out first (the
        page then has fewer runs, perhaps none, and the search goes on from `next`); None:
        nothing more matches."""
        ...

    async def with_prefix(self, project: str, prefix: str, limit: int) -> list[str]:
        """Ids of the project's runs that start with `prefix`, ascending, at most `limit`
        (a range of the primary key)."""
        ...

    async def active(self) -> list[Run]:
        """Every project's runs that are queued or running."""
        ...

    async def active_processes(self) -> list[tuple[Run, RunProcess]]:
        """Active runs with the process recorded for them, for reconciling after a crash:
        every active run on a single node; on a cluster node, those this node claimed."""
        ...

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEvent]:
        """Events with sequence > after_sequence, ascending."""
        ...

    async def notices_waiting(self, project: str) -> bool:
        """Whether the notifier has work on record: a message pending (in flight included),
        or a channel whose latest delivery attempt failed. Cheap: two index reads."""
        ...


class TriggerStore(Protocol):
    """Trigger heads, their immutable revisions (each pinned to one task revision) and the
    events of fires that did not become runs."""

    async def create(
        self, project: str, trigger_id: str | None, task_id: str, task_revision: int | None, spec: CronSpec,
        now_ms: int,
    ) -> Trigger:
        """Insert revision 1, enabled, pinned to `task_revision` (None: the task's head) and
        armed from the newest time on record. `trigger_id` None picks `<task>-N`. Raises
        invalid_argument for a spec that cannot be scheduled, not_found for the task or
        revision, conflict when the id exists."""
        ...

    async def get(self, project: str, trigger_id: str) -> Trigger | None: ...

    async def page(self, project: str, after: str | None, limit: int) -> list[Trigger]:
        """Heads with id > after, ascending by id, disabled ones included."""
        ...

    async def set_enabled(
        self, project: str, trigger_id: str, enabled: bool, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        """A new revision with the flag; enabling re-arms from now (fires missed while
        disabled are not misfires). Unchanged: returns the head. Raises not_found or conflict."""
        ...

    async def repin(
        self, project: str, trigger_id: str, task_revision: int | None, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        """A new revision pinned to `task_revision` (None: the task's head); unchanged: the
        head. Raises not_found (trigger, task or revision) or conflict."""
        ...

    async def update(
        self, project: str, trigger_id: str, spec: CronSpec, expected_revision: int | None, now_ms: int
    ) -> Trigger:
        """A new revision with `spec`, keeping its task, pin, enabled flag and events; an
        enabled trigger is re-armed for the new schedule from the newest time on record
        (so no fire already handled comes again). The same spec changes nothing and returns
        the head. Raises invalid_argument for a spec that cannot be scheduled, not_found,
        or conflict when the head is not at `expected_revision` (None: no check)."""
        ...

    async def delete(self, project: str, trigger_id: str, expected_revision: int | None) -> None:
        """Delete the trigger with its revisions and events. Raises not_found or conflict."""
        ...

    async def events(
        self, project: str, trigger_id: str | None, before_id: int | None, limit: int
    ) -> list[TriggerEvent]:
        """Events of one trigger (None: every trigger) with id < before_id, newest first."""
        ...


class RunAdmission(Protocol):
    """The one way a run comes into being: a transaction that checks the task, its overlap
    policy and the shared queue bound, inserts the queued run with its event, and (for a
    fire) moves the trigger's cursor. A committed admission must reach the executor: callers
    shield what follows (edge.core.handoff)."""

    async def armed(self, project: str) -> list[tuple[int, str]]:
        """(next_fire_at_ms, trigger_id) of every trigger that will fire, by time."""
        ...

    async def admit_fires(
        self, project: str, trigger_id: str, now_ms: int, grace_ms: int, rng: Callable[[], float]
    ) -> Admission:
        """Plan the trigger's fires from its cursor up to `now_ms` (misfire policy, grace),
        admit the due ones under the task's overlap policy and the queue bound, record the
        ones skipped or refused as trigger events, move the cursor and the clock mark. A fire
        admitted before (same idempotency key) is never admitted again. An armed `@reboot` or
        `@once` trigger fires once, at `now_ms` (key `boot:<trigger>:<boot id>` or
        `once:<trigger>:<revision>`), and is unarmed; `@once` also disables itself."""
        ...

    async def arm_boot(self, project: str, boot_id: str, at_ms: int) -> int:
        """If `boot_id` (the kernel's, for this boot) differs from the one on record, record
        it and arm every enabled `@reboot` trigger at `at_ms`, in one transaction; returns
        how many were armed (0 on a daemon restart within the same boot). On a cluster the
        record and the armed fires are the calling node's: each node's boot fires once,
        for that node to run (the other nodes neither see nor claim it)."""
        ...

    async def armed_retries(self, project: str) -> list[tuple[int, str]]:
        """(due_at_ms, run_id) of every failed run whose retry is pending, by time."""
        ...

    async def admit_retry(self, project: str, run_id: str, now_ms: int) -> Admission:
        """Admit the retry of `run_id` once it is due, under the task's overlap policy and
        the queue bound: a run with origin `retry`, `retry_of` the failed run, `attempt`
        one more, key `retry:<run id>`; or, refused, a trigger event (when the run had a
        trigger) and a `run.retry_skipped` event on the failed run. Either way the pending
        retry is cleared. Not due yet: nothing changes and `cursor` says when. No pending
        retry (retention removed the run, or it was admitted): `gone`."""
        ...

    async def admit_manual(self, task: Task | TaskRef, actor: ActorType, now_ms: int) -> ManualAdmission:
        """Admit a manual run of `task`'s revision (a TaskRef: of the task's current
        revision, read in the admission's own transaction, so that a tool that names a task
        reads nothing before it). Raises not_found, conflict (the task is
        disabled, or `forbid` and a run is active) or resource_exhausted (the queue is full)."""
        ...

    def set_capacity(self, capacity: int) -> None:
        """How many runs may be queued or running at once, across projects (live on reload)."""
        ...

    async def newest_time(self, project: str) -> int:
        """The newest wall-clock time on record (clock mark, runs, audit), for clock sanity."""
        ...

    async def save_time(self, now_ms: int) -> None:
        """Raise the clock mark to `now_ms` (never lowers it)."""
        ...

    def restamp(self, after_ms: int, upto_ms: int, shift_ms: int) -> None:
        """The clock jumped: add `shift_ms` to every time in (after_ms, upto_ms] of runs,
        their events and the audit log, and raise the clock mark to match, in one
        transaction that storage runs before any call made after this one (so no write
        stamped after the jump, age retention included, comes first). Never raises; a
        storage fault is logged."""
        ...


# -- security -----------------------------------------------------------------------


class CredentialStore(Protocol):
    async def create(self, credential: Credential, digest: bytes) -> None:
        """Store a credential with the HMAC digest of its secret. Raises conflict on an id collision."""
        ...

    async def lookup(self, credential_id: str) -> tuple[Credential, bytes] | None:
        """The credential (of any project: the caller checks) and its digest."""
        ...

    async def for_project(self, project: str) -> list[Credential]:
        """Every credential of the project, revoked ones included, oldest first."""
        ...

    async def revoke(self, project: str, credential_id: str, now_ms: int) -> Credential | None:
        """Mark it revoked (the first revocation time is kept); None when missing."""
        ...


class SecretStore(Protocol):
    """Write-only from the outside: values leave only to the runner and to redaction."""

    async def set(self, project: str, name: str, value: str, now_ms: int) -> SecretInfo:
        """Create or replace."""
        ...

    async def for_project(self, project: str) -> list[SecretInfo]:
        """Names and dates, by name; never values."""
        ...

    async def import_secret(self, project: str, key: str, name: str, value: str, now_ms: int) -> SecretImport:
        """Create the secret with the record of `key`, in one transaction: `created`; or
        nothing when the key is on record (`exists`) or a secret of that name exists that
        no import made (`taken`: an import never replaces a value). The record goes when its
        secret is deleted."""
        ...

    async def delete(self, project: str, name: str) -> bool:
        """False when there was no such secret."""
        ...

    async def resolve(self, project: str, names: list[str]) -> dict[str, str]:
        """Values of those of `names` that exist (for a run's environment)."""
        ...

    async def values(self, project: str) -> list[str]:
        """Every value of the project (for redacting output)."""
        ...


class AuditTicket(Protocol):
    """An audit row on its way (`AuditLog.ahead`)."""

    async def committed(self) -> object:
        """Returns once the row is durable; raises unavailable when it cannot be written."""
        ...


class AuditLog(Protocol):
    """Three classes of rows, each trimmed to its own bounds, so the volume of one never
    pushes out another: allowed calls, allowed changes of credentials and secrets
    (`record.change`), and refused calls (outcome denied or unauthenticated)."""

    async def append(self, record: AuditRecord) -> None:
        """Record one call, trimming the oldest rows of its class (bounded per write) to at
        most that class's row limit (an adapter may trim in batches below it) and the age
        limit.

        An allowed call is durable when this returns. A refused call is aggregated: one row
        per project, principal, cause (`reasons[0]`), outcome, transport and minute, with a
        count and its first and last time; the first call of a row is durable when this
        returns, later ones are counted and written within a few seconds (`flush`;
        edge.core.auth.RefusalTallies on either backend). Raises unavailable when a row
        cannot be written: the caller then does nothing."""
        ...

    async def ahead(self, record: AuditRecord) -> AuditTicket:
        """Record an allowed call whose work only reads: the row is written, in a transaction
        of its own, before any storage work asked for after this returns (on SQLite it rides
        on the worker's next hop, so the row and the read cost one hop); elsewhere it is
        written before this returns, as `append` does. The caller must await
        `committed()` before it returns or shows anything the call read, and answer
        unavailable when that raises. Raises unavailable when written at once and that fails."""
        ...

    async def before_change(self, record: AuditRecord) -> AuditTicket:
        """Record an allowed call that may change something: the row is durable before the
        first change the call makes. Where the store can, it rides in the call's first
        transaction, committed with it (on PostgreSQL, for `qledge.run.start`, whose first
        storage work comes before anything else it does); elsewhere it is written before
        this returns, as `append` does. The caller must await `committed()` before it
        answers, whatever the answer, and answer unavailable when that raises."""
        ...

    async def flush(self) -> None:
        """Write the counts of refused calls not written yet (on a cluster node whose
        PostgreSQL is unreachable, counts for a row in the spool wait for the end of its
        minute). Raises unavailable."""
        ...

    async def close(self) -> None:
        """Write everything held (the daemon calls this when it stops). Raises unavailable."""
        ...


class AuditReader(Protocol):
    """The security audit, read back for owners."""

    async def page(self, project: str, since_ms: int | None, before_id: int | None, limit: int) -> AuditPage:
        """The project's rows newest first (id DESC) with id < before_id and, when given,
        a last call (an aggregate's `last_at_ms`, else `at_ms`) at or after since_ms; at most
        `limit`, examining at most SEARCH_BUDGET rows (the table
        is bounded anyway). `next` is the before_id of the following page; None: no more."""
        ...


class AuditPage(msgspec.Struct):
    entries: list[AuditEntry]
    next: int | None


# -- run logs -----------------------------------------------------------------------


class LogRange(msgspec.Struct, frozen=True):
    data: bytes
    start: int  # byte offset of data[0] in the log
    total: int  # the log's size when it was read


class LogWriter(Protocol):
    """A run's log as it is written: capped to head + tail, secrets masked."""

    @property
    def truncated(self) -> bool: ...

    @property
    def failed(self) -> OSError | None:
        """The storage error that stopped the writing (a full disk), if one did."""
        ...

    def write(self, chunk: bytes) -> None:
        """Never raises: a storage error stops the writing, not the run. Redaction may
        hold back the end of what was written (`held`) until more output decides it."""
        ...

    @property
    def held(self) -> int:
        """Bytes written but held back, not in the file yet (0 once closed)."""
        ...

    def release(self) -> None:
        """Write what is held back now, decided as at the end of the output (the stream
        goes on; what continues a secret past this point is masked when it comes). Never
        raises; a no-op once closed."""
        ...

    def close(self) -> int:
        """Finish the file (head + marker + tail beyond the cap; after a storage error,
        what was written and a last line saying the log is incomplete); returns its
        size. Idempotent."""
        ...


class RunLogFiles(Protocol):
    """The one owner of run-log files: where they are, their creation, reading and removal.
    A log is a regular file of the daemon's, by its name inside the log directory; a link,
    FIFO, device or second name of another file in its place is never followed or read."""

    def create(self, run_id: str, cap: int, secrets: Iterable[bytes]) -> LogWriter:
        """A new 0600 log, its file made with the first output (a run that prints nothing
        has none): raises OSError when the log directory is unusable; a file that cannot
        be made then (something is already there, the disk is full) is the writer's
        `failed`, and nothing is written through what is in its place."""
        ...

    def recover(self, run_id: str, cap: int) -> tuple[int, bool]:
        """Assemble the log of a run whose daemon died; (size, truncated). What is in its
        place but is not a log of ours counts as no log, (0, False), and is left alone."""
        ...

    def read(self, run_id: str, offset: int, length: int) -> LogRange | None:
        """At most `length` bytes from `offset`; None when the run has no log file. Raises
        unavailable when it exists but is not a log of ours or cannot be read."""
        ...

    def tail(self, run_id: str, size: int) -> LogRange | None:
        """The last `size` bytes; None when there is no log file. Raises unavailable when
        it exists but is not a log of ours or cannot be read."""
        ...

    def remove(self, run_ids: Iterable[str]) -> None:
        """Delete these runs' logs (a link in a log's place is removed, not followed);
        missing ones are fine."""
        ...


class RunLogReader(Protocol):
    """Run logs as tools read them. Single node: the files of RunLogFiles. A cluster node
    also reads the copy of a finished run's log that the node which ran it stored, so any
    node can show the log of any run."""

    async def read(self, run_id: str, offset: int, length: int) -> LogRange | None:
        """At most `length` bytes from `offset`; None when the run has no log."""
        ...

    async def tail(self, run_id: str, size: int) -> LogRange | None:
        """The last `size` bytes; None when there is no log. Raises unavailable when it
        exists but cannot be read."""
        ...


# -- narrow readers -----------------------------------------------------------------


class TaskHeadReader(Protocol):
    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TaskHead]:
        """Heads with task_id > after, ascending by task_id."""
        ...

    async def get_head(self, project: str, task_id: str) -> TaskDetail | None: ...


class TriggerHeadReader(Protocol):
    async def page_heads(self, project: str, after: str | None, limit: int) -> list[TriggerHead]:
        """Heads with trigger_id > after, ascending by trigger_id, enabled or not."""
        ...


class RunSummaryReader(Protocol):
    async def get(self, project: str, run_id: str) -> RunSummary | None: ...

    async def page(self, project: str, after: RunCursor | None, limit: int) -> list[RunSummary]:
        """Runs strictly after `after` in (created_at_ms DESC, id DESC) order."""
        ...

    async def events(self, project: str, run_id: str, after_sequence: int, limit: int) -> list[RunEventSummary]:
        """Events with sequence > after_sequence, ascending."""
        ...


class TaskRunOutcomeWindowReader(Protocol):
    async def window(self, project: str, task_id: str, limit: int) -> list[OutcomeRow]:
        """One read: the task's newest `limit` runs in (created_at_ms DESC, id DESC) order."""
        ...


class CountsReader(Protocol):
    async def counts(self, project: str) -> Counts:
        """Tasks, triggers, runs, active runs and live credentials of the project."""
        ...


class Readers(msgspec.Struct, kw_only=True):
    """The narrow readers behind the AI read tools. Their rows are re-validated by the
    tools (edge.core.reads), so a faulty adapter fails a call instead of leaking."""

    tasks: TaskHeadReader
    triggers: TriggerHeadReader
    runs: RunSummaryReader
    outcome_window: TaskRunOutcomeWindowReader
