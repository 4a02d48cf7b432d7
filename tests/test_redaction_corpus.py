"""Redaction measured on two labelled corpora (tests/data): secret-bearing lines (credential
forms no secret is configured for, and configured secrets in every encoding a shell
pipeline produces) and benign output of real router services and tasks.

Bars: every configured secret masked in every encoding (recall 1.0), every credential form
of the corpus masked, at most 0.5% of the benign lines changed at all; and each rule that
finds an unconfigured credential must save more secret lines than it costs benign ones.
The held-out parts (`*_heldout.*`) were written after the rules and measured once (docs/security.md:
1.0, 1.0 and 2 of 296 benign lines changed, both by `password <word>` reading prose, which
the rule no longer does); the figures are pinned here, so a change that makes them worse fails.

Measured in both places the rules apply: the AI log excerpt (`redact` on normalized text)
and the run log (`Masker` on the raw text, as the log sink applies it).

`python tests/test_redaction_corpus.py` prints the table docs/security.md shows.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import pytest

from edge.core.excerpt import normalize, redact
from edge.core.redaction import Masker, apply, merge

DATA = os.path.join(os.path.dirname(__file__), "data")
BENIGN_MAX = 0.005
# Held-out figures as measured once (docs/security.md, "Redaction coverage").
HELDOUT = {"configured": 1.0, "forms": 1.0, "benign_changed": 0.0}

# What a reader does not see: terminal escapes (raw, or as the excerpt shows them), invisible
# characters, line breaks.
_NOISE = re.compile(r"(?:\x1b|\ufffd)(?:\[[0-9;?]*[ -/]*[@-~])?|[\u200b-\u200f\u2060\ufeff\u00ad\r\n]")


class Row:
    def __init__(self, raw: dict) -> None:
        self.kind: str = raw["kind"]
        self.family: str = raw["family"]
        self.form: str = raw["form"]
        self.line: str = raw["line"]
        self.secrets: list[str] = raw.get("secrets", [])
        if self.kind == "configured":
            shown = _NOISE.sub("", raw["shown"])
            width = min(6, len(shown))
            self.telltales = {shown[i : i + width] for i in range(len(shown) - width + 1)}
        else:
            self.telltales = set()
            for gone in raw["gone"]:
                self.telltales.add(gone)
                if len(gone) > 8:
                    self.telltales |= {gone[i : i + 8] for i in range(len(gone) - 7)}

    def masked(self, out: str) -> bool:
        visible = _NOISE.sub("", out)
        return not any(t in visible for t in self.telltales)


def secret_rows(name: str) -> list[Row]:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [Row(json.loads(line)) for line in f if line.strip() and not line.startswith("#")]


def benign_lines(name: str) -> list[str]:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


def configured_values(rows: Iterable[Row]) -> list[str]:
    return sorted({s for r in rows for s in r.secrets})


Place = Callable[[str, list[str]], str]


def _excerpt(line: str, secrets: list[str], skip: frozenset[str] = frozenset()) -> str:
    if skip:
        text = normalize(line)
        return apply(text, merge(Masker((normalize(s) for s in secrets), skip=skip).spans(text)))
    return redact(normalize(line), secrets).text


def _log(line: str, secrets: list[str], skip: frozenset[str] = frozenset()) -> str:
    text = line + "\n"
    masker = Masker(secrets, skip=skip) if skip else Masker(secrets)
    return apply(text, merge(masker.spans(text)))[:-1]


PLACES = {"excerpt": _excerpt, "log": _log}


def _same(place: str, line: str, out: str) -> bool:
    return out == (normalize(line) if place == "excerpt" else line)


def measure(rows: list[Row], benign: list[str], skip: frozenset[str] = frozenset()) -> dict[str, dict]:
    """Per place: which secret rows were masked, which benign lines changed."""
    values = configured_values(rows)
    found: dict[str, dict] = {}
    for place, run in PLACES.items():
        masked = [r.masked(run(r.line, r.secrets, skip)) for r in rows]
        changed = [i for i, line in enumerate(benign) if not _same(place, line, run(line, values, skip))]
        found[place] = {"masked": masked, "changed": changed}
    return found


def _recall(rows: list[Row], masked: list[bool], kind: str) -> float:
    picked = [m for r, m in zip(rows, masked, strict=True) if r.kind == kind]
    return sum(picked) / len(picked)


# -- the bars ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus() -> tuple[list[Row], list[str]]:
    return secret_rows("redaction_secrets.jsonl"), benign_lines("redaction_benign.txt")


@pytest.fixture(scope="module")
def measured(corpus) -> dict[str, dict]:
    return measure(*corpus)


def test_the_corpora_are_large_and_labelled(corpus):
    rows, benign = corpus
    assert len(rows) >= 300 and len(benign) >= 1000
    forms = {r.form for r in rows if r.kind == "configured"}
    for needed in ("url (quote defaults, / left)", "url, partial percent-encoding", "base64", "base64, no padding",
                   "hex", "HEX", "json \\uXXXX (ensure_ascii)", "split over two lines", "ansi colour inside",
                   "reversed"):
        assert needed in forms
    assert all(r.telltales for r in rows)


@pytest.mark.parametrize("place", PLACES)
def test_every_configured_secret_is_masked_in_every_encoding(corpus, measured, place):
    rows, _ = corpus
    missed = [(r.form, r.line) for r, m in zip(rows, measured[place]["masked"], strict=True)
              if r.kind == "configured" and not m]
    assert missed == []


@pytest.mark.parametrize("place", PLACES)
def test_every_credential_form_is_masked(corpus, measured, place):
    rows, _ = corpus
    missed = [(r.form, r.line) for r, m in zip(rows, measured[place]["masked"], strict=True)
              if r.kind == "form" and not m]
    assert missed == []


@pytest.mark.parametrize("place", PLACES)
def test_benign_output_is_left_alone(corpus, measured, place):
    _, benign = corpus
    changed = [benign[i] for i in measured[place]["changed"]]
    assert len(changed) <= BENIGN_MAX * len(benign), changed


@pytest.mark.parametrize("place", PLACES)
def test_masking_never_lengthens_a_line(corpus, place):
    rows, _ = corpus
    run = PLACES[place]
    for r in rows:
        shown = normalize(r.line) if place == "excerpt" else r.line
        assert len(run(r.line, r.secrets)) <= len(shown)


def test_each_heuristic_saves_more_than_it_costs(corpus):
    """A rule for credentials nobody configured is worth it only if, without it, more
    secret lines leak than benign lines are spared, on both corpora together."""
    from edge.core.redaction import heuristic_names

    rows, benign = secret_rows("redaction_secrets.jsonl"), benign_lines("redaction_benign.txt")
    rows += secret_rows("redaction_secrets_heldout.jsonl")
    benign += benign_lines("redaction_benign_heldout.txt")
    forms = [r for r in rows if r.kind == "form"]
    base = measure(forms, benign)
    for name in heuristic_names():
        without = measure(forms, benign, frozenset({name}))
        saves = costs = 0
        for place in PLACES:
            saves += sum(a and not b for a, b in zip(base[place]["masked"], without[place]["masked"], strict=True))
            costs += len(set(base[place]["changed"]) - set(without[place]["changed"]))
        assert saves > costs, (name, saves, costs)


def test_the_held_out_figures_hold():
    rows, benign = secret_rows("redaction_secrets_heldout.jsonl"), benign_lines("redaction_benign_heldout.txt")
    found = measure(rows, benign)
    for place in PLACES:
        assert _recall(rows, found[place]["masked"], "configured") >= HELDOUT["configured"]
        assert _recall(rows, found[place]["masked"], "form") >= HELDOUT["forms"]
        assert len(found[place]["changed"]) <= HELDOUT["benign_changed"] * len(benign)


# -- the table --------------------------------------------------------------------------


def table(secrets_file: str, benign_file: str) -> str:
    rows, benign = secret_rows(secrets_file), benign_lines(benign_file)
    found = measure(rows, benign)
    out = []
    per: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for place in PLACES:
        for r, m in zip(rows, found[place]["masked"], strict=True):
            key = ("configured: " + r.form) if r.kind == "configured" else r.family
            per[(key, place)]["n"] += 1
            per[(key, place)]["masked"] += m
    keys = sorted({k for k, _ in per})
    out.append("| form or encoding | lines | excerpt | log |")
    out.append("|---|---|---|---|")
    for k in keys:
        e, log = per[(k, "excerpt")], per[(k, "log")]
        out.append(f"| {k} | {e['n']} | {e['masked']}/{e['n']} | {log['masked']}/{log['n']} |")
    for place in PLACES:
        conf = _recall(rows, found[place]["masked"], "configured")
        form = _recall(rows, found[place]["masked"], "form")
        changed = found[place]["changed"]
        out.append(f"{place}: configured {conf:.3f}, forms {form:.3f}, benign changed {len(changed)}/{len(benign)}"
                   f" ({len(changed) / len(benign):.2%})")
        out += ["    " + benign[i] for i in changed]
    return "\n".join(out)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    print(table(f"redaction_secrets{which}.jsonl", f"redaction_benign{which}.txt"))
