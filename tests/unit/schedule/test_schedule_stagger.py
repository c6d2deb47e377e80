"""Staggered boundaries: a stable offset per host name, and a schedule whose every boundary moves by it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushift.schedule import parse_schedule
from gpushift.schedule.stagger import describe, offset_s

UTC = timezone.utc
TEXT = """TZ=Europe/Berlin
0 8 * * 1-5 day
0 20 * * * night
except 2026-12-24..2026-12-27 night christmas
"""


def test_the_offset_is_stable_in_range_and_differs_between_hosts() -> None:
    a, b = offset_s("gpu-a", 600), offset_s("gpu-b", 600)
    assert (a, b) == (offset_s("gpu-a", 600), offset_s("gpu-b", 600))  # stable
    assert 0 <= a < 600 and 0 <= b < 600 and a != b
    # Fixed for good: a host keeps its offset across versions (the hash input is part of the contract).
    assert (a, b) == (514, 123)
    assert offset_s("gpu-a", 0) == 0 and describe("gpu-a", 0) is None
    assert describe("gpu-a", 600) == {"host_name": "gpu-a", "stagger_s": 600, "offset_s": 514}
    spread = {offset_s(f"host-{i}", 600) for i in range(200)}
    assert len(spread) > 150 and min(spread) < 60 and max(spread) > 540


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=3600))
def test_every_offset_is_in_its_range(name: str, stagger: int) -> None:
    assert 0 <= offset_s(name, stagger) < stagger


def test_a_staggered_schedule_moves_every_boundary() -> None:
    plain = parse_schedule(TEXT, "/s")
    late = plain.staggered(306)
    d = timedelta(seconds=306)
    monday_8 = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)  # 08:00 in Berlin
    assert plain.next_change(monday_8 - timedelta(hours=1)).at == monday_8  # type: ignore[union-attr]
    nxt = late.next_change(monday_8 - timedelta(hours=1))
    assert nxt is not None and (nxt.at, nxt.target) == (monday_8 + d, "day")
    assert late.in_effect(monday_8 + d - timedelta(seconds=1)).target == "night"  # type: ignore[union-attr]
    assert late.in_effect(monday_8 + d).target == "day"  # type: ignore[union-attr]
    assert late.next_boundary(monday_8).at == monday_8 + d  # type: ignore[union-attr]
    assert [f.at for f in late.next(monday_8, 4)] == [f.at + d for f in plain.next(monday_8 - d, 4)]
    # The calendar exception's start and end move too.
    span, moved = plain.spans[0], late.spans[0]
    assert (moved.start, moved.end) == (span.start + d, span.end + d) and moved.written == span.written
    assert late.in_effect(span.start + d - timedelta(seconds=1)).in_force is None  # type: ignore[union-attr]
    assert late.in_effect(span.start + d).in_force == moved  # type: ignore[union-attr]
    # Shifting again is relative to the file, not to the shift before.
    assert late.staggered(0).next(monday_8, 3) == plain.next(monday_8, 3)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=3 * 365 * 86400), st.integers(min_value=1, max_value=3599))
def test_a_staggered_schedule_is_the_file_s_schedule_later(seconds: int, offset: int) -> None:
    plain = parse_schedule(TEXT, "/s")
    late = plain.staggered(offset)
    d = timedelta(seconds=offset)
    t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    a, b = plain.in_effect(t - d), late.in_effect(t)
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert (b.at, b.target) == (a.at + d, a.target)
    ca, cb = plain.next_change(t - d), late.next_change(t)
    assert (ca.at + d, ca.target) == (cb.at, cb.target)  # type: ignore[union-attr]
