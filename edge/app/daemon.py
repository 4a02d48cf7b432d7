"""`qledge serve`: the daemon's lifecycle: lock, store, start and stop order, signals, reload."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
import time

from edge.app import config as config_file
from edge.app.config import Config
from edge.app.graph import LIVE_KEYS, Graph, StartupError, private_dir
from edge.app.sdnotify import Notifier, start_watchdog
from edge.core.errors import ToolError
from edge.core.ports.runtime import Clock
from edge.storage.sqlite.db import Database
from edge.transports.unix import UnixListener

log = logging.getLogger("qledge")


def load_pepper(path: str) -> bytes:
    """32 random bytes in a 0600 file; the HMAC key for credential digests."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise StartupError(f"{path} has mode {st.st_mode & 0o777:04o}; it must be 0600") from None
        with open(path, "rb") as f:
            pepper = f.read()
        if len(pepper) < 32:
            raise StartupError(f"{path} is damaged (expected 32 bytes)") from None
        return pepper
    pepper = os.urandom(32)
    os.write(fd, pepper)
    os.fsync(fd)
    os.close(fd)
    return pepper


def lock_home(home: str) -> int:
    """Hold an exclusive lock on `<home>/lock` for the daemon's lifetime: only one daemon
    may reconcile and run the runs of a home. The kernel drops it when we die, however we
    die; the descriptor is not inherited by runs."""
    fd = os.open(os.path.join(home, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another qledge daemon is already running in {home}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


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
        private_dir(self.home)
        lock = lock_home(self.home)
        try:
            await self._run_locked()
        finally:
            os.close(lock)

    async def _run_locked(self) -> None:
        cfg = self.config
        pepper = load_pepper(os.path.join(self.home, "pepper"))
        try:
            db = await Database.open(os.path.join(self.home, "qledge.db"), cfg.store.synchronous, cfg.store.cache_kib)
        except Exception as exc:
            raise StartupError(f"cannot open the database in {self.home}: {exc}") from None
        try:
            await self._serve(db, pepper)
        finally:
            await db.close()

    async def _serve(self, db: Database, pepper: bytes) -> None:
        g = Graph(self.config, self.home, self.socket_path, self.loop_name, db, pepper, self.clock)
        self._graph = g
        # Before anything is served: nothing a dead daemon left may stay `running`.
        await g.runner.recover()
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
            await g.scheduler.stop()
            await g.runner.shutdown()
            with contextlib.suppress(ToolError):  # the store has logged why
                await g.stores.audit.close()  # counts of refused calls still in memory

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
            self._graph.reload(self.config)
        self.notifier.notify(f"READY=1\nSTATUS=serving on {self.socket_path}")
        log.info("reloaded")

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)


async def _listen(listener: UnixListener) -> None:
    try:
        await listener.start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"cannot listen on {listener.path}: {exc}") from None


def run_daemon(config: Config, home: str, socket_path: str, loop_name: str, config_path: str | None = None) -> int:
    logging.basicConfig(
        level=config.log_level.upper(), stream=sys.stderr, format="qledge: %(levelname)s %(name)s: %(message)s"
    )
    daemon = Daemon(config, home, socket_path, loop_name, config_path=config_path)
    try:
        if loop_name == "uvloop":
            try:
                import uvloop
            except ImportError:
                print("qledge: loop = \"uvloop\" but uvloop is not installed (pip install 'qledge[uvloop]')",
                      file=sys.stderr)
                return 1
            uvloop.run(daemon.run())
        else:
            asyncio.run(daemon.run())
    except StartupError as exc:
        print(f"qledge: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
