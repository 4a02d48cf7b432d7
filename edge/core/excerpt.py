"""Turning the tail of a run's log into text an AI client may read: pure functions, no I/O.

Three steps, in order:
1. `window_text` decodes at most the last 4 KiB. When the window starts mid-log, its first
   line is dropped, as it may be cut (a secret's name may be cut off while its value is
   not); an incomplete UTF-8 sequence at the end is left out; the rest decodes with U+FFFD
   for invalid bytes.
2. `normalize`: CRLF → LF; C0 (except TAB and LF), DEL, C1, zero-width and bidi controls
   → U+FFFD, so the text cannot hide or reorder what a reader sees.
3. `redact` masks credentials and configured secret values (edge.core.redaction, the same
   rules the run-log sink applies); `injection_signals` flags text that tries to instruct
   whoever reads it.
Masking never lengthens the text: each masked span becomes `[REDACTED]` when it is at
least that long, else as many `*` as it has characters (at most three).
"""

from __future__ import annotations

import codecs
import re
from typing import NamedTuple

from edge.core.redaction import MASK, Masker, apply, merge, opaque

WINDOW_BYTES = 4096
__all__ = ["MASK", "WINDOW_BYTES", "Redacted", "injection_signals", "normalize", "opaque", "redact", "window_text"]

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_WHITESPACE = re.compile(rb"[ \t\r]")


class Window(NamedTuple):
    text: str
    start: int  # source byte offsets of what `text` was decoded from, end exclusive
    end: int


def window_text(data: bytes, start: int) -> Window:
    """Decode a window read at byte `start` of a log (`data` at most WINDOW_BYTES)."""
    if start > 0:
        cut = data.find(b"\n")
        if cut < 0:  # one unbroken line: drop through its first blank, else all of it
            blank = _WHITESPACE.search(data)
            cut = blank.start() if blank else len(data) - 1
        data, start = data[cut + 1 :], start + cut + 1
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])  # an incomplete character at the end: not ours to guess
    return Window(text, start, start + len(data) - pending)


def normalize(text: str) -> str:
    return _CONTROLS.sub("\ufffd", text.replace("\r\n", "\n"))


# -- redaction (the rules live in edge.core.redaction, shared with the run-log sink) ----


class Redacted(NamedTuple):
    text: str
    categories: list[str]  # sorted, each once
    replacements: int  # masked spans after overlapping ones were merged


def redact(text: str, secrets: list[str]) -> Redacted:
    """Mask every credential pattern and configured secret value in (normalized) `text`."""
    found = Masker(normalize(s) for s in secrets).spans(text)
    if not found:
        return Redacted(text, [], 0)
    merged = merge(found)
    return Redacted(apply(text, merged), sorted({c for _, _, c in found}), len(merged))


# -- prompt-injection signals -----------------------------------------------------

_SIGNALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("instruction_override", re.compile(
        r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:previous|prior|above|earlier|all|your|system"
        r"|safety)\b.{0,20}?\b(?:instructions?|prompts?|messages|rules|guidelines|directions|polic(?:y|ies))\b"
        r"|\bnew (?:instructions|rules)\s*:|\bfrom now on,? you\b")),
    ("role_impersonation", re.compile(
        r"(?m)^\s*(?:#+\s*)?(?:system|assistant|developer)(?: prompt)?\s*:"
        r"|<\|?(?:system|im_start|im_end|assistant)\|?>|\[/?(?:system|inst)\]"
        r"|\byou are now\b|\bact as (?:an? |the )?(?:admin|root|system|developer|assistant)\b"
        r"|\bi am (?:the|your) (?:system|administrator|developer|owner)\b")),
    ("secret_exfiltration", re.compile(
        r"\b(?:send|post|upload|exfiltrate|leak|reveal|print|show|output|email|paste|share|dump)\b.{0,60}?"
        r"\b(?:secrets?|passwords?|tokens?|credentials?|api[ _-]?keys?|private keys?|env(?:ironment)?"
        r" var(?:iable)?s?|ssh keys?)\b"
        r"|\b(?:curl|wget|nc)\b[^\n]{0,120}\$\{?[a-z_]*(?:token|secret|key|password)"
        r"|\bcat\s+\S*(?:\.ssh/|id_rsa|/etc/shadow|\.env\b)")),
    # An instruction to call a tool or run a destructive command, not a shell trace of one.
    ("tool_coercion", re.compile(
        r"\b(?:call|invoke|use)\s+(?:the\s+|this\s+)?(?:[\w.-]+\s+)?(?:tool|function)s?\b"
        r"|\b(?:qinglong|qledge)\.[a-z]+\.[a-z.]+|\btools/call\b|\bfunction_call\b"
        r"|\b(?:run|execute)\b.{0,30}?\b(?:rm\s+-\w*[rf]|sudo\b|curl\b[^\n]*\|\s*(?:ba)?sh\b|mkfs|dd\s+if=)"
        r"|\b(?:run|execute) (?:this|the following) (?:command|script|code)\b")),
)
_SQUASH = re.compile(r"\s+")


def injection_signals(text: str) -> list[str]:
    """Which kinds of instruction the text contains (heuristics; a hit means: do not obey)."""
    # U+FFFD is where a control used to be: gone, so "ig\u200bnore" still reads "ignore".
    lines = "\n".join(_SQUASH.sub(" ", line) for line in text.replace("\ufffd", "").split("\n")).lower()
    return [name for name, pattern in _SIGNALS if pattern.search(lines)]
