"""The optional capabilities, in one shape: what turns each on (its configuration), how a
build is known to ship it (one probe: modules found, none imported), the files it ships in
(packaging/build.py builds its profiles from these), the command-line nouns it serves, and
the line a daemon that is asked for it but lacks it refuses to start with.

The command line reads this on every call and packaging/build.py runs it on the build host:
it imports nothing (not even `typing`). What each capability adds to a running daemon
(tools, deferred tools, listeners, status facts, services to start and stop) is built by
composition, edge.app.graph, from the capabilities that are enabled and available.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from edge.app.config import Config


class Capability:
    """One optional capability. `entry`: the module composition builds its daemon side
    from, reached from nowhere else; None: it has none (the web panel is a process of its
    own: a command and a profile, nothing in the daemon). `missing`: the error code and
    line of a start that asks for it where it is not available; None: a build without it
    runs without it (it needs no asking: on wherever it is shipped)."""

    __slots__ = ("name", "section", "enabled", "probe", "missing", "parts", "cli_nouns", "entry")

    def __init__(
        self, name: str, *, section: str | None, enabled: Callable[[Config], bool], probe: tuple[str, ...],
        missing: tuple[str, str] | None, parts: tuple[str, ...], cli_nouns: tuple[str, ...] = (), entry: str | None,
    ) -> None:
        self.name = name
        self.section = section  # its configuration section, [name]
        self.enabled = enabled
        self.probe = probe  # every one of these modules is found where it is available
        self.missing = missing
        self.parts = parts  # path prefixes under the source root: a directory ("edge/mcp/") or a file
        self.cli_nouns = cli_nouns  # `qledge NOUN ...` that only this capability serves
        self.entry = entry

    @property
    def daemon(self) -> bool:
        """Whether it has a daemon side (the web panel is a process of its own)."""
        return self.entry is not None

    def available(self) -> bool:
        """Whether this build, on this system, has it: every probe module can be found
        (nothing is imported but their parent packages)."""
        from importlib.util import find_spec

        for module in self.probe:
            try:
                if find_spec(module) is None:
                    return False
            except ModuleNotFoundError:  # a parent package is not there either
                return False
        return True

    def modules(self) -> tuple[str, ...]:
        """Its parts as module names (a directory as the package's prefix, "edge.mcp.")."""
        return tuple(p.removesuffix(".py").replace("/", ".") for p in self.parts)


def _never(config: Config) -> bool:
    return False


def _always(config: Config) -> bool:
    return True


CLUSTER = Capability(
    "cluster", section="cluster", enabled=lambda c: c.cluster.dsn is not None,
    probe=("edge.storage.postgres", "psycopg"),
    missing=("unavailable",
             "cluster mode needs psycopg 3 and a build that includes it (pip install 'qledge[cluster]')"),
    parts=("edge/storage/postgres/",), entry="edge.storage.postgres.cluster")
# Notifications need no section to be on: a build that ships them keeps a queue wherever a
# channel exists; one without them keeps the failing marks and queues nothing.
NOTIFY = Capability(
    "notify", section="notify", enabled=_always, probe=("edge.notify",), missing=None,
    parts=("edge/notify/", "edge/cli/notify.py", "edge/cli/notify_import.py", "edge/core/ports/notify.py",
           "edge/storage/notify.py", "edge/storage/sqlite/notify.py"), cli_nouns=("notify",),
    entry="edge.notify.handle")
# The AI operator: the daemon's side (edge/operator/, composed by edge/app/operator.py) and the
# child of each AI run (edge/airun/), with the shapes, ports and stores they share.
AGENT = Capability(
    "agent", section="agent", enabled=lambda c: c.agent.enabled, probe=("edge.operator", "edge.airun"),
    missing=("invalid_argument", "the AI operator is not included in this build"),
    parts=("edge/airun/", "edge/operator/", "edge/app/operator.py", "edge/cli/agent.py", "edge/core/agent.py",
           "edge/core/agent_settings.py",
           "edge/core/ledger.py", "edge/core/ports/agent.py", "edge/storage/sqlite/evidence.py",
           "edge/storage/sqlite/ledger.py", "edge/tools/agent.py", "edge/tools/missions.py"),
    cli_nouns=("agent", "ask"), entry="edge.app.operator")
MCP = Capability(
    "mcp", section="mcp", enabled=lambda c: c.mcp.enabled, probe=("edge.mcp",),
    missing=("invalid_argument", "MCP is not included in this build"), parts=("edge/mcp/",),
    entry="edge.mcp.server")
WEB = Capability(
    "web", section=None, enabled=_never, probe=("edge.web",),
    missing=("invalid_argument", "the web panel is not included in this build"), parts=("edge/web/",),
    cli_nouns=("web",), entry=None)

# In the order the daemon builds them: the storage a node keeps first, then what the others use.
CAPABILITIES: tuple[Capability, ...] = (CLUSTER, NOTIFY, AGENT, MCP, WEB)
