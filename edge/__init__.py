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
