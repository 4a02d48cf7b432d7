"""Constrained string types shared by every wire shape.

Constraints live in the types so that one msgspec decode both parses and validates,
and the error message names the offending field.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

# No C0 controls or DEL anywhere in an identifier or short label.
_NO_CONTROLS = r"^[^\x00-\x1f\x7f]+$"

MAX_NAME = 128
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The rules of Name and EnvName below, in words, for messages and --help.
NAME_RULE = f"1-{MAX_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit"
ENV_NAME_RULE = f"1-{MAX_NAME} letters, digits or '_', not starting with a digit"

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_CONTROLS)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_CONTROLS)]
# Names people type on the command line: task ids, secret names.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)]
# A user or group name as /etc/passwd and /etc/group spell them.
Account = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME, pattern=ENV_NAME_PATTERN)]
Limit = Annotated[int, msgspec.Meta(ge=1, le=64)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]

# What AI clients send: no C0/C1 controls, no zero-width or bidi controls, and numbers a
# JSON client can represent exactly.
MAX_SAFE_INT = 2**53 - 1
SAFE_TEXT = r"^[^\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]+$"
ReadId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=SAFE_TEXT)]
LongTaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=SAFE_TEXT)]
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=64)]
Millis = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
Revision = Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]


# C0 (except TAB and LF), DEL, C1, zero-width and bidi controls.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def normalize(text: str) -> str:
    """CRLF → LF, and every control above → U+FFFD: text that cannot hide or reorder what a
    reader sees (log excerpts, and names shown to AI clients)."""
    return _CONTROLS.sub("\ufffd", text.replace("\r\n", "\n"))


# -- values for people: the one way each kind is written in every human output --------------

TIME_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def moment(ms: int | None) -> str:
    """An instant for people, in the device's zone (the C library's: $TZ, else
    /etc/localtime) with its abbreviation: `2026-12-01 18:23:03 CET`; `-` when unknown.
    The CLI, the notifications and the daemon's log lines all write times this way."""
    import time

    if ms is None:
        return "-"
    return time.strftime(TIME_FORMAT, time.localtime(ms / 1000))


def duration_text(ms: float | None) -> str:
    """How long something took, for people: under a minute in tenths of a second (`0.4s`,
    `59.9s`), then minutes and seconds (`1m04s`), then hours and minutes (`2h05m`, `26h00m`);
    `-` when unknown. The CLI, the notifications and the log lines all write durations this
    way (the panel's format.js follows the same rule)."""
    if ms is None:
        return "-"
    tenths = int((max(0.0, ms) + 50) // 100)  # half up, as the panel's Math.round
    if tenths < 600:
        return f"{tenths / 10:.1f}s"
    seconds = max(60, int(ms // 1000))  # 59.96 s rounds up to a minute, not to 0m59s
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
