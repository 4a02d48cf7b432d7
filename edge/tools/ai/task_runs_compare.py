"""qinglong.task.runs.compare: the newest succeeded run against the newest failed one.

The selection is bounded and provable instead of left to a model paging run.list:
ONE read of the task's 65 newest runs in (created_at_ms DESC, id DESC) order, five
columns each. The first 64 are the window; the 65th only proves older runs exist. The
first `succeeded` in the window is the baseline, the first `failed` the candidate.
`selection.complete` is true when both were found or storage returned at most 64 rows;
false when the window was full and one is missing (it never claims that no such run
exists in the whole history). Then at most two project-scoped point reads, in the fixed
order succeeded → failed. A selected run that vanished, changed task or outcome, moved
project or is corrupt between the two reads fails the whole call as `unavailable`:
no retry, no further search.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from edge.core.reads import WINDOW_LIMIT, OutcomeRow, RunSummary, storage_fault, valid_page
from edge.core.text import LongTaskId
from edge.tools.ai.projections import Comparison, RunView, ai_read_tool, comparison_fields, read_run, view
from edge.tools.context import ToolContext

ORDER = "createdAtMs desc, id desc"


class TaskRunsCompareArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    task_id: LongTaskId


class Selection(msgspec.Struct, rename="camel"):
    window_limit: int
    searched_run_count: int
    has_older_runs: bool
    complete: bool
    order: str


class TaskRunsCompareResult(Comparison, rename="camel", kw_only=True):
    task_id: str
    baseline_outcome: Literal["succeeded"] = "succeeded"
    candidate_outcome: Literal["failed"] = "failed"
    selection: Selection
    baseline: RunView | None  # the newest succeeded run in the window, if any
    candidate: RunView | None  # the newest failed run in the window, if any
    consistency: Literal["bounded_task_window_then_ordered_point_reads"] = (
        "bounded_task_window_then_ordered_point_reads"
    )


def _window_key(row: OutcomeRow) -> tuple[int, str]:
    return (row.created_at_ms, row.id)


async def _selected(ctx: ToolContext, task_id: str, run_id: str | None, outcome: str) -> RunSummary | None:
    if run_id is None:
        return None
    run = await read_run(ctx, run_id)
    if run is None or run.task_id != task_id or run.status != outcome:
        raise storage_fault(f"a selected {outcome} run that vanished or changed after the window read")
    return run


async def task_runs_compare(ctx: ToolContext, args: TaskRunsCompareArgs) -> TaskRunsCompareResult:
    rows = await ctx.services.readers.outcome_window.window(ctx.project, args.task_id, WINDOW_LIMIT + 1)
    rows = valid_page(rows, OutcomeRow, ctx.project, WINDOW_LIMIT + 1, key=_window_key, descending=True)
    if any(row.task_id != args.task_id for row in rows):
        raise storage_fault("runs of another task")
    window = rows[:WINDOW_LIMIT]
    succeeded = next((r.id for r in window if r.status == "succeeded"), None)
    failed = next((r.id for r in window if r.status == "failed"), None)
    selection = Selection(
        window_limit=WINDOW_LIMIT, searched_run_count=len(window), has_older_runs=len(rows) > WINDOW_LIMIT,
        complete=(succeeded is not None and failed is not None) or len(rows) <= WINDOW_LIMIT, order=ORDER,
    )
    # Fixed order: succeeded, then failed.
    baseline = await _selected(ctx, args.task_id, succeeded, "succeeded")
    candidate = await _selected(ctx, args.task_id, failed, "failed")
    compared = comparison_fields(baseline, candidate) if baseline and candidate else {}
    return TaskRunsCompareResult(
        task_id=args.task_id, selection=selection,
        baseline=view(baseline, RunView) if baseline else None,
        candidate=view(candidate, RunView) if candidate else None,
        **compared,
    )


TOOLS = [
    ai_read_tool(
        "qinglong.task.runs.compare", task_runs_compare, TaskRunsCompareArgs, TaskRunsCompareResult, "run.read",
        "Compare a task's latest success with its latest failure",
        "Answers 'what changed between the last good run and the last failed one?' for one task, with no"
        " paging: searches only the task's 64 newest runs (newest first); baseline = the newest succeeded run,"
        " candidate = the newest failed run, each null when not in the window. selection.complete is false when"
        " the window was full and one of them was not in it (older runs were not searched; hasOlderRuns says"
        " they exist). When both are found: comparable, sameTask, sameTaskRevision, changedFields and the"
        " failed − succeeded deltas of queue delay, execution and total duration in ms. Input is exactly"
        " {taskId}.",
    ),
]
