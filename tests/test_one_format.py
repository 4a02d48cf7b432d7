"""One way to write each kind of value people read: a duration and an instant are written by
edge/__init__ alone, in the CLI, the notifications, the daemon's log lines and the panel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from edge import duration_text, moment

ROOT = Path(__file__).resolve().parent.parent
EDGE = ROOT / "edge"

# (milliseconds, what people read): tenths under a minute, then 1m04s, then 2h05m.
DURATIONS = [
    (0, "0.0s"), (40, "0.0s"), (50, "0.1s"), (400, "0.4s"), (1_500, "1.5s"), (9_990, "10.0s"),
    (59_900, "59.9s"), (59_960, "1m00s"), (60_000, "1m00s"), (64_000, "1m04s"), (245_000, "4m05s"),
    (3_599_999, "59m59s"), (3_600_000, "1h00m"), (7_530_000, "2h05m"), (93_600_000, "26h00m"), (-5, "0.0s"),
]


@pytest.mark.parametrize(("ms", "text"), DURATIONS)
def test_a_duration_is_written_one_way(ms, text):
    assert duration_text(ms) == text
    assert duration_text(None) == "-"


def test_the_panel_writes_durations_by_the_same_rule():
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the panel's format.js")
    source = (EDGE / "web/static/format.js").read_text(encoding="utf-8")
    start = source.index("export function duration(")
    body = source[start:source.index("\n}\n", start) + 3].replace("export ", "")
    values = json.dumps([ms for ms, _ in DURATIONS])
    script = body + f"console.log(JSON.stringify({values}.map((ms) => duration(0, ms))));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [text for _, text in DURATIONS]


@pytest.fixture
def berlin():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_an_instant_is_written_in_the_device_zone_with_its_abbreviation(berlin):
    assert moment(1_796_145_783_000) == "2026-12-01 18:23:03 CET"
    assert moment(1_782_922_983_000) == "2026-07-01 18:23:03 CEST"
    assert moment(None) == "-"


def _sources(*suffixes: str) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(EDGE.rglob("*"))
            if p.suffix in suffixes and p.is_file()}


# What formatting a duration or an instant by hand looks like, and the few places allowed to.
_PY_BY_HAND = [
    (re.compile(r"strftime\("), {"edge/__init__.py", "edge/core/schedule.py"}),  # schedule: a trigger's own zone
    (re.compile(r"gmtime\("), set()),
    (re.compile(r"\{[^{}]*:\.\d+f\}\s?(s|ms|min|sec)\b"), {"edge/__init__.py"}),
    (re.compile(r"\{[^{}]*\}m\{[^{}]*\}s"), {"edge/__init__.py"}),
]


def test_no_duration_or_instant_is_formatted_anywhere_else():
    found = []
    for name, source in _sources(".py").items():
        for pattern, allowed in _PY_BY_HAND:
            if name in allowed:
                continue
            for line in source.splitlines():
                # A file name's timestamp (a backup's) is not a time for people to read.
                if pattern.search(line) and ".bak" not in line:
                    found.append(f"{name}: {line.strip()}")
    assert found == []


def test_the_panel_formats_durations_and_times_in_format_js_alone():
    found = []
    for name, source in _sources(".js").items():
        if name.endswith("format.js"):
            continue
        for line in source.splitlines():
            # (a cost in dollars is the one other number with decimals)
            if re.search(r"toLocale(Time|Date)?String|DateTimeFormat|toFixed\(|getHours\(|getMinutes\(", line) \
                    and "costUsd" not in line:
                found.append(f"{name}: {line.strip()}")
    assert found == []
