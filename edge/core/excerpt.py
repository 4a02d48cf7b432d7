"""Turning the tail of a run's log into text an AI client may read: pure functions, no I/O.

Three steps, in order:
1. `window_text` decodes at most the last 4 KiB. When the window starts mid-log, its first
   line is dropped, as it may be cut (a secret's name may be cut off while its value is
   not); an incomplete UTF-8 sequence at the end is left out; the rest decodes with U+FFFD
   for invalid bytes.
2. `normalize` (edge.core.text): CRLF → LF; C0 (except TAB and LF), DEL, C1, zero-width and bidi controls
   → U+FFFD, so the text cannot hide or reorder what a reader sees.
3. `redact` masks credentials and configured secret values; `injection_signals` flags
   text that tries to instruct whoever reads it.
Masking never lengthens the text: each masked span becomes `[REDACTED]` when it is at
least that long, else as many `*` as it has characters (at most three).
"""

from __future__ import annotations

import codecs
import functools
import math
import re
from collections import Counter
from typing import NamedTuple

from edge.core.text import normalize

WINDOW_BYTES = 4096
MASK = "[REDACTED]"

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


# -- redaction --------------------------------------------------------------------

_KEY_WORDS = (
    r"password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|accountkey"
    r"|private[_-]?key|client[_-]?secret|credentials?|auth[_-]?key|session[_-]?id"
)
_PEM_BEGIN = r"-----BEGIN[^\n-]*PRIVATE KEY[^\n-]*-----"
_PEM_END = r"-----END[^\n-]*PRIVATE KEY[^\n-]*-----"
_TOKEN_CHARS = r"A-Za-z0-9+/_=-"

# (category, pattern, flags); the named group `v`, when present, is the part that is masked.
# Compiled on first use (`_rules`): a daemon that never serves an excerpt does not keep
# their compiled programs (about 0.2 MiB with the signals below).
_RULE_SOURCES: tuple[tuple[str, str, int], ...] = (
    ("private_key", _PEM_BEGIN + r".*?" + _PEM_END, re.S),
    # A key cut by the window's end (no END after BEGIN) ...
    ("private_key", _PEM_BEGIN + r"(?:(?!-----END).)*\Z", re.S),
    # ... or by its start: the base64 lines before an END marker.
    ("private_key", r"(?:^[A-Za-z0-9+/=]{8,}[ \t]*\n)*^[^\n]*" + _PEM_END, re.M),
    ("authorization", r"(?i)\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*(?P<v>[^\n]+)", 0),
    ("authorization",
     r"(?i)\b(?:x-api-key|x-auth-token|x-access-token|cookie|set-cookie)[\"']?\s*:\s*(?P<v>[^\n]+)", 0),
    ("authorization", r"(?i)\bbearer\s+(?P<v>(?=[^\s]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,})", 0),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", 0),
    ("url_userinfo", r"(?i)\b[a-z][a-z0-9+.-]*://(?P<v>[^/\s@]+)@", 0),
    ("cloud_access_key",
     r"\b(?:(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}"
     r"|AIza[0-9A-Za-z_-]{35}|LTAI[0-9A-Za-z]{12,20})\b", 0),
    ("credential_assignment",
     r"(?i)(?<![A-Za-z0-9])[\"']?[A-Za-z0-9_.-]{0,40}(?:" + _KEY_WORDS + r")[A-Za-z0-9_.-]{0,40}[\"']?"
     r"\s*(?:=|:)\s*(?P<v>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&]+)", 0),
    ("credential_assignment",
     r"(?i)--(?:password|passwd|token|secret|api-key|apikey|access-key)(?:=|\s+)(?P<v>[^\s\"']+)", 0),
    ("opaque_token",
     r"\b(?:qle_[A-Za-z0-9]+_[A-Za-z0-9]+|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
     r"|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|npm_[A-Za-z0-9]{30,})", 0),
)
_LONG_RUN = rf"(?<![{_TOKEN_CHARS}])[{_TOKEN_CHARS}]{{32,}}(?![{_TOKEN_CHARS}])"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PARTIAL_SECRET_MIN = 4  # a secret cut by the window's end is masked from this many characters on


def _entropy(token: str) -> float:
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in Counter(token).values())


@functools.cache
def _rules() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((category, re.compile(source, flags)) for category, source, flags in _RULE_SOURCES)


@functools.cache
def _compiled(source: str) -> re.Pattern[str]:
    return re.compile(source)


def opaque(token: str) -> bool:
    """A long run of token characters that looks random rather than like a word, path or UUID."""
    if _compiled(_UUID).fullmatch(token) or token.startswith("/") or token.count("/") > 2:
        return False
    digits = sum(c.isdigit() for c in token)
    letters = sum(c.isalpha() for c in token)
    return digits >= 2 and letters >= 2 and _entropy(token) >= 3.5


class Redacted(NamedTuple):
    text: str
    categories: list[str]  # sorted, each once
    replacements: int  # masked spans after overlapping ones were merged


def _mask(length: int) -> str:
    return MASK if length >= len(MASK) else "*" * min(length, 3)


def _secret_spans(text: str, secrets: list[str]) -> list[tuple[int, int]]:
    spans = []
    for secret in secrets:
        at = text.find(secret)
        while at >= 0:
            spans.append((at, at + len(secret)))
            at = text.find(secret, at + 1)
        # A secret still being written when the window was read: mask the prefix at the end.
        for size in range(len(secret) - 1, min(_PARTIAL_SECRET_MIN, len(secret)) - 1, -1):
            if text.endswith(secret[:size]):
                spans.append((len(text) - size, len(text)))
                break
    return spans


def redact(text: str, secrets: list[str]) -> Redacted:
    """Mask every credential pattern and configured secret value in (normalized) `text`."""
    found: list[tuple[int, int, str]] = []
    values = sorted({normalize(s) for s in secrets if s}, key=len, reverse=True)
    found += [(a, b, "configured_secret") for a, b in _secret_spans(text, values)]
    for category, rule in _rules():
        for match in rule.finditer(text):
            group = "v" if "v" in rule.groupindex else 0
            if match.end(group) > match.start(group):
                found.append((match.start(group), match.end(group), category))
    found += [(m.start(), m.end(), "opaque_token") for m in _compiled(_LONG_RUN).finditer(text) if opaque(m.group())]
    if not found:
        return Redacted(text, [], 0)
    found.sort()
    merged: list[list[int]] = []
    for a, b, _ in found:
        if merged and a < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    parts, at = [], 0
    for a, b in merged:
        parts += [text[at:a], _mask(b - a)]
        at = b
    parts.append(text[at:])
    return Redacted("".join(parts), sorted({c for _, _, c in found}), len(merged))


# -- prompt-injection signals -----------------------------------------------------

_SIGNAL_SOURCES: tuple[tuple[str, str], ...] = (
    ("instruction_override", (
        r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:previous|prior|above|earlier|all|your|system"
        r"|safety)\b.{0,20}?\b(?:instructions?|prompts?|messages|rules|guidelines|directions|polic(?:y|ies))\b"
        r"|\bnew (?:instructions|rules)\s*:|\bfrom now on,? you\b")),
    ("role_impersonation", (
        r"(?m)^\s*(?:#+\s*)?(?:system|assistant|developer)(?: prompt)?\s*:"
        r"|<\|?(?:system|im_start|im_end|assistant)\|?>|\[/?(?:system|inst)\]"
        r"|\byou are now\b|\bact as (?:an? |the )?(?:admin|root|system|developer|assistant)\b"
        r"|\bi am (?:the|your) (?:system|administrator|developer|owner)\b")),
    ("secret_exfiltration", (
        r"\b(?:send|post|upload|exfiltrate|leak|reveal|print|show|output|email|paste|share|dump)\b.{0,60}?"
        r"\b(?:secrets?|passwords?|tokens?|credentials?|api[ _-]?keys?|private keys?|env(?:ironment)?"
        r" var(?:iable)?s?|ssh keys?)\b"
        r"|\b(?:curl|wget|nc)\b[^\n]{0,120}\$\{?[a-z_]*(?:token|secret|key|password)"
        r"|\bcat\s+\S*(?:\.ssh/|id_rsa|/etc/shadow|\.env\b)")),
    # An instruction to call a tool or run a destructive command, not a shell trace of one.
    ("tool_coercion", (
        r"\b(?:call|invoke|use)\s+(?:the\s+|this\s+)?(?:[\w.-]+\s+)?(?:tool|function)s?\b"
        r"|\b(?:qinglong|qledge)\.[a-z]+\.[a-z.]+|\btools/call\b|\bfunction_call\b"
        r"|\b(?:run|execute)\b.{0,30}?\b(?:rm\s+-\w*[rf]|sudo\b|curl\b[^\n]*\|\s*(?:ba)?sh\b|mkfs|dd\s+if=)"
        r"|\b(?:run|execute) (?:this|the following) (?:command|script|code)\b")),
)
_SQUASH = r"\s+"


def injection_signals(text: str) -> list[str]:
    """Which kinds of instruction the text contains (heuristics; a hit means: do not obey)."""
    # U+FFFD is where a control used to be: gone, so "ig\u200bnore" still reads "ignore".
    lines = "\n".join(_compiled(_SQUASH).sub(" ", line) for line in text.replace("\ufffd", "").split("\n")).lower()
    return [name for name, source in _SIGNAL_SOURCES if _compiled(source).search(lines)]
