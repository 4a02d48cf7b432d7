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
