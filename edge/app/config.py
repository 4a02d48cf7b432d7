"""Configuration: one optional TOML file decoded into Structs; every key has a default."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

import msgspec

from edge import default_home
from edge.core.schedule import UTC_NAMES, ScheduleError, load_zone
from edge.core.text import Name

_Positive = Annotated[int, msgspec.Meta(ge=1)]


class AuthConfig(msgspec.Struct, forbid_unknown_fields=True):
    owner_uids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None  # None: our own uid and root


class StoreConfig(msgspec.Struct, forbid_unknown_fields=True):
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    cache_kib: Annotated[int, msgspec.Meta(ge=64, le=1 << 20)] = 512


class RunnerConfig(msgspec.Struct, forbid_unknown_fields=True):
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    queue_limit: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 32
    log_cap_bytes: Annotated[int, msgspec.Meta(ge=4096, le=1 << 30)] = 1 << 20
    kill_grace_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 5.0
    disk_reserve_bytes: Annotated[int, msgspec.Meta(ge=0)] = 8 << 20


class RetentionConfig(msgspec.Struct, forbid_unknown_fields=True):
    # AI comparison reads a 64-run window plus one: keeping fewer would make it lie.
    runs_per_task: Annotated[int, msgspec.Meta(ge=65)] = 100
    run_max_age_days: _Positive = 30
    log_quota_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 32 << 20
    audit_max_rows: Annotated[int, msgspec.Meta(ge=100)] = 10_000
    audit_max_age_days: _Positive = 30


class McpConfig(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = False
    socket: str | None = None
    max_line_bytes: Annotated[int, msgspec.Meta(ge=4096, le=16 << 20)] = 1 << 20


_Price = Annotated[float, msgspec.Meta(ge=0, le=10_000)]
_Tokens = Annotated[int, msgspec.Meta(ge=256, le=10_000_000)]


class AgentProfile(msgspec.Struct, forbid_unknown_fields=True):
    """A second provider or model an AI task may name (`profile`); unset keys come from [agent]."""

    base_url: str | None = None
    model: str | None = None
    api_key_file: str | None = None
    input_usd_per_mtok: _Price | None = None
    output_usd_per_mtok: _Price | None = None
    context_window_tokens: _Tokens | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=16, le=1_000_000)] | None = None


class SpecialistConfig(msgspec.Struct, forbid_unknown_fields=True):
    """A no-tool specialist the operator may consult; for a default one, unset keys keep its own."""

    enabled: bool = True
    description: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    system: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=16, le=1_000_000)] | None = None


SpecialistName = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]*$")]


class AgentConfig(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = False
    base_url: str | None = None  # an OpenAI-compatible API root, e.g. https://api.openai.com/v1
    model: str | None = None
    api_key_file: str | None = None  # mode 0600; read by each AI run's child, never by the daemon
    input_usd_per_mtok: _Price | None = None
    output_usd_per_mtok: _Price | None = None
    context_window_tokens: _Tokens = 65536
    request_timeout_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 120.0
    max_output_tokens: Annotated[int, msgspec.Meta(ge=16, le=1_000_000)] = 4096
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    retries: Annotated[int, msgspec.Meta(ge=0, le=5)] = 2
    attempts: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1  # of a mission, when the provider fails an attempt
    ca_file: str | None = None  # None: the system's trust store
    proxy: str | None = None  # http://host:port; the environment's proxy variables are never used
    read_logs: bool = True
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=8)] = 1
    budget_rounds: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 48
    budget_input_tokens: Annotated[int, msgspec.Meta(ge=1, le=10**9)] = 1_000_000
    budget_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=10**9)] = 384_000
    budget_cost_usd: Annotated[float, msgspec.Meta(ge=0, le=10_000)] = 5.0
    budget_wall_clock_s: Annotated[int, msgspec.Meta(ge=5, le=86_400)] = 600
    tool_calls_per_round: Annotated[int, msgspec.Meta(ge=1, le=16)] = 8
    profiles: dict[Name, AgentProfile] = {}
    specialists: dict[SpecialistName, SpecialistConfig] = {}


class Config(msgspec.Struct, forbid_unknown_fields=True):
    home: str | None = None
    socket: str | None = None
    loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    timezone: str | None = None
    project: Name = "default"
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024, le=16 << 20)] = 256 * 1024
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    runner: RunnerConfig = msgspec.field(default_factory=RunnerConfig)
    retention: RetentionConfig = msgspec.field(default_factory=RetentionConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)


class ConfigError(Exception):
    """One clear line naming the problem."""


def _explain(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    where = ""
    name = re.search(r" - at `key` in `\$\.?(.*)`$", text)  # a table's name, e.g. [agent.specialists.NAME]
    if name:
        return f"a name in `{name.group(1)}`: {text[0].lower()}{text[1:name.start()]}"
    m = re.search(r" - at `\$\.?(.*)`$", text)
    if m:
        text = text[: m.start()]
        where = m.group(1)
    unknown = re.match(r"Object contains unknown field `(.+)`", text)
    if unknown:
        key = f"{where}.{unknown.group(1)}" if where else unknown.group(1)
        return f"unknown key `{key}`"
    return f"`{where}`: {text[0].lower()}{text[1:]}" if where else text


def load(path: str | None) -> Config:
    if path is None:
        return Config()
    import tomllib  # only when there is a file to read

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"config {path}: {_explain(exc)}") from None


def resolve_home(flag: str | None, config: Config) -> str:
    """--home, then $QLEDGE_HOME, then the config file, then the XDG state dir."""
    return os.path.abspath(flag or os.environ.get("QLEDGE_HOME") or config.home or default_home())


def resolve_socket(flag: str | None, config: Config, home: str) -> str:
    return os.path.abspath(
        flag or os.environ.get("QLEDGE_SOCKET") or config.socket or os.path.join(home, "qledge.sock")
    )


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value}


def changed_keys(old: Config, new: Config) -> set[str]:
    """Dotted names (`runner.queue_limit`) of the keys whose values differ."""
    a, b = _flatten(msgspec.to_builtins(old)), _flatten(msgspec.to_builtins(new))
    return {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def merge_live(running: Config, new: Config, live: frozenset[str]) -> Config:
    """`running` with the `live` keys taken from `new` (what a reload may change)."""
    merged = msgspec.to_builtins(running)
    fresh = msgspec.to_builtins(new)
    for key in live:
        section, _, name = key.rpartition(".")
        src, dst = (fresh.get(section, {}), merged.setdefault(section, {})) if section else (fresh, merged)
        if name in src:
            dst[name] = src[name]
        else:
            dst.pop(name, None)
    return msgspec.convert(merged, Config)


# -- the device's zone: the default of `timezone` ------------------------------------


def device_zone() -> str | None:
    """The device's IANA zone name, when it can be told: $TZ, /etc/timezone, the
    /etc/localtime link, or OpenWrt's `system.zonename`."""
    candidates: list[str] = []
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        candidates.append(tz)
    for path, reader in (("/etc/timezone", _first_line), ("/etc/config/system", _uci_zonename)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                found = reader(f.read(65536))
        except OSError:
            continue
        if found:
            candidates.append(found)
    try:
        link = os.readlink("/etc/localtime")
    except OSError:
        link = ""
    if "zoneinfo/" in link:
        candidates.append(link.rsplit("zoneinfo/", 1)[1])
    for name in candidates:
        if "/" in name or name in UTC_NAMES:
            try:
                load_zone(name)
                return name
            except ScheduleError:
                continue
    return None


def _first_line(text: str) -> str | None:
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    return line or None


def _uci_zonename(text: str) -> str | None:
    for line in text.splitlines():
        words = line.split(None, 2)
        if len(words) == 3 and words[0] == "option" and words[1] == "zonename":
            return words[2].strip().strip("'\"").replace(" ", "_") or None
    return None


def default_zone(configured: str | None) -> str:
    """The zone a trigger gets when none is given: config, else the device's, else UTC."""
    return configured or device_zone() or "UTC"
