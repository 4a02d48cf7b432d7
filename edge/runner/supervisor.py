"""The runner: hands admitted runs to execution under a concurrency limit, enforces
timeouts and cancellation, records every outcome, and reconciles what a dead daemon left.
Implements RunController (edge.core.ports.runtime)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from edge.core.clock import LoopTimers
from edge.core.errors import ToolError, conflict, not_found
from edge.core.handoff import Background, ManualStart, shielded
from edge.core.notices import Notices, run_finished
from edge.core.ports.runtime import Clock, RunInputs, TaskUsers, TimerHandle, Timers
from edge.core.ports.stores import LogWriter, RunAdmission, RunLogFiles, RunStore, SecretStore, TaskStore
from edge.core.runs import ActorType, Run, RunProcess, RunStatus, RunUpdate, exit_text, summary
from edge.core.tasks import AgentInstruction, RunAs, SecretRef, Task, TaskRef
from edge.runner import process

if TYPE_CHECKING:
    from edge.core.agent import AgentLaunch
    from edge.core.ports.agent import AgentRuns

log = logging.getLogger("qledge.runner")

PIPE_CHUNK = 64 * 1024
DRAIN_AFTER_EXIT_S = 2.0  # a backgrounded grandchild may hold the pipe open
# A run that ends sooner has its start recorded with its end, in one write instead of two
# (flash wear); one still going by then is recorded `running` with its process. Should the
# daemon die meanwhile, recovery finds the run's processes by its id in their environment.
RECORD_RUNNING_AFTER_S = 1.0
# Output that redaction holds back (an unfinished line, or the end of one a secret could
# continue past) is written this long after it arrived at the latest, whether more comes
# or not: a follower sees each line within 250 ms, and a crash loses no more than this.
RELEASE_AFTER_S = 0.1


class RunnerSettings(msgspec.Struct, kw_only=True):
    """What the runner reads at each run; the live ones change on reload (edge.app.graph)."""

    state_dir: str  # where free space is checked before a run starts
    concurrency: int = 2
    kill_grace_s: float = 5.0
    log_cap_bytes: int = 1 << 20
    disk_reserve_bytes: int = 8 << 20
    timezone: str = "UTC"  # a run's TZ (edge.app.config.run_timezone)
    lang: str = process.DEFAULT_LANG  # a run's LANG


# Follows of a log (output_mark waits) at once, whatever the connection limits: each holds a
# task and a call; beyond this many, a follower is answered at once and reads again shortly.
MAX_FOLLOWERS = 64


class _Job:
    __slots__ = ("run", "task", "proc", "cancel_reason", "done", "started", "unrecorded_start", "chunks", "_grew",
                 "spec", "agent", "inputs")

    def __init__(self, run: Run, inputs: RunInputs | None = None) -> None:
        self.run = run
        self.inputs = inputs  # the task revision and secret values, read with the hand-over
        self.task: asyncio.Task[None] | None = None
        self.proc: process.Child | None = None
        self.cancel_reason: str | None = None
        self.done = asyncio.Event()
        self.started = False
        self.unrecorded_start: RunUpdate | None = None  # the process runs; `running` is not stored yet
        self.chunks = 0  # output chunks written to the log so far (output_mark)
        self._grew: asyncio.Event | None = None  # exists only while someone follows the log
        self.spec: Task | None = None  # the task revision it runs, once read
        self.agent = False  # an AI run: its own slots, a child with a run credential, evidence

    def output(self) -> None:
        """Output arrived, or what was held back of it was written."""
        self.chunks += 1
        self.moved()

    def moved(self) -> None:
        """Output arrived or the run ended: wake whoever follows the log."""
        if self._grew is not None:
            self._grew.set()
            self._grew = None

    async def wait_moved(self, timeout_s: float) -> None:
        if self._grew is None:
            self._grew = asyncio.Event()
        grew = self._grew
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await grew.wait()


class Runner:
    def __init__(
        self, *, runs: RunStore, tasks: TaskStore, admission: RunAdmission, secrets: SecretStore, logs: RunLogFiles,
        clock: Clock, settings: RunnerSettings, users: TaskUsers, notices: Notices | None = None,
        agents: AgentRuns | None = None, timers: Timers | None = None,
    ) -> None:
        self._runs = runs
        self._tasks = tasks
        self._secrets = secrets
        self._logs = logs
        self._clock = clock
        self._settings = settings
        self._users = users
        self._timers = timers or LoopTimers()  # when held-back output is written (RELEASE_AFTER_S)
        self._notices = notices or Notices(clock, self._timers)
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._following = 0  # output_mark calls waiting now (MAX_FOLLOWERS)
        self._agents = agents
        self._agent_slots = asyncio.Semaphore(agents.concurrency if agents is not None else 1)
        self._jobs: dict[str, _Job] = {}
        self._background = Background(log)  # hand-offs and process-group stops
        self._starts = ManualStart(self, admission, clock, self._notices, self._background, log)
        self._closing = False  # shutting down: what is submitted now is cancelled, not run
        self._forced = False  # a second stop signal: no more grace periods

    # -- what tools see -----------------------------------------------------------

    async def start(self, task: Task | TaskRef, actor: ActorType) -> Run:
        return await self._starts.start(task, actor)

    async def cancel(self, project: str, run_id: str, reason: str) -> Run:
        job = self._jobs.get(run_id)
        if job is None:
            run = await self._runs.get(project, run_id)
            if run is None:
                raise not_found(f"run {run_id} not found")
            if run.terminal:
                raise conflict(f"run {run_id} already finished ({run.status})")
            # Active in storage but not ours (e.g. admitted but not yet submitted).
            cancelled = await self._runs.transition(
                run.id, run.version, "cancelled", self._clock.now_ms(), "user",
                RunUpdate(finished_at_ms=self._clock.now_ms(), error_summary=f"cancelled: {reason}"), reason,
            )
            if self._agents is not None:
                await self._agents.ended(cancelled, None)
            self._finished(cancelled, reason)
            return cancelled
        self._request_cancel(job, reason)
        await job.done.wait()
        final = await self._runs.get(project, run_id)
        assert final is not None
        return final

    async def wait(self, project: str, run_id: str, timeout_s: float) -> Run | None:
        job = self._jobs.get(run_id)
        if job is not None and job.run.project_id == project:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await job.done.wait()
            if job.done.is_set() and job.run.terminal:
                return job.run  # as its final transition returned it, a moment ago
        return await self._runs.get(project, run_id)

    async def output_mark(self, project: str, run_id: str, seen: int | None, timeout_s: float) -> int | None:
        job = self._jobs.get(run_id)
        if job is None or job.run.project_id != project:
            return None
        if seen is not None and job.chunks == seen and not job.done.is_set():
            if self._following >= MAX_FOLLOWERS:
                return job.chunks  # enough are waiting: this one is answered now and reads again
            self._following += 1
            try:
                await job.wait_moved(timeout_s)
            finally:
                self._following -= 1
        return job.chunks if run_id in self._jobs else None

    # -- lifecycle ----------------------------------------------------------------

    def submit(self, run: Run, inputs: RunInputs | None = None) -> None:
        """Execute an admitted (queued) run when a slot is free; while shutting down,
        record it cancelled (`shutdown`) instead. With `inputs` (read with the hand-over)
        neither the task revision nor the project's secret values are read again."""
        job = _Job(run, inputs)
        if self._closing:
            job.cancel_reason = "shutdown"
        self._jobs[run.id] = job
        job.task = asyncio.create_task(self._execute(job), name=f"run-{run.id}")

    async def settle(self) -> None:
        """Wait until the hand-offs in progress (admissions, finishes, stops) are done."""
        await self._background.wait()

    async def shutdown(self) -> None:
        """Cancel everything with reason `shutdown` and wait until it is recorded,
        including runs whose admission was still being handed over."""
        self._closing = True
        while self._jobs or len(self._background):
            jobs = list(self._jobs.values())
            for job in jobs:
                self._request_cancel(job, "shutdown")
            if jobs:
                await asyncio.gather(*(job.done.wait() for job in jobs))
            await self._background.wait()

    def force(self) -> None:
        """A second stop signal: kill every process group now instead of waiting out
        the grace period; runs are still recorded."""
        self._forced = True
        for job in list(self._jobs.values()):
            job.cancel_reason = job.cancel_reason or "shutdown"  # killed by us, not failed
            if job.proc is not None:
                process.signal_group(job.proc.pid, signal.SIGKILL)

    def _grace_s(self) -> float:
        return 0.0 if self._forced else self._settings.kill_grace_s

    async def recover(self) -> int:
        """Reconcile the runs a daemon that died left queued or running: stop what
        survives of their processes, assemble their logs and record them `lost`.
        Call once at start-up, before anything is served or submitted; returns how many."""
        stale = await self._runs.active_processes()
        if stale:
            await asyncio.gather(*(self._reconcile(run, proc) for run, proc in stale))
        return len(stale)

    async def _reconcile(self, run: Run, proc: RunProcess) -> None:
        marker = f"QLEDGE_RUN_ID={run.id}".encode()
        try:
            stopped = await process.stop_orphaned_run(proc.pid, proc.start_ticks, marker, self._settings.kill_grace_s)
            task = await self._tasks.get(run.project_id, run.task_id, run.task_revision)
            size, truncated = self._logs.recover(run.id, self._log_cap(task))
            if stopped:
                detail = f"stopped what was left of process group {proc.pid}" if proc.pid else "stopped its processes"
            else:
                detail = "no process was left" if proc.pid else "it had not started"
            now = self._clock.now_ms()
            lost = await self._runs.transition(run.id, run.version, "lost", now, "system", RunUpdate(
                finished_at_ms=now, error_code="daemon_lost", log_bytes=size, log_truncated=truncated,
                error_summary=f"the daemon stopped while this run was {run.status}; {detail}",
            ), detail)
            if self._agents is not None:
                await self._agents.ended(lost, task)
            log.warning("run %s was left %s by a daemon that stopped: %s", run.id, run.status, detail)
            self._finished(lost)
        except (ToolError, OSError) as exc:
            log.error("run %s could not be reconciled: %s", run.id, exc)

    def _request_cancel(self, job: _Job, reason: str) -> None:
        if job.cancel_reason is None:
            job.cancel_reason = reason
        if job.proc is not None:
            self._background.spawn(process.stop_group(job.proc, self._grace_s()), f"stop-{job.run.id}")
        elif job.task is not None and not job.started:
            job.task.cancel()  # still waiting for a slot

    # -- execution ----------------------------------------------------------------

    async def _execute(self, job: _Job) -> None:
        try:
            if job.cancel_reason is not None:  # cancelled before it was ever queued for a slot
                await self._finish(job, "cancelled", RunUpdate(error_summary=f"cancelled: {job.cancel_reason}"))
                return
            run = job.run
            try:
                # The task revision says which slots to wait for: AI runs have their own.
                job.spec = (job.inputs.task if job.inputs is not None
                            else await self._tasks.get(run.project_id, run.task_id, run.task_revision))
                job.agent = job.spec is not None and isinstance(job.spec.spec.command, AgentInstruction)
                slots = self._agent_slots if job.agent and self._agents is not None else self._slots
                await slots.acquire()
            except asyncio.CancelledError:
                await self._finish(job, "cancelled", RunUpdate(error_summary=f"cancelled: {job.cancel_reason}"))
                return
            try:
                job.started = True
                if job.cancel_reason is not None:
                    await self._finish(job, "cancelled", RunUpdate(error_summary=f"cancelled: {job.cancel_reason}"))
                    return
                await self._run_process(job)
            finally:
                slots.release()
        except ToolError as exc:
            log.error("run %s could not be recorded: %s", job.run.id, exc.message)
        except Exception:
            log.exception("run %s failed inside the runner", job.run.id)
            with contextlib.suppress(Exception):
                await self._finish(job, "failed", RunUpdate(error_code="internal", error_summary="runner error"))
        finally:
            self._jobs.pop(job.run.id, None)
            job.done.set()
            job.moved()

    async def _run_process(self, job: _Job) -> None:
        run, task = job.run, job.spec
        if task is None:
            await self._finish(job, "failed", RunUpdate(
                error_code="task_missing", error_summary=f"task {run.task_id} revision {run.task_revision} is gone"))
            return
        if job.agent and self._agents is None:
            await self._finish(job, "failed", RunUpdate(error_code="agent_disabled", error_summary=(
                "this is an AI task and the AI operator is off ([agent] enabled = false)")))
            return
        short = self.disk_shortfall()
        if short is not None:
            await self._finish(job, "failed", RunUpdate(error_code="disk_space_low", error_summary=short))
            return
        if job.agent and self._agents is not None:
            try:
                launch = await self._agents.launch(task, run)
            except ToolError as exc:
                await self._finish(job, "failed", RunUpdate(error_code="agent_config", error_summary=exc.message))
                return
            try:
                await self._start(job, task, None, process.DEFAULT_WORK_DIR, launch)
            finally:
                _close_tool_fd(launch)  # never left open, whatever happened before the spawn
            return
        try:
            run_as, cwd = await self._identity(task)
        except ToolError as exc:
            code = "permission_denied" if exc.code == "permission_denied" else "spawn_failed"
            await self._finish(job, "failed", RunUpdate(error_code=code, error_summary=summary(exc.message)))
            return
        await self._start(job, task, run_as, cwd, None)

    async def _start(self, job: _Job, task: Task, run_as: RunAs | None, cwd: str, launch: AgentLaunch | None) -> None:
        """The environment, the log, then the process. `run_as` None: an AI run's child,
        started as the daemon's user; it becomes `launch.uid` itself (edge.airun)."""
        run = job.run
        try:
            uid = launch.uid if launch is not None else run_as.uid if run_as is not None else os.geteuid()
            known = job.inputs.secret_values if job.inputs is not None else None
            env, secrets = await self._environment(task, run, uid, run_as, known)
        except ToolError as exc:
            await self._finish(job, "failed", RunUpdate(error_code="secret_missing", error_summary=exc.message))
            return
        try:
            sink = self._logs.create(run.id, self._log_cap(task), secrets)
        except OSError as exc:
            await self._finish(job, "failed", RunUpdate(
                error_code="log_unavailable", error_summary=summary(f"cannot create the log file: {exc}")))
            return
        try:
            await self._supervise(job, task, env, sink, run_as, cwd, launch)
        finally:
            sink.close()

    async def _identity(self, task: Task) -> tuple[RunAs, str]:
        """Who the run is and where it starts, checked again now: the system and the
        configuration may have changed since the revision was written. A revision whose
        writer lacked task.privileged never runs privileged."""
        spec = task.spec
        run_as = await self._users.for_task(task)
        if run_as.privileged is not None and not task.privileged:
            raise ToolError("permission_denied", f"task {task.id} revision {task.revision} {run_as.privileged}, and"
                            " it was not written with permission task.privileged")
        cwd = self._users.working_dir(spec.working_dir, run_as)
        self._users.program(spec, run_as)
        return run_as, cwd

    async def _spawn(
        self, task: Task, env: dict[str, str], run_as: RunAs | None, cwd: str, launch: AgentLaunch | None
    ) -> process.Child:
        if launch is None:
            assert run_as is not None
            return await process.spawn(process.argv(task.spec), cwd, env, run_as)
        # The child of an AI run reads its job (credential included) from an inherited
        # descriptor and calls tools on the other: neither has a name anyone could open.
        fd = process.job_descriptor(launch.job, self._settings.state_dir)
        try:
            argv = [*launch.argv, "--job-fd", str(fd), "--tool-fd", str(launch.tool_fd)]
            return await process.spawn(argv, cwd, env, None, (fd, launch.tool_fd))
        finally:
            os.close(fd)
            _close_tool_fd(launch)  # the child holds it now: its exit ends the connection

    async def _supervise(
        self, job: _Job, task: Task, env: dict[str, str], sink: LogWriter, run_as: RunAs | None, cwd: str,
        launch: AgentLaunch | None,
    ) -> None:
        run = job.run
        try:
            proc = await self._spawn(task, env, run_as, cwd, launch)
        except OSError as exc:
            size = sink.close()
            who = f" as {run_as.user}" if run_as is not None else ""
            await self._finish(job, "failed", RunUpdate(
                error_code="spawn_failed", error_summary=f"could not start{who}: {exc}", log_bytes=size))
            return
        job.proc = proc
        now = self._clock.now_ms()
        # Its start ticks (what names the process with its pid after a restart) are read when
        # `running` is stored: a quick run's start is stored with its end and needs none, and
        # /proc/<pid>/stat of a child still in exec costs about 0.2 ms of the loop's time.
        job.unrecorded_start = RunUpdate(started_at_ms=now, pid=proc.pid)
        if job.cancel_reason is not None:  # cancelled while spawning
            self._background.spawn(process.stop_group(proc, self._grace_s()), f"stop-{run.id}")
        pump = asyncio.create_task(_Pump(sink, job.output, self._clock, self._timers).run(proc))
        loop = asyncio.get_running_loop()
        timeout_s = launch.timeout_s if launch is not None else task.spec.timeout_ms / 1000
        begun = loop.time()
        if not await _exits_within(proc, min(RECORD_RUNNING_AFTER_S, timeout_s)):
            start, job.unrecorded_start = job.unrecorded_start, None
            if start is not None and proc.returncode is None:  # not reaped: the pid is still this process's
                start.pid_start_ticks = process.start_ticks(proc.pid)
            job.run = await self._runs.transition(run.id, run.version, "running", now, "runner", start)
            if not await _exits_within(proc, timeout_s - (loop.time() - begun)):
                job.cancel_reason = job.cancel_reason or "timeout"
                await process.stop_group(proc, self._grace_s())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_AFTER_EXIT_S):
                await asyncio.shield(pump)
        pump.cancel()
        size = sink.close()
        status, update = _outcome(job, proc.returncode, size, sink.truncated, timeout_s)
        if launch is not None and self._agents is not None:
            status = self._agents.exited(run.id, status, update)  # its credential dies with it
        if sink.failed is not None:  # the log says so too (its last line)
            how = update.error_summary or "succeeded"
            update.error_code = "log_incomplete"
            update.error_summary = summary(f"{how}; the log is incomplete: {sink.failed.strerror or sink.failed}")
        await self._finish(job, status, update)

    def _log_cap(self, task: Task | None) -> int:
        return (task.spec.log_cap_bytes if task else None) or self._settings.log_cap_bytes

    def disk_shortfall(self) -> str | None:
        """Why a run may not start for lack of free space in the state directory, if so."""
        reserve = self._settings.disk_reserve_bytes
        if reserve <= 0:
            return None
        where = self._settings.state_dir
        try:
            st = os.statvfs(where)
        except OSError as exc:
            return summary(f"cannot check free space in {where}: {exc}")
        free = st.f_bavail * st.f_frsize
        if free >= reserve:
            return None
        return summary(f"only {_mib(free)} free in {where}; runs need"
                       f" {_mib(reserve)} ([runner] disk_reserve_bytes): free some space")

    async def _environment(
        self, task: Task, run: Run, uid: int, run_as: RunAs | None = None, known: list[str] | None = None
    ) -> tuple[dict[str, str], list[bytes]]:
        """The run's environment, and every secret value its output must not show (`known`:
        the project's, when read with the hand-over). An AI run's child gets the login
        variables and the markers only: its job comes on a descriptor, and an AI task names
        no variables."""
        settings = self._settings
        # Every secret of the project is redacted, not only the ones this task names:
        # a script may read one some other way.
        if known is None:
            known = await self._secrets.values(task.project_id)
        # A login's variables for the user the run executes as (its task's, resolved above).
        env = process.user_environment(uid, settings.timezone, settings.lang)
        env.update(process.run_environment(run_as))  # the task's data directory (and HOME, for its own uid)
        if isinstance(task.spec.command, AgentInstruction):
            env["QLEDGE_RUN_ID"] = run.id
            env["QLEDGE_TASK_ID"] = task.id
            return env, [v.encode() for v in known]
        refs = {k: v.secret for k, v in task.spec.env.items() if isinstance(v, SecretRef)}
        values = await self._secrets.resolve(task.project_id, sorted(set(refs.values()))) if refs else {}
        for key, value in task.spec.env.items():
            if isinstance(value, SecretRef):
                if value.secret not in values:
                    raise ToolError("not_found", f"secret {value.secret!r} (for ${key}) is not set")
                env[key] = values[value.secret]
            else:
                env[key] = value
        # Last, so nothing a task names can replace them (the marker recovery relies on).
        env["QLEDGE_RUN_ID"] = run.id
        env["QLEDGE_TASK_ID"] = task.id
        return env, [v.encode() for v in {*known, *values.values()}]

    async def _finish(self, job: _Job, status: RunStatus, update: RunUpdate) -> None:
        # The outcome is recorded even if the job is cancelled while recording it.
        await shielded(self._background, self._record(job, status, update), f"finish-{job.run.id}")

    async def _record(self, job: _Job, status: RunStatus, update: RunUpdate) -> None:
        now = self._clock.now_ms()
        update.finished_at_ms = now
        detail = job.cancel_reason if status == "cancelled" else None
        # The runner owns its active runs, so the version it holds is normally current;
        # only when another writer got there first is the row read again.
        current, started = job.run, job.unrecorded_start
        try:
            try:
                job.run = await self._runs.transition(
                    current.id, current.version, status, now, "runner", update, detail, started)
            except ToolError as exc:
                if exc.code != "conflict":
                    raise
                latest = await self._runs.get(current.project_id, current.id)
                if latest is None or latest.terminal:
                    job.run = latest or job.run
                    return
                job.run = await self._runs.transition(latest.id, latest.version, status, now, "runner", update,
                                                      detail, started if latest.status == "queued" else None)
            job.unrecorded_start = None
            self._finished(job.run, job.cancel_reason)
        finally:
            # Unread (cancelled before its task was read): only the task can tell if it was an AI run.
            if self._agents is not None and (job.agent or job.spec is None) and job.run.terminal:
                await self._agents.ended(job.run, job.spec)

    def _finished(self, run: Run, reason: str | None = None) -> None:
        level, line = run_finished(run, reason)
        self._notices.say(log, run.task_id, level, line, run.status)


async def _exits_within(proc: process.Child, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await proc.wait()
    return proc.returncode is not None


class _Pump:
    """Copies a run's output into its log, and bounds how long redaction may hold any of
    it back: each byte is in the file, and followers are woken, within RELEASE_AFTER_S of
    its arrival (one timer at a time, for the oldest byte held)."""

    def __init__(self, sink: LogWriter, on_output: Callable[[], None], clock: Clock, timers: Timers) -> None:
        self._sink = sink
        self._on_output = on_output  # more of the log to see (the followers' mark)
        self._clock = clock
        self._timers = timers
        self._received = 0  # bytes read from the pipe
        # (stream offset where a chunk ends, when it arrived) of the chunks still partly held
        self._arrivals: deque[tuple[int, float]] = deque()
        self._timer: TimerHandle | None = None
        self._armed_for = -1  # the first held byte when the timer was armed

    async def run(self, proc: process.Child) -> None:
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.read(PIPE_CHUNK):
                self._sink.write(chunk)
                self._received += len(chunk)
                self._arrivals.append((self._received, self._clock.monotonic()))
                self._on_output()
                self._watch()
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _first_held(self) -> int | None:
        """The stream offset of the first byte held back, if any."""
        held = self._sink.held
        if not held:
            self._arrivals.clear()
            return None
        first = self._received - held
        while self._arrivals and self._arrivals[0][0] <= first:
            self._arrivals.popleft()
        return first

    def _watch(self) -> None:
        first = self._first_held()
        if first is None or not self._arrivals:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        if self._timer is None:
            due = self._arrivals[0][1] + RELEASE_AFTER_S
            self._armed_for = first
            self._timer = self._timers.call_later(max(0.0, due - self._clock.monotonic()), self._expired)

    def _expired(self) -> None:
        self._timer = None
        first = self._first_held()
        if first is not None and first <= self._armed_for:  # held since the timer was armed: its time is up
            self._sink.release()
            self._arrivals.clear()
            self._on_output()
        else:
            self._watch()  # what was held then has been written since; what is held now came later


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _close_tool_fd(launch: AgentLaunch) -> None:
    if launch.tool_fd >= 0:
        fd, launch.tool_fd = launch.tool_fd, -1  # closed once: the number may be reused
        with contextlib.suppress(OSError):
            os.close(fd)


def _outcome(job: _Job, code: int | None, size: int, truncated: bool, timeout_s: float) -> tuple[RunStatus, RunUpdate]:
    update = RunUpdate(exit_code=code, log_bytes=size, log_truncated=truncated)
    if job.cancel_reason == "timeout":
        update.error_code = "timeout"
        update.error_summary = f"timed out after {timeout_s:g}s"
        return "timed_out", update
    if job.cancel_reason is not None:
        update.error_summary = summary(f"cancelled: {job.cancel_reason}")
        return "cancelled", update
    if code == 0:
        return "succeeded", update
    if code is not None and code < 0:
        update.error_code = "killed_by_signal"
        update.error_summary = exit_text(code)
    else:
        update.error_code = "exit_nonzero"
        update.error_summary = f"exited with code {code}"
    return "failed", update
