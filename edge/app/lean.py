"""What `qledge serve` does first, before asyncio is imported: keep optional heavyweights
out of the daemon, and keep an early SIGHUP from killing it.

asyncio imports `ssl` only opportunistically; blocking it saves ~4.5 MiB RSS. Blocking
`_hashlib` makes hashlib/hmac, should anything import them, use CPython's builtin SHA-256
instead of mapping OpenSSL's libcrypto (~3.5 MiB); the daemon itself digests with the
builtin module directly (edge.core.auth). uvloop needs `ssl`, so it is only used when installed
(loop = "auto") or asked for (loop = "uvloop").

msgspec's package imports every submodule it has; the daemon speaks msgpack and stores some
JSON, and idle needs neither `msgspec.inspect` (forty-odd Structs describing types), the JSON
Schema maker that imports it, nor toml and yaml: ~0.22 MiB RSS, loaded at first use instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
from types import ModuleType

_hangups: list[int] = []


def choose_loop(setting: str) -> str:
    if setting == "asyncio":
        return "asyncio"
    if setting == "uvloop" or importlib.util.find_spec("uvloop") is not None:
        return "uvloop"
    return "asyncio"


# Submodules of msgspec reached as attributes of the package (msgspec.inspect …) on first use.
_LATER = ("inspect", "toml", "yaml")
_SCHEMA = "msgspec._json_schema"


def import_msgspec() -> None:
    """Import msgspec without the submodules the daemon does not need while idle (see above);
    before anything else imports it. `msgspec.json` itself stays: the stores use it. Its
    `schema` and `schema_components` load the real JSON Schema module when first called."""
    if "msgspec" in sys.modules:
        return
    # msgspec prefers typing_extensions when it happens to be installed (test environments
    # pull it in); typing has all we use and costs nothing extra. Kept out for msgspec's
    # import only: what needs it later (psycopg, for cluster mode) still gets it.
    kept_out = "typing_extensions" not in sys.modules
    if kept_out:
        sys.modules["typing_extensions"] = None  # type: ignore[assignment]
    stand_ins = {f"msgspec.{name}": ModuleType(f"msgspec.{name}") for name in _LATER}
    stand_ins[_SCHEMA] = schema = ModuleType(_SCHEMA)
    schema.schema = _schema_call("schema")  # type: ignore[attr-defined]
    schema.schema_components = _schema_call("schema_components")  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        import msgspec
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        if kept_out and sys.modules.get("typing_extensions", ...) is None:
            del sys.modules["typing_extensions"]
    for name in _LATER:
        if msgspec.__dict__.get(name) is stand_ins.get(f"msgspec.{name}"):
            del msgspec.__dict__[name]
    vars(msgspec)["__getattr__"] = _submodule  # PEP 562: asked only for a name the package lacks


def _submodule(name: str) -> ModuleType:
    if name in _LATER:
        return importlib.import_module(f"msgspec.{name}")  # also binds it on the package
    raise AttributeError(f"module 'msgspec' has no attribute {name!r}")


def _schema_call(name: str) -> object:
    def call(*args: object, **kwargs: object) -> object:
        return getattr(importlib.import_module(_SCHEMA), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def restrict_imports(loop: str) -> None:
    if "hashlib" not in sys.modules and "hmac" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]
    if loop == "asyncio" and "asyncio" not in sys.modules:
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]


def defer_hangups() -> None:
    """Until the daemon is ready, a SIGHUP is remembered instead of ending the process
    (OpenWrt's `reload` sends one right after `start`); the daemon reloads once ready."""
    if signal.getsignal(signal.SIGHUP) is not _remember:
        signal.signal(signal.SIGHUP, _remember)


def _remember(signum: int, frame: object) -> None:
    _hangups.append(signum)


def hangups_deferred() -> bool:
    return bool(_hangups)
