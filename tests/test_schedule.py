"""Cron schedules as pure functions: table-driven, with brute-force oracles for DST."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, UTC
from itertools import takewhile
from zoneinfo import ZoneInfo

import pytest

from edge.core.schedule import (
    GRACE_MS,
    MISFIRE_COUNT_MAX,
    Missed,
    Schedule,
    ScheduleError,
    format_local,
    load_zone,
    normalize,
    plan,
)

UTC = UTC


def ms(text: str) -> int:
    """`2024-03-10T07:00:00Z` → epoch ms."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def local(expr: str, tz: str, after_utc: str, n: int) -> list[str]:
    schedule = Schedule(expr, tz)
    fires = schedule.fires_after(ms(after_utc))
    return [format_local(next(fires), schedule.zone) for _ in range(n)]


# -- DST: (expression, zone, start, expected local fire times) ---------------------

DST_CASES = [
    # New York springs forward 2024-03-10 02:00 EST → 03:00 EDT.
    ("30 2 * * *", "America/New_York", "2024-03-09T12:00:00Z",
     ["2024-03-10 03:00:00 EDT", "2024-03-11 02:30:00 EDT"]),
    ("0 30 2 * * *", "America/New_York", "2024-03-09T12:00:00Z",  # 6 fields: cronsim alone skips this day
     ["2024-03-10 03:00:00 EDT", "2024-03-11 02:30:00 EDT"]),
    ("*/30 2 * * *", "America/New_York", "2024-03-09T12:00:00Z",  # a whole skipped hour: one fire, not none
     ["2024-03-10 03:00:00 EDT", "2024-03-11 02:00:00 EDT", "2024-03-11 02:30:00 EDT"]),
    ("0 * * * *", "America/New_York", "2024-03-10T05:30:00Z",  # a rhythm: every real hour
     ["2024-03-10 01:00:00 EST", "2024-03-10 03:00:00 EDT", "2024-03-10 04:00:00 EDT"]),
    # New York falls back 2024-11-03 02:00 EDT → 01:00 EST: 01:xx happens twice.
    ("30 1 * * *", "America/New_York", "2024-11-02T12:00:00Z",
     ["2024-11-03 01:30:00 EDT", "2024-11-04 01:30:00 EST"]),
    ("0 30 1 * * *", "America/New_York", "2024-11-02T12:00:00Z",  # 6 fields: cronsim alone fires twice
     ["2024-11-03 01:30:00 EDT", "2024-11-04 01:30:00 EST"]),
    ("*/30 1 * * *", "America/New_York", "2024-11-02T12:00:00Z",
     ["2024-11-03 01:00:00 EDT", "2024-11-03 01:30:00 EDT", "2024-11-04 01:00:00 EST"]),
    ("0 * * * *", "America/New_York", "2024-11-03T04:30:00Z",  # every real hour, both 01:00s
     ["2024-11-03 01:00:00 EDT", "2024-11-03 01:00:00 EST", "2024-11-03 02:00:00 EST"]),
    # Berlin springs forward 2024-03-31 02:00 CET → 03:00 CEST and falls back 2024-10-27 03:00 → 02:00.
    ("30 2 * * *", "Europe/Berlin", "2024-03-30T12:00:00Z",
     ["2024-03-31 03:00:00 CEST", "2024-04-01 02:30:00 CEST"]),
    ("0 30 2 * * *", "Europe/Berlin", "2024-10-26T12:00:00Z",
     ["2024-10-27 02:30:00 CEST", "2024-10-28 02:30:00 CET"]),
    ("*/20 * * * *", "Europe/Berlin", "2024-10-27T00:30:00Z",
     ["2024-10-27 02:40:00 CEST", "2024-10-27 02:00:00 CET", "2024-10-27 02:20:00 CET"]),
    ("15 2 * * 0", "Europe/Berlin", "2024-03-30T00:00:00Z",  # weekly, on the skipped hour
     ["2024-03-31 03:00:00 CEST", "2024-04-07 02:15:00 CEST"]),
    # Shanghai: no DST, +08:00 all year.
    ("0 9 * * 1-5", "Asia/Shanghai", "2024-03-08T00:00:00Z",
     ["2024-03-08 09:00:00 CST", "2024-03-11 09:00:00 CST"]),
    ("*/2 * * * * *", "Asia/Shanghai", "2024-01-01T00:00:00.500Z",
     ["2024-01-01 08:00:02 CST", "2024-01-01 08:00:04 CST", "2024-01-01 08:00:06 CST"]),
    ("30 */15 9 * * *", "Asia/Shanghai", "2024-01-01T00:00:00Z",  # seconds and a fixed hour
     ["2024-01-01 09:00:30 CST", "2024-01-01 09:15:30 CST"]),
    ("@daily", "UTC", "2024-02-28T12:00:00Z", ["2024-02-29 00:00:00 UTC", "2024-03-01 00:00:00 UTC"]),
]


@pytest.mark.parametrize("expr,tz,start,expected", DST_CASES)
def test_fire_times(expr, tz, start, expected):
    assert local(expr, tz, start, len(expected)) == expected


# -- brute-force oracles ----------------------------------------------------------


def _matches(spec: str, value: int, low: int, high: int) -> bool:
    """Enough of cron for the oracles: `*`, `*/n`, `a`, `a-b`, lists."""
    for term in spec.split(","):
        base, _, step = term.partition("/")
        if base == "*":
            lo, hi = low, high
        else:
            lo, _, end = base.partition("-")
            lo, hi = int(lo), int(end or lo)
        if int(lo) <= value <= hi and (value - int(lo)) % int(step or 1) == 0:
            return True
    return False


def _local_match(minute: str, hour: str, when: datetime) -> bool:
    return _matches(minute, when.minute, 0, 59) and _matches(hour, when.hour, 0, 23)


def oracle_real(minute: str, hour: str, tz: str, start: datetime, hours: int) -> list[int]:
    """Every real minute whose local time matches: the rhythm semantics."""
    zone = ZoneInfo(tz)
    out = []
    for i in range(1, hours * 60 + 1):
        t = start + timedelta(minutes=i)
        if _local_match(minute, hour, t.astimezone(zone)):
            out.append(int(t.timestamp() * 1000))
    return out


def oracle_label(minute: str, hour: str, tz: str, start: datetime, hours: int) -> list[int]:
    """Every matching local time once: first occurrence, or the end of its gap (found by
    walking forward minute by minute, not by the code's bisection)."""
    zone = ZoneInfo(tz)
    label0 = start.astimezone(zone).replace(tzinfo=None)
    out: set[int] = set()
    for i in range(-60, hours * 60 + 60):
        label = label0.replace(second=0) + timedelta(minutes=i)
        if not _local_match(minute, hour, label):
            continue
        first = label.replace(tzinfo=zone, fold=0)
        if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == label:
            instant = first.astimezone(UTC)
        else:
            instant = label.replace(tzinfo=zone, fold=1).astimezone(UTC)
            while instant.astimezone(zone).replace(tzinfo=None) <= label:
                instant += timedelta(minutes=1)
        out.add(int(instant.timestamp() * 1000))
    lo, hi = start.timestamp() * 1000, (start + timedelta(hours=hours)).timestamp() * 1000
    return sorted(t for t in out if lo < t <= hi)


def _window(schedule: Schedule, start: datetime, hours: int) -> list[int]:
    end = (start + timedelta(hours=hours)).timestamp() * 1000
    return list(takewhile(lambda t: t <= end, schedule.fires_after(int(start.timestamp() * 1000))))


WINDOWS = [  # zone, a UTC start shortly before a change
    ("America/New_York", datetime(2024, 3, 10, 4, 0, tzinfo=UTC)),
    ("America/New_York", datetime(2024, 11, 3, 3, 0, tzinfo=UTC)),
    ("Europe/Berlin", datetime(2024, 3, 31, 0, 0, tzinfo=UTC)),
    ("Europe/Berlin", datetime(2024, 10, 27, 0, 0, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2024, 10, 5, 14, 0, tzinfo=UTC)),  # a 30-minute shift
    ("Asia/Shanghai", datetime(2024, 3, 10, 0, 0, tzinfo=UTC)),
]


@pytest.mark.parametrize("tz,start", WINDOWS)
@pytest.mark.parametrize("minute,hour", [("0", "*"), ("*/15", "*"), ("7,37", "*/2"), ("*", "*")])
def test_rhythms_follow_real_time(tz, start, minute, hour):
    got = _window(Schedule(f"{minute} {hour} * * *", tz), start, 6)
    assert got == oracle_real(minute, hour, tz, start, 6)
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("tz,start", WINDOWS)
@pytest.mark.parametrize("minute,hour", [("30", "0-5"), ("*/20", "1,2"), ("0", "2"), ("45", "1-3")])
def test_times_of_day_fire_once_each(tz, start, minute, hour):
    got = _window(Schedule(f"{minute} {hour} * * *", tz), start, 6)
    assert got == oracle_label(minute, hour, tz, start, 6)
    assert len(got) == len(set(got))


def test_no_duplicate_and_no_missing_daily_fire_over_a_year():
    for tz in ("America/New_York", "Europe/Berlin", "Australia/Lord_Howe"):
        for expr in ("30 2 * * *", "0 30 1 * * *", "0 0 * * *"):
            schedule = Schedule(expr, tz)
            fires = schedule.fires_after(ms("2024-01-01T00:00:00Z"))
            days = [datetime.fromtimestamp(next(fires) / 1000, schedule.zone).date() for _ in range(366)]
            assert days == [days[0] + timedelta(days=i) for i in range(366)], (tz, expr)


# -- validation -------------------------------------------------------------------

BAD = [
    ("61 * * * *", "invalid cron expression '61 * * * *': minute field: 61 is out of range 0-59"),
    ("* 24 * * *", "invalid cron expression '* 24 * * *': hour field: 24 is out of range 0-23"),
    ("60 * * * * *", "invalid cron expression '60 * * * * *': second field: 60 is out of range 0-59"),
    ("* * 0 * *", "invalid cron expression '* * 0 * *': day-of-month field: 0 is out of range 1-31"),
    ("* * * 13 *", "invalid cron expression '* * * 13 *': month field: 13 is out of range 1-12"),
    ("* * * * 8", "invalid cron expression '* * * * 8': day-of-week field: 8 is out of range 0-7"),
    ("* * * JANX *", "invalid cron expression '* * * JANX *': month field: 'JANX' is not a valid value"),
    ("x * * * *", "invalid cron expression 'x * * * *': minute field: 'x' is not a valid value"),
    ("*/0 * * * *", "invalid cron expression '*/0 * * * *': minute field: '*/0': the step after / must be"
                    " a number of at least 1"),
    ("5-3 * * * *", "invalid cron expression '5-3 * * * *': minute field: range '5-3' is backwards"),
    ("1,,2 * * * *", "invalid cron expression '1,,2 * * * *': minute field: empty value in '1,,2'"),
    ("* * * * MON#6", "invalid cron expression '* * * * MON#6': day-of-week field: 'MON#6': the week number"
                      " after # must be 1-5"),
    ("0 0 30 2 *", "invalid cron expression '0 0 30 2 *': day-of-month field: no month in the month field"
                   " has that day"),
    ("* * *", "invalid cron expression '* * *': expected 5 fields (minute hour day-of-month month day-of-week)"
              " or 6 with seconds first, got 3"),
    ("* * * * * * *", "invalid cron expression '* * * * * * *': expected 5 fields (minute hour day-of-month"
                      " month day-of-week) or 6 with seconds first, got 7"),
    ("@often", "invalid cron expression '@often': expected 5 fields (minute hour day-of-month month"
               " day-of-week) or 6 with seconds first, got 1"),
]


@pytest.mark.parametrize("expr,message", BAD)
def test_invalid_expressions_name_the_field(expr, message):
    with pytest.raises(ScheduleError) as err:
        normalize(expr)
    assert str(err.value) == message
    assert "\n" not in message


@pytest.mark.parametrize("expr,normal", [
    ("  0   9 * *   MON-FRI ", "0 9 * * MON-FRI"), ("@hourly", "0 * * * *"), ("@WEEKLY", "0 0 * * 0"),
    ("0 0 L * *", "0 0 L * *"), ("0 0 * * 5L", "0 0 * * 5L"), ("0 0 * * sun#2", "0 0 * * sun#2"),
    ("0 0 LW * *", "0 0 LW * *"), ("10-50/10 * * * *", "10-50/10 * * * *"), ("5/15 * * * * *", "5/15 * * * * *"),
])
def test_valid_expressions(expr, normal):
    assert normalize(expr) == normal
    assert Schedule(expr, "UTC").next_after(0) is not None


def test_unknown_zone_says_what_to_install():
    with pytest.raises(ScheduleError) as err:
        load_zone("Asia/Atlantis")
    assert "unknown time zone 'Asia/Atlantis'" in str(err.value)
    assert "zoneinfo-asia" in str(err.value) and "tzdata" in str(err.value)


def test_missing_zone_database_names_the_packages():
    # A child with no zone database at all: no system tree, no tzdata package.
    code = (
        "import sys, zoneinfo\n"
        "sys.modules['tzdata'] = None\n"
        "zoneinfo.reset_tzpath(to=['/nonexistent'])\n"
        "from edge.core.schedule import ScheduleError, load_zone\n"
        "try:\n    load_zone('Europe/Berlin')\nexcept ScheduleError as e:\n    print(e)\n"
        "print(load_zone('UTC'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == ("time zone 'Europe/Berlin' is unavailable: no time zone database is installed"
                     " (on OpenWrt install zoneinfo-core and zoneinfo-europe; elsewhere install tzdata,"
                     " e.g. `pip install tzdata`)")
    assert second == "UTC"  # the default zone needs no data


# -- misfire plans: (cursor, now, policy) → admitted, missed, new cursor ------------

HOURLY = Schedule("0 * * * *", "UTC")
PLANS = [
    # not due yet / clock went backwards: nothing, and the cursor stays (nothing repeats)
    ("10:00:00", "09:59:59", "skip", [], None, "10:00:00"),
    ("10:00:00", "03:00:00", "fire_once", [], None, "10:00:00"),
    # on time, and late within the grace
    ("10:00:00", "10:00:00", "skip", [("10:00:00", "scheduled")], None, "11:00:00"),
    ("10:00:00", "10:00:30", "skip", [("10:00:00", "scheduled")], None, "11:00:00"),
    # one millisecond past the grace: missed
    ("10:00:00", "10:00:30.001", "skip", [], ("10:00:00", "10:00:00", 1), "11:00:00"),
    ("10:00:00", "10:00:30.001", "fire_once", [("10:00:00", "fire_once")], None, "11:00:00"),
    # down over three fires
    ("10:00:00", "12:30:00", "skip", [], ("10:00:00", "12:00:00", 3), "13:00:00"),
    ("10:00:00", "12:30:00", "fire_once", [("10:00:00", "fire_once")], ("11:00:00", "12:00:00", 2), "13:00:00"),
    # back just after a fire: the missed ones are skipped, the fresh one still runs
    ("10:00:00", "12:00:10", "skip", [("12:00:00", "scheduled")], ("10:00:00", "11:00:00", 2), "13:00:00"),
    ("10:00:00", "12:00:10", "fire_once", [("10:00:00", "fire_once"), ("12:00:00", "scheduled")],
     ("11:00:00", "11:00:00", 1), "13:00:00"),
]


def _t(hms: str) -> int:
    return ms(f"2024-05-01T{hms}Z")


@pytest.mark.parametrize("cursor,now,policy,admit,missed,new_cursor", PLANS)
def test_misfire_plans(cursor, now, policy, admit, missed, new_cursor):
    result = plan(HOURLY, _t(cursor), _t(now), policy)
    assert result.admit == [(_t(f), origin) for f, origin in admit]
    assert result.missed == (Missed(_t(missed[0]), _t(missed[1]), missed[2]) if missed else None)
    assert result.cursor == _t(new_cursor)


def test_long_downtime_of_a_seconds_schedule_is_bounded():
    every_second = Schedule("* * * * * *", "UTC")
    start, now = _t("00:00:00"), _t("00:00:00") + 86_400_000  # a day: 86,400 fires
    result = plan(every_second, start, now, "skip")
    assert result.missed == Missed(first_ms=start, last_ms=None, fires=None)  # too many to count
    assert [f for f, _ in result.admit] == list(range(now - GRACE_MS, now + 1, 1000))  # the grace's fires
    assert result.cursor == now + 1000
    few = plan(every_second, start, start + (MISFIRE_COUNT_MAX - 1 + 30) * 1000, "skip")
    assert few.missed.fires == MISFIRE_COUNT_MAX - 1


def test_no_cursor_no_plan():
    assert plan(HOURLY, None, _t("10:00:00"), "skip").cursor is None


# -- `qledge cron next`: offline ---------------------------------------------------


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge", *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "QLEDGE_HOME": "/nonexistent", **(env or {})})


def test_cron_next_prints_local_times_with_offsets():
    out = _cli("cron", "next", "30 2 * * *", "--tz", "America/New_York", "--after", "2024-03-09T12:00:00Z",
               "--count", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["2024-03-10 03:00:00 EDT", "2024-03-11 02:30:00 EDT"]
    naive = _cli("cron", "next", "0 30 1 * * *", "--tz", "America/New_York", "--after", "2024-11-03T01:45",
                 "--count", "1", "--json")  # a naive --after is local time (first occurrence)
    assert json.loads(naive.stdout) == [
        {"atMs": ms("2024-11-04T06:30:00Z"), "local": "2024-11-04T01:30:00-05:00", "timezone": "America/New_York"}]


def test_cron_next_needs_no_daemon_nor_event_loop():
    code = ("import sys; from edge.cli.main import main; rc = main(['cron', 'next', '* * * * *', '--tz', 'UTC']);"
            "print(rc, sorted(m for m in ('asyncio', 'apsw', 'edge.storage.sqlite.db') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines()[-1] == "0 []"
    assert len(out.stdout.splitlines()) == 6


@pytest.mark.parametrize("args,message", [
    (["61 * * * *"], "qledge: invalid_argument: invalid cron expression '61 * * * *': minute field: 61 is out of"
                     " range 0-59\n"),
    (["* * * * *", "--tz", "Mars/Olympus"], None),
    (["* * * * *", "--after", "yesterday"], "qledge: invalid_argument: --after 'yesterday' is not an ISO 8601 time"
                                             " (e.g. 2024-03-10T01:30:00-05:00)\n"),
    (["* * * * *", "--tz", ""], "qledge: invalid_argument: --tz must name a time zone (e.g. Europe/Berlin or UTC),"
                                " not be empty\n"),
])
def test_cron_next_errors_are_one_line_exit_2(args, message):
    out = _cli("cron", "next", *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    if message:
        assert out.stderr == message


def test_cron_next_default_zone_comes_from_tz_env():
    out = _cli("cron", "next", "0 9 * * *", "--after", "2024-01-01T00:00:00Z", "--count", "1",
               env={"TZ": "Asia/Shanghai"})
    assert out.stdout == "2024-01-01 09:00:00 CST\n"
