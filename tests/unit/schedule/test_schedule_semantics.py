"""What the schedule means: "in effect at T", "next N after T", the day-field rule, DST, rare entries."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushift.schedule import Fire, Schedule, parse_schedule

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def sched(text: str, tz: str = "UTC") -> Schedule:
    return parse_schedule(text, "test.sched", None, default_tz=ZoneInfo(tz))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def effect(s: Schedule, at: datetime) -> tuple[str, datetime, int]:
    f = s.in_effect(at)
    assert f is not None
    assert f.at.tzinfo is UTC
    return f.target, f.at, f.entry.line


def times(fires: list[Fire]) -> list[tuple[datetime, str]]:
    return [(f.at, f.target) for f in fires]


ISSUE_EXAMPLE = """TZ=Asia/Shanghai
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
"""
CST = ZoneInfo("Asia/Shanghai")


# ---- in effect -----------------------------------------------------------------------------------


def test_schedule_in_effect_follows_the_issue_example_through_a_week() -> None:
    s = sched(ISSUE_EXAMPLE)
    # Friday 2026-12-04 → Monday 2026-12-07 (local times)
    cases = [
        (datetime(2026, 12, 4, 7, 59, 59, tzinfo=CST), "llama", datetime(2026, 12, 3, 20, tzinfo=CST), 3),
        (datetime(2026, 12, 4, 8, 0, tzinfo=CST), "vllm", datetime(2026, 12, 4, 8, tzinfo=CST), 2),
        (datetime(2026, 12, 4, 19, 59, tzinfo=CST), "vllm", datetime(2026, 12, 4, 8, tzinfo=CST), 2),
        (datetime(2026, 12, 4, 20, 0, tzinfo=CST), "llama", datetime(2026, 12, 4, 20, tzinfo=CST), 3),
        (datetime(2026, 12, 5, 12, 0, tzinfo=CST), "llama", datetime(2026, 12, 5, 0, tzinfo=CST), 4),
        (datetime(2026, 12, 7, 7, 0, tzinfo=CST), "llama", datetime(2026, 12, 6, 0, tzinfo=CST), 4),
        (datetime(2026, 12, 7, 8, 0, 1, tzinfo=CST), "vllm", datetime(2026, 12, 7, 8, tzinfo=CST), 2),
    ]
    for at, target, since, line in cases:
        assert effect(s, at) == (target, since.astimezone(UTC), line), at


def test_schedule_in_effect_compares_instants_not_zones() -> None:
    s = sched(ISSUE_EXAMPLE)
    at_cst = datetime(2026, 12, 4, 20, 0, tzinfo=CST)
    assert (
        s.in_effect(at_cst) == s.in_effect(at_cst.astimezone(NEW_YORK)) == s.in_effect(at_cst.astimezone(UTC))
    )


def test_schedule_in_effect_rejects_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        sched(ISSUE_EXAMPLE).in_effect(datetime(2026, 12, 4, 20))


def test_schedule_in_effect_of_a_leap_day_entry_in_march_of_a_non_leap_year() -> None:
    s = sched("0 8 29 2 * vllm\n0 9 1 3 * llama\n0 9 * * * off\n")
    only = sched("0 8 29 2 * vllm\n")
    assert effect(only, utc(2027, 3, 15, 12)) == ("vllm", utc(2024, 2, 29, 8), 1)
    assert effect(only, utc(2028, 2, 29, 7, 59)) == ("vllm", utc(2024, 2, 29, 8), 1)
    assert effect(only, utc(2028, 2, 29, 8)) == ("vllm", utc(2028, 2, 29, 8), 1)
    # 2100 is not a leap year: eight years back.
    assert effect(only, utc(2103, 1, 1)) == ("vllm", utc(2096, 2, 29, 8), 1)
    # Among other entries it is just one more candidate.
    assert effect(s, utc(2028, 2, 29, 8, 30)) == ("vllm", utc(2028, 2, 29, 8), 1)
    assert effect(s, utc(2028, 2, 29, 9, 30)) == ("off", utc(2028, 2, 29, 9), 3)


def test_schedule_in_effect_reaches_decades_back() -> None:
    # 29 February AND a Sunday ("*/7" starts with '*', so the day fields are ANDed): 2088, then 2128.
    s = sched("0 8 29 2 */7 rare\n")
    assert effect(s, utc(2127, 6, 1)) == ("rare", utc(2088, 2, 29, 8), 1)
    assert s.next(utc(2088, 3, 1), 1)[0].at == utc(2128, 2, 29, 8)


def test_schedule_in_effect_of_a_yearly_entry() -> None:
    s = sched("0 0 1 1 * newyear\n30 12 24 dec * xmas\n")
    assert effect(s, utc(2026, 12, 24, 12, 29)) == ("newyear", utc(2026, 1, 1), 1)
    assert effect(s, utc(2026, 12, 31, 23, 59)) == ("xmas", utc(2026, 12, 24, 12, 30), 2)


def test_schedule_in_effect_at_month_ends() -> None:
    s = sched("0 8 31 * * a\n")
    assert effect(s, utc(2026, 5, 1)) == ("a", utc(2026, 3, 31, 8), 1)  # April has 30 days
    assert effect(s, utc(2026, 3, 30)) == ("a", utc(2026, 1, 31, 8), 1)  # February
    assert times(s.next(utc(2026, 1, 31, 8), 4)) == [
        (utc(2026, 3, 31, 8), "a"),
        (utc(2026, 5, 31, 8), "a"),
        (utc(2026, 7, 31, 8), "a"),
        (utc(2026, 8, 31, 8), "a"),
    ]
    last = sched("59 23 28-31 * * b\n")
    assert [f.at.date() for f in last.next(utc(2026, 2, 27), 5)] == [
        date(2026, 2, 28),
        date(2026, 3, 28),
        date(2026, 3, 29),
        date(2026, 3, 30),
        date(2026, 3, 31),
    ]
    assert effect(last, utc(2026, 3, 1, 0, 0)) == ("b", utc(2026, 2, 28, 23, 59), 1)
    assert effect(last, utc(2028, 3, 1, 0, 0)) == ("b", utc(2028, 2, 29, 23, 59), 1)


def test_schedule_in_effect_across_a_year_end() -> None:
    s = sched("0 9 * * mon-fri work\n0 18 * * mon-fri rest\n")
    # 2026-12-31 Thursday 18:00 → next work day Friday 2027-01-01
    assert effect(s, utc(2027, 1, 1, 8)) == ("rest", utc(2026, 12, 31, 18), 2)
    assert effect(s, utc(2027, 1, 4, 8)) == ("rest", utc(2027, 1, 1, 18), 2)  # over the weekend


# ---- next ----------------------------------------------------------------------------------------


def test_schedule_next_is_strictly_after_and_in_order() -> None:
    s = sched(ISSUE_EXAMPLE)
    fri_8 = datetime(2026, 12, 4, 8, tzinfo=CST)
    got = s.next(fri_8, 5)
    assert [(f.at.astimezone(CST), f.target, f.entry.line) for f in got] == [
        (datetime(2026, 12, 4, 20, tzinfo=CST), "llama", 3),
        (datetime(2026, 12, 5, 0, tzinfo=CST), "llama", 4),
        (datetime(2026, 12, 6, 0, tzinfo=CST), "llama", 4),
        (datetime(2026, 12, 7, 8, tzinfo=CST), "vllm", 2),
        (datetime(2026, 12, 7, 20, tzinfo=CST), "llama", 3),
    ]
    assert all(f.at.tzinfo is UTC for f in got)
    assert s.next(fri_8 - timedelta(microseconds=1), 1)[0].at == fri_8


def test_schedule_next_ties_go_to_the_later_line_once_per_instant() -> None:
    s = sched("0 8 * * * a\n0 8 * * mon b\n0 9 * * * c\n")
    # Monday 2026-11-30: a and b both fire at 08:00 → one fire, b (the later line).
    got = s.next(utc(2026, 11, 29, 12), 4)
    assert [(f.at, f.target, f.entry.line) for f in got] == [
        (utc(2026, 11, 30, 8), "b", 2),
        (utc(2026, 11, 30, 9), "c", 3),
        (utc(2026, 12, 1, 8), "a", 1),
        (utc(2026, 12, 1, 9), "c", 3),
    ]
    assert effect(s, utc(2026, 11, 30, 8, 30)) == ("b", utc(2026, 11, 30, 8), 2)
    assert effect(s, utc(2026, 12, 1, 8, 30)) == ("a", utc(2026, 12, 1, 8), 1)


def test_schedule_next_boundary_is_any_fire_and_next_change_skips_same_target() -> None:
    s = sched(ISSUE_EXAMPLE)
    fri_21 = datetime(2026, 12, 4, 21, tzinfo=CST)
    b = s.next_boundary(fri_21)
    c = s.next_change(fri_21)
    assert b is not None and b.at == datetime(2026, 12, 5, 0, tzinfo=CST) and b.target == "llama"
    assert c is not None and c.at == datetime(2026, 12, 7, 8, tzinfo=CST) and c.target == "vllm"


def test_schedule_next_change_ignores_a_fire_shadowed_by_a_later_line() -> None:
    s = sched("0 8 * * * a\n0 8 * * mon b\n0 12 * * * b\n")
    # Sunday 2026-11-29 13:00: b in effect; Monday 08:00 a is shadowed by b; Tuesday 08:00 a wins.
    c = s.next_change(utc(2026, 11, 29, 13))
    assert c is not None and (c.at, c.target) == (utc(2026, 12, 1, 8), "a")
    assert sched("0 8 * * * a\n0 8 * * * b\n").next_change(utc(2026, 1, 1)) is None
    assert sched("0 8 * * * a\n0 20 * * * a\n").next_change(utc(2026, 1, 1)) is None


def test_schedule_next_n_counts_fires() -> None:
    s = sched("*/15 * * * * a\n")
    got = s.next(utc(2026, 1, 1), 100)
    assert len(got) == 100 and got[-1].at == utc(2026, 1, 2, 1, 0)
    assert s.next(utc(2026, 1, 1), 0) == []


# ---- the two day fields --------------------------------------------------------------------------


def test_schedule_day_fields_both_restricted_fire_on_either() -> None:
    # crontab(5): "0 8 1 * mon" fires on the 1st AND on every Monday.
    s = sched("0 8 1 * mon a\n")
    assert [f.at.date() for f in s.next(utc(2026, 11, 28), 5)] == [
        date(2026, 11, 30),  # Monday
        date(2026, 12, 1),  # the 1st (a Tuesday)
        date(2026, 12, 7),
        date(2026, 12, 14),
        date(2026, 12, 21),
    ]
    # From a Wednesday in January 2027: the next fire is Monday the 4th... not "a 1st that is a Monday".
    assert s.next(utc(2026, 12, 30), 1)[0].at == utc(2027, 1, 1, 8)
    assert effect(s, utc(2027, 1, 3)) == ("a", utc(2027, 1, 1, 8), 1)


def test_schedule_day_fields_starting_with_star_are_anded() -> None:
    # A day field that starts with '*' is "unrestricted" in crontab(5) even with a step: both must match.
    s = sched("0 8 */2 * mon a\n")  # odd days of the month that are Mondays
    got = [f.at.date() for f in s.next(utc(2026, 11, 28), 4)]
    assert got == [date(2026, 12, 7), date(2026, 12, 21), date(2027, 1, 11), date(2027, 1, 25)]
    assert all(d.weekday() == 0 and d.day % 2 == 1 for d in got)
    only_dow = sched("0 8 * * mon a\n")
    assert {f.at.weekday() for f in only_dow.next(utc(2026, 1, 1), 20)} == {0}
    only_dom = sched("0 8 13 * * a\n")
    assert {f.at.day for f in only_dom.next(utc(2026, 1, 1), 12)} == {13}


# ---- APScheduler as an independent oracle (UTC, where DST plays no part) -------------------------

_DOW_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _field(draw: st.DrawFn, low: int, high: int, names: list[str] | None = None) -> str:
    kind = draw(st.sampled_from(["star", "num", "range", "step", "rangestep", "list"]))
    if kind == "star":
        return "*"
    if kind == "step":
        return f"*/{draw(st.integers(1, high - low))}"  # APScheduler refuses steps beyond the range
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    if kind == "num":
        return names[a - low] if names and draw(st.booleans()) else str(a)
    if kind == "range":
        return f"{a}-{b}"
    if kind == "rangestep":
        return f"{a}-{b}/{draw(st.integers(1, max(1, b - a)))}" if b > a else f"{a}-{b}"
    return ",".join(str(x) for x in sorted(draw(st.sets(st.integers(low, high), min_size=1, max_size=4))))


@st.composite
def _entries(draw: st.DrawFn) -> str:
    months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    return " ".join(
        [
            _field(draw, 0, 59),
            _field(draw, 0, 23),
            _field(draw, 1, 28),
            _field(draw, 1, 12, months),
            _field(draw, 0, 7),
        ]
    )


def _oracle(fields: str, start: datetime, n: int) -> list[datetime]:
    """Cron semantics built on APScheduler: weekdays translated to names, day fields ORed by hand."""
    minute, hour, dom, month, dow = fields.split()
    dow_set: set[int] = set()
    for item in dow.split(","):
        base, _, step = item.partition("/")
        lo, hi = (0, 6) if base == "*" else (int(base.split("-")[0]), int(base.split("-")[-1]))
        dow_set.update(x % 7 for x in range(lo, hi + 1, int(step or 1)))
    dow_names = ",".join(_DOW_NAMES[d] for d in sorted(dow_set))
    common = {"minute": minute, "hour": hour, "month": month, "timezone": UTC}
    if not dom.startswith("*") and not dow.startswith("*"):
        triggers = [CronTrigger(day=dom, **common), CronTrigger(day_of_week=dow_names, **common)]
    else:
        triggers = [CronTrigger(day=dom, day_of_week=dow_names, **common)]
    out: set[datetime] = set()
    for trig in triggers:
        prev = None
        now = start + timedelta(seconds=1)
        for _ in range(n):
            t = trig.get_next_fire_time(prev, now)
            if t is None:
                break
            out.add(t.astimezone(UTC))
            prev, now = t, t + timedelta(seconds=1)
    return sorted(out)[:n]


@settings(max_examples=150, deadline=None)
@given(fields=_entries(), minute_of_2026=st.integers(0, 365 * 24 * 60))
def test_schedule_next_agrees_with_an_apscheduler_oracle(fields: str, minute_of_2026: int) -> None:
    start = utc(2026, 1, 1) + timedelta(minutes=minute_of_2026)
    s = sched(f"{fields} a\n")
    got = [f.at for f in s.next(start, 6)]
    assert got == _oracle(fields, start, 6), fields
    # ... and "in effect" just after a fire is that fire, just before the next one too.
    for a, b in zip(got, got[1:], strict=False):
        assert s.in_effect(a) is not None and s.in_effect(a).at == a  # type: ignore[union-attr]
        assert s.in_effect(b - timedelta(seconds=1)).at == a  # type: ignore[union-attr]


# ---- DST -----------------------------------------------------------------------------------------
# Europe/Berlin 2026: 29 March 02:00 CET → 03:00 CEST (01:00 UTC); 25 October 03:00 CEST → 02:00 CET
# (01:00 UTC), so 02:00-02:59 happens twice.  America/New_York 2026: 8 March 02:00 EST → 03:00 EDT
# (07:00 UTC); 1 November 02:00 EDT → 01:00 EST (06:00 UTC), so 01:00-01:59 happens twice.


def test_schedule_dst_berlin_spring_forward_fires_once_at_the_end_of_the_gap() -> None:
    s = sched("30 2 * * * night\n", "Europe/Berlin")
    assert times(s.next(utc(2026, 3, 27, 12), 3)) == [
        (utc(2026, 3, 28, 1, 30), "night"),  # 02:30 CET
        (utc(2026, 3, 29, 1, 0), "night"),  # 02:30 does not exist: 03:00 CEST, the first instant after
        (utc(2026, 3, 30, 0, 30), "night"),  # 02:30 CEST
    ]
    assert effect(s, utc(2026, 3, 29, 0, 59, 59))[1] == utc(2026, 3, 28, 1, 30)
    assert effect(s, utc(2026, 3, 29, 1, 0))[1] == utc(2026, 3, 29, 1, 0)


def test_schedule_dst_berlin_fall_back_fires_once_at_the_first_occurrence() -> None:
    s = sched("30 2 * * * night\n", "Europe/Berlin")
    assert times(s.next(utc(2026, 10, 24, 12), 2)) == [
        (utc(2026, 10, 25, 0, 30), "night"),  # 02:30 CEST, the first 02:30
        (utc(2026, 10, 26, 1, 30), "night"),  # the second 02:30 (CET, 01:30 UTC) did not fire
    ]
    # During the second 02:xx the entry has already fired; asking from there finds tomorrow's.
    second_pass = utc(2026, 10, 25, 1, 45)  # 02:45 CET
    assert second_pass.astimezone(BERLIN).fold == 1
    assert effect(s, second_pass)[1] == utc(2026, 10, 25, 0, 30)
    assert s.next(second_pass, 1)[0].at == utc(2026, 10, 26, 1, 30)
    assert s.next(utc(2026, 10, 25, 0, 30), 1)[0].at == utc(2026, 10, 26, 1, 30)


def test_schedule_dst_berlin_fall_back_second_pass_keeps_the_latest_written_time() -> None:
    s = sched("0 2 * * * b\n30 2 * * * a\n", "Europe/Berlin")
    at = utc(2026, 10, 25, 1, 15)  # 02:15 CET, second pass; a fired at 02:30 CEST (00:30 UTC)
    assert effect(s, at) == ("a", utc(2026, 10, 25, 0, 30), 2)
    assert times(s.next(utc(2026, 10, 24, 23), 3)) == [
        (utc(2026, 10, 25, 0, 0), "b"),
        (utc(2026, 10, 25, 0, 30), "a"),
        (utc(2026, 10, 26, 1, 0), "b"),
    ]


def test_schedule_dst_berlin_hourly_entry_skips_the_repeated_hour() -> None:
    s = sched("30 * * * * h\n", "Europe/Berlin")
    assert [f.at for f in s.next(utc(2026, 10, 24, 23, 45), 4)] == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 2, 30),  # 03:30 CET (02:30 CET repeats a time that already fired)
        utc(2026, 10, 25, 3, 30),
        utc(2026, 10, 25, 4, 30),
    ]
    spring = sched("30 * * * * h\n", "Europe/Berlin")
    assert [f.at for f in spring.next(utc(2026, 3, 28, 23, 45), 3)] == [
        utc(2026, 3, 29, 0, 30),  # 01:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 is skipped over: 03:00 CEST
        utc(2026, 3, 29, 1, 30),  # 03:30 CEST
    ]


def test_schedule_dst_new_york_spring_forward_fires_once_at_the_end_of_the_gap() -> None:
    s = sched("30 2 * * * night\n", "America/New_York")
    assert times(s.next(utc(2026, 3, 7), 3)) == [
        (utc(2026, 3, 7, 7, 30), "night"),  # 02:30 EST
        (utc(2026, 3, 8, 7, 0), "night"),  # 03:00 EDT
        (utc(2026, 3, 9, 6, 30), "night"),  # 02:30 EDT
    ]
    assert effect(s, utc(2026, 3, 8, 8))[1] == utc(2026, 3, 8, 7, 0)


def test_schedule_dst_new_york_fall_back_fires_once_at_the_first_occurrence() -> None:
    s = sched("30 1 * * * night\n30 2 * * * late\n", "America/New_York")
    assert times(s.next(utc(2026, 10, 31, 12), 4)) == [
        (utc(2026, 11, 1, 5, 30), "night"),  # 01:30 EDT (not 01:30 EST, 06:30 UTC)
        (utc(2026, 11, 1, 7, 30), "late"),  # 02:30 EST exists once
        (utc(2026, 11, 2, 6, 30), "night"),
        (utc(2026, 11, 2, 7, 30), "late"),
    ]
    assert effect(s, utc(2026, 11, 1, 6, 45)) == ("night", utc(2026, 11, 1, 5, 30), 1)  # 01:45 EST


def test_schedule_dst_gap_tie_goes_to_the_later_written_time() -> None:
    # 02:30 (line 2) and 03:00 (line 1) both fire at 03:00 EDT on 8 March: 03:00 is the later time,
    # so line 1 wins there, although line 2 wins ties between equal written times.
    s = sched("0 3 * * * day\n30 2 * * * night\n", "America/New_York")
    assert times(s.next(utc(2026, 3, 7), 4)) == [
        (utc(2026, 3, 7, 7, 30), "night"),
        (utc(2026, 3, 7, 8, 0), "day"),
        (utc(2026, 3, 8, 7, 0), "day"),  # one fire for the two entries
        (utc(2026, 3, 9, 6, 30), "night"),
    ]
    assert effect(s, utc(2026, 3, 8, 7, 0)) == ("day", utc(2026, 3, 8, 7, 0), 1)


def _brute_fires(s: Schedule, start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """The documented DST rule, by brute force over every UTC minute of [start, end)."""
    tz = s.tz
    first_at: dict[datetime, datetime] = {}  # wall-clock minute → first instant showing it
    walls: list[tuple[datetime, datetime]] = []
    u = start
    while u < end:
        w = u.astimezone(tz).replace(tzinfo=None)
        if w not in first_at:
            first_at[w] = u
        walls.append((u, w))
        u += timedelta(minutes=1)
    fires: dict[datetime, tuple[datetime, int, str]] = {}
    w = walls[0][1]
    last_wall = max(w for _, w in walls)
    while w <= last_wall:
        for e in s.entries:
            if not e.matches(w):
                continue
            # A wall time the clock never shows fires at the first instant whose wall time is later.
            at = first_at[w] if w in first_at else next(u for u, ww in walls if ww > w)
            key = (w, e.line, e.target)
            if at not in fires or key[:2] > fires[at][:2]:
                fires[at] = key
        w += timedelta(minutes=1)
    return [(at, fires[at][2]) for at in sorted(fires)]


@settings(max_examples=60, deadline=None)
@given(
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    spring=st.booleans(),
    lines=st.lists(
        st.tuples(
            st.sampled_from(["0", "15", "30", "45", "*/20", "10,50"]),
            st.sampled_from(["0-4", "1", "2", "3", "*"]),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_schedule_dst_nights_match_a_brute_force_of_the_rule(
    zone: str, spring: bool, lines: list[tuple[str, str]]
) -> None:
    text = "".join(f"{m} {h} * * * t{i}\n" for i, (m, h) in enumerate(lines))
    s = sched(text, zone)
    # Find the transition of 2026 in this zone by scanning offsets.
    month = {("Australia/Lord_Howe", True): 10, ("Australia/Lord_Howe", False): 4}.get(
        (zone, spring), 3 if spring else 10
    )
    if zone == "America/New_York" and not spring:
        month = 11
    u = utc(2026, month, 1)
    while u.astimezone(s.tz).utcoffset() == (u + timedelta(hours=1)).astimezone(s.tz).utcoffset():
        u += timedelta(hours=1)
    start, end = u - timedelta(hours=6), u + timedelta(hours=6)
    expected = [x for x in _brute_fires(s, start, end) if start < x[0] < end - timedelta(hours=2)]
    got = [(f.at, f.target) for f in s.next(start, len(expected))]
    assert got == expected, text
    for at, target in expected:
        assert effect(s, at)[:2] == (target, at)
