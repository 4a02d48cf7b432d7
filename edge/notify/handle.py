"""The notify capability as the daemon holds it before it is needed: what its tools are
(their modules load on the first call, edge.tools.definition.Deferred), and the notifier,
dormant until there is something to deliver.

An idle daemon that has never had a channel keeps its memory and module set as they were
without notifications: nothing here imports the notifier (edge.notify.dispatch), the
channel shapes, the tools or the store adapter. The notifier is built by the first
wake-up (a transaction queued a message), at start when the store says work is on record
(messages waiting, a channel whose last attempt failed), or when a tool needs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from edge.core.errors import ToolError
from edge.core.handoff import Background
from edge.tools.context import ToolInfo
from edge.tools.definition import info

if TYPE_CHECKING:
    from edge.core.ports.notify import ChannelHealth, NotifyStore
    from edge.notify.dispatch import Notifier

log = logging.getLogger("qledge.notify")

TEST_WAIT_S = 25.0  # a test message's wait for its outcome


# The notify tools (edge.notify.tools builds them from these, so the two agree).
TOOL_INFOS: tuple[ToolInfo, ...] = (
    info("qledge.notify.channel.set", effect="write", risk="high", permission=("notify.write", "secret.export"),
         title="Create or replace a notification channel (it names secrets, never holds them)"),
    info("qledge.notify.channel.list", effect="read", risk="medium", permission="notify.read",
         title="Notification channels with their health"),
    info("qledge.notify.channel.delete", effect="write", risk="medium", permission="notify.write",
         title="Delete a notification channel"),
    info("qledge.notify.rules.get", effect="read", risk="low", permission="notify.read",
         title="The project's default notification rules"),
    info("qledge.notify.rules.set", effect="write", risk="medium", permission="notify.write",
         title="Replace the project's default notification rules"),
    info("qledge.notify.test", effect="write", risk="medium", permission="notify.write",
         title="Send a test message through a channel and wait for the outcome", deadline_s=TEST_WAIT_S + 5),
    info("qledge.notify.log", effect="read", risk="medium", permission="notify.read",
         title="Recent notifications and every attempt's outcome, newest first"),
)


class NotifierHandle:
    """The notifier, built on first need. `build` makes it; `store` gives the notify store
    (its adapter is loaded then too); `waiting` says whether work is on record."""

    def __init__(self, build: Callable[[], Notifier], store: Callable[[], NotifyStore],
                 waiting: Callable[[], Awaitable[bool]], project: str) -> None:
        self._build = build
        self._store = store
        self._waiting = waiting
        self._project = project
        self._notifier: Notifier | None = None
        self._starting: asyncio.Future[None] | None = None
        self._started = False  # wakes before start (a lost run recorded at start-up) wait for it
        self._closing = False
        self._background = Background(log)

    @property
    def notifier(self) -> Notifier | None:
        """The notifier once built; None while dormant."""
        return self._notifier

    def store(self) -> NotifyStore:
        return self._store()

    async def start(self) -> None:
        """Start the notifier now when work is on record; otherwise stay dormant."""
        self._started = True
        if await self._waiting():
            await self.ready()

    async def ready(self) -> Notifier:
        """The notifier, built and started (once) if it was dormant."""
        if self._notifier is None:
            self._notifier = self._build()
            self._starting = asyncio.ensure_future(self._notifier.start())
        assert self._starting is not None
        try:
            await asyncio.shield(self._starting)
        except ToolError:  # storage unavailable: the next need tries again
            self._notifier, self._starting = None, None
            raise
        return self._notifier

    def wake(self) -> None:
        """Messages may be due (called after the transaction that queued them)."""
        if self._closing or not self._started:
            return
        if self._notifier is not None and self._starting is not None and self._starting.done():
            self._notifier.wake()
        elif self._notifier is None:
            self._background.spawn(self._wake_up(), "notify-start")

    async def _wake_up(self) -> None:
        try:
            await self.ready()
        except ToolError as exc:
            log.error("notifications: %s", exc.message)

    async def stop(self) -> None:
        self._closing = True
        await self._background.wait()
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._notifier is not None:
            await self._notifier.stop()

    def forget(self, channel: str) -> None:
        """A channel was replaced or deleted: its window and health start afresh."""
        if self._notifier is not None:
            self._notifier.forget(channel)

    async def health(self) -> dict[str, ChannelHealth]:
        if self._notifier is not None:
            return self._notifier.health()
        return {h.channel: h for h in await self._store().health(self._project)}

    def status(self) -> dict[str, str]:
        return self._notifier.status() if self._notifier is not None else {}
