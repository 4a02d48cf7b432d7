"""`qledge.status` and `qledge.tools.list`: what the daemon is, holds and offers."""

from __future__ import annotations

import os
import sys

import msgspec

import edge
from edge.core.auth import missing_permission
from edge.core.reads import Counts
from edge.core.runs import RunDefaults
from edge.tools.context import ToolContext, ToolInfo
from edge.tools.definition import Empty, tool


class StatusArgs(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    include_modules: bool = False


class Status(msgspec.Struct, rename="camel", omit_defaults=True):
    version: str
    pid: int
    uptime_s: float
    loop: str
    ssl_loaded: bool
    rss_bytes: int
    hwm_bytes: int
    rss_anon_bytes: int
    module_count: int
    db_path: str
    db_bytes: int
    project: str
    counts: Counts
    timezone: str = ""  # the zone triggers get when they name none: the device's
    defaults: RunDefaults | None = None  # what a run gets when its task does not say
    # Bytes this process made the kernel write (/proc/self/io write_bytes: pages of the
    # database, its WAL and the run logs; what wears a router's flash), and that rate
    # over a day. 0 where /proc does not say.
    written_bytes: int = 0
    written_bytes_per_day: int = 0
    extra: dict[str, str] = {}
    modules: list[str] | None = None


def _proc_status() -> dict[str, int]:
    """VmRSS, VmHWM and RssAnon from /proc/self/status, in bytes (0 where unknown)."""
    wanted = {"VmRSS", "VmHWM", "RssAnon"}
    values = dict.fromkeys(wanted, 0)
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in wanted:
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def _written() -> int:
    try:
        with open("/proc/self/io", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "write_bytes":
                    return int(rest)
    except (OSError, ValueError):
        pass
    return 0


async def status(ctx: ToolContext, args: StatusArgs) -> Status:
    facts = ctx.services.facts
    mem = _proc_status()
    # Rounded once: the rate is judged on the uptime the reply shows (0.9996 s shows as 1.0).
    uptime = round(ctx.services.clock.monotonic() - facts.started_monotonic, 3)
    written = _written()
    try:
        db_bytes = os.stat(facts.db_path).st_size
    except OSError:
        db_bytes = 0
    modules = sorted(name for name, mod in sys.modules.items() if mod is not None)
    return Status(
        version=edge.__version__,
        pid=os.getpid(),
        uptime_s=uptime,
        loop=facts.loop,
        ssl_loaded=sys.modules.get("ssl") is not None,
        rss_bytes=mem["VmRSS"],
        hwm_bytes=mem["VmHWM"],
        rss_anon_bytes=mem["RssAnon"],
        module_count=len(modules),
        db_path=facts.db_path,
        db_bytes=db_bytes,
        project=ctx.project,
        counts=await facts.counts(ctx.project),
        timezone=ctx.services.triggers.default_timezone,
        defaults=facts.run_defaults(),
        written_bytes=written,
        written_bytes_per_day=round(written * 86_400 / uptime) if uptime >= 1 else 0,
        extra=facts.extra(),
        modules=modules if args.include_modules else None,
    )


class ToolList(msgspec.Struct, rename="camel"):
    tools: list[ToolInfo]


async def list_tools(ctx: ToolContext, args: Empty) -> ToolList:
    """The tools this caller may call, by name (others are not disclosed)."""
    granted = ctx.principal.permissions
    return ToolList(tools=[
        t for t in ctx.services.catalog if missing_permission(granted, t.name, t.permissions) is None])


TOOLS = [
    tool("qledge.status", status, StatusArgs, Status, effect="read", risk="low", permission="status.read",
         title="Daemon status"),
    tool("qledge.tools.list", list_tools, Empty, ToolList, effect="read", risk="low", permission="status.read",
         title="The tools you may call"),
]
