"""Export and import: tasks and triggers at their current heads (and, only on request, the
secrets' values), so a device's state can be carried across a reflash or to another device.

Export is paged like every list tool. Import plans first and writes nothing when anything
it would overwrite differs, unless told to replace; what is already identical is skipped,
so an import can be run again (after an interruption, too) with the same result.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from edge.core.errors import conflict
from edge.core.reads import keyset
from edge.core.tasks import Task, TaskSpec, content_digest
from edge.core.text import Label, Limit, Name
from edge.core.triggers import CronSpec, Trigger
from edge.tools.builtin import credentials as secret_tools
from edge.tools.builtin import tasks as task_tools
from edge.tools.builtin import triggers as trigger_tools
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


class Document(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """The export file (JSON)."""

    format: Literal["qledge-export"]
    version: Literal[1]
    qledge_version: str = ""
    exported_at_ms: int = 0
    tasks: list[ExportedTask] = []
    triggers: list[ExportedTrigger] = []
    secrets: list[SecretValue] | None = None  # present only in an export made with secrets


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


class ImportArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    tasks: Annotated[list[ExportedTask], msgspec.Meta(max_length=BATCH)] = []
    triggers: Annotated[list[ExportedTrigger], msgspec.Meta(max_length=BATCH)] = []
    replace: bool = False  # overwrite what differs instead of refusing
    dry_run: bool = False  # plan and report, write nothing


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

    def add(self, other: ImportReport) -> None:
        for mine, theirs in ((self.created, other.created), (self.updated, other.updated),
                             (self.skipped, other.skipped), (self.conflicts, other.conflicts),
                             (self.notes, other.notes)):
            mine += theirs


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


def refusal(conflicts: list[str]) -> str:
    return (f"{len(conflicts)} item(s) differ from what this daemon has, so nothing was imported: "
            + "; ".join(conflicts))


def _settle(report: ImportReport, conflicts: list[str], args: ImportArgs | SecretImportArgs) -> None:
    """Without replace, what differs is not updated: a dry run reports it, a real one refuses."""
    if args.replace:
        return
    report.updated.clear()
    if args.dry_run:
        report.conflicts = conflicts
    elif conflicts:
        raise conflict(refusal(conflicts) + " (import with replace to overwrite them)")


async def _plan_tasks(ctx: ToolContext, items: list[ExportedTask], report: ImportReport,
                      conflicts: list[str]) -> list[tuple[ExportedTask, Task | None]]:
    work: list[tuple[ExportedTask, Task | None]] = []
    for item in items:
        here = await ctx.services.tasks.get(ctx.project, item.id)
        label = f"task {item.id}"
        if here is None:
            report.created.append(label)
            work.append((item, None))
        elif (here.content_digest, here.name, here.enabled) == (content_digest(item.spec), item.name, item.enabled):
            report.skipped.append(label)
        else:
            report.updated.append(label)
            conflicts.append(f"{label} (revision {here.revision} here)")
            work.append((item, here))
    return work


async def _apply_task(ctx: ToolContext, item: ExportedTask, here: Task | None) -> None:
    # Through the task tools' own handlers, so every rule they apply to a spec applies here.
    ref = task_tools.TaskRef(task_id=item.id)
    if here is None:
        here = await task_tools.create(ctx, task_tools.CreateArgs(task_id=item.id, spec=item.spec, name=item.name))
    elif (here.content_digest, here.name) != (content_digest(item.spec), item.name):
        here = await task_tools.update(ctx, task_tools.UpdateArgs(
            task_id=item.id, expected_revision=here.revision, spec=item.spec, name=item.name))
    if here.enabled != item.enabled:
        await (task_tools.enable if item.enabled else task_tools.disable)(ctx, ref)


def _same_trigger(here: Trigger, item: ExportedTrigger) -> bool:
    return (here.task_id, here.spec, here.enabled) == (item.task_id, item.spec, item.enabled)


async def _plan_triggers(ctx: ToolContext, items: list[ExportedTrigger], report: ImportReport,
                         conflicts: list[str]) -> list[tuple[ExportedTrigger, Trigger | None]]:
    work: list[tuple[ExportedTrigger, Trigger | None]] = []
    for item in items:
        here = await ctx.services.triggers.get(ctx.project, item.id)
        label = f"trigger {item.id}"
        if here is not None and _same_trigger(here, item):
            report.skipped.append(label)
            continue
        if here is None:
            report.created.append(label)
        else:
            report.updated.append(label)
            conflicts.append(f"{label} (revision {here.revision} here)")
        if item.pinned:
            report.notes.append(f"{label} ran revision {item.task_revision} of task {item.task_id}, an older one"
                                " than its head; it now runs the current revision")
        work.append((item, here))
    return work


async def _apply_trigger(ctx: ToolContext, item: ExportedTrigger, here: Trigger | None) -> None:
    ref = trigger_tools.TriggerRef(trigger_id=item.id)
    spec = item.spec
    if here is not None and here.task_id == item.task_id:
        # Another schedule: a new revision of the same trigger (its events and history stay).
        if here.spec != spec:
            await trigger_tools.update(ctx, trigger_tools.UpdateArgs(
                trigger_id=item.id, expected_revision=here.revision, expression=spec.expression,
                timezone=spec.timezone, misfire=spec.misfire, jitter_s=spec.jitter_s))
        await trigger_tools.repin(ctx, trigger_tools.RepinArgs(trigger_id=item.id))  # runs the head it imports
        await (trigger_tools.enable if item.enabled else trigger_tools.disable)(ctx, ref)
        return
    if here is not None:  # another task: the trigger is made anew (its events go)
        await trigger_tools.delete(ctx, trigger_tools.TriggerRef(trigger_id=item.id, expected_revision=here.revision))
    await trigger_tools.create(ctx, trigger_tools.CreateArgs(
        task_id=item.task_id, expression=spec.expression, timezone=spec.timezone, misfire=spec.misfire,
        jitter_s=spec.jitter_s, trigger_id=item.id))
    if not item.enabled:
        await trigger_tools.disable(ctx, ref)


async def import_state(ctx: ToolContext, args: ImportArgs) -> ImportReport:
    report = ImportReport()
    conflicts: list[str] = []
    tasks = await _plan_tasks(ctx, args.tasks, report, conflicts)
    triggers = await _plan_triggers(ctx, args.triggers, report, conflicts)
    _settle(report, conflicts, args)
    if not args.dry_run:
        for task_item, task_here in tasks:
            await _apply_task(ctx, task_item, task_here)
        for trigger_item, trigger_here in triggers:
            await _apply_trigger(ctx, trigger_item, trigger_here)
    return report


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
