"""The notification port: channels, the project's default rules and the notifier's side of
the delivery queue. Messages are queued by the writes that finish runs and admit fires
(RunStore.transition, RunAdmission), in their transactions; this port is how the notifier
and the notify tools reach them. The rules of edge.core.ports.stores hold here too.

It ships with the notify capability (packaging/build.py): only the notifier, its tools
and their adapters load it.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from edge.core.tasks import NotifyRule



class TestOutcome(msgspec.Struct, rename="camel"):
    """What a test message through a channel came to: the notification's id, whether the
    channel accepted it, and the channel's answer or why there is none yet."""

    id: int
    ok: bool
    detail: str | None

class ChannelRow(msgspec.Struct, rename="camel"):
    """A notification channel as stored: its spec is JSON that names secrets, never holds them."""

    name: str
    kind: str
    spec: str
    created_at_ms: int
    updated_at_ms: int


class Damping(msgspec.Struct, frozen=True):
    """How a task that keeps failing is reported on a channel: its first failure at once,
    then a reminder when `first_ms` has passed, each later one `factor` times as long after
    the one before, at most `max_ms` apart; the failures in between wait for the next
    reminder and are counted in it. A recovery ends the streak."""

    first_ms: int
    factor: float
    max_ms: int

    def interval(self, repeats: int) -> int:
        """The wait after the first message (repeats 0) or after the `repeats`th reminder."""
        return int(min(float(self.max_ms), self.first_ms * self.factor ** min(repeats, 64)))


class Streak(msgspec.Struct, frozen=True):
    """A task's failures on a channel since the first of them was reported: for a reminder
    ("still failing") or the recovery that ends them."""

    failures: int  # the failures of the streak, those of this message included
    since_ms: int  # when the first of them happened
    next_at_ms: int | None  # when the next reminder may go; None: the streak ended (a recovery)


class PendingNotice(msgspec.Struct, kw_only=True):
    """A queued message due for delivery, with what it is about and its channel (kind and
    spec None: the channel was deleted since). `streak` is set on a reminder of a failure
    and on the recovery that ends one."""

    id: int
    channel: str
    event: str  # failure, recovery, success, lost, skipped, finished, test, summary
    task_id: str | None
    task_name: str | None
    run_id: str | None
    status: str | None
    exit_code: int | None
    duration_ms: int | None
    detail: str | None  # an error summary, a skip reason, or a summary's lines
    count: int  # events coalesced into this message
    first_at_ms: int
    created_at_ms: int
    attempts: int
    kind: str | None
    spec: str | None
    streak: Streak | None = None


class NoticeOutcome(msgspec.Struct, frozen=True):
    """One delivery attempt: ok; or failed, with `retry_at_ms` when it is tried again."""

    id: int
    ok: bool
    detail: str | None
    elapsed_ms: int
    retry_at_ms: int | None = None


class NoticeAttempt(msgspec.Struct, rename="camel"):
    at_ms: int
    ok: bool
    detail: str | None
    elapsed_ms: int | None


class NoticeRecord(msgspec.Struct, rename="camel"):
    """A message of the delivery log: `state` pending, sent, failed (gave up), dropped (no
    such channel) or merged (into the summary `merged_into`)."""

    id: int
    channel: str
    event: str
    task_id: str | None
    run_id: str | None
    status: str | None
    count: int
    state: str
    attempts: int
    created_at_ms: int
    done_at_ms: int | None
    last_error: str | None
    merged_into: int | None
    tries: list[NoticeAttempt]


class ChannelHealth(msgspec.Struct, rename="camel"):
    """A channel's recent attempts: how many failed in a row (0: the last one went through)."""

    channel: str
    failures: int
    last_error: str | None
    failing_since_ms: int | None
    last_ok_at_ms: int | None


class NotifyStore(Protocol):
    """Channels, the project's default rules and the delivery queue.

    A message handed out by `due` is claimed by its caller for `lease_ms`: until it is
    recorded, merged or released (or the lease ends, when the caller died), no caller gets
    it again and no new event joins it, so what joins a message is never lost to a
    delivery already in flight, and on a shared database one node delivers it."""

    async def set_channel(self, project: str, name: str, kind: str, spec: str, now_ms: int,
                          create_only: bool = False) -> tuple[ChannelRow, str]:
        """Create or replace a channel; returns it and `created`, `updated` or (create_only
        and it exists: nothing changed) `exists`."""
        ...

    async def channels(self, project: str) -> list[ChannelRow]:
        """Every channel, by name."""
        ...

    async def delete_channel(self, project: str, name: str) -> bool:
        """False when there was none. Its queued messages fail when their turn comes."""
        ...

    async def rules(self, project: str) -> list[NotifyRule] | None:
        """The project's default rules (for tasks without their own); None when never set."""
        ...

    async def set_rules(self, project: str, rules: list[NotifyRule] | None, now_ms: int) -> None:
        """Replace the default rules (None: none)."""
        ...

    async def enqueue_test(self, project: str, channel: str, now_ms: int) -> int:
        """Queue a test message to `channel`, due now; its id. Raises not_found."""
        ...

    async def due(self, project: str, now_ms: int, limit: int, lease_ms: int,
                  damping: Damping | None = None) -> list[PendingNotice]:
        """Pending messages due at `now_ms` and not claimed by another caller, oldest due
        first, at most `limit`; each is claimed for `lease_ms`.

        With `damping`, in the same transaction: a task's failure on a channel starts a
        streak (handed out as it is); a later failure of the same failing spell (the task's
        failing mark unchanged) waits, unclaimed, until the streak's next reminder is due
        (later failures join it), and is then handed out with `streak` (the failures so far,
        since when) while the next reminder moves `Damping.interval` further out; a message
        handed out before (released, or tried and due again) is handed out as it was. A
        recovery on a channel with a streak carries it (`streak`, next_at_ms None): the
        failures still waiting are merged into it and the streak ends."""
        ...

    async def release(self, project: str, ids: list[int], now_ms: int) -> None:
        """Claimed messages the caller did not deliver: unclaimed, due at `now_ms`."""
        ...

    async def recover(self, project: str, now_ms: int) -> int:
        """Release the claims this caller's earlier life held (a daemon that stopped while
        delivering): those messages are due now. Returns how many."""
        ...

    async def next_due(self, project: str, after_ms: int) -> int | None:
        """The earliest time after `after_ms` a pending message is due (or its claim ends);
        None when none is pending."""
        ...

    async def record(self, project: str, outcomes: list[NoticeOutcome], now_ms: int) -> None:
        """Record attempts in one transaction: each one's row in the attempts log, and its
        message sent, pending again (`retry_at_ms`) or failed, unclaimed; trims old rows,
        bounded. A message no longer pending (recorded meanwhile) is skipped."""
        ...

    async def merge(self, project: str, ids: list[int], channel: str, detail: str, count: int,
                    now_ms: int, lease_ms: int) -> int:
        """Replace claimed messages by one summary (`detail` its lines, `count` the events it
        stands for), claimed by the caller for `lease_ms`; the others become `merged`.
        Returns the summary's id."""
        ...

    async def log(self, project: str, before_id: int | None, limit: int) -> list[NoticeRecord]:
        """Messages with id < before_id, newest first, each with its latest attempts."""
        ...

    async def health(self, project: str) -> list[ChannelHealth]:
        """Per channel with attempts on record: its failures in a row and the last error."""
        ...

    async def recent_attempts(self, project: str, since_ms: int) -> list[tuple[str, int]]:
        """(channel, at_ms) of the attempts since `since_ms` (to rebuild rate windows)."""
        ...
