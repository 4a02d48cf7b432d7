"""The budgets in docs/performance.md's table, measured; CI runs these after the tests and
fails when one is exceeded.

Each daemon variant runs from a regular install, is loaded with 100 tasks (and 100 cron
triggers where the scheduler exists), then left alone for a minute; memory is read from
/proc at the end of that minute and wake-ups are counted over it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

import cli_start
from callfloor import CLIENTS_CPU_RATIO_BUDGET, CPU_RATIO_BUDGET, against_floor
from daemons import (ROOT, BenchDaemon, context_switches, install_venv, io_counters, memory, record, unit_environment,
                     uvloop_path)
from edge.cli.client import Client
from edge.tools.definition import WRITE_DEADLINE_S

MiB = 1 << 20
IDLE_S = float(os.environ.get("QLEDGE_BENCH_IDLE_S", "60"))
TASKS = 100

BUDGET = {
    # The goal is 23.5 / 13.5 MiB; 23.36-23.40 / 13.33 measured since msgspec's type
    # descriptions wait for a use and no statement of a run or a call builds a temporary B-tree
    # (23.8 / 13.7 before). The margin is for the host: the same build reads ~0.1 MiB apart on
    # two machines.
    "default_hwm_mib": 23.6,
    "default_rss_anon_mib": 13.6,
    "mcp_hwm_mib": 26.0,
    "agent_over_default_mib": 0.3,
    "bridge_rss_mib": 12.0,
    "edge_pyz_bytes": 256 * 1024,
    "edge_pyz_files": 66,  # the SQLite worker thread's module: 64 before; its making of a database apart: 65
    "idle_wakeups_per_min": 1.0,
    # Flash wear: bytes the daemon makes the kernel write (/proc/<pid>/io write_bytes),
    # in steady state (retention and the audit bound at work), over >= 500 runs so that
    # WAL checkpoints are included. 8.0-8.1 KB measured since the time indexes of runs hold
    # no id (schema 20; the goal is 8 KiB); 9.0 to 10.1 KB before, since a fire names its run
    # and two quiet runs share a page (schema 18); 10.8 to 12.0 KB before that.
    # bench/flash_pages.py says which pages. The margin is for where the checkpoints fall.
    "flash_per_scheduled_run_bytes": 8704,
    # A run with its two audited calls (qledge.run.start, qledge.run.wait): the run's budget
    # and two calls'; a manual run also enters runs_unscheduled_idx (the history's origin
    # filter), about 1.2 KB a run that a scheduled one does not write.
    "flash_per_manual_run_bytes": 8704 + 2 * 1536 + 2 * 1024,
    "flash_per_audited_read_call_bytes": 1536,
    # Whole-process CPU of a command against `python -c pass` of the same interpreter, the
    # least of the pair-by-pair ratios over interleaved rounds (bench/cli_start.py): a command
    # starts like a shell tool.
    "cli_status_cpu_ratio": 3.0,
    "cli_version_cpu_ratio": 1.5,
    # A run's start that switches users (fork, then the exec as the user) leaves the loop free
    # while the kernel works: its busy time per start, as a share of the start's wall time
    # (measured near 0.1; a start on the loop, as asyncio makes it, is near 0.9).
    "loop_busy_share_of_switching_spawn": 0.4,
    # The server's CPU per audited read (`qledge.task.get`) over the floor's (bench/callfloor.py):
    # the median of the pairs of one interleaved run, one client and 16.
    "audited_read_cpu_over_floor": CPU_RATIO_BUDGET,
    "audited_read_cpu_over_floor_16_clients": CLIENTS_CPU_RATIO_BUDGET,
}
REPORT: dict[str, Any] = {"budget": BUDGET}
IDLE_OPERATOR = {"edge.app.operator", "edge.core.agent_settings", "edge.operator",
                 "edge.operator.offer", "edge.operator.settings", "edge.operator.tools"}
# The AI operator on, pointed at nothing: idle, it must cost the daemon (almost) nothing.
AGENT_ON = '[agent]\nenabled = true\nbase_url = "https://api.openai.com/v1"\nmodel = "gpt-4o-mini"\n'


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    record("budgets", REPORT)


def _spec(i: int) -> dict:
    return {"command": {"kind": "argv", "file": "true", "args": [str(i)]}, "overlap": "allow"}


def populate(daemon: BenchDaemon) -> dict[str, int]:
    """100 tasks, and a cron trigger on each."""
    with Client(daemon.socket) as client:
        for i in range(TASKS):
            client.call("qledge.task.create", {"taskId": f"task-{i:03d}", "spec": _spec(i)})
        for i in range(TASKS):
            client.call("qledge.trigger.create", {
                "triggerId": f"trigger-{i:03d}", "taskId": f"task-{i:03d}",
                "expression": f"{i % 60} 3 1 1 *", "timezone": "UTC",  # yearly: nothing due while idle
            })
    return {"tasks": TASKS, "triggers": TASKS}


@pytest.fixture(scope="module")
def idle():
    """Every variant started, loaded, then idle together for IDLE_S; readings per variant."""
    python = install_venv()
    variants = {
        "default": BenchDaemon(python),
        "unit_env": BenchDaemon(python, env=unit_environment()),
        "uvloop": BenchDaemon(python, env={"PYTHONPATH": uvloop_path()}),
        "mcp": BenchDaemon(python, config="[mcp]\nenabled = true\n"),
        "agent": BenchDaemon(python, config=AGENT_ON),
        "agent_off": BenchDaemon(python, config=AGENT_ON.replace("enabled = true", "enabled = false")),
    }
    readings: dict[str, dict[str, Any]] = {}
    try:
        for name, d in variants.items():
            d.start()
            readings[name] = {"startup_to_ready_s": round(d.ready_s or 0, 3), "loaded": populate(d),
                              "home": d.home}
        # Start-up work (checkpoints, optimize) settles before the window opens, and so does
        # the tools' deadline timer, which fires once, a write's deadline after the last call
        # (edge.tools.chain._Deadlines): a wake-up of the calls, not of the idle daemon.
        time.sleep(WRITE_DEADLINE_S + 2)
        before = {name: context_switches(d.pid) for name, d in variants.items()}
        time.sleep(IDLE_S)
        for name, d in variants.items():
            after = context_switches(d.pid)
            minutes = IDLE_S / 60
            readings[name]["memory_mib"] = memory(d.pid)
            readings[name]["threads"] = after["threads"]
            readings[name]["idle_wakeups_per_min"] = round(
                (after["voluntary"] - before[name]["voluntary"]) / minutes, 2)
            readings[name]["idle_involuntary_per_min"] = round(
                (after["nonvoluntary"] - before[name]["nonvoluntary"]) / minutes, 2)
        for name, d in variants.items():  # after the window: a call is itself a wake-up
            with Client(d.socket) as client:
                status = client.call("qledge.status", {"includeModules": True})
            readings[name]["loop"] = status["loop"]
            readings[name]["modules"] = status["modules"]
            readings[name]["module_count"] = len(status["modules"])
        yield readings
    finally:
        for d in variants.values():
            d.cleanup()


def _summary(reading: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reading.items() if k not in ("modules", "home")}


def test_default_daemon_idle_memory(idle):
    r = idle["default"]
    REPORT["default"] = _summary(r)
    mem = r["memory_mib"]
    assert r["loop"] == "asyncio"
    assert mem["VmHWM"] <= BUDGET["default_hwm_mib"], mem
    assert mem["RssAnon"] <= BUDGET["default_rss_anon_mib"], mem


def test_daemon_under_the_systemd_units_environment(idle):
    """The default daemon with the environment packaging/systemd/qledge.service gives it
    (MALLOC_ARENA_MAX=1: one glibc malloc arena for the loop and the SQLite worker), held to
    the same budget; what it saves against `default` is reported (about 0.1 MiB, measured
    together in one window; too close to the noise between two daemons to assert)."""
    r, base = idle["unit_env"], idle["default"]
    assert unit_environment() == {"MALLOC_ARENA_MAX": "1"}
    mem = r["memory_mib"]
    REPORT["unit_env"] = {**_summary(r), "under_default_mib": {
        k: round(base["memory_mib"][k] - mem[k], 2) for k in ("VmHWM", "RssAnon", "Pss")}}
    assert set(r["modules"]) == set(base["modules"])
    assert mem["VmHWM"] <= BUDGET["default_hwm_mib"], mem
    assert mem["RssAnon"] <= BUDGET["default_rss_anon_mib"], mem


def test_uvloop_variant_is_reported(idle):
    r = idle["uvloop"]
    REPORT["uvloop"] = _summary(r)
    assert r["loop"] == "uvloop"
    assert "ssl" in r["modules"]  # uvloop needs it: the reason it is opt-in


def test_mcp_daemon_idle_memory(idle):
    r = idle["mcp"]
    REPORT["mcp"] = _summary(r)
    assert "edge.mcp" in " ".join(r["modules"])
    assert r["memory_mib"]["VmHWM"] <= BUDGET["mcp_hwm_mib"], r["memory_mib"]


def test_agent_enabled_daemon_idle_memory(idle):
    """[agent] enabled against the same config file with it off (reading a file costs tomllib,
    whatever it says): the daemon's side of the operator is loaded; the child (edge.airun), its
    HTTP client and ssl are not."""
    r, base = idle["agent"], idle["agent_off"]
    delta = {k: round(r["memory_mib"][k] - base["memory_mib"][k], 2) for k in ("VmHWM", "RssAnon", "Pss")}
    REPORT["agent"] = {**_summary(r), "over_agent_off_mib": delta, "agent_off": _summary(base),
                       "over_default_mib": {k: round(r["memory_mib"][k] - idle["default"]["memory_mib"][k], 2)
                                            for k in ("VmHWM", "RssAnon", "Pss")}}
    # Idle, the daemon's side of the operator is its checked settings, what its runs are offered
    # and its tools' listings; how AI runs start and end, their credentials, the evidence writer
    # and store, the missions and ledger and every one of its tools wait for their first use.
    assert set(r["modules"]) - set(base["modules"]) == IDLE_OPERATOR
    modules = r["modules"]
    for absent in ("edge.airun", "ssl", "_ssl", "http", "urllib", "_hashlib"):
        assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent
    # Judged on RssAnon, what the operator's side allocates: the file-backed rest of VmHWM (the
    # shared-library pages a daemon happened to touch) differs by 0.1-0.2 MiB between two
    # daemons of one build and one config. VmHWM's difference is reported beside it.
    assert delta["RssAnon"] <= BUDGET["agent_over_default_mib"], delta


def test_default_daemon_modules(idle):
    modules = idle["default"]["modules"]
    REPORT["default_modules"] = modules
    # edge.core.imports: the import planner runs in the CLI; the daemon needs only its shapes (core.tasks).
    # hashlib, hmac, secrets, random: SHA-256 and the kernel's random bytes suffice (edge.core.ids);
    # those would map their other hash modules, base64 and zlib (about 0.4 MiB).
    # edge.core.redaction and edge.core.excerpt: loaded with the first run's log or excerpt, not while idle.
    # edge.tools.ai: the AI read tools load when an AI client first calls or lists them.
    # http, smtplib, email, edge.notify.send: notifications are delivered by a child process;
    # the rest of the notify capability waits for a channel (only its dormant handle is loaded)
    for absent in ("edge.mcp", "edge.storage.postgres", "edge.core.ports.cluster", "psycopg", "ssl", "_ssl",
                   "_hashlib", "argparse", "edge.core.imports", "hashlib", "hmac", "secrets", "random", "base64",
                   "edge.core.excerpt", "edge.core.redaction", "edge.airun", "edge.tools.agent", "edge.core.agent",
                   "edge.core.agent_settings", "edge.operator", "edge.app.operator", "edge.tools.ai",
                   "http", "smtplib",
                   "email", "edge.notify.send", "edge.notify.dispatch", "edge.notify.channels", "edge.notify.tools",
                   "edge.core.ports.notify", "edge.storage.sqlite.notify",
                   # msgspec's type descriptions, JSON Schema, toml and yaml (~0.22 MiB): edge.app.lean
                   "msgspec.inspect", "msgspec._json_schema", "msgspec.toml", "msgspec.yaml"):
        assert not [m for m in modules if m == absent or m.startswith(absent + ".")], absent
    assert [m for m in modules if m.startswith("edge.notify")] == ["edge.notify", "edge.notify.handle"]


def test_idle_wakeups(idle):
    r = idle["default"]
    assert r["idle_wakeups_per_min"] <= BUDGET["idle_wakeups_per_min"], r


def test_edge_artifact_size():
    out = tempfile.mkdtemp(prefix="qlb")
    try:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "packaging", "build.py"), "--profile", "edge",
                                 "--out", out], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        with open(os.path.join(out, "qledge-edge.json")) as f:
            manifest = json.load(f)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    REPORT["edge_pyz"] = {k: manifest[k] for k in ("bytes", "files", "source_bytes", "sha256")}
    assert manifest["bytes"] <= BUDGET["edge_pyz_bytes"], manifest["bytes"]
    assert manifest["files"] <= BUDGET["edge_pyz_files"], manifest["files"]


def test_cli_start_cpu():
    """`qledge status` (against an idle daemon) and `qledge --version`, as pip installs the
    launcher; the zipapps and `python -m edge` are recorded beside them."""
    figures = cli_start.measure_install(install_venv(), rounds=15)
    record("cli_start", figures)
    ratios = figures["ratio_to_pass"]
    assert ratios["status"]["min"] <= BUDGET["cli_status_cpu_ratio"], ratios
    assert ratios["version"]["min"] <= BUDGET["cli_version_cpu_ratio"], ratios


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}


def test_bridge_rss(idle):
    """`qledge mcp` connected to the MCP daemon, after a handshake, idle for a moment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QLEDGE_", "PYTHON"))}
    env["QLEDGE_HOME"] = idle["mcp"]["home"]
    bridge = subprocess.Popen([install_venv(), "-P", "-m", "edge", "mcp"], env=env, cwd=idle["mcp"]["home"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        bridge.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        bridge.stdin.flush()
        answer = json.loads(bridge.stdout.readline())
        assert answer.get("id") == 1 and "result" in answer, answer
        time.sleep(1)
        mem = memory(bridge.pid)
    finally:
        bridge.stdin.close()
        try:
            bridge.wait(10)
        except subprocess.TimeoutExpired:
            bridge.kill()
            bridge.wait()
    REPORT["bridge"] = {"memory_mib": mem}
    assert mem["VmHWM"] <= BUDGET["bridge_rss_mib"], mem


# -- flash wear ------------------------------------------------------------------------

FLASH_TRIGGERS = 17  # each fires every second: ~500 scheduled runs in 30 s
FLASH_RUNS = 510
FLASH_CALLS = 8000  # about two WAL checkpoints' worth, so earlier phases' pages hardly count
SPEC_TRUE = {"command": {"kind": "argv", "file": "true"}, "overlap": "allow"}
OTHER_TASKS = [f"other-{i}" for i in range(4)]


def _manual_run(client: Client, task: str) -> None:
    run = client.call("qledge.run.start", {"taskId": task})
    assert client.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 60_000})["run"]["status"] == "succeeded"


def _written(daemon: BenchDaemon) -> int:
    return io_counters(daemon.pid)["write_bytes"]


def _writeback(home: str) -> None:
    """What the kernel's writeback does between two runs a minute apart (dirty pages are
    written after 30 s): afterwards a page the next run changes counts again."""
    for name in ("qledge.db", "qledge.db-wal", "qledge.db-shm"):
        if not os.path.exists(os.path.join(home, name)):  # no -shm under [store] exclusive_lock
            continue
        fd = os.open(os.path.join(home, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _per_manual_run(daemon: BenchDaemon, client: Client, tasks: list[str], runs: int, apart: bool = False) -> float:
    if apart:
        _writeback(daemon.home)
    before = _written(daemon)
    for i in range(runs):
        _manual_run(client, tasks[i % len(tasks)])
        if apart:
            _writeback(daemon.home)
    return (_written(daemon) - before) / runs


@pytest.fixture(scope="module")
def flash():
    """One daemon in steady state: the task measured and four others at their retention
    limit (100 runs each), the audit log at its row bound. Then audited reads, manual runs
    of one task, of five tasks in turn, one run at a time with a writeback between each
    (the one-run-a-minute case), and scheduled runs."""
    d = BenchDaemon(install_venv(), config="[retention]\naudit_max_rows = 1000\n").start()
    out: dict[str, Any] = {}
    try:
        with Client(d.socket) as client:
            for task in ["flash", *OTHER_TASKS]:
                client.call("qledge.task.create", {"taskId": task, "spec": SPEC_TRUE})
                for _ in range(110):
                    _manual_run(client, task)
            before = _written(d)
            for _ in range(FLASH_CALLS):
                client.call("qledge.task.get", {"taskId": "flash"})
            out["per_audited_read_call"] = (_written(d) - before) / FLASH_CALLS
            out["per_manual_run"] = _per_manual_run(d, client, ["flash"], FLASH_RUNS)
            out["per_manual_run_five_tasks_in_turn"] = _per_manual_run(d, client, ["flash", *OTHER_TASKS], FLASH_RUNS)
            out["per_manual_run_a_minute_apart"] = _per_manual_run(d, client, ["flash"], 200, apart=True)
            for i in range(FLASH_TRIGGERS):
                client.call("qledge.trigger.create", {"triggerId": f"flash-{i:02d}", "taskId": "flash",
                                                      "expression": "* * * * * *", "timezone": "UTC"})
            time.sleep(2)
            started_ms, before = time.time_ns() // 1_000_000, _written(d)
            time.sleep(FLASH_RUNS / FLASH_TRIGGERS)
            ended_ms, written = time.time_ns() // 1_000_000, _written(d) - before
            for i in range(FLASH_TRIGGERS):
                client.call("qledge.trigger.disable", {"triggerId": f"flash-{i:02d}"})
            # At most 100 runs are kept, so the runs made in the window are its fires: one run
            # per trigger and second, as no fire was skipped or refused.
            events = client.call("qledge.trigger.events", {"limit": 64})["events"]
            assert [e for e in events if e["createdAtMs"] >= started_ms] == [], events
            fires = FLASH_TRIGGERS * (ended_ms // 1000 - started_ms // 1000)  # whole seconds in the window
            out["scheduled_runs"] = fires
            out["per_scheduled_run"] = written / fires
            out["db_bytes"] = client.call("qledge.status")["dbBytes"]
        yield {k: round(v) if isinstance(v, float) else v for k, v in out.items()}
    finally:
        d.cleanup()


class SteppedClock:
    """The wall clock a minute per run (monotonic time runs with it), so a once-a-minute
    job can be measured over hundreds of runs without waiting for them."""

    def __init__(self, now_ms: int) -> None:
        self.ms, self.mono = now_ms, 0.0

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.mono

    def step(self, ms: int) -> None:
        self.ms += ms
        self.mono += ms / 1000


async def _minutely(home: str, runs: int, exclusive: bool = False) -> dict[str, float]:
    """The daemon's own store, runner and scheduler, in this process: a task with a
    `* * * * *` trigger, each minute one fire admitted, run (`true`, a real process) and
    recorded, four other tasks with their history; write_bytes of this process per run,
    and per run with a writeback between runs (dirty pages are written back after 30 s,
    so that is what a run a minute costs the flash)."""
    import asyncio

    from edge.app.config import Config
    from edge.app.graph import build_stores, build_workers
    from edge.core.tasks import ArgvCommand, TaskSpec
    from edge.core.triggers import CronSpec
    from edge.storage.sqlite.db import Database

    clock = SteppedClock(1_780_000_000_000 // 60_000 * 60_000)
    db = await Database.open(os.path.join(home, "qledge.db"), exclusive=exclusive)
    config = Config()
    stores = build_stores(db, config, home)
    workers = build_workers(config, home, stores, clock)
    spec = TaskSpec(command=ArgvCommand(file="true"), overlap="allow")

    async def idle() -> None:
        async with asyncio.timeout(30):
            while await stores.runs.active():
                await asyncio.sleep(0.002)

    async def minute() -> None:
        clock.step(60_000)
        await workers.scheduler.tick()
        await workers.scheduler.settle()
        await idle()

    def written() -> int:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("write_bytes")).split()[1])

    try:
        for task in ["minutely", *OTHER_TASKS]:
            await stores.tasks.create("default", task, task, spec, clock.ms, privileged=True)  # as the daemon's user
        for task in OTHER_TASKS:  # history of other jobs, at its retention limit
            for _ in range(110):
                one = await stores.tasks.get("default", task)
                assert one is not None
                await workers.runner.start(one, "user")
                await idle()
        await stores.triggers.create("default", "minutely", "minutely", None,
                                     CronSpec(expression="* * * * *", timezone="UTC"), clock.ms)
        clock.step(1)  # a millisecond after each fire time
        await workers.scheduler.load()
        for _ in range(110):  # its own history up to the retention limit
            await minute()
        before = written()
        for _ in range(runs):
            await minute()
        per_run = (written() - before) / runs
        _writeback(home)
        before = written()
        for _ in range(200):
            await minute()
            _writeback(home)
        apart = (written() - before) / 200
        kept = await stores.runs.page("default", "minutely", None, 64)
        assert {r.status for r in kept} == {"succeeded"} and kept[0].origin == "scheduled"
    finally:
        await workers.scheduler.stop()
        await workers.runner.shutdown()
        await db.close()
    return {"per_scheduled_run_one_a_minute": per_run, "per_scheduled_run_one_a_minute_written_back": apart}


def test_flash_budget(flash):
    """Manual runs and audited calls through a real daemon; a once-a-minute job in process
    (its clock stepped a minute per run)."""
    import asyncio

    minutely: dict[str, int] = {}
    for exclusive in (False, True):
        home = tempfile.mkdtemp(prefix="qlf")
        try:
            measured = asyncio.run(_minutely(home, FLASH_RUNS, exclusive))
        finally:
            shutil.rmtree(home, ignore_errors=True)
        suffix = "_exclusive_lock" if exclusive else ""
        minutely.update({k + suffix: round(v) for k, v in measured.items()})
    figures = {**flash, **minutely}
    figures["per_day_at_one_run_a_minute_bytes"] = minutely["per_scheduled_run_one_a_minute_written_back"] * 1440
    figures["per_day_at_one_run_a_minute_exclusive_lock_bytes"] = (
        minutely["per_scheduled_run_one_a_minute_written_back_exclusive_lock"] * 1440)
    REPORT["flash"] = {**figures, "note": (
        "write_bytes: page-cache pages dirtied (what reaches flash). per_scheduled_run: 17 triggers of one task "
        "firing every second; per_scheduled_run_one_a_minute: one trigger, clock stepped a minute per run; "
        "written_back / a_minute_apart: db, WAL and -shm flushed between runs, as the kernel's writeback does "
        "for runs a minute apart (per_day is that times 1440)")}
    assert flash["scheduled_runs"] >= 480, figures
    assert minutely["per_scheduled_run_one_a_minute"] <= BUDGET["flash_per_scheduled_run_bytes"], figures
    assert minutely["per_scheduled_run_one_a_minute_exclusive_lock"] <= BUDGET["flash_per_scheduled_run_bytes"]
    assert flash["per_manual_run"] <= BUDGET["flash_per_manual_run_bytes"], figures
    assert flash["per_audited_read_call"] <= BUDGET["flash_per_audited_read_call_bytes"], figures


@pytest.mark.emulated("the loop's share of a spawn")
@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_run_that_switches_users_starts_off_the_loop():
    import pwd

    from edge.runner.process import pidfd_available
    from spawn import spawn_alone

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    if not pidfd_available():
        pytest.skip("this kernel has no pidfds: runs start on the loop")
    figures = spawn_alone(install_venv(), None, 100)
    share = figures["spawn_nobody_loop_busy_us"] / figures["spawn_nobody_wall_us"]
    REPORT["spawn"] = {**{k: round(v, 1) for k, v in figures.items()}, "loop_busy_share_of_switching_spawn":
                       round(share, 3)}
    assert share <= BUDGET["loop_busy_share_of_switching_spawn"], figures


def test_audited_read_cpu_against_its_floor():
    """One worker hop per audited read, and little around it: the server's CPU per call
    within its budget of the floor's (bench/floor_server.py, measured in the same run)."""
    python = install_venv()
    d = BenchDaemon(python).start()
    try:
        with Client(d.socket) as client:
            client.call("qledge.task.create", {"taskId": "bench", "spec": _spec(0)})
        assert d.proc is not None
        result = against_floor(python, d.socket, d.proc.pid, rounds=7)
    finally:
        d.cleanup()
    REPORT["call_floor"] = result
    assert result["cpu_us_per_call"]["ratio"]["median"] <= BUDGET["audited_read_cpu_over_floor"], result
    assert (result["clients_16_cpu_us_per_call"]["ratio"]["median"]
            <= BUDGET["audited_read_cpu_over_floor_16_clients"]), result
