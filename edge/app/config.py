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


class ConfigError(Exception):
    """One clear line naming the problem."""


def _explain(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    where = ""
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
