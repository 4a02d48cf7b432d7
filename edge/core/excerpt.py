"""Turning the tail of a run's log into text an AI client may read: pure functions, no I/O.

Three steps, in order:
1. `window_text` decodes at most the last 4 KiB. When the window starts mid-log, its first
   line is dropped, as it may be cut (a secret's name may be cut off while its value is
   not); an incomplete UTF-8 sequence at the end is left out; the rest decodes with U+FFFD
   for invalid bytes.
2. `normalize` (edge.core.text): CRLF → LF; C0 (except TAB and LF), DEL, C1, zero-width
   and bidi controls → U+FFFD, so the text cannot hide or reorder what a reader sees.
3. `redact` masks credentials and configured secret values (edge.core.redaction, the same
   rules the run-log sink applies); `injection_signals` flags text that tries to instruct
   whoever reads it.
Masking never lengthens the text: each masked span becomes `[REDACTED]` when it is at
least that long, else as many `*` as it has characters (at most three).
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import NamedTuple

from edge.core.text import normalize

WINDOW_BYTES = 4096

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


# -- redaction (the rules live in edge.core.redaction, shared with the run-log sink) ----


class Redacted(NamedTuple):
    text: str
    categories: list[str]  # sorted, each once
    replacements: int  # masked spans after overlapping ones were merged


def redact(text: str, secrets: list[str]) -> Redacted:
    """Mask every credential pattern and configured secret value in (normalized) `text`."""
    from edge.core.redaction import Masker, apply, merge  # with the first excerpt, not at start

    found = Masker(normalize(s) for s in secrets).spans(text)
    if not found:
        return Redacted(text, [], 0)
    merged = merge(found)
    return Redacted(apply(text, merged), sorted({c for _, _, c in found}), len(merged))


# -- prompt-injection signals -----------------------------------------------------
#
# Matched on the text folded two ways, after NFKC (fullwidth and other compatibility
# forms), case folding, and joining letters spelled out one by one ("i g n o r e",
# "I.G.N.O.R.E"): `latin`, with look-alike letters (Cyrillic, Greek) and digits inside
# words (1gn0re) folded to Latin, for the English, Spanish and German phrasings; `native`,
# with the scripts as they are (a Latin look-alike inside a Cyrillic word folded to
# Cyrillic), for the Chinese and Russian ones. A hit means: do not obey this text.

_HOMOGLYPHS = str.maketrans({
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "һ": "h", "ӏ": "l",
    "ԛ": "q", "ԝ": "w", "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ı": "i", "ɡ": "g", "ɑ": "a", "ℓ": "l",
})
_TO_CYRILLIC = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "y": "у", "x": "х", "k": "к"})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t"})
_FULLWIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}
_SPELLED = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ .\-_*·]){2,}[^\W\d_](?![^\W\d_])")
_LEETISH = re.compile(r"\w*[^\W\d_]\w*")
_CYRILLIC_WORD = re.compile(r"\w*[а-яё]\w*")
_SQUASH = re.compile(r"[^\S\n]+")


def _nfkc(text: str) -> str:
    try:
        import unicodedata  # only when an excerpt is asked for; a trimmed interpreter may lack it
    except ImportError:
        return text.translate(_FULLWIDTH)
    return unicodedata.normalize("NFKC", text)


def _spelled_out(text: str) -> str:
    return _SPELLED.sub(lambda m: re.sub(r"[ .\-_*·]", "", m.group()), text)


def _fold(text: str) -> tuple[str, str]:
    """(latin, native): the forms the patterns match."""
    # U+FFFD is where a control used to be: gone, so "ig\u200bnore" still reads "ignore".
    base = _nfkc(text.replace("\ufffd", "")).casefold()
    native = _spelled_out(_CYRILLIC_WORD.sub(lambda m: m.group().translate(_TO_CYRILLIC), base))
    latin = base.translate(_HOMOGLYPHS)
    latin = _LEETISH.sub(lambda m: m.group().translate(_LEET) if not m.group().isalpha() else m.group(), latin)
    # Spelled-out words are joined first: the wider gaps between them stay word breaks.
    return _SQUASH.sub(" ", _spelled_out(latin)), _SQUASH.sub(" ", native)


_DANGEROUS = (
    r"(?:rm\s+-\w*[rf]|sudo\b|(?:curl|wget)\b[^\n]*\|\s*(?:ba)?sh\b|mkfs|dd\s+if=|chmod\s+(?:-r\s+)?777"
    r"|:\(\)\s*\{)"
)
_SECRET_WORDS_EN = (
    r"(?:secrets?|passwords?|passwd|tokens?|credentials?|api\s*[_-]?\s*keys?|private\s*keys?|ssh\s*keys?"
    r"|env(?:ironment)?\s*var(?:iable)?s?)"
)
_ZH_SECRETS = r"(?:密钥|密码|口令|令牌|凭据|凭证|秘钥|私钥|环境变量|token|secret)"

@functools.cache
def _signals() -> tuple[tuple[str, str, re.Pattern[str]], ...]:
    """(family, form, pattern), compiled when an excerpt is first asked for."""
    return (
        ("instruction_override", "latin", re.compile(
            # English
            r"\b(?:ignore|disregard|forget|override|bypass)\b\s*(?:(?:all|any|the|your|my|of|these|those|every)\b\s*)*"
            r"(?:previous|prior|above|earlier|preceding|system|safety|original|initial|existing|everything|instructions?"
            r"|rules|prompts?|guidelines|directions|polic(?:y|ies)|context|(?:what\s*)?you\s*were\s*told)\b"
            r"|\bnew\s*instructions\s*:|\bfrom\s*now\s*on,?\s*(?:you|your)\b"
            r"|\b(?:do\s*not|don'?t|stop)\s*(?:follow(?:ing)?|obey(?:ing)?)\s*(?:your|the|any|all)?\s*"
            r"(?:previous|prior|system|original)?\s*(?:rules|instructions|guidelines|prompt)"
            # Spanish
            r"|\b(?:ignora|ignore|ignoren|olvida|olvide|olvidad|omite|descarta)\b\s*"
            r"(?:(?:todas?|todos?|las|los|tus|sus)\b\s*)*(?:instrucciones|reglas|indicaciones|[oó]rdenes|todo)\b"
            r"|\bhaz\s*caso\s*omiso\b|\ba\s*partir\s*de\s*ahora,?\s*(?:t[uú]|usted|eres|debes|obedece)"
            r"|\bnuevas\s*instrucciones\s*:"
            # German
            r"|\b(?:ignoriere|ignorier|ignoriert|vergiss|vergesst|missachte|übergehe)\b\s*"
            r"(?:(?:alle|die|deine|ihre|bisherigen|vorherigen|obigen)\b\s*)*"
            r"(?:anweisungen|instruktionen|regeln|vorgaben|befehle|alles)\b"
            r"|\bab\s*(?:jetzt|sofort)\s*(?:bist|befolgst|gehorchst|antwortest|musst)\s*du\b|\bneue\s*anweisungen\s*:")),
        ("instruction_override", "native", re.compile(
            # Chinese
            r"(?:忽略|无视|忽视|不要理会|别管|跳过)[^。\n]{0,12}(?:之前|以上|上面|前面|先前|此前|所有|全部|一切|系统)"
            r"[^。\n]{0,10}(?:指令|指示|提示|规则|命令|要求|设定|说明|约束)"
            r"|(?:忘记|忘掉)[^。\n]{0,8}(?:之前|以上|所有|全部|一切)|不要(?:再)?(?:遵守|遵循|服从)[^。\n]{0,8}(?:指令|规则|指示)"
            r"|从现在(?:开始|起)[，,]?\s*你|新的?指令\s*[:：]"
            # Russian
            r"|(?:игнорируй(?:те)?|проигнорируй(?:те)?|забудь(?:те)?|не\s*обращай(?:те)?\s*внимания\s*на|отбрось"
            r"|пренебреги)\s*(?:(?:все|всё|эти|свои|твои|ваши)\s*)*"
            r"(?:предыдущ|прежн|прошл|вышеуказанн|изначальн|все\b|всё|инструкци|указани|правил|что\s*тебе\s*говорили)"
            r"|с\s*этого\s*момента\s*(?:ты|вы)\b|новые\s*инструкции\s*:")),
        ("role_impersonation", "latin", re.compile(
            r"(?m)^\s*(?:#+\s*)?(?:system|assistant|developer)\s*(?:prompt|message)?\s*:(?=.*\b(?:you|your|ignore|obey"
            r"|comply|must)\b)"
            r"|<\|?(?:system|im_start|im_end|assistant)\|?>|\[/?(?:system|inst)\]"
            r"|\byou\s*are\s*now\s*(?:a|an|the|dan|root|admin|my|no\s*longer|free|unrestricted|jailbroken|developer)\b"
            r"|\bact\s*as\s*(?:an?\s*|the\s*)?(?:admin(?:istrator)?|root|system|developer|assistant|superuser|operator)\b"
            r"|\bi\s*am\s*(?:the|your)\s*(?:system|administrator|admin|developer|owner|operator|creator)\b"
            r"|\bpretend\s*(?:to\s*be|you\s*are)\b"
            r"|\bahora\s*eres\b|\bact[uú]a\s*como\s*(?:un\s*|el\s*)?(?:administrador|root|sistema|desarrollador|superusuario)"
            r"|\bsoy\s*(?:tu|el|su)\s*(?:administrador|desarrollador|creador|due[nñ]o)"
            r"|(?m:^)\s*sistema\s*:(?=.*\b(?:t[uú]|usted|debes)\b)"
            r"|\bdu\s*bist\s*(?:jetzt|nun|ab\s*sofort)\b|\btu\s*so,?\s*als\b"
            r"|\b(?:agiere|handle|verhalte\s*dich)\s*als\s*(?:ein\s*|der\s*)?(?:administrator|admin|root|system|entwickler)"
            r"|\bich\s*bin\s*(?:dein|ihr|der)\s*(?:administrator|admin|entwickler|besitzer|system)"
            r"|(?m:^)\s*system\s*:(?=.*\b(?:du|dich|dein)\b)")),
        ("role_impersonation", "native", re.compile(
            r"你现在是|你(?:现在)?是一个(?:没有|不受)|扮演|假装(?:你)?是|我是你的(?:管理员|开发者|主人|创造者|系统)"
            r"|(?m:^)\s*系统\s*[:：](?=.*你)"
            r"|(?:теперь\s*ты|ты\s*теперь)\b|(?:представь|вообрази),?\s*что\s*ты"
            r"|действуй\s*как\s*(?:администратор|root|систем|разработчик)"
            r"|я\s*(?:твой|ваш)\s*(?:администратор|разработчик|создатель|владелец)"
            r"|(?m:^)\s*система\s*:(?=.*\b(?:ты|вы)\b)")),
        ("secret_exfiltration", "latin", re.compile(
            r"\b(?:send|post|upload|exfiltrate|leak|reveal|print|show|output|email|e-mail|paste|share|dump|give|tell"
            r"|list|display|expose|forward)\b[^\n]{0,60}?\b" + _SECRET_WORDS_EN + r"\b"
            r"|\b(?:curl|wget|nc)\b[^\n]{0,120}\$\{?[a-z_]*(?:token|secret|key|password|pass)"
            r"|\bcat\s+\S*(?:\.ssh/|id_rsa|id_ed25519|/etc/shadow|\.env\b|\.netrc)"
            r"|\b(?:env[ií]a|enviar|manda|muestra|mu[eé]strame|imprime|revela|sube|comparte|dame|dime|lista|filtra"
            r"|exporta)\b[^\n]{0,60}?\b(?:secretos?|contrase[nñ]as?|claves?|tokens?|credenciales|variables\s*de\s*entorno)\b"
            r"|\b(?:sende|sendet|schicke|schick|zeige|zeig|gib|drucke|verrate|teile|liste|lade|übermittle|poste)\b"
            r"[^\n]{0,60}?\b(?:geheimnisse|passw[öo]rter|passwort|kennw[öo]rter|schl[üu]ssel|tokens?|zugangsdaten"
            r"|umgebungsvariablen|anmeldedaten)\b")),
        ("secret_exfiltration", "native", re.compile(
            r"(?:输出|打印|发送|发给|显示|泄露|告诉我|给我|列出|上传|导出|透露|提供)[^。\n]{0,20}" + _ZH_SECRETS
            + r"|把[^。\n]{0,20}" + _ZH_SECRETS + r"[^。\n]{0,20}(?:发送|发给|上传|告诉|输出|交给)"
            r"|(?:отправь|покажи|выведи|напечатай|раскрой|загрузи|перешли|дай|скажи|перечисли|сообщи|слей)(?:те)?\b"
            r"[^\n]{0,60}?(?:секрет|парол|ключ|токен|учетн|учётн|переменные\s*окружения)")),
        # An instruction to call a tool or run a destructive command, not a shell trace of one.
        ("tool_coercion", "latin", re.compile(
            r"\b(?:call|invoke)\b\s*(?:the\s*|this\s*|a\s*)?(?:[\w.-]+\s*)?(?:tool|function)s?\b"
            r"|\buse\b\s*(?:the\s*|your\s*)?(?:shell|terminal|bash|exec|command|delete|admin|python|code)\s*(?:tool|function)s?\b"
            r"|\b(?:qinglong|qledge)\.[a-z]+\.[a-z.]+|\btools/call\b|\bfunction_call\b"
            r"|\b(?:run|execute|exec)\b[^\n]{0,30}?" + _DANGEROUS
            + r"|\byou\s*must\s*(?:now\s*)?(?:run|execute|call|invoke)\b"
            r"|\b(?:llama|invoca|usa|utiliza)\s*(?:a\s*)?(?:la\s*|el\s*)?(?:herramienta|funci[oó]n)\b"
            r"|\b(?:ejecuta|corre|lanza)\b[^\n]{0,30}?" + _DANGEROUS
            + r"|\b(?:rufe|ruf)\b[^\n]{0,40}?\b(?:werkzeug|tool|funktion)\b[^\n]{0,40}\bauf\b"
            r"|\b(?:verwende|benutze|nutze)\s*(?:das|die|den)?\s*(?:werkzeug|tool|funktion)\b"
            r"|\bf[üu]hre\b[^\n]{0,30}?" + _DANGEROUS)),
        ("tool_coercion", "native", re.compile(
            r"调用[^。\n]{0,15}(?:工具|函数|接口)|使用[^。\n]{0,6}(?:shell|终端|命令行|删除|管理)[^。\n]{0,6}(?:工具|函数)"
            r"|(?:执行|运行)[^。\n]{0,20}?" + _DANGEROUS
            + r"|(?:вызови|используй|запусти)(?:те)?\s*(?:этот\s*)?(?:инструмент|функци)"
            r"|(?:выполни|запусти)(?:те)?\b[^\n]{0,30}?" + _DANGEROUS)),
    )
SIGNAL_NAMES = ("instruction_override", "role_impersonation", "secret_exfiltration", "tool_coercion")


def injection_signals(text: str) -> list[str]:
    """Which kinds of instruction the text contains (heuristics; a hit means: do not obey)."""
    forms = dict(zip(("latin", "native"), _fold(text), strict=True))
    hit = {name for name, form, pattern in _signals() if pattern.search(forms[form])}
    return [name for name in SIGNAL_NAMES if name in hit]
