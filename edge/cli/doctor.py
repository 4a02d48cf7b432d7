"""`qledge doctor`: an installation checked the way a support thread would check it, one line
per check and, for each that fails, the fix.

The checks: the daemon answers; the state directory and its files are owned by the daemon's
user and not writable by others (what `qledge serve` refuses to start without); the clock is
synchronised (or the daemon holds its stamps); time zone data is there; free space against
the runner's reserve, and the ballast; flash written per day at the current rate; each
optional capability (edge.app.capabilities) configured against importable; the service
manager's view (systemd or procd, where there is one); the Python and SQLite versions.

A warning is printed and does not fail. The exit code is the error table's
(docs/reference/errors.md) for the worst failure: 3 when the daemon cannot be reached, 2 for
what makes `qledge serve` refuse to start (the configuration, the state directory, a zone,
a capability configured but not importable), 1 for the rest; 0 when nothing failed.

Offline in the CLI's sense: it asks the daemon itself, with a short timeout, and goes on
without it.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from edge import EXIT_OK, EXIT_TOOL, EXIT_UNREACHABLE, EXIT_USAGE
from edge.cli.shared import Verb

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from edge.app.capabilities import Capability
    from edge.app.config import Config

ASK_TIMEOUT_S = 3.0  # a daemon that does not answer status in this long is as good as gone
RATE_WINDOW_S = 3600  # the written-per-day rate means little over a shorter uptime
FLASH_WARN_BYTES_PER_DAY = 100 << 20  # a few years of a small router's flash at this rate
_OPENWRT_UNIT = "/etc/init.d/qledge"
_SYSTEMD_UNIT = "qledge.service"
# The services' configurations: systemd's unit (packaging/systemd) and OpenWrt's rendered UCI.
SERVICE_CONFIGS = ("/etc/qledge/qledge.toml", "/var/etc/qledge/qledge.toml")


class Check:
    """One line: `ok`, `warn`, `fail` or `skip` (could not be checked here), what was found,
    and for a warning or a failure the fix; `exit` is a failure's exit code."""

    __slots__ = ("name", "status", "detail", "fix", "exit")

    def __init__(self, name: str, status: str, detail: str, fix: str = "", exit: int = EXIT_TOOL) -> None:
        self.name, self.status, self.detail, self.fix, self.exit = name, status, detail, fix, exit

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix and self.status in ("warn", "fail") else ""
        return f"{self.status:<5} {self.name:<18} {self.detail}{fix}"

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.fix and self.status in ("warn", "fail"):
            found["fix"] = self.fix
        return found


def _size(n: int) -> str:
    from edge.cli.shared import size

    return size(n)


# -- the daemon -------------------------------------------------------------------------------


def _ask_daemon(socket_path: str) -> tuple[Check, dict[str, object] | None]:
    from edge.transports.client import CallFailed, Client, Unreachable

    try:
        with Client(socket_path, token=os.environ.get("QLEDGE_TOKEN") or None, timeout_s=ASK_TIMEOUT_S) as c:
            status = c.call("qledge.status")
    except Unreachable as exc:
        return Check("daemon", "fail", str(exc),
                     "start it: qledge serve (as a service: /etc/init.d/qledge start, or systemctl start qledge;"
                     " elsewhere, say where it listens: --home, --socket or --config)", EXIT_UNREACHABLE), None
    except CallFailed as exc:
        return Check("daemon", "warn", f"reachable at {socket_path}, but status was refused: {exc.message}",
                     "run doctor as the daemon's owner, or with QLEDGE_TOKEN set to an owner's token"), None
    except (OSError, ValueError) as exc:  # a timeout, a reset, a reply that is not the protocol
        return Check("daemon", "fail", f"no answer from {socket_path}: {exc}",
                     "restart the daemon; its log says why it stopped answering", EXIT_UNREACHABLE), None
    if not isinstance(status, dict):
        return Check("daemon", "fail", f"{socket_path} answered status with something else", "", EXIT_TOOL), None
    from edge.cli.shared import duration

    uptime = status.get("uptimeS", 0)
    up = duration(0, int(uptime * 1000)) if isinstance(uptime, (int, float)) else "-"
    return Check("daemon", "ok", f"qledge {status.get('version')} (pid {status.get('pid')}, up {up})"
                 f" at {socket_path}"), status


def _daemon_uid(status: dict[str, object] | None) -> int:
    """The daemon's effective uid (what its home must belong to), else ours."""
    pid = status.get("pid") if status else None
    if isinstance(pid, int):
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        return int(line.split()[2])
        except (OSError, ValueError, IndexError):
            pass
    return os.geteuid()


# -- the state directory ------------------------------------------------------------------------


def _trust(path: str, info: os.stat_result, uid: int) -> str | None:
    """Why the daemon would refuse `path` (edge.app.home's rules), with the fix, or None."""
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link; fix: remove it (the daemon opens nothing through links)"
    if info.st_uid != uid:
        return f"{path} is owned by uid {info.st_uid}, not by the daemon's uid {uid}; fix: chown {uid} {path}"
    if info.st_mode & 0o022:
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o});"
                f" fix: chmod go-w {path}")
    return None


def _home(home: str, uid: int) -> Check:
    from edge.app.home import STATE_DIRS, STATE_FILES

    try:
        info = os.stat(home)
    except OSError as exc:
        return Check("state directory", "fail", f"{home}: {exc.strerror}",
                     "start the daemon once (it creates its home, mode 0700), or point --home at it", EXIT_USAGE)
    if not stat.S_ISDIR(info.st_mode):
        return Check("state directory", "fail", f"{home} is not a directory", "move it away", EXIT_USAGE)
    real = os.path.realpath(home)
    problems = [p for p in [_trust(real, info, uid)] if p]
    for name in (*STATE_FILES, *STATE_DIRS):
        path = os.path.join(real, name)
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        problem = _trust(path, found, uid)
        if problem:
            problems.append(problem)
    if problems:
        detail, _, fix = problems[0].partition("; fix: ")
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Check("state directory", "fail", f"{detail}{more}: the daemon refuses to start on it", fix, EXIT_USAGE)
    return Check("state directory", "ok", f"{home}: owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}")


# -- the clock and the zone ---------------------------------------------------------------------


def _kernel_synchronised() -> bool | None:
    """What the kernel says of its clock (adjtimex(2) with no change asked: TIME_ERROR, 5,
    is "not synchronised"), or None where that cannot be asked."""
    try:
        import ctypes  # not everywhere: OpenWrt packages it apart (python3-ctypes)
    except ImportError:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timex = ctypes.create_string_buffer(1024)  # struct timex (about 208 bytes), modes 0: read only
        state = libc.adjtimex(timex)
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return bool(state != 5)


def _clock() -> Check:
    from edge.core.clock import EPOCH_FLOOR_MS

    fix = "start time synchronisation (OpenWrt: /etc/init.d/sysntpd start; systemd: timedatectl set-ntp true)"
    now_ms = int(time.time() * 1000)
    if now_ms < EPOCH_FLOOR_MS:
        from edge.cli.shared import when

        return Check("clock", "fail", f"the wall clock says {when(now_ms)}, before {when(EPOCH_FLOOR_MS)}:"
                     " the daemon holds its stamps from the newest time on record, and cron fires wait", fix)
    synced = _kernel_synchronised()
    if synced is None:
        return Check("clock", "skip", "whether the kernel's clock is synchronised cannot be read here"
                     " (it needs Python's ctypes: on OpenWrt, opkg install python3-ctypes)")
    if not synced:
        return Check("clock", "warn", "not synchronised (a clock that jumps back is held: stamps count on from"
                     " the newest time on record)", fix)
    return Check("clock", "ok", "synchronised")


def _zone(config: Config, status: dict[str, object] | None) -> Check:
    from edge.app.config import tz_problem

    fix = "install the zone data (OpenWrt: opkg install zoneinfo-core and the zoneinfo package of your region;" \
          " Debian: apt install tzdata)"
    problem = tz_problem(os.environ.get("TZ"))
    if problem:
        text, _, hint = problem.partition(": ")
        return Check("time zone", "fail", text, hint, EXIT_USAGE)
    zone_dir = os.environ.get("TZDIR") or "/usr/share/zoneinfo"
    try:
        entries = [e for e in os.listdir(zone_dir) if not e.startswith(".")]
    except OSError:
        entries = []
    if not entries:
        return Check("time zone", "fail", f"no time zone data in {zone_dir}: times print as UTC and triggers"
                     " in a named zone are refused", fix, EXIT_USAGE)
    zone = config.timezone or (status.get("timezone") if status else None)
    named = isinstance(zone, str) and zone not in ("", "UTC", "Etc/UTC") and not zone.startswith("/")
    if named and not os.path.isfile(os.path.join(zone_dir, str(zone))):
        return Check("time zone", "fail", f"the zone {zone} has no data in {zone_dir}", fix, EXIT_USAGE)
    return Check("time zone", "ok", f"{zone or 'the system zone'}; data in {zone_dir}")


# -- space and flash --------------------------------------------------------------------------


def _space(home: str, config: Config, status: dict[str, object] | None) -> list[Check]:
    reserve = config.runner.disk_reserve_bytes
    try:
        fs = os.statvfs(home)
    except OSError as exc:
        return [Check("free space", "skip", f"cannot check {home}: {exc.strerror}"),
                Check("ballast", "skip", "cannot check without the state directory")]
    free = fs.f_bavail * fs.f_frsize
    fix = (f"free some space where {home} lives (old runs' logs go with [retention] log_quota_bytes),"
           " or lower [runner] disk_reserve_bytes")
    if free < reserve:
        space = Check("free space", "fail", f"{_size(free)} free in {home}, below the reserve of {_size(reserve)}"
                      " ([runner] disk_reserve_bytes): runs are refused", fix)
    elif free < 2 * reserve:
        space = Check("free space", "warn", f"{_size(free)} free in {home}, near the reserve of {_size(reserve)}", fix)
    else:
        space = Check("free space", "ok", f"{_size(free)} free in {home} (reserve {_size(reserve)})")
    wanted = config.store.ballast_bytes
    path = os.path.join(home, "ballast")
    extra = status.get("extra") if status else None
    disk_line = extra.get("disk", "") if isinstance(extra, dict) else ""
    if wanted == 0:
        ballast = Check("ballast", "ok", "none ([store] ballast_bytes = 0)")
    elif "released" in str(disk_line):
        ballast = Check("ballast", "fail", f"the {_size(wanted)} ballast was released: the disk filled up",
                        f"{fix}; the daemon puts the ballast back once there is room")
    else:
        try:
            held = os.stat(path).st_size
        except OSError:
            held = 0
        if held >= wanted:
            ballast = Check("ballast", "ok", f"{_size(held)} held in {path}")
        else:
            ballast = Check("ballast", "warn", f"no {_size(wanted)} ballast in {home} (there was no room for it"
                            " at the daemon's start, or it has not started yet)",
                            f"{fix}; the daemon makes it when it starts with room")
    return [space, ballast]


def _flash(status: dict[str, object] | None) -> Check:
    if status is None:
        return Check("flash writes", "skip", "needs the daemon")
    written, per_day, up = status.get("writtenBytes", 0), status.get("writtenBytesPerDay", 0), status.get("uptimeS", 0)
    if not isinstance(written, int) or not isinstance(per_day, int) or not isinstance(up, (int, float)):
        return Check("flash writes", "skip", "the daemon does not say")
    from edge.cli.shared import span

    if up < RATE_WINDOW_S:
        return Check("flash writes", "ok", f"{_size(written)} since start; a rate per day after {span(RATE_WINDOW_S)}"
                     f" up (up {span(float(int(up)))})")
    line = f"about {_size(per_day)} a day at the rate of the last {span(float(int(up)), 2)}"
    if per_day > FLASH_WARN_BYTES_PER_DAY:
        return Check("flash writes", "warn", line, "fewer runs a minute, [store] exclusive_lock = true, or a home"
                     " on tmpfs or a USB disk (docs/performance.md)")
    return Check("flash writes", "ok", line)


# -- optional capabilities ------------------------------------------------------------------


def _importable(cap: Capability) -> str | None:
    """Why `cap` cannot be imported here, or None: its probe modules and its daemon side are
    imported (a package that is found but fails to load counts as missing)."""
    import importlib

    for module in (*cap.probe, *((cap.entry,) if cap.entry else ())):
        try:
            importlib.import_module(module)
        except Exception as exc:  # an ImportError, or whatever a broken package raises on import
            return f"importing {module} fails: {type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


_INSTALL = {"cluster": "pip install 'qledge[cluster]'", "mcp": "a build with MCP (OpenWrt: opkg install qledge-mcp)",
            "agent": "a build with the AI operator (the full zipapp or pip install qledge)",
            "notify": "a build with notifications", "web": "a build with the web panel (pip install qledge)"}


def _capability(cap: Capability, config: Config) -> Check:
    name = f"capability {cap.name}"
    asked = cap.missing is not None and cap.enabled(config)
    if not asked:
        shipped = cap.available()
        how = "on wherever shipped" if cap.missing is None else (
            f"off (turn on in [{cap.section}])" if cap.section else "its own command")
        return Check(name, "ok", f"{'available' if shipped else 'not in this build'}; {how}")
    problem = _importable(cap)
    if problem is not None:
        assert cap.missing is not None
        return Check(name, "fail", f"configured ([{cap.section}]) but not importable: {problem}",
                     f"{_INSTALL.get(cap.name, 'install it')}, or turn it off in [{cap.section}]", EXIT_USAGE)
    return Check(name, "ok", f"configured ([{cap.section}]) and importable")


# -- the service manager, the platform ----------------------------------------------------------


def _run(argv: list[str]) -> tuple[int, str]:
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return done.returncode, (done.stdout or done.stderr).strip()


def _service() -> Check:
    import shutil

    if os.path.isdir("/run/systemd/system") and shutil.which("systemctl"):
        code, enabled = _run(["systemctl", "is-enabled", _SYSTEMD_UNIT])
        if (code != 0 and enabled in ("", "not-found")) or "No such file" in enabled:
            return Check("service", "skip", f"systemd: no {_SYSTEMD_UNIT} installed (docs/install-systemd.md)")
        _, active = _run(["systemctl", "is-active", _SYSTEMD_UNIT])
        if enabled != "enabled":
            return Check("service", "warn", f"systemd: {_SYSTEMD_UNIT} is {enabled}, {active}",
                         f"systemctl enable --now {_SYSTEMD_UNIT}")
        if active != "active":
            return Check("service", "fail", f"systemd: {_SYSTEMD_UNIT} is enabled but {active}",
                         f"systemctl start {_SYSTEMD_UNIT}; journalctl -u {_SYSTEMD_UNIT} says why it stopped")
        return Check("service", "ok", f"systemd: {_SYSTEMD_UNIT} enabled and active")
    if os.path.exists(_OPENWRT_UNIT) and os.path.exists("/sbin/procd"):
        at_boot = _run([_OPENWRT_UNIT, "enabled"])[0] == 0
        running = _run([_OPENWRT_UNIT, "running"])[0] == 0
        if not at_boot:
            return Check("service", "warn", "procd: qledge does not start at boot",
                         f"{_OPENWRT_UNIT} enable && {_OPENWRT_UNIT} start")
        if not running:
            return Check("service", "fail", "procd: qledge is enabled but not running",
                         f"{_OPENWRT_UNIT} start; logread -e qledge says why it stopped")
        return Check("service", "ok", "procd: qledge enabled and running")
    return Check("service", "skip", "no service manager here (neither systemd nor procd): the daemon runs by hand")


def _python() -> Check:
    version = ".".join(str(n) for n in sys.version_info[:3])  # an older one never gets this far
    return Check("python", "ok", f"Python {version} ({sys.executable})")


def _sqlite() -> Check:
    try:
        import apsw
    except ImportError:
        return Check("sqlite", "fail", "the Python package apsw is not installed",
                     "pip install apsw (OpenWrt: opkg install python3-apsw)", EXIT_USAGE)
    return Check("sqlite", "ok", f"SQLite {apsw.sqlite_lib_version()} (apsw {apsw.apsw_version()})")


# -- the command ------------------------------------------------------------------------------


def checks(args: argparse.Namespace) -> list[Check]:
    """Every check, in the order they print."""
    from edge.app import config as cfg
    from edge.cli.main import _client_socket_for

    found: list[Check] = []
    path = getattr(args, "config", None) or os.environ.get("QLEDGE_CONFIG") or _service_config(args)
    try:
        config = cfg.load(path)
        if path:
            found.append(Check("configuration", "ok", os.path.abspath(path)))
    except cfg.ConfigError as exc:
        found.append(Check("configuration", "fail", str(exc), "correct the file (docs/reference/configuration.md)",
                           EXIT_USAGE))
        config = cfg.Config()
        path = None
    socket_path = _client_socket_for(args) if path else _plain_socket(args)
    daemon, status = _ask_daemon(socket_path)
    found.append(daemon)
    db_path = status.get("dbPath") if status else None
    # The daemon's own home, as it says, else where it would be.
    home = os.path.dirname(db_path) if isinstance(db_path, str) and db_path else cfg.resolve_home(
        getattr(args, "home", None), config)
    found.append(_home(home, _daemon_uid(status)))
    found += [_clock(), _zone(config, status), *_space(home, config, status), _flash(status)]
    from edge.app.capabilities import CAPABILITIES

    found += [_capability(cap, config) for cap in CAPABILITIES]
    found += [_service(), _python(), _sqlite()]
    return found


def _service_config(args: argparse.Namespace) -> str | None:
    """Beside the service's daemon (the CLI reaches its socket by itself), the service's
    configuration: what systemd's unit and OpenWrt's init script give `qledge serve`."""
    from edge import SYSTEM_RUN_DIR

    if getattr(args, "home", None) or os.environ.get("QLEDGE_HOME"):
        return None
    if not os.path.realpath(_plain_socket(args)).startswith(os.path.realpath(SYSTEM_RUN_DIR) + "/"):
        return None
    return next((p for p in SERVICE_CONFIGS if os.path.isfile(p)), None)


def _plain_socket(args: argparse.Namespace) -> str:
    from edge.cli.main import client_socket

    return client_socket(getattr(args, "socket", None), getattr(args, "home", None))


def doctor(args: argparse.Namespace) -> int:
    found = checks(args)
    failed = [c for c in found if c.status == "fail"]
    code = max((c.exit for c in failed), default=EXIT_OK)
    if args.json:
        import json

        sys.stdout.write(json.dumps({"ok": not failed, "exit": code, "checks": [c.as_dict() for c in found]}) + "\n")
    else:
        for check in found:
            print(check.line())
        warned = sum(1 for c in found if c.status == "warn")
        print(f"{len(failed)} failed, {warned} warnings, {len(found)} checks")
    return code


VERBS = {"doctor": Verb("doctor", doctor, offline=True)}
