"""The AI read tools against a real daemon over its real socket: projections, paging to
the end, cross-project isolation, fail-closed input, permissions, audit and the CLI."""

from __future__ import annotations

import json

import msgspec
import pytest

from edge.cli.client import CallFailed
from edge.app.graph import ai_tools
from rows import add_run, add_task, add_trigger
from support import DaemonProcess

TOOLS = {
    "qinglong.task.list": "task.read",
    "qinglong.task.get": "task.read",
    "qinglong.trigger.list": "trigger.read",
    "qinglong.run.list": "run.read",
    "qinglong.run.get": "run.read",
    "qinglong.run.events.list": "run.read",
    "qinglong.run.compare": "run.read",
    "qinglong.task.runs.compare": "run.read",
    "qinglong.run.log.excerpt": "artifact.read",
}
VALID_ARGS = {
    "qinglong.task.list": {},
    "qinglong.task.get": {"taskId": "t01"},
    "qinglong.trigger.list": {},
    "qinglong.run.list": {},
    "qinglong.run.get": {"runId": "run-000"},
    "qinglong.run.events.list": {"runId": "run-000"},
    "qinglong.run.compare": {"baselineRunId": "run-000", "candidateRunId": "run-001"},
    "qinglong.task.runs.compare": {"taskId": "t01"},
    "qinglong.run.log.excerpt": {"runId": "run-000"},
}
RUN_FIELDS = {"id", "taskId", "taskRevision", "status", "origin", "createdAtMs", "queuedAtMs", "startedAtMs",
              "finishedAtMs", "exitCode"}
DEFAULT_TASKS = [f"t{i:02d}" for i in range(70)]
DEFAULT_TRIGGERS = [f"g{i:02d}" for i in range(70)]


def _seed(d: DaemonProcess) -> None:
    """Two projects in one database; this daemon serves `default`."""
    db = d.db()
    db.execute("BEGIN")
    for i, task in enumerate(DEFAULT_TASKS):
        add_task(db, "default", task, revision=1 + i % 3, enabled=i % 4 != 0, kind="shell" if i % 5 == 0 else "argv")
        add_trigger(db, "default", DEFAULT_TRIGGERS[i], task, revision=1 + i % 2, enabled=i % 3 != 0)
    for task in ("t01", "t02", "zz-theirs"):
        add_task(db, "other", task)
        add_trigger(db, "other", "g01" if task == "t01" else f"g-{task}", task)
    # 150 runs of ours, several per millisecond; 60 of another project interleaved in time.
    for i in range(150):
        add_run(db, "default", f"t{i % 3:02d}", f"run-{i:03d}", ("succeeded", "failed", "cancelled")[i // 3 % 3],
                10_000 + i // 4, events=True)
    for i in range(60):
        add_run(db, "other", "t01", f"oth-{i:03d}", "failed", 10_000 + i, events=True)
    db.execute("COMMIT")
    db.close()


@pytest.fixture(scope="module")
def d():
    daemon = DaemonProcess().start()
    _seed(daemon)
    yield daemon
    daemon.cleanup()


def _audit_last(d: DaemonProcess) -> tuple:
    db = d.db()
    tool, outcome, reasons = db.execute(
        "SELECT tool, outcome, reasons FROM security_audit ORDER BY id DESC LIMIT 1").fetchone()
    db.close()
    return tool, outcome, json.loads(reasons)


def _code(d: DaemonProcess, tool: str, args, token: str | None = None) -> str:
    with pytest.raises(CallFailed) as err:
        d.call(tool, args, token=token)
    return err.value.code


def _pages(d: DaemonProcess, tool: str, key: str, limit: int, **extra) -> list[dict]:
    """Follow `next` to the end; every page but the last is full and says hasMore."""
    rows, after, calls = [], None, 0
    while True:
        page = d.call(tool, {**extra, "limit": limit, **({"after": after} if after else {})})
        calls += 1
        rows += page[key]
        if not page["hasMore"]:
            assert "next" not in page and len(page[key]) <= limit
            return rows
        assert len(page[key]) == limit and calls < 100
        after = page["next"]


# -- contract ---------------------------------------------------------------------


def _top(schema: dict) -> dict:
    """The definition a msgspec schema's top-level $ref names."""
    return schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]


def test_the_nine_tools_and_their_contract():
    tools = {t.name: t for t in ai_tools()}
    assert set(tools) == set(TOOLS)
    for name, tool in tools.items():
        assert (tool.version, tool.effect, tool.deadline_s, tool.ai) == ("1.0.0", "read", 5.0, True)
        assert tool.permissions == (TOOLS[name],)
        assert tool.risk == ("medium" if name == "qinglong.run.log.excerpt" else "low")
        assert tool.title and len(tool.description) > 80
        # MCP derives its schemas from these types: arguments are a closed object, results an object.
        args_def, result_def = _top(msgspec.json.schema(tool.args_type)), _top(msgspec.json.schema(tool.result_type))
        assert args_def["type"] == "object" and args_def["additionalProperties"] is False, name
        assert result_def["type"] == "object", name
    args = msgspec.json.schema(tools["qinglong.task.runs.compare"].args_type)
    (body,) = args["$defs"].values()
    assert body["properties"] == {"taskId": {"type": "string", "minLength": 1, "maxLength": 255,
                                             "pattern": body["properties"]["taskId"]["pattern"]}}
    assert body["required"] == ["taskId"] and body["additionalProperties"] is False


# -- task.list / task.get ---------------------------------------------------------


def test_task_list_pages_to_the_end_with_disabled_tasks_and_nothing_else(d):
    tasks = _pages(d, "qinglong.task.list", "tasks", 8)
    assert [t["taskId"] for t in tasks] == DEFAULT_TASKS  # ordered, no gaps, no duplicates, no other project
    assert {t["enabled"] for t in tasks} == {True, False}
    assert {t["kind"] for t in tasks} == {"argv", "shell"}
    for t in tasks:
        assert set(t) == {"taskId", "revision", "name", "kind", "specSchema", "enabled", "updatedAtMs"}
    t05 = tasks[5]
    assert t05 == {"taskId": "t05", "revision": 3, "name": "name of t05", "kind": "shell",
                   "specSchema": "qinglong/command@v1", "enabled": True, "updatedAtMs": 1003}
    raw = json.dumps(d.call("qinglong.task.list", {"limit": 64}))
    for never in ("/bin/true", "plain-env-value", "sha256:", "other"):
        assert never not in raw


def test_task_list_default_page_is_32(d):
    page = d.call("qinglong.task.list", {})
    assert len(page["tasks"]) == 32 and page["hasMore"] is True and page["next"] == {"taskId": "t31"}


def test_task_get_and_the_indistinguishable_missing_task(d):
    got = d.call("qinglong.task.get", {"taskId": "t04"})
    assert got == {"found": True, "task": {
        "taskId": "t04", "revision": 2, "name": "name of t04", "kind": "argv", "specSchema": "qinglong/command@v1",
        "enabled": False, "updatedAtMs": 1002, "contentDigest": "sha256:" + f"{2:064x}", "createdAtMs": 1000}}
    assert d.call("qinglong.task.get", {"taskId": "zz-theirs"}) == {"found": False}  # another project's
    assert d.call("qinglong.task.get", {"taskId": "nobody"}) == {"found": False}


# -- trigger.list -----------------------------------------------------------------


def test_trigger_list_pages_to_the_end_and_never_shows_the_schedule(d):
    triggers = _pages(d, "qinglong.trigger.list", "triggers", 9)
    assert [g["triggerId"] for g in triggers] == DEFAULT_TRIGGERS
    assert {g["enabled"] for g in triggers} == {True, False}  # disabled ones are listed, not filtered
    assert triggers[1] == {"triggerId": "g01", "revision": 2, "taskId": "t01", "taskRevision": 1,
                           "specSchema": "qinglong/cron@v1", "enabled": True, "updatedAtMs": 2002}
    raw = json.dumps(triggers)
    for never in ("*/5", "Asia/Shanghai", "fire_once", "sha256", "nextFire", "other", "projectId", "2000"):
        assert never not in raw


# -- run.list / run.get / run.events.list --------------------------------------------


def test_run_list_pages_newest_first_to_the_end(d):
    runs = _pages(d, "qinglong.run.list", "runs", 7)
    expected = sorted(((10_000 + i // 4, f"run-{i:03d}") for i in range(150)), reverse=True)
    assert [(r["createdAtMs"], r["id"]) for r in runs] == expected  # ties broken by id, nothing of `other`
    for r in runs:
        assert set(r) == RUN_FIELDS
    raw = json.dumps(runs)
    for never in ("trig-secret-id", "error text", "idem:", "projectId"):
        assert never not in raw


def test_run_get_and_the_indistinguishable_missing_run(d):
    got = d.call("qinglong.run.get", {"runId": "run-004"})
    assert got == {"found": True, "run": {
        "id": "run-004", "taskId": "t01", "taskRevision": 1, "status": "failed", "origin": "manual",
        "createdAtMs": 10_001, "queuedAtMs": 10_001, "startedAtMs": 10_011, "finishedAtMs": 10_111, "exitCode": 1}}
    assert d.call("qinglong.run.get", {"runId": "oth-001"}) == {"found": False}
    assert d.call("qinglong.run.get", {"runId": "nope"}) == {"found": False}


def test_run_events_page_in_sequence_without_payloads(d):
    seen, after = [], 0
    while True:
        page = d.call("qinglong.run.events.list", {"runId": "run-006", "afterSequence": after, "limit": 1})
        assert page["found"] is True
        seen += page["events"]
        if not page["hasMore"]:
            assert "nextAfterSequence" not in page
            break
        after = page["nextAfterSequence"]
    assert seen == [
        {"sequence": 1, "type": "run.queued", "actorType": "user", "createdAtMs": 10_002},
        {"sequence": 2, "type": "run.running", "actorType": "runner", "createdAtMs": 10_003},
        {"sequence": 3, "type": "run.cancelled", "actorType": "runner", "createdAtMs": 10_004},
    ]
    assert d.call("qinglong.run.events.list", {"runId": "run-006", "afterSequence": 3}) == {
        "found": True, "events": [], "hasMore": False}
    assert d.call("qinglong.run.events.list", {"runId": "oth-002"}) == {"found": False}
    assert d.call("qinglong.run.events.list", {"runId": "nope"}) == {"found": False}


# -- run.compare / task.runs.compare --------------------------------------------------


def test_run_compare(d):
    out = d.call("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": "run-004"})
    assert out["found"] is True and out["baseline"]["id"] == "run-000" and out["candidate"]["id"] == "run-004"
    assert out["changedFields"] == ["taskId", "status", "exitCode"]
    assert (out["comparable"], out["sameTask"], out["sameTaskRevision"]) == (True, False, False)
    assert (out["queueDelayDeltaMs"], out["executionDurationDeltaMs"], out["totalDurationDeltaMs"]) == (0, 0, 0)
    assert out["consistency"] == "ordered_independent_point_reads"
    assert d.call("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": "oth-000"}) == {
        "found": False, "missing": ["candidate"], "consistency": "ordered_independent_point_reads"}
    assert d.call("qinglong.run.compare", {"baselineRunId": "nope", "candidateRunId": "run-000"}) == {
        "found": False, "missing": ["baseline"], "consistency": "ordered_independent_point_reads"}


def test_run_compare_omits_deltas_it_cannot_know(d):
    db = d.db()
    add_run(db, "default", "t09", "unstarted", "cancelled", 9_000, timed=False)
    db.close()
    out = d.call("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": "unstarted"})
    assert out["comparable"] is True
    assert "queueDelayDeltaMs" not in out and "executionDurationDeltaMs" not in out
    assert "totalDurationDeltaMs" not in out and out["candidate"]["startedAtMs"] is None


def test_task_runs_compare_over_the_socket(d):
    out = d.call("qinglong.task.runs.compare", {"taskId": "t01"})
    # t01 has runs 1, 4, 7, ...; their status cycles succeeded, failed, cancelled
    assert out["baseline"]["id"] == "run-145" and out["candidate"]["id"] == "run-148"
    assert out["selection"] == {"windowLimit": 64, "searchedRunCount": 50, "hasOlderRuns": False,
                                "complete": True, "order": "createdAtMs desc, id desc"}
    assert out["changedFields"] == ["status", "exitCode"]


# -- inputs fail closed --------------------------------------------------------------

BAD_INPUTS = [
    ("qinglong.task.list", {"limit": 0}),
    ("qinglong.task.list", {"limit": 65}),
    ("qinglong.task.list", {"limit": "5"}),
    ("qinglong.task.list", {"limit": True}),
    ("qinglong.task.list", {"limit": 2.5}),
    ("qinglong.task.list", {"projectId": "other"}),
    ("qinglong.task.list", {"after": "t01"}),
    ("qinglong.task.list", {"after": {}}),
    ("qinglong.task.list", {"after": {"taskId": ""}}),
    ("qinglong.task.list", {"after": {"taskId": "t" * 129}}),
    ("qinglong.task.list", {"after": {"taskId": "t01", "revision": 1}}),
    ("qinglong.task.list", {"after": {"triggerId": "g01"}}),
    ("qinglong.task.get", {}),
    ("qinglong.task.get", {"taskId": ""}),
    ("qinglong.task.get", {"taskId": "x" * 129}),
    ("qinglong.task.get", {"taskId": "a\x00b"}),
    ("qinglong.task.get", {"taskId": "a\nb"}),
    ("qinglong.task.get", {"taskId": "a\u202eb"}),
    ("qinglong.task.get", {"taskId": 7}),
    ("qinglong.task.get", {"taskId": "t01", "project": "other"}),
    ("qinglong.trigger.list", {"limit": 65}),
    ("qinglong.trigger.list", {"after": {"taskId": "t01"}}),
    ("qinglong.trigger.list", {"after": {"triggerId": "g\x7f"}}),
    ("qinglong.trigger.list", {"enabled": True}),
    ("qinglong.run.list", {"limit": -1}),
    ("qinglong.run.list", {"taskId": "t01"}),
    ("qinglong.run.list", {"status": "failed"}),
    ("qinglong.run.list", {"after": {"runId": "run-001"}}),
    ("qinglong.run.list", {"after": {"createdAtMs": 10_000}}),
    ("qinglong.run.list", {"after": {"createdAtMs": -1, "runId": "run-001"}}),
    ("qinglong.run.list", {"after": {"createdAtMs": 2**53, "runId": "run-001"}}),
    ("qinglong.run.list", {"after": {"createdAtMs": "10000", "runId": "run-001"}}),
    ("qinglong.run.list", {"after": {"createdAtMs": 10_000, "runId": "run-001", "x": 1}}),
    ("qinglong.run.list", {"after": [10_000, "run-001"]}),
    ("qinglong.run.get", {"runId": ""}),
    ("qinglong.run.get", {"runId": "r" * 129}),
    ("qinglong.run.get", {"runId": "r\tx"}),
    ("qinglong.run.get", {"runId": "run-000", "runID": "run-001"}),
    ("qinglong.run.events.list", {"runId": "run-000", "afterSequence": -1}),
    ("qinglong.run.events.list", {"runId": "run-000", "limit": 65}),
    ("qinglong.run.events.list", {"runId": "run-000", "cursor": 3}),
    ("qinglong.run.events.list", {"afterSequence": 1}),
    ("qinglong.run.compare", {"baselineRunId": "run-000"}),
    ("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": "run-000"}),  # must differ
    ("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": ""}),
    ("qinglong.run.compare", {"baselineRunId": "run-000", "candidateRunId": "r" * 129}),
    ("qinglong.task.runs.compare", {}),
    ("qinglong.task.runs.compare", {"taskId": ""}),
    ("qinglong.task.runs.compare", {"taskId": "t" * 256}),
    ("qinglong.task.runs.compare", {"taskId": "t\x1b[31m"}),
    ("qinglong.task.runs.compare", {"taskId": "t01", "limit": 10}),
    ("qinglong.task.runs.compare", {"taskId": "t01", "cursor": "x"}),
    ("qinglong.task.runs.compare", {"taskId": "t01", "status": "failed"}),
    ("qinglong.task.runs.compare", {"taskId": "t01", "order": "asc"}),
    ("qinglong.task.runs.compare", {"taskId": "t01", "projectId": "other"}),
    ("qinglong.run.log.excerpt", {"runId": ""}),
    ("qinglong.run.log.excerpt", {"runId": "r" * 129}),
    ("qinglong.run.log.excerpt", {"runId": "run-000", "bytes": 100000}),
    ("qinglong.run.log.excerpt", {"runId": "run-000", "offset": 0}),
]


@pytest.mark.parametrize("tool, args", BAD_INPUTS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(BAD_INPUTS)])
def test_bad_input_is_invalid_argument(d, tool, args):
    assert _code(d, tool, args) == "invalid_argument"


def test_bad_input_as_a_whole_is_invalid_argument(d):
    for tool in TOOLS:
        assert _code(d, tool, [1, 2]) == "invalid_argument"
        assert _code(d, tool, "runId") == "invalid_argument"


def test_the_longest_ids_allowed_are_accepted(d):
    assert d.call("qinglong.task.get", {"taskId": "t" * 128}) == {"found": False}
    assert d.call("qinglong.run.get", {"runId": "r" * 128}) == {"found": False}
    assert d.call("qinglong.task.runs.compare", {"taskId": "t" * 255})["selection"]["searchedRunCount"] == 0
    assert d.call("qinglong.task.list", {"limit": 64, "after": {"taskId": "t" * 128}})["tasks"] == []
    assert d.call("qinglong.task.list", {"limit": 1})["next"] == {"taskId": "t00"}


# -- permissions and audit ------------------------------------------------------------


def test_every_tool_is_audited_with_its_reason(d):
    for tool, args in VALID_ARGS.items():
        d.call(tool, args)
        assert _audit_last(d) == (tool, "allowed", ["tool_invocation_allowed", "tool_" + tool.replace(".", "_")])


def test_viewer_reads_everything_but_logs(d):
    _, viewer = d.token("viewer")
    for tool, args in VALID_ARGS.items():
        if tool == "qinglong.run.log.excerpt":
            assert _code(d, tool, args, token=viewer) == "permission_denied"
            assert _audit_last(d) == (tool, "denied", ["domain_permission_denied", "tool_qinglong_run_log_excerpt"])
        else:
            d.call(tool, args, token=viewer)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_each_tool_needs_its_domain_permission(d, tool):
    _, narrow = d.token("operator", [f"tool.call:{tool}"])
    assert _code(d, tool, VALID_ARGS[tool], token=narrow) == "permission_denied"
    assert _audit_last(d) == (tool, "denied", ["domain_permission_denied", "tool_" + tool.replace(".", "_")])
    _, enough = d.token("operator", [f"tool.call:{tool}", TOOLS[tool]])
    d.call(tool, VALID_ARGS[tool], token=enough)
    _, other_tool = d.token("operator", ["tool.call:qledge.status", *set(TOOLS.values())])
    assert _code(d, tool, VALID_ARGS[tool], token=other_tool) == "permission_denied"
    assert _audit_last(d)[2] == ["tool_policy_denied", "tool_" + tool.replace(".", "_")]


# -- the CLI ------------------------------------------------------------------------


def test_every_tool_is_callable_from_the_cli(d):
    for tool, args in VALID_ARGS.items():
        done = d.cli("call", tool, "--args", json.dumps(args))
        assert done.returncode == 0, done.stderr
        assert isinstance(json.loads(done.stdout), dict)
    done = d.cli("call", "qinglong.task.list", "--args", '{"limit": 2}')
    assert [t["taskId"] for t in json.loads(done.stdout)["tasks"]] == ["t00", "t01"]
    bad = d.cli("call", "qinglong.task.runs.compare", "--args", '{"taskId": "t01", "limit": 3}')
    assert bad.returncode == 2 and bad.stderr.startswith("qledge: invalid_argument:")
    assert "Traceback" not in bad.stderr


def test_project_comes_only_from_the_daemon_configuration(daemon_factory):
    d = daemon_factory(config='project = "other"\n').start()
    _seed(d)
    assert [t["taskId"] for t in d.call("qinglong.task.list", {})["tasks"]] == ["t01", "t02", "zz-theirs"]
    assert d.call("qinglong.run.get", {"runId": "run-000"}) == {"found": False}
    assert d.call("qinglong.run.get", {"runId": "oth-000"})["found"] is True
    assert d.call("qinglong.task.runs.compare", {"taskId": "t01"})["selection"]["searchedRunCount"] == 60
