"""qinglong.run.list, .get, .events.list and .compare: the run projection, bounded pages.

run.list pages the project's runs newest first, (createdAtMs DESC, id DESC), on the
project-wide runs index; run.compare is two ordered, independent point reads.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from edge.core.errors import invalid
from edge.core.reads import PAGE_DEFAULT, RunEventSummary, RunSummary, keyset, storage_fault, valid_page
from edge.core.runs import ActorType, RunCursor
from edge.core.text import MAX_SAFE_INT, PageLimit, ReadId
from edge.tools.ai.projections import Comparison, RunView, ai_read_tool, comparison_fields, read_run, view
from edge.tools.context import ToolContext

# -- run.list ---------------------------------------------------------------------


class RunListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    after: RunCursor | None = None
    limit: PageLimit = PAGE_DEFAULT


class RunPage(msgspec.Struct, rename="camel"):
    runs: list[RunView]
    has_more: bool
    next: RunCursor | UnsetType = UNSET  # only when hasMore


def _key(run: RunSummary) -> tuple[int, str]:
    return (run.created_at_ms, run.id)


async def run_list(ctx: ToolContext, args: RunListArgs) -> RunPage:
    after = args.after
    rows = await ctx.services.readers.runs.page(ctx.project, after, args.limit + 1)
    runs = valid_page(rows, RunSummary, ctx.project, args.limit + 1, key=_key, descending=True)
    if runs and after is not None and _key(runs[0]) >= (after.created_at_ms, after.run_id):
        raise storage_fault("rows at or before the cursor")
    page, last = keyset(runs, args.limit)
    return RunPage(
        runs=[view(r, RunView) for r in page], has_more=last is not None,
        next=RunCursor(created_at_ms=last.created_at_ms, run_id=last.id) if last else UNSET,
    )


# -- run.get ----------------------------------------------------------------------


class RunGetArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId


class RunGetResult(msgspec.Struct, rename="camel"):
    found: bool
    run: RunView | UnsetType = UNSET


async def run_get(ctx: ToolContext, args: RunGetArgs) -> RunGetResult:
    run = await read_run(ctx, args.run_id)
    return RunGetResult(found=False) if run is None else RunGetResult(found=True, run=view(run, RunView))


# -- run.events.list --------------------------------------------------------------


class EventListArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    run_id: ReadId
    after_sequence: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)] = 0
    limit: PageLimit = PAGE_DEFAULT


class EventView(msgspec.Struct, rename="camel"):
    sequence: int
    type: str
    actor_type: ActorType
    created_at_ms: int


class EventPage(msgspec.Struct, rename="camel"):
    found: bool
    events: list[EventView] | UnsetType = UNSET
    has_more: bool | UnsetType = UNSET
    next_after_sequence: int | UnsetType = UNSET  # only when hasMore


async def run_events(ctx: ToolContext, args: EventListArgs) -> EventPage:
    if await read_run(ctx, args.run_id) is None:
        return EventPage(found=False)
    rows = await ctx.services.readers.runs.events(ctx.project, args.run_id, args.after_sequence, args.limit + 1)
    events = valid_page(rows, RunEventSummary, ctx.project, args.limit + 1, key=lambda e: e.sequence)
    if any(e.run_id != args.run_id for e in events) or (events and events[0].sequence <= args.after_sequence):
        raise storage_fault("events of another run or before the cursor")
    page, last = keyset(events, args.limit)
    return EventPage(
        found=True, events=[view(e, EventView) for e in page], has_more=last is not None,
        next_after_sequence=last.sequence if last else UNSET,
    )


# -- run.compare ------------------------------------------------------------------


class RunCompareArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    baseline_run_id: ReadId
    candidate_run_id: ReadId


class RunCompareResult(Comparison, rename="camel", kw_only=True):
    found: bool  # false when either run does not exist here; `missing` names which
    missing: list[str] | UnsetType = UNSET
    baseline: RunView | UnsetType = UNSET
    candidate: RunView | UnsetType = UNSET
    consistency: str = "ordered_independent_point_reads"


async def run_compare(ctx: ToolContext, args: RunCompareArgs) -> RunCompareResult:
    if args.baseline_run_id == args.candidate_run_id:
        raise invalid("baselineRunId and candidateRunId must differ")
    baseline = await read_run(ctx, args.baseline_run_id)
    candidate = await read_run(ctx, args.candidate_run_id)
    if baseline is None or candidate is None:
        missing = [role for role, run in (("baseline", baseline), ("candidate", candidate)) if run is None]
        return RunCompareResult(found=False, missing=missing)
    return RunCompareResult(
        found=True, baseline=view(baseline, RunView), candidate=view(candidate, RunView),
        **comparison_fields(baseline, candidate),
    )


_PROJECTION = (
    " A run is: id, taskId, taskRevision, status, origin, createdAtMs, queuedAtMs, startedAtMs, finishedAtMs"
    " (UTC epoch ms, null while unknown), exitCode, and on a run with origin retry, retryOf: the run it retries."
)

TOOLS = [
    ai_read_tool(
        "qinglong.run.list", run_list, RunListArgs, RunPage, "run.read", "List runs, newest first",
        "Runs of every task, newest first (createdAtMs desc, id desc)." + _PROJECTION
        + " Pass `next` back as `after` for the following page; `next` is present only when hasMore is true."
        " limit is 1..64 (default 32).",
    ),
    ai_read_tool(
        "qinglong.run.get", run_get, RunGetArgs, RunGetResult, "run.read", "Get a run",
        "One run by id; found is false when there is no such run." + _PROJECTION,
    ),
    ai_read_tool(
        "qinglong.run.events.list", run_events, EventListArgs, EventPage, "run.read", "List a run's events",
        "A run's status events in order: sequence, type (e.g. run.started), actorType, createdAtMs; no payloads."
        " Pass nextAfterSequence back as afterSequence for the following page. limit is 1..64 (default 32)."
        " found is false when there is no such run.",
    ),
    ai_read_tool(
        "qinglong.run.compare", run_compare, RunCompareArgs, RunCompareResult, "run.read", "Compare two runs",
        "Two runs side by side: both projections, whether they are comparable (both finished), sameTask,"
        " sameTaskRevision, changedFields (among taskId, taskRevision, status, origin, exitCode) and the"
        " candidate − baseline deltas of queue delay, execution and total duration in ms (omitted when a"
        " time is unknown). The two runs are read one after the other, not as one snapshot.",
    ),
]
