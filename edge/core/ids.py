"""Time-sortable identifiers (UUIDv7 text), credential tokens, SHA-256 digests and the
jitter's random fraction.

The digests use CPython's own SHA-256 module directly (the one hashlib falls back to
without OpenSSL, which the daemon never maps): hashlib, hmac, secrets and random would
load and map their other hash, base64 and zlib modules, about 0.4 MiB of the daemon's
memory for nothing it uses."""

from __future__ import annotations

import importlib
import os
import threading
import time
from _operator import _compare_digest
from collections.abc import Callable
from typing import Protocol, cast


class _Hash(Protocol):
    def digest(self) -> bytes: ...
    def hexdigest(self) -> str: ...


def _builtin_sha256() -> Callable[[bytes], _Hash]:
    for name in ("_sha2", "_sha256"):  # CPython 3.12 and later, 3.11
        try:
            return cast(Callable[[bytes], _Hash], importlib.import_module(name).sha256)
        except (ImportError, AttributeError):
            continue
    import hashlib  # another interpreter: the usual way

    return hashlib.sha256


sha256 = _builtin_sha256()


def digests_equal(a: bytes, b: bytes) -> bool:
    """In constant time, as hmac.compare_digest (which is this without OpenSSL)."""
    return _compare_digest(a, b)


_BLOCK = 64  # SHA-256's block size
_INNER = bytes(b ^ 0x36 for b in range(256))
_OUTER = bytes(b ^ 0x5C for b in range(256))


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104), as hmac.new(key, message, hashlib.sha256).digest()."""
    if len(key) > _BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = sha256(key.translate(_INNER) + message).digest()
    return sha256(key.translate(_OUTER) + inner).digest()


def token_hex(nbytes: int) -> str:
    """As secrets.token_hex: `nbytes` from the kernel's CSPRNG, as hex."""
    return os.urandom(nbytes).hex()


def random_fraction() -> float:
    """A uniform float in [0, 1) from 53 random bits, as random.random() (for jitter)."""
    return (int.from_bytes(os.urandom(7), "big") >> 3) / (1 << 53)

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def uuid7(now_ms: int | None = None) -> str:
    """A UUIDv7 string; ids made in this process are strictly increasing.

    Within one millisecond the 12-bit ``rand_a`` field counts up, so two ids made
    back to back still sort in creation order (run lists break ties on id).
    """
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                ms += 1
                _seq = 0
        else:
            _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave headroom to count
        _last_ms = ms
        seq = _seq
    return _uuid7_text(ms, seq, int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1))


def uuid7_named(ms: int, name: str) -> str:
    """The UUIDv7 of `name` at `ms`: the same name and time always give the same id, so an
    id can itself be the key that makes a repeat impossible (a fire's run). Its 74 bits
    beside the time are SHA-256 of the name: two names collide with odds of 2^-74 within
    one millisecond."""
    bits = int.from_bytes(sha256(name.encode()).digest()[:10], "big")  # 80 bits: 12 for rand_a, 62 for rand_b
    return _uuid7_text(ms, bits >> 68, bits & ((1 << 62) - 1))


def _uuid7_text(ms: int, rand_a: int, rand_b: int) -> str:
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
