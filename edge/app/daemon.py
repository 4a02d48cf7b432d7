"""`qledge serve`: the daemon's lifecycle: lock, store, start and stop order, signals, reload,
and what it tells the service manager (sd_notify without libsystemd: datagrams to
$NOTIFY_SOCKET, a path or an abstract `@name`; the watchdog)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from edge.app import config as config_file
from edge.app import home as state_dir
from edge.app.config import Config
from edge.app.graph import LIVE_KEYS, Cluster, Graph, task_users
from edge.app.home import StartupError
from edge.app.lean import defer_hangups, hangups_deferred
from edge.core.clock import LoopTimers
from edge.core.errors import ToolError
from edge.core.ports.runtime import Clock, TimerHandle, Timers
from edge.storage.sqlite.db import Ballast, Database, OpenError
from edge.transports.unix import UnixListener

log = logging.getLogger("qledge")


class Daemon:
    """Start order: store → runner → scheduler → tools → socket. Stop order is the reverse."""

    def __init__(
        self, config: Config, home: str, socket_path: str, loop_name: str,
        clock: Clock | None = None, config_path: str | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.home = home
        self.socket_path = socket_path
        self.loop_name = loop_name
        self.clock = clock
        self.notifier = Notifier()
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()  # a second stop signal: cut every grace period short
        self._graph: Graph | None = None
        self._reload_wanted = asyncio.Event()

    async def run(self) -> None:
        real = state_dir.prepare(self.home)  # StrictModes: ours, not writable by others, no links
        lock = state_dir.lock_home(real)
        try:
            await self._run_locked(real)
        finally:
            os.close(lock)

    async def _run_locked(self, home: str) -> None:
        cfg = self.config
        # Everything that can refuse the start is checked before anything is written.
        for problem in task_users(cfg, home).problems():
            raise StartupError(problem, "invalid_argument")  # the configuration, on this system
        pepper = state_dir.load_pepper(os.path.join(home, "pepper"))
        if cfg.cluster.dsn is not None:  # a cluster node: PostgreSQL instead of the SQLite file
            cluster = Cluster(cfg, home)
            await cluster.open()
            try:
                await self._serve(None, pepper, home, cluster)
            finally:
                await cluster.close()
            return
        ballast = Ballast(os.path.join(home, "ballast"), cfg.store.ballast_bytes)
        try:
            ballast.ensure()
        except OSError as exc:
            raise StartupError(f"cannot check free space in {home}: {exc.strerror}") from None
        try:
            db = await Database.open(os.path.join(home, "qledge.db"), cfg.store.synchronous, cfg.store.cache_kib,
                                     ballast=ballast, exclusive=cfg.store.exclusive_lock)
        except OpenError as exc:
            raise StartupError(str(exc)) from None
        try:
            await self._serve(db, pepper, home)
        finally:
            await db.close()

    async def _serve(self, db: Database | None, pepper: bytes, home: str, cluster: Cluster | None = None) -> None:
        g = Graph(self.config, home, self.socket_path, self.loop_name, db, pepper, self.clock, cluster)
        for problem in g.workers.users.problems():
            raise StartupError(problem, "invalid_argument")  # the configuration, on this system
        self._graph = g
        await g.hold_clock()
        # Before anything is served: nothing a dead daemon left may stay `running`.
        await g.runner.recover()
        for service in g.services:  # what the notifier has queued (a lost run's message too) goes out now
            await service.start()
        node = cluster.node if cluster is not None else None
        if node is not None:
            await node.start(g.scheduler.changed, g.wake)
        await g.scheduler.start()
        started: list[UnixListener] = []
        try:
            for listener in g.listeners:
                await _listen(listener)
                started.append(listener)
        except StartupError:
            for listener in started:
                await listener.stop()
            await g.scheduler.stop()
            if node is not None:
                await node.stop()
                await g.runner.shutdown()
                await node.close()
            for service in reversed(g.services):
                await service.stop()
            raise
        self._install_signals()
        log.info("qledge serving on %s (loop %s, pid %d)", self.socket_path, self.loop_name, os.getpid())
        self.notifier.notify(f"READY=1\nSTATUS=serving on {self.socket_path}\nMAINPID={os.getpid()}")
        watchdog = start_watchdog(self.notifier)
        if watchdog is not None:
            g.scheduler.on_wake = watchdog.pet
        reloads = asyncio.create_task(self._reload_loop(), name="reload")
        try:
            await self._stop.wait()
        finally:
            reloads.cancel()
            if watchdog is not None:
                watchdog.stop()
            self.notifier.notify("STOPPING=1")
            log.info("qledge stopping: answering the calls in flight (a second signal stops at once)")
            # Listeners first: no new calls; those in flight are answered within the grace.
            await asyncio.gather(*(listener.stop(forced=self._forced) for listener in g.listeners))
            for service in reversed(g.services):  # the notifier's batch in flight is finished; the rest waits
                await service.stop()
            await g.scheduler.stop()
            if node is not None:
                await node.stop()  # claim nothing more; what this node holds is recorded below
            await g.runner.shutdown()
            with contextlib.suppress(ToolError):  # the store has logged why
                await g.stores.audit.close()  # counts of refused calls still in memory
            g.workers.notices.close()
            if node is not None:
                await node.close()

    def stop(self) -> None:
        """The first call stops gracefully; a second one forces: no more waiting for calls
        in flight, and runs are killed at once instead of after their grace period."""
        if not self._stop.is_set():
            self._stop.set()
            return
        if not self._forced.is_set():
            log.warning("stopping now")
            self._forced.set()
            if self._graph is not None:
                self._graph.runner.force()

    # -- reload (SIGHUP) ------------------------------------------------------------

    def request_reload(self) -> None:
        """Signal-safe: HUPs arriving during a reload coalesce into one more reload."""
        self._reload_wanted.set()

    async def _reload_loop(self) -> None:
        while True:
            await self._reload_wanted.wait()
            self._reload_wanted.clear()
            await self.reload()

    async def reload(self) -> None:
        """Re-read the config file and apply its live keys (Graph.reload)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notifier.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading")
        new = self.config
        if self.config_path is not None:
            try:
                new = config_file.load(self.config_path)
            except config_file.ConfigError as exc:
                log.error("reload: %s; keeping the running configuration", exc)
        later = sorted(k for k in config_file.changed_keys(self.config, new) if k not in LIVE_KEYS)
        if later:
            log.warning("reload: %s changed; restart to apply", ", ".join(later))
        # Keys that need a restart keep their running values, so status stays truthful.
        self.config = config_file.merge_live(self.config, new, LIVE_KEYS)
        if self._graph is not None:
            await self._graph.reload(self.config)
        self.notifier.notify(f"READY=1\nSTATUS=serving on {self.socket_path}")
        log.info("reloaded")

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        if hangups_deferred():  # one arrived while starting: honour it now
            self.request_reload()


async def _listen(listener: UnixListener) -> None:
    try:
        await listener.start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"cannot listen on {listener.path}: {exc}") from None


def _print_error(code: str, message: str) -> None:
    print(f"qledge: {code}: {message}", file=sys.stderr)


def run_daemon(
    config: Config, home: str, socket_path: str, loop_name: str, config_path: str | None = None,
    report: Callable[[str, str], None] = _print_error,
) -> int:
    """Run until stopped: 0. A daemon that cannot start as configured says why in one line
    (`report(code, message)`) and returns 2, the exit code of a configuration error."""
    defer_hangups()
    logging.basicConfig(
        level=config.log_level.upper(), stream=sys.stderr, format="qledge: %(levelname)s %(name)s: %(message)s"
    )
    daemon = Daemon(config, home, socket_path, loop_name, config_path=config_path)
    try:
        if loop_name == "uvloop":
            try:
                import uvloop
            except ImportError:
                report("invalid_argument",
                       "loop = \"uvloop\" but uvloop is not installed (pip install 'qledge[uvloop]')")
                return 2
            uvloop.run(daemon.run())
        else:
            asyncio.run(daemon.run())
    except StartupError as exc:
        report(exc.code, str(exc))
        return 2
    except OSError as exc:  # anything else the start-up could not do: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        report("unavailable", f"cannot start: {exc.strerror or exc}{where}")
        return 2
    except KeyboardInterrupt:
        pass
    return 0


# -- the service manager: sd_notify without libsystemd ---------------------------------


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address: str | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, message: str) -> bool:
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self._address)
            return True
        except OSError:
            return False

    def watchdog_interval_s(self) -> float | None:
        """Half of $WATCHDOG_USEC when the watchdog is meant for us, else None."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            interval = int(usec) / 2_000_000
        except ValueError:
            return None
        return interval if interval > 0 else None


class Watchdog:
    """Sends WATCHDOG=1 from a timer on the event loop.

    A timer rather than a thread: if the loop is stuck, nothing pets the watchdog and
    the service manager restarts us, which is the point.
    """

    def __init__(self, notifier: Notifier, interval_s: float, timers: Timers | None = None) -> None:
        self._notifier = notifier
        self._interval_s = interval_s
        self._timers = timers or LoopTimers()
        self._handle: TimerHandle | None = None

    def start(self) -> None:
        self.pet()

    def pet(self) -> None:
        """Send WATCHDOG=1 and push the fallback timer back.

        The scheduler calls this on its own wake-ups (at least once a minute), so an
        idle daemon wakes once per minute, not once for each timer.
        """
        self._notifier.notify("WATCHDOG=1")
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._timers.call_later(self._interval_s, self.pet)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def start_watchdog(notifier: Notifier) -> Watchdog | None:
    """A running Watchdog when the service manager asked for one, else None."""
    interval = notifier.watchdog_interval_s() if notifier.enabled else None
    if interval is None:
        return None
    watchdog = Watchdog(notifier, interval)
    watchdog.start()
    return watchdog
