"""Wire shapes of the tool protocol: 4-byte big-endian length, then a msgpack body.

Request `{id, tool, args, token?, transport?}` → response `{id, ok, result | error{code, message}}`.
`transport` is the client's own label for the audit (`web`: the panel's calls on behalf of a
signed-in user); without it the call is recorded as the socket's.
Shared by the daemon and the CLI client; one encoder and decoder each, built once.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

DEFAULT_MAX_FRAME = 256 * 1024
HEADER_BYTES = 4

RequestId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | Annotated[str, msgspec.Meta(max_length=128)]
_EMPTY_MAP = msgspec.Raw(b"\x80")


_TOOL_PATTERN = r"^[^\x00-\x1f\x7f]+$"
_TOOL_RE = re.compile(_TOOL_PATTERN)
# What the decoder said of a tool name with a control character in it, when it checked.
TOOL_REFUSED = f"Expected `str` matching regex {_TOOL_PATTERN!r} - at `$.tool`"


class Request(msgspec.Struct, forbid_unknown_fields=True):
    id: RequestId
    # No control characters (`tool_name_ok`): checked after decoding, where a name that is
    # printable ASCII needs no regular expression (the decoder's check ran one per request).
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    args: msgspec.Raw = _EMPTY_MAP
    token: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    transport: Literal["web"] | None = None


class ErrorBody(msgspec.Struct):
    code: str
    message: str


class Response(msgspec.Struct, omit_defaults=True):
    id: RequestId | None
    ok: bool
    result: msgspec.Raw = msgspec.Raw()  # empty when ok is false
    error: ErrorBody | None = None


class _IdOnly(msgspec.Struct):
    """Used to salvage the id of a request that failed validation."""

    id: RequestId | None = None


encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
response_decoder = msgspec.msgpack.Decoder(Response)
_id_decoder = msgspec.msgpack.Decoder(_IdOnly)


def tool_name_ok(tool: str) -> bool:
    """No control character in it (`_TOOL_PATTERN`)."""
    return (tool.isascii() and tool.isprintable()) or _TOOL_RE.match(tool) is not None


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def salvage_id(body: bytes) -> int | str | None:
    try:
        return _id_decoder.decode(body).id
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def error_frame(request_id: int | str | None, code: str, message: str) -> bytes:
    return frame(encoder.encode(Response(id=request_id, ok=False, error=ErrorBody(code, message))))


def result_frame(request_id: int | str, result: object) -> bytes:
    return frame(encoder.encode(Response(id=request_id, ok=True, result=msgspec.Raw(encoder.encode(result)))))
