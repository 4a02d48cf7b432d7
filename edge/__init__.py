"""qledge: a minimal-footprint task runtime for routers and small boards."""

import os

__version__ = "0.1.0"


def default_home() -> str:
    """The state directory when nothing says otherwise. Here, not in edge.app.config, because
    the MCP bridge needs it and must not import msgspec."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "qledge")
