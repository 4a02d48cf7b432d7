"""Configuration: one optional TOML file decoded into Structs; every key has a default."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

import msgspec

from edge import default_home
from edge.core.schedule import UTC_NAMES, ScheduleError, load_zone
from edge.core.text import Account, Label, Name

_Positive = Annotated[int, msgspec.Meta(ge=1)]


class AuthConfig(msgspec.Struct, forbid_unknown_fields=True):
    owner_uids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None  # None: our own uid and root


class StoreConfig(msgspec.Struct, forbid_unknown_fields=True):
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    cache_kib: Annotated[int, msgspec.Meta(ge=64, le=1 << 20)] = 128
    # Space given back when the disk fills up, so audited calls keep working (0: none).
    ballast_bytes: Annotated[int, msgspec.Meta(ge=0, le=64 << 20)] = 1 << 20
    # Hold the database for this daemon alone: no -shm file is mapped and written back to
    # flash (about half of what a run a minute writes), but nothing else may open it.
    exclusive_lock: bool = False


class RunnerConfig(msgspec.Struct, forbid_unknown_fields=True):
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    queue_limit: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 32
    log_cap_bytes: Annotated[int, msgspec.Meta(ge=4096, le=1 << 30)] = 1 << 20
    kill_grace_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 5.0
    disk_reserve_bytes: Annotated[int, msgspec.Meta(ge=0)] = 8 << 20
    # Users a task may run as without task.privileged; a task naming none gets default_user
    # (None: the first of these). Neither applies when the daemon is not root.
    task_users: Annotated[list[Account], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=lambda: ["nobody"])
    default_user: Account | None = None
    work_dir: Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$")] = "/"
    # [low, high]: the uids a task that uses a secret runs as, one of its own ([] : none,
    # such tasks share their task user). Like systemd's DynamicUser range.
    dynamic_uids: Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=2**31 - 2)]],
                            msgspec.Meta(max_length=2)] = msgspec.field(default_factory=lambda: [61184, 65519])


class RetentionConfig(msgspec.Struct, forbid_unknown_fields=True):
    # AI comparison reads a 64-run window plus one: keeping fewer would make it lie.
    runs_per_task: Annotated[int, msgspec.Meta(ge=65)] = 100
    run_max_age_days: _Positive = 30
    log_quota_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 32 << 20
    audit_max_rows: Annotated[int, msgspec.Meta(ge=100)] = 10_000  # allowed calls
    audit_change_max_rows: Annotated[int, msgspec.Meta(ge=100)] = 1_000  # credential and secret changes
    audit_refused_max_rows: Annotated[int, msgspec.Meta(ge=100)] = 1_000  # aggregates of refused calls
    audit_max_age_days: _Positive = 30


class ConnectionsConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Limits every socket connection lives under, before and after authentication."""

    max_per_socket: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 32
    frame_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    idle_timeout_s: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 30.0  # 0: never
    session_idle_timeout_s: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 0.0  # 0: never
    partial_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024, le=1 << 30)] = 4 << 20
    fd_reserve: Annotated[int, msgspec.Meta(ge=16, le=1 << 20)] = 64


class McpConfig(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = False
    socket: str | None = None
    max_line_bytes: Annotated[int, msgspec.Meta(ge=4096, le=16 << 20)] = 1 << 20


class ClusterConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Cluster mode: set `dsn` and this daemon is a node of a PostgreSQL cluster."""

    dsn: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None  # libpq URI or key=value
    node: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")] | None = None
    lease_s: Annotated[float, msgspec.Meta(ge=2, le=3600)] = 30.0
    heartbeat_s: Annotated[float, msgspec.Meta(ge=0.2, le=600)] = 5.0
    poll_s: Annotated[float, msgspec.Meta(ge=0.2, le=5)] = 2.0
    pool_size: Annotated[int, msgspec.Meta(ge=2, le=64)] = 4
    connect_timeout_s: Annotated[int, msgspec.Meta(ge=1, le=120)] = 5
    write_retry_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0


class NotifyConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Delivery of notifications; channels and rules are in the database (qledge notify)."""

    device: Label | None = None  # the name messages give this device; None: its host name
    language: Literal["en", "zh"] = "en"  # of the built-in message templates
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=20)] = 5
    backoff_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0  # doubles per attempt
    max_backoff_s: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 3600.0
    per_minute: Annotated[int, msgspec.Meta(ge=1, le=600)] = 5  # requests per channel per minute
    timeout_s: Annotated[float, msgspec.Meta(ge=1, le=120)] = 10.0  # per attempt, connect to last byte
    # A task that keeps failing: its first failure, then reminders `repeat_s` after, each next
    # `repeat_factor` times as long after, at most `max_repeat_s` apart; 0: every failure.
    repeat_s: Annotated[float, msgspec.Meta(ge=0, le=604_800)] = 600.0
    repeat_factor: Annotated[float, msgspec.Meta(ge=1, le=100)] = 2.0
    max_repeat_s: Annotated[float, msgspec.Meta(ge=1, le=2_592_000)] = 21_600.0
    python: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None  # the sender's interpreter


_Price = Annotated[float, msgspec.Meta(ge=0, le=10_000)]
_Tokens = Annotated[int, msgspec.Meta(ge=256, le=10_000_000)]


ProviderKind = Literal["openai", "deepseek", "qwen", "gemini", "ollama", "llamacpp", "vllm", "generic"]
TokensParam = Literal["max_tokens", "max_completion_tokens"]


class AgentProfile(msgspec.Struct, forbid_unknown_fields=True):
    """A second provider or model an AI task may name (`profile`); unset keys come from [agent]."""

    base_url: str | None = None
    model: str | None = None
    provider: ProviderKind | None = None  # None: [agent]'s, or what a base_url of its own names
    max_tokens_param: TokensParam | None = None
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
    # None: what the provider takes (OpenAI: max_completion_tokens, which its reasoning models need)
    max_tokens_param: TokensParam | None = None
    provider: ProviderKind | None = None  # None: named by base_url's host where that is unambiguous
    retries: Annotated[int, msgspec.Meta(ge=0, le=5)] = 2
    attempts: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1  # of a mission, when the provider fails an attempt
    ca_file: str | None = None  # None: the system's trust store
    proxy: str | None = None  # http://host:port; the environment's proxy variables are never used
    read_logs: bool = True
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=8)] = 1
    # Whom each AI run's child becomes where the daemon is root: never root or the daemon's user.
    user: Account = "nobody"
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
    connections: ConnectionsConfig = msgspec.field(default_factory=ConnectionsConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    notify: NotifyConfig = msgspec.field(default_factory=NotifyConfig)
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


_POSIX_TZ = re.compile(r"^(<[^>]+>|[A-Za-z]{3,})[+-]?[0-9]")  # `CET-1CEST,M3.5.0,M10.5.0/3`, `UTC0`


def tz_problem(value: str | None) -> str | None:
    """Why a $TZ value names no time zone this system knows (the C library would silently
    use UTC), or None when it is fine: unset or empty, a zone file, or a POSIX rule."""
    if not value:
        return None
    name = value[1:] if value.startswith(":") else value
    if _POSIX_TZ.match(name):
        return None
    path = name if name.startswith("/") else os.path.join(os.environ.get("TZDIR") or "/usr/share/zoneinfo", name)
    if name and os.path.isfile(path):
        return None
    return (f"TZ={value!r} is not a time zone this system knows (no {path}): unset TZ, or set it to an IANA name"
            " such as Europe/Berlin (on OpenWrt, install its zoneinfo-* package)")


def check_timezones(config: Config, env_tz: str | None) -> None:
    """Refuse, at start-up, a configured `timezone` that cannot be loaded and a $TZ that
    names no zone: either would otherwise surface later as a zone nobody typed."""
    problem = tz_problem(env_tz)
    if problem:
        raise ConfigError(problem)
    if config.timezone is not None:
        try:
            load_zone(config.timezone)
        except ScheduleError as exc:
            raise ConfigError(f"config `timezone`: {exc}") from None


def run_timezone(config: Config) -> str:
    """A run's TZ: the configured zone, else the daemon's own $TZ, else the device's zone
    (OpenWrt keeps a POSIX rule in /etc/TZ when it has no zone data), else UTC."""
    if config.timezone:
        return config.timezone
    env = os.environ.get("TZ", "")
    if env and tz_problem(env) is None:
        return env
    found = device_zone()
    if found:
        return found
    try:
        with open("/etc/TZ", encoding="utf-8", errors="replace") as f:
            rule = f.read(256).strip()
    except OSError:
        rule = ""
    return rule if rule and tz_problem(rule) is None else "UTC"


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
