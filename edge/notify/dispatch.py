"""The notifier: the daemon's side of notification delivery.

It never sends anything itself. When messages are due it reads them from the queue
(NotifyStore, which damps a task that keeps failing: its first failure, then reminders at
growing intervals, then its recovery), applies each channel's rate limit (at most
`per_minute` requests in any 60 s; what is over waits, and when more is waiting than the
next window allows, the rest goes as one summary), renders them (the run's log through the
same redaction as the AI log excerpt, at most 1 KiB of it), resolves the secrets their
channels name, and hands the batch to a short-lived child (edge.notify.send) on its stdin.

A batch holds at most one message per channel, and the child sends to the channels at once,
each attempt within `timeout_s` from connect to last byte: a batch lasts at most about one
deadline, so a channel that is slow or hangs delays another channel's next message by at
most that. Each message is charged only for its own attempt: one the child did not try
(its channel timed out before it, or the child was stopped before it) is released, due
again, with no attempt on record. The results are recorded in one transaction: sent,
pending again after a backoff, or failed for good. Between batches it sleeps on one timer
until the next message is due, so an empty queue costs no wake-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import deque
from typing import TYPE_CHECKING, Literal

import msgspec

import edge
from edge.core.errors import ToolError
from edge.core.excerpt import WINDOW_BYTES, normalize, redact, window_text
from edge.core.handoff import Background
from edge.core.ports.runtime import Clock, TimerHandle, Timers
from edge.core.ports.notify import ChannelHealth, Damping, NoticeOutcome, NotifyStore, PendingNotice, TestOutcome
from edge.core.ports.stores import RunLogFiles, SecretStore
from edge.core.tasks import redact_label
from edge import moment

if TYPE_CHECKING:  # the channel shapes are loaded by the first delivery
    from edge.notify.channels import ChannelSpec, Delivery, Result

log = logging.getLogger("qledge.notify")

WINDOW_MS = 60_000
BATCH = 16  # messages per child, each for a channel of its own
LAUNCH_GRACE_S = 10.0  # for the sender to start (and load TLS) before its deadlines count
SUMMARY_LINES = 20
STDERR_MAX = 2048
# -I: neither the environment nor the working directory (where tasks may write) reaches the
# child's import path.
_BOOT = "import sys; sys.path.insert(0, {root!r}); from edge.notify.send import main; sys.exit(main())"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(edge.__file__)))  # a directory, or a .pyz
_PASSED_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "LANG", "LC_ALL")


class NotifySettings(msgspec.Struct, kw_only=True):
    """The `[notify]` configuration as the notifier uses it (edge.app.graph builds it)."""

    device: str
    language: Literal["en", "zh"] = "en"  # edge.notify.channels.Language
    max_attempts: int = 5
    backoff_s: float = 30.0
    max_backoff_s: float = 3600.0
    per_minute: int = 5
    timeout_s: float = 10.0
    # A task that keeps failing: its first failure, a reminder after `repeat_s`, each next
    # one `repeat_factor` times as long after, at most `max_repeat_s` apart; 0: every failure.
    repeat_s: float = 600.0
    repeat_factor: float = 2.0
    max_repeat_s: float = 21_600.0
    python: str = sys.executable

    def damping(self) -> Damping | None:
        if self.repeat_s <= 0:
            return None
        return Damping(first_ms=int(self.repeat_s * 1000), factor=self.repeat_factor,
                       max_ms=int(max(self.max_repeat_s, self.repeat_s) * 1000))


class Notifier:
    def __init__(self, *, store: NotifyStore, secrets: SecretStore, logs: RunLogFiles, clock: Clock, timers: Timers,
                 project: str, settings: NotifySettings) -> None:
        self._store = store
        self._secrets = secrets
        self._logs = logs
        self._clock = clock
        self._timers = timers
        self._project = project
        self.settings = settings
        # How long a batch may hold its messages: the sender's time (one attempt per channel), and some.
        self._lease_ms = int((settings.timeout_s + LAUNCH_GRACE_S + 30) * 1000)
        self._damping = settings.damping()
        self._windows: dict[str, deque[int]] = {}
        self._health: dict[str, ChannelHealth] = {}
        self._timer: TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None
        self._again = False
        self._started = False  # wakes before start (a lost run recorded at start-up) wait for it
        self._closing = False
        self._waiters: dict[int, asyncio.Future[TestOutcome]] = {}
        self._background = Background(log)
        self._proc: asyncio.subprocess.Process | None = None

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild the rate windows and channel health from the attempts on record, then
        deliver what is due (messages left by a daemon that stopped included, also those
        it was delivering)."""
        now = self._clock.now_ms()
        await self._store.recover(self._project, now)
        for channel, at in await self._store.recent_attempts(self._project, now - WINDOW_MS):
            self._windows.setdefault(channel, deque()).append(at)
        self._health = {h.channel: h for h in await self._store.health(self._project)}
        self._started = True
        self.wake()

    async def stop(self) -> None:
        """No new batches; the one in flight gets its timeout, then its child is killed
        (what it had not reported stays queued for the next start)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self._running is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._running), self.settings.timeout_s + 5)
            if not self._running.done():
                self._kill()
                self._running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._running
        await self._background.wait()

    def wake(self) -> None:
        """Messages may be due: look now (or right after the pass in progress)."""
        if self._closing or not self._started:
            return
        if self._running is not None and not self._running.done():
            self._again = True
            return
        self._running = self._background.spawn(self._passes(), "notify")

    async def settle(self) -> None:
        """Until the pass in progress (and any it asked for) is done."""
        while self._running is not None and not self._running.done():
            await asyncio.shield(self._running)

    # -- what tools see ---------------------------------------------------------------

    async def test(self, channel: str, timeout_s: float) -> TestOutcome:
        """Send a test message through `channel` now and wait for its outcome."""

        nid = await self._store.enqueue_test(self._project, channel, self._clock.now_ms())
        future: asyncio.Future[TestOutcome] = asyncio.get_running_loop().create_future()
        self._waiters[nid] = future
        self.wake()
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            return TestOutcome(id=nid, ok=False, detail="no outcome yet: see qledge notify log")
        finally:
            self._waiters.pop(nid, None)

    def forget(self, channel: str) -> None:
        self._health.pop(channel, None)
        self._windows.pop(channel, None)

    def health(self) -> dict[str, ChannelHealth]:
        return dict(self._health)

    def status(self) -> dict[str, str]:
        failing = sorted((h for h in self._health.values() if h.failures), key=lambda h: h.channel)
        if not failing:
            return {}
        parts = []
        for h in failing:
            since = moment(h.failing_since_ms or 0)
            parts.append(f"{h.channel} ({h.failures} failed attempts in a row since {since}: {h.last_error})")
        return {"notify": f"{len(failing)} channel{'s' if len(failing) > 1 else ''} failing: " + "; ".join(parts)}

    # -- a pass -------------------------------------------------------------------------

    async def _passes(self) -> None:
        try:
            while True:
                self._again = False
                await self._pass()
                if not self._again or self._closing:
                    break
        except ToolError as exc:  # storage unavailable: look again later
            log.error("notifications: %s", exc.message)
            self._arm(self._clock.now_ms() + WINDOW_MS)

    async def _pass(self) -> None:
        held: dict[str, int] = {}
        while not self._closing:
            now = self._clock.now_ms()
            due = await self._store.due(self._project, now, 4 * BATCH, self._lease_ms, self._damping)
            if not due:
                break
            planned, merged = await self._plan([n for n in due if n.channel not in held or n.event == "test"],
                                               now, held)
            batch = _one_per_channel(planned)
            going = {n.id for n in batch} | merged
            # What this batch does not take is due again at once (and may be joined meanwhile).
            await self._store.release(self._project, [n.id for n in [*due, *planned] if n.id not in going], now)
            if not batch:
                break
            await self._deliver(batch)
        now = self._clock.now_ms()
        wake_at = [t for t in held.values()]
        upcoming = await self._store.next_due(self._project, now)
        if upcoming is not None:
            wake_at.append(upcoming)
        if wake_at:
            self._arm(min(wake_at))
        elif self._timer is not None:  # nothing is coming (a reminder was folded into a recovery)
            self._timer.cancel()
            self._timer = None

    def _arm(self, at_ms: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (at_ms - self._clock.now_ms()) / 1000) + 0.001
        self._timer = self._timers.call_later(delay, self.wake)

    def _window(self, channel: str, now: int) -> deque[int]:
        window = self._windows.setdefault(channel, deque())
        while window and window[0] <= now - WINDOW_MS:
            window.popleft()
        return window

    async def _plan(self, due: list[PendingNotice], now: int,
                    held: dict[str, int]) -> tuple[list[PendingNotice], set[int]]:
        """What may go now, per channel: tests always; others within the rate limit, the
        overflow as one summary in the last free slot; a full channel is held until its
        window frees (`held`). Returns the messages to send and the ids merged into
        summaries."""
        merged: set[int] = set()
        by_channel: dict[str, list[PendingNotice]] = {}
        for notice in due:
            by_channel.setdefault(notice.channel, []).append(notice)
        batch: list[PendingNotice] = []
        for channel, notices in by_channel.items():
            tests = [n for n in notices if n.event == "test"]
            others = [n for n in notices if n.event != "test"]
            batch += tests
            window = self._window(channel, now)
            free = self.settings.per_minute - len(window) - len(tests)
            if not others:
                continue
            if free <= 0:
                held[channel] = (window[0] if window else now) + WINDOW_MS
                continue
            if len(others) <= free:
                batch += others
                continue
            batch += others[: free - 1]
            batch.append(await self._summarize(channel, others[free - 1:], now))
            merged.update(n.id for n in others[free - 1:])
        return batch, merged

    async def _summarize(self, channel: str, notices: list[PendingNotice], now: int) -> PendingNotice:
        lines = []
        for n in notices[:SUMMARY_LINES]:
            what = n.detail if n.event == "summary" else (
                f"{n.task_name or n.task_id or '-'}: {n.event}" + (f" ×{n.count}" if n.count > 1 else ""))
            lines.append(what or "")
        if len(notices) > SUMMARY_LINES:
            lines.append(f"… and {len(notices) - SUMMARY_LINES} more")
        detail = "\n".join(lines)
        count = sum(n.count for n in notices)
        nid = await self._store.merge(self._project, [n.id for n in notices], channel, detail, count, now,
                                      self._lease_ms)
        first = notices[0]
        return PendingNotice(
            id=nid, channel=channel, event="summary", task_id=None, task_name=None, run_id=None, status=None,
            exit_code=None, duration_ms=None, detail=detail, count=count,
            first_at_ms=min(n.first_at_ms for n in notices), created_at_ms=now, attempts=0, kind=first.kind,
            spec=first.spec)

    async def _excerpt(self, run_id: str, secret_values: list[str]) -> str | None:
        from edge.notify.channels import log_tail

        try:
            tail = self._logs.tail(run_id, WINDOW_BYTES)
        except ToolError:
            return None
        if tail is None:
            return None
        window = window_text(tail.data, tail.start)
        return log_tail(redact(normalize(window.text), secret_values).text)

    async def _deliver(self, batch: list[PendingNotice]) -> None:
        from edge.notify.channels import Delivery, Result

        values = await self._secrets.values(self._project)
        deliveries: list[Delivery] = []
        outcomes: list[NoticeOutcome] = []
        now = self._clock.now_ms()
        for notice in batch:
            built = await self._delivery(notice, values, now)
            if isinstance(built, Delivery):
                deliveries.append(built)
            else:
                outcomes.append(NoticeOutcome(id=notice.id, ok=False, detail=built, elapsed_ms=0))
        results: dict[int, Result] = {}
        started: set[int] = set()
        stopped_after = 0.0
        if deliveries:
            reported, stopped_after = await self._launch(deliveries)
            for line in reported:
                if line.started:
                    started.add(line.id)
                else:
                    results[line.id] = line
        finished = self._clock.now_ms()
        by_id = {n.id: n for n in batch}
        untried: list[int] = []
        for delivery in deliveries:
            notice = by_id[delivery.id]
            result = results.get(delivery.id)
            if result is None and delivery.id in started:  # its attempt began, then the sender was stopped
                result = Result(id=delivery.id, ok=False, timed_out=True,
                                detail=f"the sender was stopped after {stopped_after:g} s while sending it")
            if result is None or not result.tried:
                untried.append(delivery.id)  # charged nothing: due again
                continue
            detail = redact(normalize(result.detail), values).text if result.detail else None
            outcomes.append(self._outcome(notice, result, detail, finished))
            self._window(notice.channel, finished).append(finished)
            self._note_health(notice.channel, result.ok, detail, finished)
        await self._store.record(self._project, outcomes, finished)
        await self._store.release(self._project, untried, finished)
        for outcome in outcomes:
            waiter = self._waiters.get(outcome.id)
            if waiter is not None and not waiter.done():
                waiter.set_result(TestOutcome(id=outcome.id, ok=outcome.ok, detail=outcome.detail))

    def _outcome(self, notice: PendingNotice, result: Result, detail: str | None, now: int) -> NoticeOutcome:
        if result.ok:
            return NoticeOutcome(id=notice.id, ok=True, detail=None, elapsed_ms=result.elapsed_ms)
        attempt = notice.attempts + 1
        retry_at = None
        if not result.permanent and notice.event != "test" and attempt < self.settings.max_attempts:
            delay = min(self.settings.max_backoff_s, self.settings.backoff_s * 2 ** (attempt - 1))
            retry_at = now + int(delay * 1000)
        return NoticeOutcome(id=notice.id, ok=False, detail=detail, elapsed_ms=result.elapsed_ms, retry_at_ms=retry_at)

    def _note_health(self, channel: str, ok: bool, detail: str | None, now: int) -> None:
        old = self._health.get(channel)
        if ok:
            self._health[channel] = ChannelHealth(channel=channel, failures=0, last_error=None, failing_since_ms=None,
                                                  last_ok_at_ms=now)
        else:
            failures = (old.failures if old else 0) + 1
            since = old.failing_since_ms if old and old.failures else now
            self._health[channel] = ChannelHealth(channel=channel, failures=failures, last_error=detail,
                                                  failing_since_ms=since,
                                                  last_ok_at_ms=old.last_ok_at_ms if old else None)

    async def _delivery(self, notice: PendingNotice, values: list[str], now: int) -> Delivery | str:
        """The sender's job for one message, or why there is none (a final failure)."""
        from edge.notify.channels import Delivery, Facts, render, secret_names, spec_decoder

        if notice.spec is None:
            return f"channel {notice.channel!r} was deleted"
        try:
            spec: ChannelSpec = spec_decoder.decode(notice.spec)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return f"channel {notice.channel!r} cannot be read: {exc}"
        names = secret_names(spec)
        resolved = await self._secrets.resolve(self._project, names) if names else {}
        missing = [name for name in names if name not in resolved]
        if missing:
            return f"channel {notice.channel!r} names secret {missing[0]!r}, which is not set"
        log_text = None
        if notice.run_id and notice.event not in ("skipped", "summary", "test"):
            log_text = await self._excerpt(notice.run_id, values)
        streak = notice.streak
        next_ms = streak.next_at_ms - now if streak and streak.next_at_ms is not None else None
        name = redact_label(notice.task_name, values) if notice.task_name else None  # free text: masked as a log
        facts = Facts(channel=notice.channel, event=notice.event, device=self.settings.device, task=name,
                      task_id=notice.task_id, run_id=notice.run_id, status=notice.status, exit_code=notice.exit_code,
                      duration_ms=notice.duration_ms, detail=notice.detail, count=notice.count,
                      first_at_ms=notice.first_at_ms if notice.count > 1 else None, log=log_text,
                      failures=streak.failures if streak else None,
                      failing_since_ms=streak.since_ms if streak else None, next_reminder_ms=next_ms)
        message = render(facts, spec.language or self.settings.language, spec.title, spec.text)
        return Delivery(id=notice.id, channel=notice.channel, spec=spec, secrets=resolved, message=message, now_ms=now)

    # -- the child ----------------------------------------------------------------------

    async def _launch(self, deliveries: list[Delivery]) -> tuple[list[Result], float]:
        """Run the sender on `deliveries`; the lines it reported (attempts begun, outcomes)
        and, when it had to be stopped, after how long (else 0). A sender that died or ran
        out of time reported fewer."""
        from edge.notify.channels import Job, Result, job_encoder, result_decoder

        timeout = self.settings.timeout_s
        job = job_encoder.encode(Job(timeout_s=timeout, deliveries=deliveries))
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        # Its channels go at once, each attempt within `timeout`: the longest lane decides.
        lanes: dict[str, int] = {}
        for delivery in deliveries:
            lanes[delivery.channel] = lanes.get(delivery.channel, 0) + 1
        allowed = timeout * max(lanes.values()) + LAUNCH_GRACE_S
        try:
            proc = await asyncio.create_subprocess_exec(
                self.settings.python, "-I", "-c", _BOOT.format(root=_ROOT), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env)
        except OSError as exc:
            log.error("notifications: cannot start the sender (%s): %s", self.settings.python, exc)
            return [Result(id=d.id, ok=False, detail=f"cannot start the sender: {exc.strerror or exc}")
                    for d in deliveries], 0.0
        self._proc = proc
        results: list[Result] = []
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            async with asyncio.timeout(allowed):
                proc.stdin.write(job)
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
                proc.stdin.close()
                while line := await proc.stdout.readline():
                    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                        results.append(result_decoder.decode(line))
                errors = await proc.stderr.read(STDERR_MAX)
                code = await proc.wait()
        except TimeoutError:
            self._kill()
            await proc.wait()
            log.error("notifications: the sender did not finish within %g s; stopped with SIGKILL", allowed)
            return results, allowed
        finally:
            self._proc = None
        if code != 0:
            text = " ".join(errors.decode("utf-8", "replace").split())[-300:]
            log.error("notifications: the sender exited with %s: %s", code, text)
            if "No module named 'edge.notify" in text:
                reported = {r.id for r in results if not r.started}
                return results + [Result(id=d.id, ok=False, permanent=True,
                                         detail="the notification sender is not included in this build")
                                  for d in deliveries if d.id not in reported], 0.0
        return results, 0.0

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _one_per_channel(planned: list[PendingNotice]) -> list[PendingNotice]:
    """The first message of each channel, at most BATCH: one slow channel holds a batch (and
    so every other channel's next message) for at most one attempt."""
    seen: set[str] = set()
    batch: list[PendingNotice] = []
    for notice in planned:
        if notice.channel not in seen and len(batch) < BATCH:
            seen.add(notice.channel)
            batch.append(notice)
    return batch
