"""The cron dialect people bring from busybox crond and qinglong: the day-of-month /
day-of-week rule, and agreement with croniter (which implements the same rule) over
thousands of random expressions in several zones."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import datetime
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadDateError, croniter

from edge.core.schedule import Schedule, ScheduleError, days_ored, format_local


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def fires(expr: str, after: str, n: int, tz: str = "UTC") -> list[str]:
    schedule = Schedule(expr, tz)
    return [format_local(m, schedule.zone)[:16] for m in islice(schedule.fires_after(ms(after)), n)]


# (expression, start, expected first fires): both day fields restricted → either day fires.
DAY_RULE_CASES = [
    # The example: days 1, 11, 21, 31 and every Monday (2024-06-03 is a Monday).
    ("0 15 */10 * 1", "2024-06-01T00:00Z",
     ["2024-06-01 15:00", "2024-06-03 15:00", "2024-06-10 15:00", "2024-06-11 15:00", "2024-06-17 15:00",
      "2024-06-21 15:00", "2024-06-24 15:00", "2024-07-01 15:00"]),
    ("0 0 13 * FRI", "2024-09-01T00:00Z",  # every 13th and every Friday, not only Friday the 13th
     ["2024-09-06 00:00", "2024-09-13 00:00", "2024-09-20 00:00", "2024-09-27 00:00", "2024-10-04 00:00",
      "2024-10-11 00:00", "2024-10-13 00:00"]),
    ("0 0 */15 * */3", "2024-05-30T12:00Z",  # a step is a restriction, `*` or not: 1, 16, 31 or Sun/Wed/Sat
     ["2024-05-31 00:00", "2024-06-01 00:00", "2024-06-02 00:00", "2024-06-05 00:00", "2024-06-08 00:00",
      "2024-06-09 00:00", "2024-06-12 00:00", "2024-06-15 00:00", "2024-06-16 00:00"]),
    # Only one field restricted: that one alone decides.
    ("0 0 * * 1", "2024-06-01T00:00Z", ["2024-06-03 00:00", "2024-06-10 00:00"]),
    ("0 0 */10 * *", "2024-05-30T00:00Z", ["2024-05-31 00:00", "2024-06-01 00:00", "2024-06-11 00:00",
                                           "2024-06-21 00:00", "2024-07-01 00:00"]),
    # A field that names every value is not restricted, however it is written.
    ("0 0 1-31 * 1", "2024-06-01T00:00Z", ["2024-06-03 00:00", "2024-06-10 00:00"]),
    ("0 0 */1 * 1", "2024-06-01T00:00Z", ["2024-06-03 00:00", "2024-06-10 00:00"]),
    ("0 0 5 * 0-6", "2024-06-01T00:00Z", ["2024-06-05 00:00", "2024-07-05 00:00"]),
    ("0 0 5 * 1-7", "2024-06-01T00:00Z", ["2024-06-05 00:00", "2024-07-05 00:00"]),
    # OR makes an impossible day possible: February 30th or any Saturday.
    ("0 0 30 2 SAT", "2025-01-01T00:00Z", ["2025-02-01 00:00", "2025-02-08 00:00"]),
    # 6 fields: the same rule.
    ("0 0 12 1 * 3", "2024-05-01T00:00Z", ["2024-05-01 12:00", "2024-05-08 12:00", "2024-05-15 12:00"]),
]


@pytest.mark.parametrize("expr,start,expected", DAY_RULE_CASES)
def test_day_of_month_and_day_of_week_follow_busybox(expr, start, expected):
    assert fires(expr, start, len(expected)) == expected


@pytest.mark.parametrize("expr,ored", [
    ("* 15 */10 * 1", True), ("0 0 13 * FRI", True), ("0 0 L * 1", True), ("0 0 1 * MON#2", True),
    ("0 0 * * 1", False), ("0 0 1 * *", False), ("0 0 1-31 * 1", False), ("0 0 1 * 0-6", False),
    ("@weekly", False), ("@reboot", False), ("@once", False),
])
def test_days_ored(expr, ored):
    assert days_ored(Schedule(expr, "UTC").expression) is ored


def test_cron_next_notes_the_or_rule_on_one_line():
    def cron_next(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edge", "cron", "next", *args, "--tz", "UTC",
                               "--after", "2024-06-01T00:00", "--count", "2"], capture_output=True, text=True)

    both = cron_next("* 15 */10 * 1")
    assert both.returncode == 0
    assert both.stdout.splitlines() == ["2024-06-01 15:00:00 UTC", "2024-06-01 15:01:00 UTC"]
    assert both.stderr == (
        "note: day-of-month and day-of-week are both restricted, so a day matching either fires"
        " (as in busybox crond and qinglong)\n")
    one = cron_next("* 15 */10 * *")
    assert one.returncode == 0 and one.stderr == ""


# -- agreement with croniter -------------------------------------------------------

ZONES = ["UTC", "Asia/Shanghai", "Asia/Kolkata", "Europe/Berlin", "America/New_York", "Australia/Sydney"]
# Some starts fall shortly before a DST change, so the comparison crosses them often.
TRANSITIONS = {
    "Europe/Berlin": ["2024-03-31T01:00Z", "2024-10-27T01:00Z", "2025-03-30T01:00Z", "2025-10-26T01:00Z"],
    "America/New_York": ["2024-03-10T07:00Z", "2024-11-03T06:00Z", "2025-03-09T07:00Z", "2025-11-02T06:00Z"],
    "Australia/Sydney": ["2024-04-06T16:00Z", "2024-10-05T16:00Z", "2025-04-05T16:00Z", "2025-10-04T16:00Z"],
}
_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
CASES = 5000
FIRES = 8


def _field(rng: random.Random, low: int, high: int, names: list[str] | None = None) -> str:
    """One field in the dialect busybox crond and qinglong share: *, */N, N, A-B, A-B/N, lists, names."""
    k = rng.random()
    if k < 0.35:
        return "*"
    if k < 0.5:
        return f"*/{rng.randint(2, max(2, (high - low) // 2))}"
    if k < 0.7:
        n = rng.randint(low, high)
        return names[n - low] if names and rng.random() < 0.3 else str(n)
    if k < 0.85:
        a = rng.randint(low, high - 1)
        b = rng.randint(a + 1, high)
        return f"{a}-{b}" + (f"/{rng.randint(2, 4)}" if rng.random() < 0.3 else "")
    return ",".join(map(str, sorted(rng.sample(range(low, high + 1), rng.randint(2, 4)))))


def _covers_all(text: str, low: int, high: int, modulo: int | None = None) -> bool:
    """A day field other than `*` that still names every value: croniter reads it as
    restricted (its own quirk, see test_day_of_month_and_day_of_week_follow_busybox)."""
    if text == "*":
        return False
    values: set[int] = set()
    for term in text.split(","):
        base, _, step = term.partition("/")
        if base == "*":
            start, end = low, high
        elif "-" in base:
            start, end = (int(x) for x in base.split("-"))
        else:
            start = end = _DAYS.index(base) if base in _DAYS else int(base)
            end = high if step else end
        values.update(range(start, end + 1, int(step or 1)))
    if modulo:
        values = {v % modulo for v in values}
    return set(range(low, high + 1)) <= values


def random_expression(rng: random.Random) -> tuple[str, bool]:
    while True:
        six = rng.random() < 0.3
        seconds = [_field(rng, 0, 59)] if six else []
        dom, dow = _field(rng, 1, 31), _field(rng, 0, 6, _DAYS)
        if _covers_all(dom, 1, 31) or _covers_all(dow, 0, 6, 7):
            continue
        expr = " ".join(seconds + [_field(rng, 0, 59), _field(rng, 0, 23), dom, _field(rng, 1, 12, _MONTHS), dow])
        try:
            Schedule(expr, "UTC")
        except ScheduleError:  # e.g. `31 NOV *`: refused here, and croniter refuses it too
            with pytest.raises(CroniterBadDateError):
                croniter(expr, datetime(2024, 1, 1), second_at_beginning=six).get_next(datetime)
            continue
        return expr, six


def _near_transition(zone: str, instant_ms: int, start_s: int, end_ms: int) -> bool:
    """Within three hours of a change of the zone's UTC offset: where the guide's DST
    rules decide (a repeated time fires once, a skipped one at the end of the gap, an
    hour field starting with `*` follows real time), and croniter decides otherwise."""
    z = ZoneInfo(zone)
    t, prev = start_s - 86400, datetime.fromtimestamp(start_s - 86400, z).utcoffset()
    while t < end_ms // 1000 + 86400:
        t += 900
        offset = datetime.fromtimestamp(t, z).utcoffset()
        if offset != prev:
            if abs(instant_ms / 1000 - t) <= 3 * 3600:
                return True
            prev = offset
    return False


def compare_with_croniter(cases: int, seed: int = 15) -> tuple[int, int, list[str]]:
    """(expressions whose next fires agree exactly, those that differ only next to a DST
    change, descriptions of any other difference)."""
    rng = random.Random(seed)
    agree = dst = 0
    other: list[str] = []
    for i in range(cases):
        expr, six = random_expression(rng)
        zone = ZONES[i % len(ZONES)]
        if zone in TRANSITIONS and rng.random() < 0.6:
            start = ms(rng.choice(TRANSITIONS[zone])) // 1000 - rng.randint(0, 2 * 86400)
        else:
            start = rng.randint(1704067200, 1767225600)  # 2024 and 2025
        ours = list(islice(Schedule(expr, zone).fires_after(start * 1000), FIRES))
        it = croniter(expr, datetime.fromtimestamp(start, ZoneInfo(zone)), second_at_beginning=six)
        theirs = [int(it.get_next(datetime).timestamp()) * 1000 for _ in ours]
        if ours == theirs:
            agree += 1
            continue
        end = min(ours[-1], theirs[-1])
        differ = sorted(x for x in set(ours) ^ set(theirs) if x <= end)
        if differ and all(_near_transition(zone, x, start, end) for x in differ):
            dst += 1
        else:
            other.append(f"{expr!r} in {zone} after {start}: ours {ours[:3]}…, croniter {theirs[:3]}…")
    return agree, dst, other


def test_agrees_with_croniter_outside_the_dst_rules():
    agree, dst, other = compare_with_croniter(CASES)
    assert other == []
    assert agree + dst == CASES
    assert agree > CASES * 0.97, (agree, dst)  # DST differences are rare even with starts near a change
    assert dst > 0  # the comparison did cross DST changes where the rules differ
