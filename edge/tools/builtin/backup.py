"""Export and import: tasks and triggers at their current heads (and, only on request, the
secrets' values), so a device's state can be carried across a reflash or to another device.

Export is paged like every list tool. Import plans first and writes nothing when anything
it would overwrite differs, unless told to replace; what is already identical is skipped,
so an import can be run again (after an interruption, too) with the same result.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec

from edge.core.errors import ErrorCode, ToolError, conflict, invalid, not_found
from edge.core.reads import keyset
from edge.core.schedule import ScheduleError
from edge.core.tasks import NotifyRule, Task, TaskSpec, content_digest
from edge.core.text import Label, Limit, Name
from edge.core.triggers import CronSpec, ImportPlan, PlannedTask, PlannedTrigger, Trigger
from edge.tools.builtin import credentials as secret_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.context import ToolContext
from edge.tools.definition import WRITE_DEADLINE_S, tool

FORMAT: Literal["qledge-export"] = "qledge-export"
FORMAT_VERSION: Literal[1] = 1
BATCH = 64  # items per import call, like every page

_Revision = Annotated[int, msgspec.Meta(ge=1)]


class ExportedTask(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A task's current head. `revision` and `content_digest` say what was exported; an
    import creates its own revisions."""

    id: Name
    name: Label
    enabled: bool
    spec: TaskSpec
    revision: _Revision = 1
    content_digest: str = ""


class ExportedTrigger(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A trigger's current head. `pinned`: it ran an older revision of its task than the
    head; an import pins it to the head it imports (and says so)."""

    id: Name
    task_id: Name
    enabled: bool
    spec: CronSpec
    revision: _Revision = 1
    task_revision: _Revision = 1
    pinned: bool = False


class SecretValue(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    name: Name
    value: secret_tools.Value


class ExportedChannel(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A notification channel as stored: the secrets it uses by name (their values travel
    only in an export made with secrets)."""

    name: Name
    spec: dict[str, Any]


class ExportedNotify(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    channels: list[ExportedChannel] = []
    rules: list[NotifyRule] | None = None  # the project's default rules (None: none)


class ExportedScripts(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """The scripts `qledge import qinglong` copied (`root`, `<state dir>-scripts` on the
    device exported), in the gzipped tar beside the export (`archive`, its file name)."""

    root: Annotated[str, msgspec.Meta(min_length=2, max_length=4096, pattern=r"^/[^\x00]*$")]
    archive: Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=r"^[^/\x00]+$")]
    files: Annotated[int, msgspec.Meta(ge=0)]
    bytes: Annotated[int, msgspec.Meta(ge=0)]
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]


class Document(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """The export file (JSON)."""

    format: Literal["qledge-export"]
    version: Literal[1]
    qledge_version: str = ""
    exported_at_ms: int = 0
    tasks: list[ExportedTask] = []
    triggers: list[ExportedTrigger] = []
    secrets: list[SecretValue] | None = None  # present only in an export made with secrets
    notify: ExportedNotify | None = None  # None: the device exported had no notifications to carry
    scripts: ExportedScripts | None = None
    not_exported: list[str] = []  # what the device had that this file does not carry, and why


Part = Literal["tasks", "triggers"]


class ExportCursor(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    part: Part
    after: Name | None = None


class ExportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """One page: tasks by id, then triggers by id. Start without a cursor, then pass `next`."""

    cursor: ExportCursor | None = None
    limit: Limit = 64


class ExportPage(msgspec.Struct, rename="camel", omit_defaults=True):
    tasks: list[ExportedTask] = []
    triggers: list[ExportedTrigger] = []
    next: ExportCursor | None = None


class SecretExportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: Name | None = None
    limit: Limit = 64


class SecretPage(msgspec.Struct, rename="camel", omit_defaults=True):
    secrets: list[SecretValue]
    next: str | None = None


class ImportSession(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """One import sent in parts (an export is larger than one call may be): the parts of a
    session are kept, in memory and bounded, until its `last`, which checks them all and
    writes them in one transaction. Parts are numbered from 0."""

    id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{8,64}$")]
    part: Annotated[int, msgspec.Meta(ge=0, le=100_000)]
    last: bool = False


class ImportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    tasks: Annotated[list[ExportedTask], msgspec.Meta(max_length=BATCH)] = []
    triggers: Annotated[list[ExportedTrigger], msgspec.Meta(max_length=BATCH)] = []
    replace: bool = False  # overwrite what differs instead of refusing
    dry_run: bool = False  # plan and report, write nothing
    session: ImportSession | None = None  # None: these items are the whole import


class SecretImportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    secrets: Annotated[list[SecretValue], msgspec.Meta(max_length=BATCH)]
    replace: bool = False
    dry_run: bool = False


class ImportReport(msgspec.Struct, rename="camel"):
    """What an import did (or, dry, would do), as "task NAME" / "trigger NAME" / "secret NAME"."""

    created: list[str] = []
    updated: list[str] = []
    skipped: list[str] = []
    conflicts: list[str] = []  # what differs and, without replace, blocks the import (dry runs only)
    notes: list[str] = []
    refused: list[str] = []  # what this caller may not import, and why (dry runs only; the first REFUSED_SHOWN)
    refused_count: int = 0  # all of them
    refused_code: ErrorCode | None = None  # the error a real import would end with
    staged: int = 0  # a part of a session: the items held so far

    def add(self, other: ImportReport) -> None:
        for mine, theirs in ((self.created, other.created), (self.updated, other.updated),
                             (self.skipped, other.skipped), (self.conflicts, other.conflicts),
                             (self.notes, other.notes), (self.refused, other.refused)):
            mine += theirs
        self.refused_count += other.refused_count
        self.refused_code = self.refused_code or other.refused_code


# -- export ---------------------------------------------------------------------------


def exported_task(t: Task) -> ExportedTask:
    return ExportedTask(id=t.id, name=t.name, enabled=t.enabled, spec=t.spec, revision=t.revision,
                        content_digest=t.content_digest)


async def export(ctx: ToolContext, args: ExportArgs) -> ExportPage:
    cursor = args.cursor or ExportCursor(part="tasks")
    if cursor.part == "tasks":
        rows = await ctx.services.tasks.page(ctx.project, cursor.after, args.limit + 1)
        tasks, last = keyset(rows, args.limit)
        following = ExportCursor(part="tasks", after=last.id) if last else ExportCursor(part="triggers")
        return ExportPage(tasks=[exported_task(t) for t in tasks], next=following)
    rows_t = await ctx.services.triggers.page(ctx.project, cursor.after, args.limit + 1)
    triggers, last_t = keyset(rows_t, args.limit)
    heads: dict[str, int] = {}
    for trig in triggers:
        if trig.task_id not in heads:
            task = await ctx.services.tasks.get(ctx.project, trig.task_id)
            heads[trig.task_id] = task.revision if task else trig.task_revision
    return ExportPage(
        triggers=[_exported_trigger(trig, heads[trig.task_id]) for trig in triggers],
        next=ExportCursor(part="triggers", after=last_t.id) if last_t else None,
    )


def _exported_trigger(t: Trigger, task_head: int) -> ExportedTrigger:
    return ExportedTrigger(id=t.id, task_id=t.task_id, enabled=t.enabled, spec=t.spec, revision=t.revision,
                           task_revision=t.task_revision, pinned=t.task_revision != task_head)


async def export_secrets(ctx: ToolContext, args: SecretExportArgs) -> SecretPage:
    names = [s.name for s in await ctx.services.secrets.for_project(ctx.project)
             if args.after is None or s.name > args.after]
    page, last = keyset(names, args.limit)
    values = await ctx.services.secrets.resolve(ctx.project, page)
    return SecretPage(secrets=[SecretValue(name=n, value=values[n]) for n in page if n in values], next=last)


# -- import ---------------------------------------------------------------------------

REFUSED_SHOWN = 32  # refused entries a refusal names; the count covers the rest
_STAGED_BYTES = 8 << 20  # what the parts of every open session may hold together
_STAGED_ITEMS = 10_000
_SESSION_IDLE_S = 300.0


class _Staged:
    __slots__ = ("tasks", "triggers", "replace", "dry_run", "next_part", "size", "touched")

    def __init__(self, args: ImportArgs, now: float) -> None:
        self.tasks: list[ExportedTask] = []
        self.triggers: list[ExportedTrigger] = []
        self.replace, self.dry_run = args.replace, args.dry_run
        self.next_part, self.size, self.touched = 0, 0, now


_sessions: dict[tuple[str, str], _Staged] = {}
_part_size = msgspec.msgpack.Encoder()


def _stage(ctx: ToolContext, args: ImportArgs, session: ImportSession) -> tuple[_Staged, bool]:
    """Keep this part; the session, and whether its last part is in (then it is forgotten here)."""
    now = time.monotonic()
    for key in [k for k, s in _sessions.items() if now - s.touched > _SESSION_IDLE_S]:
        del _sessions[key]
    key = (ctx.principal.subject, session.id)
    staged = _sessions.get(key)
    if staged is None:
        if session.part != 0:
            raise conflict(f"import session {session.id}: part {session.part} of a session this daemon does not"
                           " hold (it expired, or the daemon restarted): import again")
        staged = _sessions[key] = _Staged(args, now)
    if session.part != staged.next_part or (args.replace, args.dry_run) != (staged.replace, staged.dry_run):
        del _sessions[key]
        raise conflict(f"import session {session.id}: part {session.part} is not the one expected"
                       f" ({staged.next_part}, with the same replace and dry run): import again")
    size = sum(len(_part_size.encode(item)) for item in (*args.tasks, *args.triggers))
    held = sum(s.size for s in _sessions.values()) + size
    items = len(staged.tasks) + len(staged.triggers) + len(args.tasks) + len(args.triggers)
    if held > _STAGED_BYTES or items > _STAGED_ITEMS:
        del _sessions[key]
        raise ToolError("resource_exhausted", f"an import holds at most {_STAGED_ITEMS} tasks and triggers and"
                        f" {_STAGED_BYTES >> 20} MiB (with every other import in progress): split the export")
    staged.tasks += args.tasks
    staged.triggers += args.triggers
    staged.size += size
    staged.next_part += 1
    staged.touched = now
    if not session.last:
        return staged, False
    del _sessions[key]
    return staged, True


def refusal(conflicts: list[str]) -> str:
    return (f"{len(conflicts)} item(s) differ from what this daemon has, so nothing was imported: "
            + "; ".join(conflicts))


def refused_line(refused: list[str], count: int) -> str:
    more = f"; and {count - len(refused)} more" if count > len(refused) else ""
    return f"{count} item(s) cannot be imported, so nothing was: " + "; ".join(refused) + more


class _Plan:
    """What an import would write, and every entry that stops it (all found before any write)."""

    def __init__(self) -> None:
        self.report = ImportReport()
        self.conflicts: list[str] = []
        self.refused: list[str] = []
        self.codes: set[ErrorCode] = set()
        self.tasks: list[PlannedTask] = []
        self.triggers: list[PlannedTrigger] = []
        self.specs: dict[str, tuple[TaskSpec, int | None]] = {}  # task id → the spec its triggers will run
        self.refused_tasks: set[str] = set()

    def refuse(self, label: str, exc: ToolError) -> None:
        self.codes.add(exc.code)
        self.refused.append(f"{label}: {exc.message}")
        if label.startswith("task "):
            self.refused_tasks.add(label[len("task "):])


async def _plan_task(ctx: ToolContext, item: ExportedTask, plan: _Plan) -> None:
    label = f"task {item.id}"
    if not item.content_digest:
        plan.refuse(label, invalid("it has no contentDigest (not a file qledge exported)"))
        return
    if content_digest(item.spec) != item.content_digest:
        plan.refuse(label, invalid("its spec does not match its contentDigest (the file was changed after the"
                                   " export)"))
        return
    here = await ctx.services.tasks.get(ctx.project, item.id)
    if here is not None and (here.content_digest, here.name, here.enabled) == (item.content_digest, item.name,
                                                                                 item.enabled):
        plan.report.skipped.append(label)
        plan.specs[item.id] = (here.spec, here.revision)
        return
    try:
        # The checks the task tools apply to what they write (edge.tools.builtin.tasks).
        task_tools.check_program(item.spec)
        spec = task_tools.named(ctx, item.spec)
        privileged = ctx.may_run(label, spec)
        name = await task_tools.label(ctx, item.name) or item.id
    except ToolError as exc:
        plan.refuse(label, exc)
        return
    if here is None:
        plan.report.created.append(label)
    else:
        plan.report.updated.append(label)
        plan.conflicts.append(f"{label} (revision {here.revision} here)")
        if here.content_digest == item.content_digest:
            spec, privileged = here.spec, here.privileged  # only its name or flag: the spec keeps its writer
    plan.tasks.append(PlannedTask(id=item.id, name=name, spec=spec, enabled=item.enabled, privileged=privileged,
                                  expected=None if here is None else here.revision))
    plan.specs[item.id] = (spec, None)


async def _plan_trigger(ctx: ToolContext, item: ExportedTrigger, plan: _Plan) -> None:
    label = f"trigger {item.id}"
    here = await ctx.services.triggers.get(ctx.project, item.id)
    if here is not None and (here.task_id, here.spec, here.enabled) == (item.task_id, item.spec, item.enabled):
        plan.report.skipped.append(label)
        return
    target = plan.specs.get(item.task_id)
    if target is None:
        task = await ctx.services.tasks.get(ctx.project, item.task_id)
        target = (task.spec, task.revision) if task is not None else None
    if target is None:
        why = (f"its task {item.task_id} cannot be imported" if item.task_id in plan.refused_tasks
               else f"task {item.task_id!r} is neither in the file nor here")
        plan.refuse(label, not_found(why))
        return
    try:
        item.spec.schedule()
    except ScheduleError as exc:
        plan.refuse(label, invalid(str(exc)))
        return
    if item.enabled:
        try:  # what a trigger that fires needs: what its task's revision runs (as trigger tools check)
            ctx.may_run(f"{label}, for task {item.task_id}", target[0])
        except ToolError as exc:
            plan.refuse(label, exc)
            return
    if here is None:
        plan.report.created.append(label)
    else:
        plan.report.updated.append(label)
        plan.conflicts.append(f"{label} (revision {here.revision} here)")
    if item.pinned:
        plan.report.notes.append(f"{label} ran revision {item.task_revision} of task {item.task_id}, an older one"
                                 " than its head; it now runs the current revision")
    plan.triggers.append(PlannedTrigger(id=item.id, task_id=item.task_id, spec=item.spec, enabled=item.enabled,
                                        expected=None if here is None else here.revision,
                                        recreate=here is not None and here.task_id != item.task_id))


def _verdict(plan: _Plan, replace: bool, dry_run: bool) -> None:
    """Without replace, what differs is not updated: a dry run reports it, a real one
    refuses. What may not be imported refuses a real import, naming every entry (bounded)."""
    report = plan.report
    differ = plan.conflicts if not replace else []
    if not replace:
        report.updated.clear()
    report.refused, report.refused_count = plan.refused[:REFUSED_SHOWN], len(plan.refused)
    order: tuple[ErrorCode, ...] = ("permission_denied", "invalid_argument", "not_found", "conflict")
    code = next((c for c in (*order, *sorted(plan.codes)) if c in plan.codes), None)
    if dry_run:
        report.conflicts = differ
        report.refused_code = code
        return
    if code is not None:
        also = f"; {len(differ)} more differ from what this daemon has (replace overwrites them)" if differ else ""
        raise ToolError(code, refused_line(report.refused, len(plan.refused)) + also)
    if differ:
        raise conflict(refusal(differ) + " (import with replace to overwrite them)")


async def import_state(ctx: ToolContext, args: ImportArgs) -> ImportReport:
    tasks, triggers = args.tasks, args.triggers
    if args.session is not None:
        staged, complete = _stage(ctx, args, args.session)
        if not complete:
            return ImportReport(staged=len(staged.tasks) + len(staged.triggers))
        tasks, triggers = staged.tasks, staged.triggers
    plan = _Plan()
    for task_item in tasks:
        await _plan_task(ctx, task_item, plan)
    for trigger_item in triggers:
        await _plan_trigger(ctx, trigger_item, plan)
    _verdict(plan, args.replace, args.dry_run)
    if not args.dry_run and (plan.tasks or plan.triggers):
        # Every check passed: all of it is written, in one transaction, or none of it.
        await ctx.services.triggers.apply_import(ctx.project, ImportPlan(tasks=plan.tasks, triggers=plan.triggers),
                                                 ctx.now_ms())
    return plan.report


def _settle(report: ImportReport, conflicts: list[str], args: SecretImportArgs) -> None:
    """Without replace, what differs is not updated: a dry run reports it, a real one refuses."""
    if args.replace:
        return
    report.updated.clear()
    if args.dry_run:
        report.conflicts = conflicts
    elif conflicts:
        raise conflict(refusal(conflicts) + " (import with replace to overwrite them)")


async def import_secrets(ctx: ToolContext, args: SecretImportArgs) -> ImportReport:
    report = ImportReport()
    conflicts: list[str] = []
    here = await ctx.services.secrets.resolve(ctx.project, [s.name for s in args.secrets])
    work: list[SecretValue] = []
    for item in args.secrets:
        label = f"secret {item.name}"
        if item.name not in here:
            report.created.append(label)
            work.append(item)
        elif here[item.name] == item.value:
            report.skipped.append(label)
        else:
            report.updated.append(label)
            conflicts.append(f"{label} (another value here)")
            work.append(item)
    _settle(report, conflicts, args)
    if not args.dry_run:
        for item in work:
            await ctx.services.secrets.set(ctx.project, item.name, item.value, ctx.now_ms())
    return report


# Import plans and writes up to 2 x 64 items, each its own transaction: a write's deadline
# per item would be too short for a whole batch on slow flash.
_IMPORT_DEADLINE_S = 4 * WRITE_DEADLINE_S

TOOLS = [
    tool("qledge.export", export, ExportArgs, ExportPage, effect="read", risk="high",
         permission=("task.inspect", "trigger.inspect"), title="Tasks and triggers at their heads, for an export"),
    tool("qledge.secret.export", export_secrets, SecretExportArgs, SecretPage, effect="read", risk="high",
         permission="secret.export", title="Secret values, for an export made with secrets"),
    tool("qledge.import", import_state, ImportArgs, ImportReport, effect="write", risk="high",
         permission=("task.write", "trigger.write"), deadline_s=_IMPORT_DEADLINE_S,
         title="Create or (with replace) overwrite tasks and triggers from an export"),
    tool("qledge.secret.import", import_secrets, SecretImportArgs, ImportReport, effect="write", risk="high",
         permission="secret.write", deadline_s=_IMPORT_DEADLINE_S, title="Store secrets from an export"),
]
