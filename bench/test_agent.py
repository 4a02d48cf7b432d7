"""The AI operator, measured: the child's peak RSS (https, a regular install), the evidence
history's sizes (seed 001's table: a trace against its projection, a failure without a
trace, the worst single record, the whole table at 500 records) and the end-to-end overhead
of an AI run excluding the provider's time. Results go to bench/results/latest.json
("agent"); docs/ai.md's figures come from there.

The provider is a real loopback HTTPS server with scripted replies (tests/fake_provider),
its certificate trusted through `[agent] ca_file`.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

import msgspec
import pytest

from daemons import BenchDaemon, install_venv, record
from edge.cli.client import Client
from edge.core.agent import EvidenceOpen, EvidenceRecord, RoundMeta
from edge.storage.sqlite.db import Database
from edge.storage.sqlite.evidence import SqliteEvidenceStore
from edge.operator.history import detail_view
from edge.tools.agent import ROUND_PAGE
from fake_provider import FakeProvider, Step, answer, self_signed, tool_call, usage

MiB = 1 << 20
CHILD_BUDGET_MIB = 24.0
RESULTS: dict[str, Any] = {}
_json = msgspec.json.Encoder()


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    record("agent", RESULTS)


@pytest.fixture(scope="module")
def setup():
    python = install_venv()
    tmp = tempfile.mkdtemp(prefix="qla")
    cert, key = self_signed(tmp)
    provider = FakeProvider(tls=(cert, key))
    config = (f'[agent]\nenabled = true\nbase_url = "{provider.url}"\nmodel = "bench-model"\n'
              f'ca_file = "{cert}"\nbudget_wall_clock_s = 120\n')
    d = BenchDaemon(python, config=config).start()
    with Client(d.socket) as c:
        # 64 tasks whose names fill a page, and 64 runs: a 64-row task page and run page are
        # 48 KB of tool results between them.
        for i in range(64):
            c.call("qledge.task.create", {"taskId": f"job-{i:02d}", "name": f"{i:02d} " + "每日备份到外接硬盘 " * 12,
                                          "spec": {"command": {"kind": "argv", "file": "true"}, "overlap": "allow"}})
        c.call("qledge.task.create", {"taskId": "backup", "spec": {"command": {"kind": "shell", "command": (
            "for i in $(seq 200); do echo \"copying /srv/share/file-$i.tar\"; done;"
            " echo 'rsync: write failed: No space left on device (28)'; exit 23")}}})
        for i in range(63):
            c.call("qledge.run.start", {"taskId": f"job-{i:02d}"})
        failed = c.call("qledge.run.start", {"taskId": "backup"})
        for _ in range(600):
            if c.call("qledge.run.wait", {"runId": failed["id"], "timeoutMs": 1000})["done"]:
                break
    yield d, provider, failed["id"]
    d.cleanup()
    provider.close()
    shutil.rmtree(tmp, ignore_errors=True)


class PeakWatcher:
    """Polls a process's VmHWM until it exits; the last reading is its peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.hwm_kib = 0
        self.rss_anon_kib = 0
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                return
            if fields.get("State", "").strip().startswith("Z") or "VmHWM" not in fields:
                return
            self.hwm_kib = max(self.hwm_kib, int(fields["VmHWM"].split()[0]))
            self.rss_anon_kib = max(self.rss_anon_kib, int(fields.get("RssAnon", "0 kB").split()[0]))
            time.sleep(0.001)

    def join(self) -> None:
        self._thread.join(30)


def _child_pid(d: BenchDaemon) -> int:
    """The daemon's AI child, found as it starts: a quick run's pid is on record only with its
    end, when the child is gone."""
    for _ in range(20_000):
        for listing in glob.glob(f"/proc/{d.pid}/task/*/children"):
            try:
                with open(listing) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"--job-fd" in f.read():
                            return pid
                except OSError:
                    continue
        time.sleep(0.0005)
    raise AssertionError("the child never started")


def _ai_run(d: BenchDaemon, task_id: str, instruction: str) -> tuple[dict, PeakWatcher]:
    with Client(d.socket) as c:
        c.call("qledge.task.create", {"taskId": task_id, "spec": {"command": {
            "kind": "agent", "instruction": instruction}}})
        run = c.call("qledge.run.start", {"taskId": task_id})
        watcher = PeakWatcher(_child_pid(d))
        while not (waited := c.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000}))["done"]:
            pass
    watcher.join()
    return waited["run"], watcher


def _owner(d: BenchDaemon, tool: str, args: dict) -> Any:
    with Client(d.socket) as c:
        return c.call(tool, args)


def _record_bytes(d: BenchDaemon, run_id: str) -> tuple[dict, int]:
    found = _owner(d, "qinglong.agent.history.get", {"runId": run_id})
    assert found["found"], found
    return found["record"], len(_json.encode(found["record"]))


def test_typical_task_trace_projection_and_child_peak(setup):
    d, provider, failed = setup
    raw_results: list[int] = []

    def second(request):  # the child has made round 1's calls: the same reads, as the daemon returns them
        raw_results.append(len(_json.encode(_owner(d, "qinglong.task.list", {"limit": 64}))))
        raw_results.append(len(_json.encode(_owner(d, "qinglong.run.list", {"limit": 64}))))
        return tool_call("qinglong.run.log.excerpt", {"runId": failed}, call_id="call_2",
                         content="Plan: read the failed backup's log.", usage_=usage(9000, 40))

    def third(request):
        raw_results.append(len(_json.encode(_owner(d, "qinglong.run.log.excerpt", {"runId": failed}))))
        return answer(f"The backup (run {failed}) failed: rsync found no space left on the device.",
                      usage_=usage(14000, 60))

    provider.requests.clear()
    provider.add(tool_call("", calls=[("qinglong.task.list", {"limit": 64}), ("qinglong.run.list", {"limit": 64})],
                           content="Plan: list the tasks and the latest runs.", usage_=usage(3000, 50)),
                 second, third)
    run, watcher = _ai_run(d, "typical", "Why did last night's backup fail?")
    assert run["status"] == "succeeded", run
    requests = sum(len(r.raw) for r in provider.requests)
    responses = sum(r.response_bytes for r in provider.requests)
    trace = requests + responses + sum(raw_results)
    evidence, projection = _record_bytes(d, run["id"])
    assert evidence["rounds"] == 3
    RESULTS["typical"] = {
        "rounds": 3, "tool_result_bytes": raw_results, "request_bytes": requests, "response_bytes": responses,
        "trace_bytes": trace, "projection_bytes": projection, "ratio": round(trace / projection, 1),
    }
    RESULTS["child_peak"] = {"VmHWM_mib": round(watcher.hwm_kib / 1024, 2),
                             "RssAnon_mib": round(watcher.rss_anon_kib / 1024, 2), "https": True}
    assert 0 < watcher.hwm_kib / 1024 <= CHILD_BUDGET_MIB, RESULTS["child_peak"]


def test_failure_record_without_a_trace(setup):
    d, provider, _ = setup
    provider.add(Step({"error": {"message": "Incorrect API key provided"}}, status=401))
    run, _ = _ai_run(d, "refused", "Why did last night's backup fail?")
    assert run["errorCode"] == "provider_http"
    _, size = _record_bytes(d, run["id"])
    RESULTS["failure_bytes"] = size


def test_end_to_end_overhead_excluding_the_provider(setup):
    d, provider, _ = setup
    one_round, three_rounds = [], []
    for i in range(7):
        provider.requests.clear()
        provider.add(answer("Nothing failed last night."))
        run, _ = _ai_run(d, f"quick-{i}", "Did anything fail last night?")
        total_ms = run["finishedAtMs"] - run["createdAtMs"]
        one_round.append(total_ms - sum(r.handled_s for r in provider.requests) * 1000)
    for i in range(5):
        provider.requests.clear()
        provider.add(tool_call("qinglong.run.list", {"limit": 16}), tool_call("qinglong.task.list", {"limit": 16}),
                     answer("Nothing failed last night."))
        run, _ = _ai_run(d, f"three-{i}", "Did anything fail last night?")
        total_ms = run["finishedAtMs"] - run["createdAtMs"]
        three_rounds.append(total_ms - sum(r.handled_s for r in provider.requests) * 1000)
    RESULTS["overhead_ms"] = {
        "one_round_median": round(statistics.median(one_round)),
        "three_rounds_two_tool_calls_median": round(statistics.median(three_rounds)),
        "note": "run created -> finished, minus the provider's handling time; https, a fresh TLS connection per run",
    }


# -- single records and the whole table, through the store itself ------------------------


LONGEST_TOOL = "qinglong.agent.history.list"  # rounds keep offered names only; this is the longest


def _worst_round(n: int) -> RoundMeta:
    return RoundMeta(round=n, model="m" * 128, input_tokens=999_999, output_tokens=99_999, usage_estimated=False,
                     response_chars=999_999, tools=[LONGEST_TOOL] * 16, plan="p" * 500)


def _normal_round(n: int) -> RoundMeta:
    return RoundMeta(
        round=n, model="gpt-4o-mini-2024-07-18", input_tokens=20_000 + 500 * n, output_tokens=120,
        usage_estimated=False, response_chars=380, tools=["qinglong.run.list", "qinglong.run.log.excerpt"],
        plan="Plan: read the failed run's log to see why rsync stopped, then compare with the last success.")


async def _table(path: str, records: int, rounds: int, make_round, instruction: str, error: str | None,
                 answer_text: str) -> tuple[int, int, int]:
    db = await Database.open(path)
    store = SqliteEvidenceStore(db)
    try:
        for i in range(records):
            opened = EvidenceOpen(project_id="default", run_id=f"01a2{i:032d}", task_id="nightly-diagnosis",
                                  task_revision=12, instruction=instruction, provider="api.openai.com",
                                  model="gpt-4o-mini", cost_known=True)
            rounds_ = [make_round(n) for n in range(1, rounds + 1)]
            await store.finish(EvidenceRecord(
                started=opened, state="failed" if error else "succeeded", rounds=rounds_,
                input_tokens=sum(r.input_tokens for r in rounds_), output_tokens=sum(r.output_tokens for r in rounds_),
                cost_usd=0.0123 * rounds, error_code="provider_http" if error else None, error=error,
                answer_summary=answer_text, created_at_ms=1_800_000_000_000 + i), 1_800_000_000_000 + i + 1)
        row = await store.get("default", opened.run_id)
        single = len(_json.encode(detail_view(row)))
        page = len(_json.encode(detail_view(row, 0, ROUND_PAGE)))  # what one history.get answers
        table = await db.run(lambda conn: conn.execute(
            "SELECT sum(pgsize) FROM dbstat WHERE name IN ('agent_evidence', 'agent_evidence_created_idx',"
            " 'sqlite_autoindex_agent_evidence_1')").fetchone()[0])
        return single, page, table
    finally:
        await db.close()


@pytest.mark.parametrize("shape", ["worst", "normal_48_rounds", "typical"])
def test_evidence_sizes(shape):
    tmp = tempfile.mkdtemp(prefix="qle")
    try:
        path = os.path.join(tmp, "e.db")
        if shape == "worst":
            args = (48, _worst_round, "i" * 2000, "e" * 500, "a" * 500)
        elif shape == "normal_48_rounds":
            args = (48, _normal_round, "Why did last night's backup fail? Look at its runs and logs.", None,
                    "The backup failed because the disk is full (run 01a2…).")
        else:
            args = (3, _normal_round, "Why did last night's backup fail?", None,
                    "The backup failed because the disk is full (run 01a2…).")
        single, page, table = asyncio.run(_table(path, 500, *args))
        RESULTS.setdefault("records", {})[shape] = {"single_bytes": single, "first_page_bytes": page,
                                                    "table_500_bytes": table}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_report_table():
    print(json.dumps(RESULTS, indent=2, ensure_ascii=False))


# -- what an AI run writes to flash -------------------------------------------------------

WRITE_RUNS = 30


def _flush(home: str) -> None:
    """The kernel's writeback between two runs far apart: afterwards a page the next run
    changes counts again (bench/test_budgets.py does the same)."""
    for name in ("qledge.db", "qledge.db-wal", "qledge.db-shm"):
        path = os.path.join(home, name)
        if os.path.exists(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _written(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("write_bytes")).split()[1])


def test_bytes_written_per_ai_run(setup):
    """write_bytes of the daemon (/proc/<pid>/io) per AI run of three rounds with two tool
    calls, one run at a time with a writeback between runs (as for runs far apart), after
    the task's history and the evidence table are warm."""
    d, provider, _ = setup
    with Client(d.socket) as c:
        c.call("qledge.task.create", {"taskId": "written", "spec": {"command": {
            "kind": "agent", "instruction": "Did anything fail last night?"}, "overlap": "allow"}})

        def one() -> None:
            provider.add(tool_call("qinglong.run.list", {"limit": 4}), tool_call("qinglong.task.list", {"limit": 4}),
                         answer("Nothing failed last night."))
            run = c.call("qledge.run.start", {"taskId": "written"})
            while not (waited := c.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 30_000}))["done"]:
                pass
            assert waited["run"]["status"] == "succeeded", waited

        for _ in range(5):
            one()
        _flush(d.home)
        before = _written(d.pid)
        for _ in range(WRITE_RUNS):
            one()
            _flush(d.home)
        apart = (_written(d.pid) - before) / WRITE_RUNS
        before = _written(d.pid)
        for _ in range(WRITE_RUNS):
            one()
        together = (_written(d.pid) - before) / WRITE_RUNS
    RESULTS["written_per_ai_run"] = {
        "written_back_between_runs_bytes": round(apart), "back_to_back_bytes": round(together),
        "note": "daemon write_bytes per AI run (3 rounds, 2 tool calls), /proc/<pid>/io",
    }
