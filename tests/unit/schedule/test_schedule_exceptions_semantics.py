"""What calendar exceptions mean: in effect, next, next boundary, next change, across their start and
end, with DST inside them, and what the keeper makes of them (its reason, its status, an override)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushift.keeper import Snapshot, decide
from gpushift.keeper.decide import Switch
from gpushift.keeper.override import manual_override
from gpushift.schedule import Fire, Schedule, parse_schedule
from gpushift.values import Trigger

UTC = timezone.utc
CST = ZoneInfo("Asia/Shanghai")

#: The issue's week (Shanghai): vllm on weekdays from 08:00, llama from 20:00 and at weekends; the
#: holiday week on llama, and a maintenance morning with every backend off.
WEEK = """TZ=Asia/Shanghai
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
except 2026-12-24 12:00 .. 2026-12-28 10:00 llama holidays
except 2027-01-04 .. 2027-01-04T09:30 off
"""


def sched(text: str = WEEK, tz: str = "UTC") -> Schedule:
    return parse_schedule(text, "test.sched", None, default_tz=ZoneInfo(tz))


def cst(*args: int) -> datetime:
    return datetime(*args, tzinfo=CST).astimezone(UTC)  # type: ignore[misc]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def what(f: Fire | None) -> tuple[Any, ...] | None:
    """(target, at, line, exception in force, exception that ended here) of a fire."""
    if f is None:
        return None
    return (f.target, f.at, f.entry.line, f.exception, f.span.label if f.span and f.ends else None)


# ---- in effect -----------------------------------------------------------------------------------


def test_exception_in_effect_before_inside_and_after() -> None:
    s = sched()
    # Thursday 24 December 2026 (local): vllm from 08:00, the holidays from 12:00 (mid-period) ...
    assert what(s.in_effect(cst(2026, 12, 24, 11, 59))) == ("vllm", cst(2026, 12, 24, 8), 2, None, None)
    at_start = ("llama", cst(2026, 12, 24, 12), 5, "holidays", None)
    assert what(s.in_effect(cst(2026, 12, 24, 12))) == at_start
    # ... in force across what would have been vllm on Friday and Monday morning ...
    for t in (cst(2026, 12, 25, 9), cst(2026, 12, 26, 12), cst(2026, 12, 28, 9, 59, 59)):
        assert what(s.in_effect(t)) == at_start, t
    # ... until Monday 10:00 (excluded), when vllm, which fired at 08:00 inside it, is in effect again.
    back = ("vllm", cst(2026, 12, 28, 10), 2, None, "holidays")
    assert what(s.in_effect(cst(2026, 12, 28, 10))) == back
    assert what(s.in_effect(cst(2026, 12, 28, 19, 59))) == back
    assert what(s.in_effect(cst(2026, 12, 28, 20))) == ("llama", cst(2026, 12, 28, 20), 3, None, None)


def test_exception_that_ends_in_another_period_hands_back_to_the_entry_fired_last_before_its_end() -> None:
    # From a vllm afternoon into a llama night: the entry that fired last before the end is line 3.
    s = sched(
        "TZ=Asia/Shanghai\n0 8 * * * vllm\n0 20 * * * llama\nexcept 2026-12-24 15:00 .. 2026-12-25 23:00 off\n"
    )
    assert what(s.in_effect(cst(2026, 12, 24, 14))) == ("vllm", cst(2026, 12, 24, 8), 2, None, None)
    assert s.in_effect(cst(2026, 12, 25, 12)).target == "off"  # type: ignore[union-attr]
    end = ("llama", cst(2026, 12, 25, 23), 3, None, "2026-12-24T15:00..2026-12-25T23:00")
    assert what(s.in_effect(cst(2026, 12, 25, 23))) == end


def test_exception_ending_when_an_entry_fires_is_one_fire_naming_that_entry() -> None:
    s = sched("0 8 * * * vllm\n0 20 * * * llama\nexcept 2026-12-24 .. 2026-12-25T08:00 llama\n")
    f = s.in_effect(utc(2026, 12, 25, 8))
    assert what(f) == ("vllm", utc(2026, 12, 25, 8), 1, None, "2026-12-24..2026-12-25T08:00")
    assert [what(x) for x in s.next(utc(2026, 12, 25, 7), 2)] == [
        what(f),
        ("llama", utc(2026, 12, 25, 20), 2, None, None),
    ]


def test_exception_beginning_when_an_entry_fires_wins_that_instant() -> None:
    s = sched("0 8 * * * vllm\nexcept 2026-12-24T08:00 .. 2026-12-25 off maint\n")
    assert what(s.in_effect(utc(2026, 12, 24, 8))) == ("off", utc(2026, 12, 24, 8), 2, "maint", None)
    assert [f.target for f in s.next(utc(2026, 12, 24, 7), 3)] == ["off", "vllm", "vllm"]


def test_exception_that_has_passed_changes_nothing_now() -> None:
    s = sched("0 8 * * * vllm\n0 20 * * * llama\nexcept 2020-12-24 .. 2020-12-31 off\n")
    assert what(s.in_effect(utc(2026, 12, 1, 12))) == ("vllm", utc(2026, 12, 1, 8), 1, None, None)
    assert s.next(utc(2026, 12, 1, 12), 1)[0].at == utc(2026, 12, 1, 20)


def test_exceptions_end_to_start_hand_over_without_an_end_fire_between() -> None:
    s = sched(
        "0 8 * * * vllm\nexcept 2026-12-24 .. 2026-12-24 llama a\nexcept 2026-12-25 .. 2026-12-25 off b\n"
    )
    assert [what(f) for f in s.next(utc(2026, 12, 23, 12), 4)] == [
        ("llama", utc(2026, 12, 24), 2, "a", None),
        ("off", utc(2026, 12, 25), 3, "b", None),
        ("vllm", utc(2026, 12, 26), 1, None, "b"),
        ("vllm", utc(2026, 12, 26, 8), 1, None, None),
    ]


def test_exceptions_without_any_entry() -> None:
    s = sched("except 2026-12-24 .. 2026-12-31 llama holidays\n")
    assert s.in_effect(utc(2026, 12, 23)) is None
    assert s.in_effect(utc(2026, 12, 25)).exception == "holidays"  # type: ignore[union-attr]
    assert s.in_effect(utc(2027, 1, 1)) is None, "after it, nothing has ever fired: nothing is in effect"
    assert [f.at for f in s.next(utc(2026, 1, 1), 5)] == [utc(2026, 12, 24)]
    assert s.next_change(utc(2026, 12, 25)) is None


# ---- next, next boundary, next change ------------------------------------------------------------


def test_exception_next_lists_its_start_and_end_and_nothing_inside() -> None:
    s = sched()
    assert [what(f) for f in s.next(cst(2026, 12, 23, 12), 6)] == [
        ("llama", cst(2026, 12, 23, 20), 3, None, None),
        ("vllm", cst(2026, 12, 24, 8), 2, None, None),
        ("llama", cst(2026, 12, 24, 12), 5, "holidays", None),
        ("vllm", cst(2026, 12, 28, 10), 2, None, "holidays"),
        ("llama", cst(2026, 12, 28, 20), 3, None, None),
        ("vllm", cst(2026, 12, 29, 8), 2, None, None),
    ]
    # from inside, the first is its end
    assert what(s.next(cst(2026, 12, 26), 1)[0]) == ("vllm", cst(2026, 12, 28, 10), 2, None, "holidays")
    # the "off" morning starts at midnight (Sunday night's llama boundary inside it is not listed)
    assert [what(f) for f in s.next(cst(2027, 1, 3, 12), 3)] == [
        ("off", cst(2027, 1, 4), 6, "2027-01-04..2027-01-04T09:30", None),
        ("vllm", cst(2027, 1, 4, 9, 30), 2, None, "2027-01-04..2027-01-04T09:30"),
        ("llama", cst(2027, 1, 4, 20), 3, None, None),
    ]


def test_exception_next_boundary_is_its_start_then_its_end() -> None:
    s = sched()
    assert s.next_boundary(cst(2026, 12, 24, 9)).at == cst(2026, 12, 24, 12)  # type: ignore[union-attr]
    assert s.next_boundary(cst(2026, 12, 24, 12)).at == cst(2026, 12, 28, 10)  # type: ignore[union-attr]
    assert s.next_boundary(cst(2026, 12, 25, 7, 59)).at == cst(2026, 12, 28, 10)  # type: ignore[union-attr]
    assert s.next_boundary(cst(2026, 12, 28, 10)).at == cst(2026, 12, 28, 20)  # type: ignore[union-attr]


def test_exception_next_change_skips_starts_and_ends_that_change_nothing() -> None:
    s = sched()
    # Wednesday night (llama): the holidays begin on vllm's Thursday, so the next change is 08:00.
    assert what(s.next_change(cst(2026, 12, 23, 21))) == ("vllm", cst(2026, 12, 24, 8), 2, None, None)
    # Thursday 09:00 (vllm): the holidays' start is the change.
    assert what(s.next_change(cst(2026, 12, 24, 9))) == ("llama", cst(2026, 12, 24, 12), 5, "holidays", None)
    # Inside: back to vllm at the end.
    assert what(s.next_change(cst(2026, 12, 25))) == ("vllm", cst(2026, 12, 28, 10), 2, None, "holidays")
    # An exception naming what runs anyway changes nothing at its start nor at its end.
    same = sched("0 8 * * * vllm\n0 20 * * * llama\nexcept 2026-12-24T21:00 .. 2026-12-25T07:00 llama\n")
    assert what(same.next_change(utc(2026, 12, 24, 20, 30))) == ("vllm", utc(2026, 12, 25, 8), 1, None, None)
    # A start and an end with nothing changing between two exceptions.
    two = sched(
        "0 8 * * * vllm\nexcept 2026-12-24 .. 2026-12-24 vllm\nexcept 2026-12-26 .. 2026-12-26 off x\n"
    )
    assert what(two.next_change(utc(2026, 12, 23, 12))) == ("off", utc(2026, 12, 26), 3, "x", None)


# ---- DST inside an exception ---------------------------------------------------------------------


def test_exception_spanning_the_autumn_fold_silences_the_repeated_hour_and_ends_on_local_time() -> None:
    # Berlin, 25 October 2026: 03:00 CEST -> 02:00 CET.  The hourly entry would fire at 02:30 CEST
    # (00:30 UTC); inside the exception nothing fires, and its end (Sunday 12:00 CET) is 11:00 UTC.
    s = sched("TZ=Europe/Berlin\n30 * * * * vllm\nexcept 2026-10-24 .. 2026-10-25T12:00 llama\n")
    assert [f.at for f in s.next(utc(2026, 10, 23, 21, 15), 4)] == [
        utc(2026, 10, 23, 21, 30),  # Friday 23:30 CEST
        utc(2026, 10, 23, 22),  # the exception begins: Saturday 00:00 CEST
        utc(2026, 10, 25, 11),  # it ends: Sunday 12:00 CET
        utc(2026, 10, 25, 11, 30),  # 12:30 CET
    ]
    assert s.span_at(utc(2026, 10, 25, 1, 30)) is not None  # the second 02:30, CET
    assert s.in_effect(utc(2026, 10, 25, 1, 30)).target == "llama"  # type: ignore[union-attr]


def test_exception_ending_in_the_spring_gap_ends_at_the_first_instant_after_it() -> None:
    # Berlin, 29 March 2026: 02:00 CET -> 03:00 CEST.  UNTIL 02:30 does not exist: the end is 03:00 CEST.
    s = sched("TZ=Europe/Berlin\n0 8 * * * vllm\nexcept 2026-03-28 .. 2026-03-29T02:30 llama\n")
    (span,) = s.spans
    assert span.end == utc(2026, 3, 29, 1, 0)
    assert s.in_effect(utc(2026, 3, 29, 0, 59)).target == "llama"  # type: ignore[union-attr]
    assert what(s.in_effect(utc(2026, 3, 29, 1, 0))) == (
        "vllm",
        utc(2026, 3, 29, 1, 0),
        2,
        None,
        span.written,
    )


# ---- the keeper ----------------------------------------------------------------------------------


def snapshot(s: Schedule, now: datetime, running: str) -> Snapshot:
    return Snapshot(
        now=now,
        mono=1000.0,
        trigger=Trigger.SCHEDULE,
        schedule=s,
        override=None,
        busy=False,
        established=running,
        running=(running,),
    )


def test_exception_start_and_end_are_scheduled_switches_with_a_reason_naming_it() -> None:
    s = sched()
    (start,) = [
        a for a in decide(snapshot(s, cst(2026, 12, 24, 12), "vllm")).actions if isinstance(a, Switch)
    ]
    assert (start.target, start.trigger) == ("llama", Trigger.SCHEDULE)
    assert start.reason == (
        "schedule line 5 (except 2026-12-24T12:00..2026-12-28T10:00) fired at 2026-12-24T04:00:00+00:00 "
        "(calendar exception holidays)"
    )
    (end,) = [a for a in decide(snapshot(s, cst(2026, 12, 28, 10), "llama")).actions if isinstance(a, Switch)]
    assert end.target == "vllm"
    assert end.reason == (
        "schedule line 2 (0 8 * * 1-5) in effect again at 2026-12-28T02:00:00+00:00 "
        "(calendar exception holidays on line 5 ended)"
    )
    assert decide(snapshot(s, cst(2026, 12, 26), "llama")).actions == (), "inside it, llama is right"


def test_exception_a_manual_switch_inside_lasts_until_its_end() -> None:
    s = sched()
    ov = manual_override(cst(2026, 12, 25, 9), s, "vllm", "alice", False, None, "a demo")
    assert ov.until == cst(2026, 12, 28, 10), "not until Friday's 08:00, which the exception silences"


def test_exception_in_status(make_world: Any) -> None:
    from gpushift.keeper import Keeper

    world = make_world()
    world.boot("day")  # status reads the schedule only

    class Store:
        def load(self) -> None:
            return None

        def save(self, override: Any) -> None:
            pass

    k = Keeper(
        world.switcher, sched(), Store(), now=lambda: cst(2026, 12, 26), monotonic=world.clock.monotonic
    )
    st = k.status()["schedule"]
    assert st["wants"] == "llama"
    assert st["exception"] == {
        "name": "holidays",
        "line": 5,
        "target": "llama",
        "from": "2026-12-24T04:00:00+00:00",
        "until": "2026-12-28T02:00:00+00:00",
        "until_local": "2026-12-28T10:00:00+08:00",
    }
    assert (st["next"]["target"], st["next"]["at"], st["next"]["line"]) == (
        "vllm",
        "2026-12-28T02:00:00+00:00",
        2,
    )
    k2 = Keeper(
        world.switcher, sched(), Store(), now=lambda: cst(2026, 12, 28, 11), monotonic=world.clock.monotonic
    )
    assert k2.status()["schedule"]["exception"] is None


# ---- against a brute force -----------------------------------------------------------------------


def _oracle(s: Schedule, start: datetime, end: datetime) -> list[tuple[datetime, str, str | None]]:
    """The documented rule by brute force: the weekly fires (from the same file without its
    exceptions) outside every exception, each exception's start, and each end that has an entry in
    effect; one per instant, an exception's start first, then an end."""
    weekly = Schedule(s.path, s.tz, s.entries, s.tz_line)
    events: dict[datetime, tuple[int, str, str | None]] = {}
    for f in weekly.next(start, 5000):
        if f.at >= end:
            break
        if not any(sp.start <= f.at < sp.end for sp in s.spans):
            events[f.at] = (0, f.target, None)
    for sp in s.spans:
        if start < sp.end < end and not any(o.start == sp.end for o in s.spans):
            w = weekly.in_effect(sp.end)
            if w is not None:
                events[sp.end] = (1, w.target, None)
        if start < sp.start < end:
            events[sp.start] = (2, sp.target, sp.label)
    return [(t, events[t][1], events[t][2]) for t in sorted(events)]


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["0", "30", "*/20"]),
            st.sampled_from(["*/6", "8", "20", "2"]),
            st.sampled_from("abc"),
        ),
        min_size=0,
        max_size=3,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=6 * 24 * 4), min_size=2, max_size=6, unique=True),
    targets=st.lists(st.sampled_from("abc"), min_size=3, max_size=3),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "Asia/Shanghai"]),
)
def test_exception_next_and_in_effect_agree_with_a_brute_force(
    entries: list[tuple[str, str, str]], cuts: list[int], targets: list[str], zone: str
) -> None:
    # Spans from sorted quarter-hours of 20-26 October 2026 (Berlin's autumn change inside), paired up.
    q = sorted(cuts)
    base = datetime(2026, 10, 20)
    walls = [base + timedelta(minutes=15 * x) for x in q]
    lines = [f"{m} {h} * * * {t}" for m, h, t in entries]
    for i in range(0, len(walls) - 1, 2):
        lines.append(
            f"except {walls[i]:%Y-%m-%dT%H:%M} .. {walls[i + 1]:%Y-%m-%dT%H:%M} {targets[i // 2]} n{i}"
        )
    s = sched(f"TZ={zone}\n" + "\n".join(lines) + "\n")
    start, end = utc(2026, 10, 19, 12), utc(2026, 10, 27)
    expected = _oracle(s, start, end)
    got = [f for f in s.next(start, len(expected) + 1) if f.at < end]
    assert [(f.at, f.target, f.exception) for f in got] == expected
    for a, b in zip(got, got[1:], strict=False):
        assert what(s.in_effect(a.at)) == what(a)
        before_b = s.in_effect(b.at - timedelta(seconds=1))
        if a.in_force is not None and a.in_force.end < b.at:  # it ended with no entry to hand back to
            assert before_b is None
        else:
            assert what(before_b) == what(a)
        assert s.next_boundary(a.at) == b
    # next_change is the first listed fire that names another backend than the one in effect
    for k, t in enumerate([start] + [f.at for f in got]):
        cur = s.in_effect(t)
        want = next((f for f in got[k:] if f.at > t and f.target != (cur.target if cur else None)), None)
        if want is not None:
            assert s.next_change(t) == want, t
