"""What `qledge serve` does first, before asyncio is imported: keep optional heavyweights
out of the daemon, and keep an early SIGHUP from killing it.

asyncio imports `ssl` only opportunistically; blocking it saves ~4.5 MiB RSS. Blocking
`_hashlib` makes hashlib/hmac, should anything import them, use CPython's builtin SHA-256
instead of mapping OpenSSL's libcrypto (~3.5 MiB); the daemon itself digests with the
builtin module directly (edge.core.auth). uvloop needs `ssl`, so it is only used when installed
(loop = "auto") or asked for (loop = "uvloop").
"""

from __future__ import annotations

import importlib.util
import signal
import sys

_hangups: list[int] = []


def choose_loop(setting: str) -> str:
    if setting == "asyncio":
        return "asyncio"
    if setting == "uvloop" or importlib.util.find_spec("uvloop") is not None:
        return "uvloop"
    return "asyncio"


def restrict_imports(loop: str) -> None:
    # msgspec prefers typing_extensions when it happens to be installed (test
    # environments pull it in); typing has all we use and costs nothing extra.
    if "msgspec" not in sys.modules:
        sys.modules.setdefault("typing_extensions", None)  # type: ignore[arg-type]
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
