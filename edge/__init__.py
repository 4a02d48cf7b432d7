"""qledge: a minimal-footprint task runtime for routers and small boards."""

import os

__version__ = "0.1.0"

# How every `qledge` command ends, here so that the commands that load none of the CLI (the web
# panel, the MCP bridge) share them: done; the daemon or the work refused or failed; the command
# line is wrong; no daemon to ask.
EXIT_OK, EXIT_TOOL, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def default_home() -> str:
    """The state directory when nothing says otherwise. Here, not in edge.app.config, because
    the MCP bridge needs it and must not import msgspec."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "qledge")


SYSTEM_RUN_DIR = "/run/qledge"  # qledge.service's RuntimeDirectory: its tool and MCP sockets


def home_socket(name: str, flag_home: str | None, system_dir: str = SYSTEM_RUN_DIR) -> str:
    """<--home or $QLEDGE_HOME>/<name>. With neither, the per-user home's socket, unless only
    a system daemon's exists: then that one, so `qledge status` just works beside the service."""
    home = flag_home or os.environ.get("QLEDGE_HOME")
    if home:
        return os.path.join(os.path.abspath(home), name)
    path = os.path.join(default_home(), name)
    system = os.path.join(system_dir, name)
    if not os.path.exists(path) and os.path.exists(system):
        return system
    return path


# -- values for people: the one way each kind is written in every human output. Here, not in
# edge.core.text, because `qledge status` writes them and loads no msgspec. ----------------

TIME_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def moment(ms: int | None) -> str:
    """An instant for people, in the device's zone (the C library's: $TZ, else
    /etc/localtime) with its abbreviation: `2026-12-01 18:23:03 CET`; `-` when unknown.
    The CLI, the notifications and the daemon's log lines all write times this way."""
    import time

    if ms is None:
        return "-"
    return time.strftime(TIME_FORMAT, time.localtime(ms / 1000))


def duration_text(ms: float | None) -> str:
    """How long something took, for people: under a minute in tenths of a second (`0.4s`,
    `59.9s`), then minutes and seconds (`1m04s`), then hours and minutes (`2h05m`, `26h00m`);
    `-` when unknown. The CLI, the notifications and the log lines all write durations this
    way (the panel's format.js follows the same rule)."""
    if ms is None:
        return "-"
    tenths = int((max(0.0, ms) + 50) // 100)  # half up, as the panel's Math.round
    if tenths < 600:
        return f"{tenths / 10:.1f}s"
    seconds = max(60, int(ms // 1000))  # 59.96 s rounds up to a minute, not to 0m59s
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
