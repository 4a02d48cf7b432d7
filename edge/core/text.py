"""Constrained string types shared by every wire shape.

Constraints live in the types so that one msgspec decode both parses and validates,
and the error message names the offending field.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# No C0 controls or DEL anywhere in an identifier or short label.
_NO_CONTROLS = r"^[^\x00-\x1f\x7f]+$"

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_CONTROLS)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_CONTROLS)]
# Names people type on the command line: task ids, secret names.
Name = Annotated[
    str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Limit = Annotated[int, msgspec.Meta(ge=1, le=64)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
