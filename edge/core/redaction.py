r"""Masking credentials and configured secret values in program output: pure functions, no
I/O, shared by the run-log sink (what reaches the log file), the AI log excerpt and the
evidence history.

Two kinds of match, each reported by category:
- credential patterns, line by line: assignments (`password=`, `DB_PASS=`, `密码：`,
  `passwort:`, OpenWrt UCI `option key '…'` and `uci show`'s `….key='…'`), command-line
  passwords (`mysql -p…`, `sshpass -p`, `redis-cli -a`, `curl -u`), `password <value>` and
  `.netrc` lines, authorization headers and `Basic`/`Bearer` credentials on their own,
  private keys, URL userinfo (with or without a scheme), webhook URLs, well-known token
  formats (Discord's, AWS secret keys and hex API keys among them) and long random-looking
  strings. An assignment whose value says it is none (`(hidden)`, `off`, `***PW***`,
  `[PASSWORD]`, `$TOKEN`), names a file (`key '/etc/uhttpd.key'`), is prose
  (`token: expired, …`) or code (`token = login(…)`), or whose name is a path
  (`…/dropbear_rsa_host_key: Permission denied`) or a public key, is left alone; so are
  digests and ids (hex, `SHA256:` fingerprints, ssh public keys, request ids);
- configured secret values in every form a shell pipeline gives them: as they are, any
  mix of percent-encoded and plain characters (either case, `+` for space), backslash and
  JSON escapes (`\"`, `\/`, `\u0026`), hex, base64 (alone, unpadded, URL-safe, or inside a
  longer base64 string, as in Basic auth: the whole string is masked), reversed, in
  another letter case, and across ANSI colour codes, zero-width characters and line
  breaks. A value shorter than `SHORT_SECRET` is masked only as a whole token (and in its
  exact case), so where it is masked does not tell it (`abc` never turns `abcdef…` into
  `***def…`).

Matching runs on a skeleton of the text with that noise taken out; each match is mapped
back and the original span, noise included, is masked. A mask never lengthens the text: a
span becomes `[REDACTED]` when it is at least that long, else as many `*` as it has
characters (at most three).

Every rule for credentials nobody configured has a name (`heuristic_names`), and
`Masker(skip=…)` leaves some out: none may cost more benign lines than it saves secret
ones on the corpora in tests/data (tests/test_redaction_corpus.py).
"""

from __future__ import annotations

import binascii
import bisect
import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import NamedTuple

MASK = "[REDACTED]"
SHORT_SECRET = 8  # configured values shorter than this are masked only as whole tokens
PARTIAL_SECRET_MIN = 4  # a secret cut by the end of the text is masked from this many characters on
_BASE64_CORE_MIN = 8  # shorter cores of a base64-embedded secret would match too much

# Terminal escapes (raw, or as normalized text shows them: ESC became U+FFFD), invisible
# characters, and U+FFFD where normalization put one in place of a control.
_INLINE_NOISE = (
    r"(?:\x1b|\ufffd)(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]{0,256}(?:\x07|\x1b\\))"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u00ad\u200b-\u200f\u2060-\u2064\ufeff\ufffd]"
)
_LINE_NOISE = re.compile(_INLINE_NOISE)
_JOINED_NOISE = re.compile(_INLINE_NOISE + r"|\r\n|[\r\n]")

_KEY_WORDS = (
    r"password|passwd|passphrase|passwort|kennwort|contrase(?:ñ|n)a|[пП]ароль|pwd|secret|token|api[_-]?key|apikey"
    r"|access[_-]?key|accountkey|private[_-]?key|preshared[_-]?key|client[_-]?secret|credentials?|auth[_-]?key"
    r"|session[_-]?id|cookie|密码|口令|密钥|秘钥|令牌"
)
# Short words that name a secret only as a whole name or its last part (`DB_PASS`, `pt_key`).
_WEAK_WORDS = r"pass|pw|psk|key|sig|sign"
_SEP = r"[ \t]*(?:=>?|:|：|＝)[ \t]*"
_VALUE = r"(?P<v>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&]+)"
_QUOTED_OR_WORD = r"(?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)"
_PEM_BEGIN = r"-{3,}[ \t]*BEGIN[^\n-]*PRIVATE[ \t]+KEY[^\n-]*-{3,}"
_PEM_END = r"-{3,}[ \t]*END[^\n-]*PRIVATE[ \t]+KEY[^\n-]*-{3,}"
_TOKEN_CHARS = r"A-Za-z0-9+/_=-"
# What follows a secret's name in prose or in an error rather than a value.
_PROSE_WORDS = (
    r"is|was|for|of|to|the|a|an|and|or|not|no|incorrect|invalid|changed|change|required|expired|expires|wrong"
    r"|failed|failure|authentication|auth|must|should|has|have|will|can|cannot|could|policy|reset|too|length"
    r"|mismatch|updated|update|accepted|denied|rejected|protected|prompt|login|manager|hash|file|field|from|with"
    r"|set|saved|stored|here|please|again|successfully|ok|okay|none|empty|missing|needed|given|provided|entered"
    r"|sent|attempt|attempts|permission|error|unknown|unavailable|unauthorized|forbidden|refused|revoked|found"
    r"|exists|check|checking|verification|verified|valid|request|requested|refresh|refreshing|renew|expiry"
    r"|timeout|timed|cleared|removed|deleted|disabled|enabled|used|using|already|now|yet|unset|blank|too_short"
    r"|access_denied|unsupported"
)
_PROSE = r"(?:" + _PROSE_WORDS + r")\b"
# A value that says there is none, or stands for one: masking it hides nothing.
_NO_VALUE = re.compile(
    r"|\*+(?:[A-Za-z]+\*+)?|\[[A-Za-z_ -]*\]|<[^<>\s]{0,40}>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%"
    r"|\((?:hidden|none|null|redacted|not set|unset|empty|masked)\)|x{3,}|\.{3,}|…"
    r"|on|off|yes|no|true|false|none|null|nil|undefined|n/a|\d",
    re.I)


def _placeholder(value: str) -> bool:
    """A value that stands for none (`(hidden)`, `***PW***`, `$TOKEN`). What a mask of ours
    left (`[REDACTED]`, `***`) still counts as masked: masking it again changes nothing
    and keeps its category in the report."""
    return value not in (MASK, MASK.lower(), "***", "**", "*") and _NO_VALUE.fullmatch(value) is not None


_PROSE_VALUE = re.compile(r"(?:" + _PROSE_WORDS + r")(?:\b|_)", re.I)
_CODE_VALUE = re.compile(r"[A-Za-z_][\w.]*[(\[]|[(\[{]")

@functools.cache
def _keys() -> tuple[re.Pattern[str], ...]:
    """Compiled on first use: a daemon that runs nothing does not hold them."""
    return (
        re.compile(_PEM_BEGIN + r".*?" + _PEM_END, re.S),
        # A key cut by the end of the text (no END after BEGIN); for one cut by its start, see _backwards.
        re.compile(_PEM_BEGIN + r"(?:(?!-{3,}[ \t]*END).)*\Z", re.S),
    )


class Rule(NamedTuple):
    """A pattern, the category its matches count in, and what must precede a match: rules
    run over whole logs, so each starts with a literal (a fast search) and the character
    before it is checked here rather than by a look-behind (which would make it slow).
    `name` identifies the rule (`Masker(skip=…)`); `check`, when set, is asked of each
    match (the subject it was found in, the match) whether it really holds a credential."""

    category: str
    pattern: re.Pattern[str]
    after: str = ""  # "word": not after a letter, digit or _; "alnum": not after a letter or digit;
    #                  "digit": after a digit; "space": at a line's start or after white space
    name: str = ""
    check: Callable[[str, re.Match[str]], bool] | None = None


def _rule(category: str, pattern: str, after: str = "", name: str = "",
          check: Callable[[str, re.Match[str]], bool] | None = None) -> Rule:
    return Rule(category, re.compile(pattern), after, name, check)


# -- what a match must also show to count -----------------------------------------------


def _value(match: re.Match[str]) -> tuple[str, bool]:
    group = next((g for g in _VALUE_GROUPS if g in match.re.groupindex and match.start(g) >= 0), None)
    text = match.group(group) if group else match.group()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1], True
    return text, False


def _a_value(subject: str, match: re.Match[str]) -> bool:
    """The value is a credential: not a placeholder, a path, prose or code."""
    value, quoted = _value(match)
    if not quoted:
        value = value.rstrip(").,:;!?")
    if _placeholder(value.strip()) or value.startswith(("/", "~/", "./")):
        return False
    return quoted or not (_PROSE_VALUE.match(value) or _CODE_VALUE.match(value))


def _assigned(subject: str, match: re.Match[str]) -> bool:
    """An assignment of a credential (`_a_value`) to a name that is neither a file's
    (`/etc/dropbear/dropbear_rsa_host_key: …`) nor a public key's."""
    if not _a_value(subject, match):
        return False
    start = match.start()
    line_start = subject.rfind("\n", 0, start) + 1
    name_start = max(subject.rfind(c, line_start, start) for c in " \t\"'=(,") + 1
    if "/" in subject[max(name_start, line_start):start]:
        return False
    return not re.search(r"public[ _-]?$|pub[ _-]?$", subject[max(line_start, start - 8):start])


def _prose_word(subject: str, match: re.Match[str]) -> bool:
    """The value is a word of letters only with more text after it on its line: English
    around the key word ("password pair", "passphrase supplied in …") rather than a value."""
    end = subject.find("\n", match.end("v"))
    rest = subject[match.end("v"):end if end >= 0 else len(subject)]
    return match.group("v").isalpha() and bool(rest.strip())


def _credential(subject: str, match: re.Match[str]) -> bool:
    """A header's value holds a credential: its scheme is followed by more than a placeholder;
    a header quoted on a command line ends at its closing quote."""
    value = match.group("v")
    quote = subject[match.start() - 1] if match.start() > 0 else ""
    if quote and quote in "'\"" and quote in value:
        value = value[: value.index(quote)]
    words = value.split()
    secret = words[-1] if words else ""
    return not (_placeholder(secret) or (len(words) == 1 and words[0] in ("basic", "bearer", "digest")))


def _header_span(subject: str, match: re.Match[str]) -> tuple[int, int]:
    start, end = match.span("v")
    quote = subject[match.start() - 1] if match.start() > 0 else ""
    if quote and quote in "'\"":
        cut = subject.find(quote, start, end)
        if cut >= 0:
            end = cut
    return start, end


def _basic(subject: str, match: re.Match[str]) -> bool:
    """`Basic <base64>` without its header: masked when it decodes to `user:password`."""
    raw = match.group("v")
    try:
        decoded = binascii.a2b_base64(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        return False
    text = decoded.decode("utf-8", "replace")
    return ":" in text and text.isprintable() and "\ufffd" not in text


_KEY_TYPES = re.compile(r"(?:rsa|dsa|ecdsa|eddsa|ed25519|gpg|pgp|host|public|signing|session|fingerprint)[ \t]+$")


def _hex_key(subject: str, match: re.Match[str]) -> bool:
    """`api key 5f2b…`: not a key's type and id (`using RSA key 3C2A…`, gpg's fingerprints)."""
    line_start = subject.rfind("\n", 0, match.start()) + 1
    return not _KEY_TYPES.search(subject, line_start, match.start())


def _discord(text: str, tail: re.Match[str]) -> tuple[int, int] | None:
    """The span of a Discord token ending in `tail`: its id, before it, is a number in base64."""
    head = _DISCORD_ID.search(text, max(0, tail.start() - 28), tail.start())
    if head is None:
        return None
    try:
        ok = binascii.a2b_base64(head.group() + "=" * (-len(head.group()) % 4)).isdigit()
    except (binascii.Error, ValueError):
        return None
    return (head.start(), tail.end()) if ok else None


# The named group `v` (or v2…), when present, is the part that is masked. These apply
# within a line, to the text in lower case (so each is a case-sensitive search), and only
# to lines holding one of `_TRIGGERS`: a log is mostly lines none of them could match.
@functools.cache
def rules() -> tuple[Rule, ...]:
    """The rules, compiled on first use."""
    return (
        _rule("authorization", r"(?:proxy-authorization|authorization)\b[\"']?\s*[:=]\s*(?P<v>[^\n]+)", "word",
              "authorization_header", _credential),
        _rule("authorization", r"(?:x-api-key|x-auth-token|x-access-token|cookie|set-cookie)[\"']?\s*:\s*(?P<v>[^\n]+)",
              "word", "token_header", _credential),
        _rule("authorization", r"bearer\s+(?P<v>(?=[^\s]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,})", "word", "bearer",
              lambda s, m: not _placeholder(m.group("v"))),
        # An all-letters token: longer than the words that follow "bearer" in prose.
        _rule("authorization", r"bearer\s+(?P<v>[a-z]{16,})(?![A-Za-z0-9._~+/=-])", "word", "bearer_letters"),
        # scheme://user:password@ (a password may hold a slash), scheme://token@
        _rule("url_userinfo", r"://(?P<v>[^\s/@:]*:(?!\d+/)[^\s@]*|[^\s/@:]+)@(?=[\w\[])", "", "url_userinfo"),
        _rule("webhook",
              r"(?:hooks\.slack\.com/(?:services|workflows|triggers)/|discord(?:app)?\.com/api/webhooks/"
              r"|open\.(?:feishu\.cn|larksuite\.com)/open-apis/bot/v2/hook/|api\.day\.app/|sctapi\.ftqq\.com/"
              r"|api\.telegram\.org/bot)(?P<v>[A-Za-z0-9:._/-]{8,})", "", "webhook"),
        _rule("credential_assignment",  # a query parameter that carries a secret
              r"[?&](?:key|access_token|token|sign|signature|sig|secret|sendkey|apikey|api_key|auth|password|pwd"
              r"|pass)=(?P<v>[^\s&#\"'<>]{4,})", "", "query_secret", _a_value),
        _rule("credential_assignment",  # the key word anywhere in the name: DB_PASSWORD=, "api_key": …
              r"(?:" + _KEY_WORDS + r")[A-Za-z0-9_.-]{0,40}[\"']?" + _SEP + _VALUE, "", "assignment", _assigned),
        _rule("credential_assignment",  # DB_PASS=, pass=, pw:, wifi.psk=, pt_key=, uci show's ….key='…'
              r"(?:" + _WEAK_WORDS + r")[\"']?(?![A-Za-z0-9])" + _SEP
              + r"(?P<v>\"[^\"\n]{4,}\"|'[^'\n]{4,}'|[^\s\"',;&]{4,})", "alnum", "short_name_assignment", _assigned),
        _rule("credential_assignment",  # OpenWrt UCI: option key 'hunter2', list password …
              r"(?:option|list)[ \t]+[\"']?\w*(?:key|password|passwd|pass|psk|secret|token|pwd)[\"']?[ \t]+"
              + _QUOTED_OR_WORD, "space", "uci_option", _assigned),
        _rule("credential_assignment",
              r"--(?:password|passwd|pass|token|secret|api-key|apikey|access-key|auth-token)(?:=|\s+)(?P<v>[^\s\"']+)",
              "", "password_flag", _assigned),
        _rule("credential_assignment",  # passwords on command lines
              r"(?:mysql(?:dump|admin|sh)?\b[^\n]*?\s-p(?P<v>[^\s'\"]+|'[^'\n]*'|\"[^\"\n]*\")"
              r"|sshpass\b[^\n]*?\s-p\s*(?P<v2>'[^'\n]*'|\"[^\"\n]*\"|\S+)"
              r"|redis-cli\b[^\n]*?\s-a\s+(?P<v3>\S+)"
              r"|(?:curl|wget)\b[^\n]*?\s(?:-u|--user)\s*(?P<v4>[^\s:]+:\S+))", "word", "command_password"),
        # password hunter2, .netrc: machine h login u password p. A word of letters there is
        # prose ("password pair", "passphrase supplied in …"), unless the line ends with it.
        _rule("credential_assignment",
              r"(?:password|passwd|passphrase|passwort|kennwort)[ \t]+(?!" + _PROSE + r")(?P<v>[^\s'\"]{4,})", "word",
              "password_word", lambda s, m: _assigned(s, m) and not _prose_word(s, m)),
        # An API key or token in hex after its name and a space: `api key 5f2b9c0e1a3d4b6c7e8f9a0b`.
        _rule("opaque_token", r"(?:api[ _-]?key|apikey|key|token|secret)[ \t]+(?P<v>[0-9a-f]{24,})(?![0-9a-z])",
              "alnum", "hex_key", _hex_key),
        _rule("opaque_token",
              r"(?:qle_r?[0-9a-f]{12,20}_[0-9a-f]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
              r"|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}"
              r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}|whsec_[A-Za-z0-9]{16,}|npm_[A-Za-z0-9]{30,}"
              r"|hf_[A-Za-z0-9]{30,}|sg\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"
              r"|dop_v1_[a-f0-9]{64}|pypi-age[A-Za-z0-9_-]{50,}|tskey-[A-Za-z0-9-]{20,}|ya29\.[A-Za-z0-9_-]{20,}"
              r"|key-[0-9a-z]{32}|sct\d{3,}t[A-Za-z0-9]{10,})", "word", "token_format"),
        _rule("opaque_token", r":aa[a-z0-9_-]{30,}", "digit", "telegram_token"),  # a Telegram bot token's secret half
    )
# Formats whose case is part of them: looked for in the text as it is.
@functools.cache
def exact_rules() -> tuple[Rule, ...]:
    """The case-sensitive rules, compiled on first use."""
    return (
        _rule("cloud_access_key",
              r"(?:(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}"
              r"|AIza[0-9A-Za-z_-]{35}|LTAI[0-9A-Za-z]{12,20})\b", "word", "cloud_key_id"),
        _rule("jwt", r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", "word", "jwt"),
        _rule("authorization", r"(?:Basic|BASIC|basic)\s+(?P<v>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])", "word",
              "basic", _basic),
    )
# Found anywhere (no key word to look for first): Discord's bot tokens, `<id>.<time>.<hmac>`,
# from their `.<time>.` (a literal leads the search, so it is fast), then the id before it.
_DISCORD = re.compile(r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}(?![A-Za-z0-9_-])")
_DISCORD_ID = re.compile(r"(?<![A-Za-z0-9_-])[MNO][A-Za-z0-9_-]{23,27}\Z")
_TRIGGERS = (
    "pass", "pw", "psk", "key", "sig", "secret", "token", "auth", "cookie", "credential", "session", "bearer",
    "option", "list", "mysql", "sshpass", "redis", "curl", "wget", "://", "hooks.", "discord", "feishu",
    "lark", "day.app", "ftqq", "telegram", "gh", "glpat", "xox", "xapp", "sk-", "sk_", "rk_", "whsec", "npm_",
    "hf_", "sg.", "shp", "dop_", "pypi-", "tskey", "ya29", "sct", "akia", "asia", "agpa", "aida", "aroa", "aipa",
    "anpa", "anva", "abia", "acca", "aiza", "ltai", "eyj", "qle_", ":aa", "kennwort", "contrase", "пароль",
    "密码", "口令", "密钥", "秘钥", "令牌", "basic",
)


def _trie(words: Iterable[str]) -> str:
    """An alternation grouped by first character, so the engine tries one branch per position."""
    by_first: dict[str, list[str]] = {}
    for word in words:
        by_first.setdefault(word[0], []).append(word[1:])
    branches = []
    for first, rests in sorted(by_first.items()):
        if "" in rests:  # the one-character word already matches: the longer ones add nothing
            branches.append(re.escape(first))
        elif len(rests) == 1:
            branches.append(re.escape(first + rests[0]))
        else:
            branches.append(re.escape(first) + "(?:" + _trie(rests) + ")")
    return "|".join(branches)


@functools.cache
def _trigger() -> re.Pattern[str]:
    return re.compile(_trie(_TRIGGERS))


# user:password@host with no scheme (ssh, rsync, mysql): found from its `@`, looked at backwards.
_AT = re.compile(r"@(?=[A-Za-z0-9\[])")
_USERINFO_BEFORE = re.compile(r"(?<![\w/.:@-])(?P<v>[A-Za-z0-9_.-]{1,64}:(?:(?![@/:])[!-~]){3,64})\Z")
_PEM_END_LINE = PEM_END = re.compile(_PEM_END)
PEM_BEGIN = re.compile(_PEM_BEGIN)  # the log sink follows a key across the lines it decides
_BASE64_LINE = re.compile(r"[A-Za-z0-9+/=]{8,}[ \t]*")
_LONG_RUN = re.compile(rf"(?<![{_TOKEN_CHARS}])[{_TOKEN_CHARS}]{{32,}}(?![{_TOKEN_CHARS}])")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_VALUE_GROUPS = ("v", "v2", "v3", "v4")


def _entropy(token: str) -> float:
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in Counter(token).values())


_HEX = re.compile(r"[0-9a-fA-F]+")
# What a long random-looking string right after it is: a digest, a fingerprint, a public
# key or a request's id, printed to be read (ssh, git, curl -v, wg show): not a credential.
_PUBLIC_BEFORE = re.compile(
    r"(?:(?:sha(?:1|224|256|384|512)|md5)[:-]|(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com)"
    r"[ \t]+|(?:peer|public[ _-]?key|publickey|pub)[\"']?[ \t]*[:=]?[ \t]*[\"']?"
    r"|(?:x-amz-id-2|x-amz-cf-id|x-amz-request-id|x-request-id|request-id|x-github-request-id|cf-ray|etag"
    r"|trace-?id|correlation-?id|x-cache-key)[ \t]*:[ \t]*\"?)\Z", re.I)


def opaque(token: str) -> bool:
    """A long run of token characters that looks random rather than like a word, path, UUID,
    or a hex digest (a commit, a checksum), or a variable set to a UUID (as `env` prints a
    run's QLEDGE_RUN_ID): letters of both cases and digits, and no words between its dashes."""
    if _UUID.fullmatch(token) or token.startswith("/") or token.count("/") > 2:
        return False
    name, _, value = token.partition("=")
    if value and name.isidentifier() and (_UUID.fullmatch(value) or _HEX.fullmatch(value)):
        return False
    if _HEX.fullmatch(token.rstrip("=")):
        return False
    if aws_secret(token):
        return True
    parts = [p for p in re.split(r"[-_/]", token) if p]
    wordish = sum(p.isdigit() or (p.isalpha() and (p.islower() or p.isupper())) for p in parts)
    if len(parts) >= 3 and 3 * wordish >= 2 * len(parts):
        return False  # words and numbers between separators: a file's or a package's name
    upper = sum(c.isupper() for c in token)
    lower = sum(c.islower() for c in token)
    digits = sum(c.isdigit() for c in token)
    return upper >= 2 and lower >= 2 and digits >= 2 and _entropy(token) >= 3.5


def aws_secret(token: str) -> bool:
    """40 characters of base64 in both cases that look random: an AWS secret access key."""
    if len(token) != 40 or not re.fullmatch(r"[A-Za-z0-9/+]{40}", token):
        return False
    upper = sum(c.isupper() for c in token)
    lower = sum(c.islower() for c in token)
    return upper >= 8 and lower >= 8 and _entropy(token) >= 4.4


def _public(text: str, start: int) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    return _PUBLIC_BEFORE.search(text, max(line_start, start - 48), start) is not None


def mask(length: int) -> str:
    return MASK if length >= len(MASK) else "*" * min(length, 3)


# -- a skeleton: the text without noise, and the way back -----------------------------


class _Skeleton:
    """`text` with the noise taken out, and the way back to the original offsets. The way
    back is worked out only when a match needs it: most output has no noise but its line
    breaks, and most has nothing to mask."""

    __slots__ = ("text", "_source", "_noise", "_starts", "_origins")

    def __init__(self, source: str, noise: re.Pattern[str]) -> None:
        self._source = source
        self._noise = noise
        self._starts: list[int] | None = None  # offset in `text` where each kept piece begins
        self._origins: list[int] = []  # offset of that piece in the source
        if not _clean(source):
            self._build()
        elif noise is _LINE_NOISE:
            self.text, self._starts, self._origins = source, [0], [0]
        else:
            self.text = source.replace("\r", "").replace("\n", "")

    def _build(self) -> None:
        starts: list[int] = []
        parts: list[str] = []
        self._origins = []
        at = size = 0
        for m in self._noise.finditer(self._source):
            if m.start() > at:
                starts.append(size)
                self._origins.append(at)
                parts.append(self._source[at : m.start()])
                size += m.start() - at
            at = m.end()
        if at < len(self._source) or not parts:
            starts.append(size)
            self._origins.append(at)
            parts.append(self._source[at:])
        self.text, self._starts = "".join(parts), starts

    def span(self, a: int, b: int) -> tuple[int, int]:
        """The original span of skeleton span [a, b) (b > a), noise inside included."""
        return self._at(a), self._at(b - 1) + 1

    def _at(self, pos: int) -> int:
        if self._starts is None:
            self._build()
        assert self._starts is not None
        i = bisect.bisect_right(self._starts, pos) - 1
        return self._origins[i] + pos - self._starts[i]


def _clean(text: str) -> bool:
    """No noise but line breaks and tabs (a quick test, run in C)."""
    return "\ufffd" not in text and text.replace("\n", "").replace("\r", "").replace("\t", "").isprintable()


# -- configured secrets and their encodings ------------------------------------------


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).decode()


def _base64_cores(raw: bytes) -> set[str]:
    """The characters of base64 that depend on `raw` alone, at each of the three offsets
    it can have inside a longer encoded string (`user:secret` in Basic auth)."""
    cores = set()
    for pad in range(3):
        encoded = _b64(b"\0" * pad + raw).rstrip("=")
        first = -(-8 * pad // 6)  # the first character with no bit of the padding
        last = 8 * (pad + len(raw)) // 6  # characters from here on need bits that follow
        core = encoded[first:last]
        if len(core) >= _BASE64_CORE_MIN:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_JSON_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _percent(raw: bytes, space: str) -> str:
    return "".join(chr(b) if b in _UNRESERVED else space if b == 0x20 and space else f"%{b:02X}" for b in raw)


def _json_escaped(secret: str, ascii_only: bool) -> str:
    out = []
    for c in secret:
        if c in _JSON_SHORT:
            out.append(_JSON_SHORT[c])
        elif c < " " or (ascii_only and c > "\x7f"):
            code = ord(c)
            if code > 0xFFFF:  # a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(c)
    return "".join(out)


def encodings(secret: str) -> set[str]:
    """The literal forms a value commonly takes in output: as is, URL-encoded, hex, base64,
    JSON, reversed. (A Masker also finds any mix of these escapes: see `_flexible`.)"""
    raw = secret.encode("utf-8", "surrogateescape")
    forms = {secret, secret[::-1]}
    for quoted in (_percent(raw, ""), _percent(raw, "+")):
        forms |= {quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted)}
    forms |= {raw.hex(), raw.hex().upper()}
    forms |= _base64_forms(raw)
    forms |= _base64_cores(raw)
    escaped = _json_escaped(secret, ascii_only=True)
    forms |= {escaped, _json_escaped(secret, ascii_only=False), escaped.replace("/", "\\/")}
    return {f for f in forms if f}


def _base64_forms(raw: bytes) -> set[str]:
    whole = _b64(raw)
    urlsafe = whole.replace("+", "-").replace("/", "_")
    return {whole, whole.rstrip("="), urlsafe, urlsafe.rstrip("=")}


def _hex_byte(b: int) -> str:
    """`%2F` or `%2f`: one byte percent-encoded, its hex digits in either case."""
    return "".join(f"[{d}{d.lower()}]" if d.isalpha() else d for d in f"{b:02X}")


def _unicode_escape(code: int) -> str:
    if code > 0xFFFF:  # a surrogate pair
        code -= 0x10000
        return _unicode_escape(0xD800 + (code >> 10)) + _unicode_escape(0xDC00 + (code & 0x3FF))
    return r"\\u" + "".join(f"[{d}{d.lower()}]" if d.isalpha() else d for d in f"{code:04X}")


def _char(c: str) -> tuple[str, int]:
    """A pattern for one character of a secret in every form output gives it: as is,
    backslash-escaped (JSON's `\\"`, `\\/`, a shell's `\\&`), percent-encoded, JSON's `\\uXXXX`,
    and `+` for a space; and the longest of them."""
    if c.isascii() and (c.isalnum() or c in "-._~"):
        return re.escape(c), 1
    raw = c.encode("utf-8", "surrogateescape")
    forms = [re.escape(c), "".join("%" + _hex_byte(b) for b in raw), _unicode_escape(ord(c))]
    longest = max(3 * len(raw), 12 if ord(c) > 0xFFFF else 6)
    if c.isascii():
        forms.append(r"\\" + re.escape(c))
        if c in _JSON_SHORT:
            forms.append(re.escape(_JSON_SHORT[c]))
    if c == " ":
        forms.append(r"\+")
    return "(?:" + "|".join(forms) + ")", longest


def _flexible(secret: str) -> tuple[str, int]:
    """A pattern for the secret with each character in any of its forms (partial
    percent-encoding, `quote`'s defaults leaving `/`, JSON and shell escapes), and the
    length of its longest match."""
    parts = [_char(c) for c in secret]
    return "".join(p for p, _ in parts), sum(n for _, n in parts)


def _alternation(values: Iterable[str]) -> str:
    return "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))


_BASE64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")


class _Configured:
    """One configured value: the pattern of its escaped forms, its literal forms, and the
    pieces every escaped form holds as they are (its runs of letters and digits), so that
    a text without one of them is passed over with an `in` each, and the pattern is tried
    only around the longest."""

    __slots__ = ("short", "pattern", "anchors", "folded", "exact", "encoded", "longest")

    def __init__(self, value: str) -> None:
        raw = value.encode("utf-8", "surrogateescape")
        self.short = len(value) < SHORT_SECRET
        pattern, most = _flexible(value)
        # A long value also in another letter case (`tr a-z A-Z`); a short one only as it is.
        self.pattern = re.compile(pattern, 0 if self.short else re.IGNORECASE)
        runs = {run.lower() for run in _ALNUM_RUN.findall(value) if len(run) >= 2}
        self.anchors = tuple(sorted(runs, key=len, reverse=True))  # the longest first
        b64 = _base64_forms(raw)
        self.folded: tuple[str, ...] = ()
        self.exact: tuple[str, ...] = ()
        self.encoded: tuple[str, ...] = ()
        if self.short:
            self.exact = tuple({value[::-1], raw.hex(), raw.hex().upper(), *b64} - {value})
        else:
            self.folded = tuple({value[::-1].lower(), raw.hex()})  # looked for in the text in lower case
            # Every base64 form holds one of the cores; the whole string around it is masked.
            self.encoded = tuple(_base64_cores(raw) or b64)
        self.longest = max(most, len(raw) * 2, *(len(f) for f in b64))

    def spans(self, skeleton: str, low: str) -> Iterable[tuple[int, int, str]]:
        """(start, end, how) in the skeleton; how: "escaped" (the pattern), "literal", "base64"."""
        yield from self._escaped(skeleton, low)
        for form in self.folded:
            for at in _finds(low, form):
                yield at, at + len(form), "literal"
        for form in self.exact:
            for at in _finds(skeleton, form):
                yield at, at + len(form), "literal"
        for form in self.encoded:
            for at in _finds(skeleton, form):
                yield at, at + len(form), "base64"

    def _escaped(self, skeleton: str, low: str) -> Iterable[tuple[int, int, str]]:
        if not self.anchors:
            for m in _overlapping(self.pattern, skeleton):
                yield m.start(), m.end(), "escaped"
            return
        if not all(anchor in low for anchor in self.anchors):
            return
        seen: set[tuple[int, int]] = set()
        for at in _finds(low, self.anchors[0]):
            window = (max(0, at - self.longest), min(len(skeleton), at + self.longest))
            for m in _overlapping(self.pattern, skeleton, *window):
                if m.span() not in seen:
                    seen.add(m.span())
                    yield m.start(), m.end(), "escaped"


def _finds(text: str, needle: str) -> Iterable[int]:
    at = text.find(needle)
    while at >= 0:
        yield at
        at = text.find(needle, at + 1)


def heuristic_names() -> tuple[str, ...]:
    """The name of every rule for credentials nobody configured (`Masker(skip=…)`)."""
    return (*(r.name for r in rules()), *(r.name for r in exact_rules()), "discord_token", "opaque",
            "private_key", "userinfo_no_scheme")


class Masker:
    """Every rule, and the configured secrets of one project compiled once (per excerpt,
    per run's log). `spans` finds what to mask; `apply` masks it. `skip` names rules to
    leave out (to measure what each one is worth)."""

    def __init__(self, secrets: Iterable[str] = (), skip: frozenset[str] = frozenset()) -> None:
        # Matched on the skeleton, so without the noise the skeleton lacks (a value may hold a line break).
        values = {_JOINED_NOISE.sub("", s) for s in secrets if s} - {""}
        self._skip = skip
        self._rules = tuple(r for r in rules() if r.name not in skip)
        self._exact = tuple(r for r in exact_rules() if r.name not in skip)
        self._configured = tuple(_Configured(v) for v in sorted(values, key=len, reverse=True))
        # A secret still being written at the end of the text: its prefixes, longest first.
        plain = {s for s in values if len(s) >= SHORT_SECRET}
        self._prefixes = sorted(
            {s[:n] for s in plain for n in range(PARTIAL_SECRET_MIN, len(s))}, key=len, reverse=True)
        self.longest = max((c.longest for c in self._configured), default=0)

    def undecided(self, text: str) -> int:
        """Where, near the end of `text`, a secret might start that more text could complete:
        the offset of the last `longest - 1` characters, noise not counted."""
        if self.longest <= 1:
            return len(text)
        keep = self.longest - 1
        start = max(0, len(text) - 4 * keep - 256)  # the end is enough, unless noise is dense there
        while True:
            joined = _Skeleton(text[start:], _JOINED_NOISE)
            if len(joined.text) > keep:
                return start + joined.span(len(joined.text) - keep, len(joined.text))[0]
            if start == 0:
                return 0
            start = max(0, start - 4 * keep - 4096)

    def spans(self, text: str, cut_at_end: bool = True) -> list[tuple[int, int, str]]:
        """(start, end, category) of everything to mask, unmerged. `cut_at_end`: the text
        may end in the middle of a secret (mask a long one's prefix there)."""
        found: list[tuple[int, int, str]] = []
        lines = _Skeleton(text, _LINE_NOISE)
        skeleton = lines.text
        low = _lower(skeleton)
        for a, b in _candidate_lines(low):
            for kind, subject in ((self._rules, low), (self._exact, skeleton)):
                for rule in kind:
                    for match in rule.pattern.finditer(subject, a, b):
                        if rule.after and not _preceded(subject, match.start(), rule.after):
                            continue
                        if rule.check is not None and not rule.check(subject, match):
                            continue
                        start, end = _masked(rule, subject, match)
                        if end > start:
                            found.append((*lines.span(start, end), rule.category))
        skip = self._skip
        if "PRIVATE" in skeleton and "private_key" not in skip:
            for key in _keys():
                found += [(*lines.span(m.start(), m.end()), "private_key") for m in key.finditer(skeleton)]
        if "opaque" not in skip:
            for match in _LONG_RUN.finditer(skeleton):
                if opaque(match.group()) and not _public(skeleton, match.start()):
                    found.append((*lines.span(match.start(), match.end()), "opaque_token"))
        if "discord_token" not in skip and "." in skeleton:
            for match in _DISCORD.finditer(skeleton):
                token = _discord(skeleton, match)
                if token is not None:
                    found.append((*lines.span(*token), "opaque_token"))
        found += [(*lines.span(a, b), category) for a, b, category in _backwards(skeleton, skip)]
        if self._configured:
            found += self._secret_spans(_Skeleton(text, _JOINED_NOISE), cut_at_end)
        return found

    def _secret_spans(self, joined: _Skeleton, cut_at_end: bool) -> list[tuple[int, int, str]]:
        found: list[tuple[int, int, str]] = []
        skeleton = joined.text
        low = _lower(skeleton)
        for configured in self._configured:
            for a, b, how in configured.spans(skeleton, low):
                if configured.short and not _whole_token(skeleton, a, b):
                    continue
                if how == "base64":  # inside a longer base64 string (`user:secret` in Basic auth): all of it
                    while a > 0 and skeleton[a - 1] in _BASE64_CHARS:
                        a -= 1
                    while b < len(skeleton) and skeleton[b] in _BASE64_CHARS:
                        b += 1
                    while b < len(skeleton) and skeleton[b] == "=" and skeleton[b - 2 : b] != "==":
                        b += 1
                found.append((*joined.span(a, b), "configured_secret"))
        if cut_at_end and skeleton:
            for prefix in self._prefixes:
                if skeleton.endswith(prefix):
                    found.append((*joined.span(len(skeleton) - len(prefix), len(skeleton)), "configured_secret"))
                    break
        return found


_SPANS: dict[str, Callable[[str, re.Match[str]], tuple[int, int]]] = {
    "authorization_header": _header_span, "token_header": _header_span}


def _masked(rule: Rule, subject: str, match: re.Match[str]) -> tuple[int, int]:
    """The part of a match that is masked: its value group, else all of it."""
    cut = _SPANS.get(rule.name)
    if cut is not None:
        return cut(subject, match)
    group = next((g for g in _VALUE_GROUPS if g in rule.pattern.groupindex and match.start(g) >= 0), 0)
    return match.start(group), match.end(group)


def _preceded(text: str, at: int, after: str) -> bool:
    before = text[at - 1] if at > 0 else "\n"
    if after == "digit":
        return before.isdigit()
    if after == "space":
        return before.isspace()
    return not (before.isalnum() or (after == "word" and before == "_"))


def _lower(text: str) -> str:
    """Lower case, offset for offset (a character whose lower case is longer stays)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _candidate_lines(low: str) -> Iterable[tuple[int, int]]:
    """(start, end) of the runs of lines that hold a trigger word."""
    at = 0
    block: tuple[int, int] | None = None
    while (hit := _trigger().search(low, at)) is not None:
        start = low.rfind("\n", 0, hit.start()) + 1
        end = low.find("\n", hit.end())
        end = len(low) if end < 0 else end
        if block is not None and start <= block[1] + 1:
            block = (block[0], end)
        else:
            if block is not None:
                yield block
            block = (start, end)
        at = end + 1
    if block is not None:
        yield block


def _backwards(text: str, skip: frozenset[str] = frozenset()) -> list[tuple[int, int, str]]:
    """Matches found from their end: the base64 lines of a key cut by the start of the text
    (before an END marker), and `user:password@` with no scheme."""
    found: list[tuple[int, int, str]] = []
    if "PRIVATE" in text and "private_key" not in skip:
        for end in _PEM_END_LINE.finditer(text):
            start = text.rfind("\n", 0, end.start()) + 1  # the END line, then the base64 lines above it
            while start > 0:
                above = text.rfind("\n", 0, start - 1) + 1
                if not _BASE64_LINE.fullmatch(text, above, start - 1):
                    break
                start = above
            found.append((start, end.end(), "private_key"))
    if "@" in text and "userinfo_no_scheme" not in skip:
        for at in _AT.finditer(text):
            before = _USERINFO_BEFORE.search(text, max(0, at.start() - 130), at.start())
            if before is not None:
                found.append((before.start("v"), before.end("v"), "url_userinfo"))
    return found


def _overlapping(pattern: re.Pattern[str], text: str, start: int = 0,
                 end: int | None = None) -> Iterable[re.Match[str]]:
    """Every match in text[start:end], including those starting inside another (`abab` in
    `ababab` twice)."""
    stop = len(text) if end is None else end
    at = start
    while (m := pattern.search(text, at, stop)) is not None:
        yield m
        at = m.start() + 1


def _whole_token(text: str, a: int, b: int) -> bool:
    before = text[a - 1] if a > 0 else " "
    after = text[b] if b < len(text) else " "
    return not (before.isalnum() or before == "_" or after.isalnum() or after == "_")


def merge(found: list[tuple[int, int, str]]) -> list[list[int]]:
    """Overlapping spans become one, in order."""
    merged: list[list[int]] = []
    for a, b, _ in sorted(found):
        if merged and a < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def apply(text: str, merged: list[list[int]]) -> str:
    parts, at = [], 0
    for a, b in merged:
        parts += [text[at:a], mask(b - a)]
        at = b
    parts.append(text[at:])
    return "".join(parts)
