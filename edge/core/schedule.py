"""Cron schedules as pure functions: validation, DST-correct fire times, misfire plans.

Fire times come from cronsim; this module decides what they mean across DST changes,
because cronsim alone repeats or drops some of them (6-field expressions, and 5-field
ones with a wildcard minute, fire twice in the repeated hour and not at all in the
skipped one). The rule, decided by the hour field:

- hour field is a time of day (a number, list or range): each matching local time fires
  exactly once. A time that occurs twice (clocks go back) fires on its first occurrence;
  a time that does not exist (clocks go forward) fires once, at the end of the gap.
- hour field starts with `*` (`*`, `*/2`): the schedule is a rhythm and follows real
  time, so an hourly job fires every real hour through both changes, and every
  fire is a distinct instant.

Day-of-month and day-of-week follow busybox crond (and qinglong, croniter): when both
are restricted (neither covers every value) a day matching either fires; otherwise the
restricted one alone decides. cronsim follows Vixie cron here (a field starting with `*`
makes it AND), so `_Cron` replaces that one decision.

`@reboot` (qinglong spells it `@boot`) and `@once` are no schedule of times: they fire
once per boot of the device, and once when armed. The trigger store and the scheduler
give them their meaning; here they only validate and never yield a fire time.

All times are UTC epoch milliseconds. Nothing here does I/O except reading zone data.
"""

from __future__ import annotations

import functools

from collections.abc import Iterator
from datetime import datetime, tzinfo, UTC
from typing import Literal

import msgspec
from cronsim import CronSim, CronSimError

Misfire = Literal["skip", "fire_once"]

GRACE_MS = 30_000  # a fire at most this late still runs; later than that it was missed
MISFIRE_COUNT_MAX = 1000  # missed fires counted one by one before the rest are jumped over

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
REBOOT, ONCE = "@reboot", "@once"
_EVENTS = {"@reboot": REBOOT, "@boot": REBOOT, "@once": ONCE}  # not times: see the module doc
_FIELDS = (  # name, low, high; the seconds field is optional and comes first
    ("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23),
    ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 7),
)
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Zulu", "Etc/Zulu", "Universal", "Etc/Universal"})
# OpenWrt splits the zone database into packages by region.
_OPENWRT_PACKAGES = {
    "Africa": "zoneinfo-africa", "Asia": "zoneinfo-asia", "Atlantic": "zoneinfo-atlantic",
    "Australia": "zoneinfo-australia-nz", "Europe": "zoneinfo-europe", "Indian": "zoneinfo-india",
    "America": "zoneinfo-northamerica or zoneinfo-southamerica", "Pacific": "zoneinfo-pacific",
    "Antarctica": "zoneinfo-poles", "Arctic": "zoneinfo-poles",
}


class ScheduleError(ValueError):
    """One clear line for the user: what is wrong and, where it helps, what to do."""


# -- expressions ------------------------------------------------------------------


def _number(field: int, text: str) -> int:
    name, low, high = _FIELDS[field]
    upper = text.upper()
    if field == 4 and upper in _MONTHS:
        return _MONTHS.index(upper) + 1
    if field == 5 and upper in _DAYS:
        return _DAYS.index(upper)
    if not text or any(c not in "0123456789" for c in text):
        raise ScheduleError(f"{name} field: {text!r} is not a valid value")
    value = int(text)
    if not low <= value <= high:
        raise ScheduleError(f"{name} field: {value} is out of range {low}-{high}")
    return value


def _check_term(field: int, term: str) -> None:
    """Mirror cronsim's grammar, so what passes here also parses there."""
    name = _FIELDS[field][0]
    upper = term.upper()
    if upper == "*":
        return
    if field == 5 and "L" in upper:  # NL: the last N-day of the month
        if not (upper.endswith("L") and term[:-1].isdigit()):
            raise ScheduleError(f"{name} field: {term!r} is not a valid value (NL means the last N-day)")
        _number(field, term[:-1])
        return
    if field == 5 and "#" in term:  # N#K: the K-th N-day of the month
        day, nth = term.split("#", 1)
        _number(field, day)
        if not nth.isdigit() or not 1 <= int(nth) <= 5:
            raise ScheduleError(f"{name} field: {term!r}: the week number after # must be 1-5")
        return
    if "/" in term:
        base, step = term.split("/", 1)
        if not step or any(c not in "0123456789" for c in step) or int(step) == 0:
            raise ScheduleError(f"{name} field: {term!r}: the step after / must be a number of at least 1")
        if base != "*":
            _check_range(field, base) if "-" in base else _number(field, base)
        return
    if "-" in term:
        _check_range(field, term)
        return
    if field == 3 and upper in ("L", "LW"):
        return
    _number(field, term)


def _check_range(field: int, term: str) -> None:
    low, high = term.split("-", 1)
    start, end = _number(field, low), _number(field, high)
    if end < start:
        raise ScheduleError(f"{_FIELDS[field][0]} field: range {term!r} is backwards")


class _Cron(CronSim):
    """cronsim with busybox crond's day rule: OR only when both day fields are restricted."""

    @property
    def day_and(self) -> bool:
        try:
            return self._days_and
        except AttributeError:  # first asked once cronsim has parsed the fields
            self._days_and: bool = not (_restricted_days(self.days) and _restricted_weekdays(self.weekdays))
            return self._days_and

    @day_and.setter
    def day_and(self, value: bool) -> None:
        pass  # cronsim assigns Vixie's rule here; ours is computed from the parsed fields


def _restricted_days(days: set[int]) -> bool:
    return not set(range(1, 32)) <= days


def _restricted_weekdays(weekdays: set[int | tuple[int, int]]) -> bool:
    return not set(range(7)) <= {d % 7 for d in weekdays if isinstance(d, int)}


def days_ored(expression: str) -> bool:
    """Whether a (normalized) expression restricts both day fields, so that either matches."""
    if expression in (REBOOT, ONCE):
        return False
    return not _Cron(expression, datetime(2000, 1, 1)).day_and


def normalize(expression: str) -> str:
    """The expression with macros expanded and single spaces; raises ScheduleError."""
    found = _normalized(expression)
    if isinstance(found, ScheduleError):
        raise ScheduleError(str(found))
    return found


@functools.lru_cache(maxsize=256)
def _normalized(expression: str) -> str | ScheduleError:
    """normalize's answer, remembered: an import of many entries names few schedules."""
    text = " ".join(expression.split())
    if text.lower() in _EVENTS:
        return _EVENTS[text.lower()]
    try:
        return _validate(MACROS.get(text.lower(), text))
    except ScheduleError as exc:
        return ScheduleError(f"invalid cron expression {expression!r}: {exc}")


def _validate(text: str) -> str:
    parts = text.split()
    if len(parts) not in (5, 6):
        raise ScheduleError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, got {len(parts)}"
        )
    offset = 6 - len(parts)
    for i, part in enumerate(parts):
        for term in part.split(","):
            if not term:
                raise ScheduleError(f"{_FIELDS[i + offset][0]} field: empty value in {part!r}")
            _check_term(i + offset, term)
    try:
        sim = _Cron(text, datetime(2000, 1, 1))
    except CronSimError as exc:  # what our grammar lets through: an impossible day
        field = str(exc).removeprefix("Bad ")
        raise ScheduleError(f"{field} field: no month in the month field has that day") from None
    try:
        next(sim)
    except StopIteration:
        raise ScheduleError("it never fires") from None
    return text


# -- zones ------------------------------------------------------------------------


def load_zone(name: str) -> tzinfo:
    """An IANA zone; a missing zone database is an error that says what to install."""
    if name in UTC_NAMES:
        return UTC  # needs no zone data, so the default always works
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    region = name.split("/", 1)[0]
    openwrt = f"zoneinfo-core and {_OPENWRT_PACKAGES[region]}" if region in _OPENWRT_PACKAGES else "zoneinfo-core"
    if _have_zone_data():
        raise ScheduleError(
            f"unknown time zone {name!r} (an IANA name such as Europe/Berlin; if it is one, its data is"
            f" missing: on OpenWrt install {openwrt}, elsewhere the tzdata package)"
        )
    raise ScheduleError(
        f"time zone {name!r} is unavailable: no time zone database is installed"
        f" (on OpenWrt install {openwrt}; elsewhere install tzdata, e.g. `pip install tzdata`)"
    )


def _have_zone_data() -> bool:
    import importlib.util
    import os
    import zoneinfo

    if any(os.path.exists(os.path.join(p, "Europe", "Berlin")) for p in zoneinfo.TZPATH):
        return True
    return importlib.util.find_spec("tzdata") is not None


# -- fire times -------------------------------------------------------------------


class Schedule:
    """A validated expression in a zone; yields fire instants (epoch ms)."""

    __slots__ = ("expression", "zone_name", "zone", "event", "_by_label")

    def __init__(self, expression: str, zone_name: str) -> None:
        self.expression = normalize(expression)
        self.zone_name = zone_name
        self.zone = load_zone(zone_name)
        # REBOOT or ONCE: fired by the store and scheduler, never by time
        self.event = self.expression if self.expression in (REBOOT, ONCE) else None
        hour = self.expression.split()[-4] if self.event is None else "*"
        self._by_label = not hour.startswith("*") and self.zone is not UTC

    def fires_after(self, after_ms: int) -> Iterator[int]:
        """Every fire strictly after `after_ms`, in increasing order (none for an event)."""
        if self.event is not None:
            return
        last = after_ms
        for ms in self._label_fires(after_ms) if self._by_label else self._real_fires(after_ms):
            if ms > last:  # several labels may map to one instant (the end of a gap)
                last = ms
                yield ms

    def next_after(self, after_ms: int) -> int | None:
        return next(self.fires_after(after_ms), None)

    # Both stop where Python's calendar does (the end of year 9999, or before year 1):
    # there are no fires there, rather than an error.
    def _real_fires(self, after_ms: int) -> Iterator[int]:
        try:
            # An aware start: cronsim steps through UTC, so each instant is visited once.
            start = datetime.fromtimestamp(after_ms // 1000, self.zone)
            for when in _Cron(self.expression, start):
                yield int(when.timestamp()) * 1000
        except (StopIteration, OverflowError, ValueError):
            return

    def _label_fires(self, after_ms: int) -> Iterator[int]:
        try:
            # Naive local labels from the local time of `after_ms`; labels at or before it
            # map to instants at or before it (the mapping never goes backwards).
            start = datetime.fromtimestamp(after_ms // 1000, self.zone).replace(tzinfo=None)
            for label in _Cron(self.expression, start):
                yield _label_instant(label, self.zone)
        except (StopIteration, OverflowError, ValueError):
            return


def _label_instant(label: datetime, zone: tzinfo) -> int:
    """Epoch ms of a local time: its first occurrence, or the end of the gap it is in."""
    first = label.replace(tzinfo=zone, fold=0)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == label:
        return int(first.timestamp()) * 1000
    # Inside a gap: fold=1 reads it with the later offset (an instant before the gap),
    # fold=0 with the earlier one (after it). The first instant whose local time is past
    # the label is where the clocks jumped.
    lo, hi = int(label.replace(tzinfo=zone, fold=1).timestamp()), int(first.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).replace(tzinfo=None) > label:
            hi = mid
        else:
            lo = mid
    return hi * 1000


def local_time(ms: int, zone: tzinfo) -> datetime:
    # replace(), not + timedelta: arithmetic would reset `fold` (the repeated hour's second pass)
    return datetime.fromtimestamp(ms // 1000, zone).replace(microsecond=ms % 1000 * 1000)


def format_local(ms: int, zone: tzinfo) -> str:
    """`2024-03-10 03:00:00 EDT`: the local time and its zone abbreviation (which tells the
    two passes of a repeated hour apart: 02:30 CEST, then 02:30 CET), the one format of
    every time the CLI prints. A zone without abbreviations shows its offset (`+04`)."""
    when = local_time(ms, zone)
    text = when.strftime("%Y-%m-%d %H:%M:%S") + (f".{ms % 1000:03d}" if ms % 1000 else "")
    abbreviation = when.tzname() or when.strftime("%z")
    return f"{text} {abbreviation}" if abbreviation else text


# -- misfires ---------------------------------------------------------------------


class Missed(msgspec.Struct, frozen=True):
    """Fires more than the grace late: never run (except one, under fire_once)."""

    first_ms: int
    last_ms: int | None  # None when there were too many to count
    fires: int | None


class Plan(msgspec.Struct, frozen=True):
    admit: list[tuple[int, str]]  # (scheduled_for_ms, origin) in fire order
    missed: Missed | None
    cursor: int | None  # the next fire not yet handled


def plan(schedule: Schedule, cursor_ms: int | None, now_ms: int, misfire: Misfire, grace_ms: int = GRACE_MS) -> Plan:
    """What to do with the fires from the cursor up to now.

    Fires at most `grace_ms` late are admitted (origin `scheduled`). Older ones were
    missed: `skip` runs none of them, `fire_once` runs the oldest (origin `fire_once`).
    The cursor moves past now. A cursor in the future (the clock went back) stays where
    it is, so no fire is ever handled twice.
    """
    if cursor_ms is None or now_ms < cursor_ms:
        return Plan(admit=[], missed=None, cursor=cursor_ms)
    admit: list[tuple[int, str]] = []
    first = last = None
    count: int | None = 0
    late_limit = now_ms - grace_ms
    fires = schedule.fires_after(cursor_ms - 1)
    cursor = None
    while (fire := next(fires, None)) is not None:
        if fire > now_ms:
            cursor = fire
            break
        if fire >= late_limit:
            admit.append((fire, "scheduled"))
        elif misfire == "fire_once" and not admit:
            admit.append((fire, "fire_once"))
        else:
            first = fire if first is None else first
            last = fire
            if count is not None:
                count += 1
                if count >= MISFIRE_COUNT_MAX and fire < late_limit - 1:
                    count = last = None  # too many to count: jump to the first fire in the grace
                    fires = schedule.fires_after(late_limit - 1)
    missed = Missed(first_ms=first, last_ms=last, fires=count) if first is not None else None
    return Plan(admit=admit, missed=missed, cursor=cursor)
