"""The schedule laid out over days (``gpushift/schedule/week.py``) and drawn as text
(``weektext.py``): stretches, the 24-hour axis on the days the clock changes, the cell rule, notes."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone

import pytest

from gpushift.schedule import parse_schedule
from gpushift.schedule.week import DAY_S, Overlay, Stretch, lay_out, overlaid
from gpushift.schedule.weektext import COLUMNS, WIDTH, cell_stretch, letters, render

UTC = timezone.utc
BACKENDS = {"vllm", "llama"}

# Europe/Berlin: the clock goes forward on Sunday 29 March 2026 (02:00 CET -> 03:00 CEST).
SPRING = """TZ=Europe/Berlin
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
30 2  *  *  sun      vllm
0  12 *  *  sun      off
10 12 *  *  sun      llama
except 2026-03-27 12:00 .. 2026-03-28 off maintenance
"""


def sched(text: str = SPRING):  # type: ignore[no-untyped-def]
    return parse_schedule(text, "schedule", backends=BACKENDS)


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


def test_week_stretches_follow_the_fires_and_merge_the_same_backend() -> None:
    w = lay_out(sched(), date(2026, 3, 26), 2)
    got = [(s.start, s.end, s.backend, s.source, s.label, s.line) for s in w.stretches]
    assert got == [
        (utc(2026, 3, 25, 23), utc(2026, 3, 26, 7), "llama", "schedule", None, 3),  # since Wed 20:00
        (utc(2026, 3, 26, 7), utc(2026, 3, 26, 19), "vllm", "schedule", None, 2),
        (utc(2026, 3, 26, 19), utc(2026, 3, 27, 7), "llama", "schedule", None, 3),
        (utc(2026, 3, 27, 7), utc(2026, 3, 27, 11), "vllm", "schedule", None, 2),
        (utc(2026, 3, 27, 11), utc(2026, 3, 27, 23), "off", "exception", "maintenance", 8),
    ]
    assert w.start == utc(2026, 3, 25, 23) and w.end == utc(2026, 3, 27, 23)
    # The first stretch began before the days drawn (Wed 20:00 CET): it does not begin on them.
    assert w.stretches[0].since == utc(2026, 3, 25, 19) and not w.days[0].pieces[0].begins
    assert w.stretches[1].since is None and w.days[0].pieces[1].begins
    assert [s.label for s in w.spans] == ["maintenance"]


def test_spring_forward_day_is_23_hours_with_the_skipped_hour_on_its_axis() -> None:
    w = lay_out(sched(), date(2026, 3, 29), 1)
    (day,) = w.days
    assert day.hours == 23
    (shift,) = day.shifts
    assert (shift.kind, shift.at, shift.before_name, shift.after_name) == (
        "gap",
        utc(2026, 3, 29, 1),
        "CET",
        "CEST",
    )
    assert (shift.x0, shift.x1) == (2 * 3600, 3 * 3600)
    # No piece covers the skipped hour: the llama from midnight (where the exception ends) stops at
    # 02:00, and the 02:30 entry (which fires at 03:00 CEST) begins at 03:00.
    pieces = [(p.x0, p.x1, w.stretches[p.stretch].backend, p.begins) for p in day.pieces]
    assert pieces[:2] == [(0, 7200, "llama", True), (10800, 43200, "vllm", True)]
    assert cell_stretch(day, 6) is None and cell_stretch(day, 8) is None  # 02:00 and 02:40
    assert pieces[-1][1] == DAY_S


def test_fall_back_day_is_25_hours_and_the_second_pass_is_drawn_at_the_end_of_the_repeat() -> None:
    s = sched(SPRING.replace("except 2026-03-27 12:00 .. 2026-03-28 off maintenance\n", ""))
    # An override set in the second pass of 02:00-03:00 (01:20 UTC = 02:20 CET) is drawn at 03:00.
    ov = Overlay("hold", "llama", utc(2026, 10, 25, 1, 20))
    w = lay_out(s, date(2026, 10, 25), 1, overlay=ov)
    (day,) = w.days
    assert day.hours == 25
    (shift,) = day.shifts
    assert (shift.kind, shift.x0, shift.x1, shift.before_name, shift.after_name) == (
        "repeat",
        7200,
        10800,
        "CEST",
        "CET",
    )
    assert w.x_of(utc(2026, 10, 25, 0, 30)) == (0, 9000)  # 02:30 CEST: the first pass
    assert w.x_of(utc(2026, 10, 25, 1, 20)) == (0, 10800)  # 02:20 CET: the second pass
    hold = [p for p in day.pieces if w.stretches[p.stretch].source == "hold"]
    assert [(p.x0, p.x1) for p in hold] == [(10800, DAY_S)]


def test_an_override_is_laid_from_when_it_was_set_to_its_end_and_an_ended_one_is_not() -> None:
    base = [Stretch(utc(2026, 1, 1), utc(2026, 1, 2), "vllm", line=2)]
    ov = Overlay("override", "llama", utc(2026, 1, 1, 6), utc(2026, 1, 1, 8))
    got = [
        (s.start.hour, s.end.hour if s.end.day == 1 else 24, s.backend, s.source)
        for s in overlaid(base, ov, None)
    ]
    assert got == [(0, 6, "vllm", "schedule"), (6, 8, "llama", "override"), (8, 24, "vllm", "schedule")]
    assert overlaid(base, ov, utc(2026, 1, 1, 9)) == base  # ended before now: nothing laid
    hold = Overlay("hold", "off", utc(2025, 12, 31))  # set before the range: from its start, to its end
    assert [(s.backend, s.source) for s in overlaid(base, hold, utc(2026, 1, 1, 9))] == [("off", "hold")]


def test_a_stretch_shorter_than_a_cell_shows_its_letter_where_it_starts() -> None:
    w = lay_out(sched(), date(2026, 3, 29), 1)
    day = w.days[0]
    # off from 12:00 to 12:10 CEST, then llama: the 12:00-12:20 cell shows off, the next llama.
    assert w.stretches[cell_stretch(day, 36) or 0].backend == "off"
    assert w.stretches[cell_stretch(day, 37) or 0].backend == "llama"


def test_letters_take_the_first_free_letter_of_the_name_then_of_the_alphabet() -> None:
    assert letters(["vllm", "vllm2", "llama", "lv", "off"]) == {
        "vllm": "v",
        "vllm2": "l",
        "llama": "a",
        "lv": "b",
    }


SPRING_WEEK = """\
        00    02    04    06    08    10    12    14    16    18    20    22
Thu 26  llllllllllllllllllllllllvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvllllllllllll
                                                      now 20:00 CET ^
Fri 27  llllllllllllllllllllllllvvvvvvvvvvvv====================================
                                            ^ maintenance (line 8) begins 12:00
Sat 28  ========================================================================
Sun 29  llllll   vvvvvvvvvvvvvvvvvvvvvvvvvvv-lllllllllllllllllllllllllllllllllll
        ^ maintenance ends 00:00
              ^^^ 02:00-03:00 skipped: clocks go forward (CET to CEST)

  v vllm   l llama   - off
  UPPER CASE and =: a calendar exception, an override or a hold
  blank: wall-clock times the clock skips
  calendar exceptions:
    maintenance (line 8): off, 2026-03-27 12:00 CET to 2026-03-29 00:00 CET"""


def test_week_text_for_a_spring_forward_week_with_an_exception_and_now() -> None:
    w = lay_out(sched(), date(2026, 3, 26), 4, now=utc(2026, 3, 26, 19))
    lines = render(w, letters(["vllm", "llama"]))
    assert "\n".join(lines) == SPRING_WEEK
    assert all(len(line) <= WIDTH for line in lines)


def test_week_text_marks_an_override_and_where_it_ends() -> None:
    ov = Overlay("override", "vllm", utc(2026, 3, 26, 20, 50), utc(2026, 3, 27, 7))
    w = lay_out(sched(), date(2026, 3, 26), 1, now=utc(2026, 3, 26, 21), overlay=ov)
    lines = render(w, letters(["vllm", "llama"]))
    # Set at 21:50 CET (the 21:40-22:00 cell): upper case from there to the day's end; no room right
    # of the markers near the day's end, so the notes go left of them.
    assert lines[1:4] == [
        "Thu 26  " + "l" * 24 + "v" * 36 + "l" * 5 + "V" * 7,
        " " * 48 + "override vllm from 21:50 ^",
        " " * 60 + "now 22:00 CET ^",
    ]
    assert lines[-1] == "  override in effect: vllm until 2026-03-27 08:00 CET"


def test_week_text_paints_runs_and_stripping_the_paint_gives_the_plain_text() -> None:
    w = lay_out(sched(), date(2026, 3, 29), 1)

    def paint(text: str, style: str) -> str:
        return f"<{style}>{text}</>"

    lines = render(w, letters(["vllm", "llama"]), paint)
    assert lines[1] == (
        "Sun 29  <b:llama>llllll</>   <b:vllm>" + "v" * 27 + "</><off>-</><b:llama>" + "l" * 35 + "</>"
    )
    plain = render(w, letters(["vllm", "llama"]))
    assert [re.sub(r"<[^>]*>", "", line) for line in lines] == plain


def test_days_out_of_range_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="days: expected 1 to 31, got 0"):
        lay_out(sched(), date(2026, 3, 26), 0)
    with pytest.raises(ValueError, match="9999-12-31"):
        lay_out(sched(), date(9999, 12, 31), 1)


def test_every_cell_of_an_ordinary_week_shows_a_stretch_and_the_row_is_80_columns() -> None:
    w = lay_out(sched(), date(2026, 4, 6), 7, now=utc(2026, 4, 8, 12))
    for day in w.days:
        assert day.hours == 24 and not day.shifts
        assert all(cell_stretch(day, k) is not None for k in range(COLUMNS))
    rows = render(w, letters(["vllm", "llama"]))[1:]
    assert [len(r) for r in rows if r[:3] in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")] == [WIDTH] * 7
    assert w.days[-1].end - w.days[0].start == timedelta(days=7)


def test_an_empty_schedule_draws_nothing_in_effect_and_says_so() -> None:
    w = lay_out(parse_schedule("# nothing\n", "schedule", backends=BACKENDS), date(2026, 3, 26), 1)
    lines = render(w, letters(["vllm", "llama"]))
    assert lines[1] == "Thu 26  " + "?" * 72
    assert lines[-1] == "  ?: nothing in effect (no entry has fired yet)"


def test_a_day_whose_midnight_is_skipped_starts_after_the_gap_on_its_axis() -> None:
    # America/Santiago, Sunday 6 September 2026: 00:00 -04 becomes 01:00 -03.
    s = parse_schedule(
        "TZ=America/Santiago\n0 8 * * * vllm\n0 20 * * * llama\n", "schedule", backends=BACKENDS
    )
    w = lay_out(s, date(2026, 9, 6), 1)
    (day,) = w.days
    assert day.hours == 23 and day.start == utc(2026, 9, 6, 4)
    assert [(x.kind, x.x0, x.x1) for x in day.shifts] == [("gap", 0, 3600)]
    assert day.pieces[0].x0 == 3600
    assert render(w, letters(["vllm", "llama"]))[1] == "Sun  6     " + "l" * 21 + "v" * 36 + "l" * 12
