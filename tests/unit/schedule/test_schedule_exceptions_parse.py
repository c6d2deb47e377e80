"""Reading calendar exceptions: ``except FROM .. UNTIL backend [NAME]`` lines of the schedule file."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushift.errors import ConfigError
from gpushift.schedule import Schedule, Span, parse_schedule

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")


def sched(text: str, path: str = "s", backends: set[str] | None = None, tz: str = "UTC") -> Schedule:
    return parse_schedule(text, path, backends, default_tz=ZoneInfo(tz))


def one(text: str, tz: str = "Europe/Berlin") -> Span:
    (span,) = sched(f"TZ={tz}\n0 8 * * * vllm\n{text}\n").spans
    return span


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


# ---- good forms ----------------------------------------------------------------------------------


def test_schedule_except_dates_alone_are_whole_days_both_included() -> None:
    s = one("except 2026-12-24 .. 2026-12-31 llama holidays")
    assert (s.line, s.target, s.name, s.written) == (3, "llama", "holidays", "2026-12-24..2026-12-31")
    assert (s.start_wall, s.end_wall) == (datetime(2026, 12, 24), datetime(2027, 1, 1))
    # Berlin is UTC+1 in winter: the 24th 00:00 CET .. the 1st 00:00 CET
    assert (s.start, s.end) == (utc(2026, 12, 23, 23), utc(2026, 12, 31, 23))
    assert s.label == "holidays"


def test_schedule_except_one_day_is_a_day() -> None:
    s = one("except 2026-12-25 .. 2026-12-25 off")
    assert s.end - s.start == timedelta(days=1)
    assert s.name is None and s.label == "2026-12-25..2026-12-25"


@pytest.mark.parametrize(
    "written",
    [
        "except 2026-12-24 18:00 .. 2027-01-04 08:00 llama",
        "except 2026-12-24T18:00 .. 2027-01-04T08:00 llama",
        "except 2026-12-24T18:00..2027-01-04T08:00 llama",
        "except 2026-12-24 18:00..2027-01-04 8:00 llama",
        "EXCEPT   2026-12-24 18:00   ..   2027-01-04T08:00   llama",
        "\texcept 2026-12-24 18:00 .. 2027-01-04 08:00 llama\t",
    ],
)
def test_schedule_except_with_times_ends_at_that_time(written: str) -> None:
    s = one(written)
    assert s.written == "2026-12-24T18:00..2027-01-04T08:00"
    assert (s.start, s.end) == (utc(2026, 12, 24, 17), utc(2027, 1, 4, 7))
    assert s.name is None


def test_schedule_except_mixes_a_date_and_a_time() -> None:
    s = one("except 2026-12-24 12:00 .. 2026-12-24 llama half-day")
    assert (s.start_wall, s.end_wall) == (datetime(2026, 12, 24, 12), datetime(2026, 12, 25))
    assert (s.written, s.name) == ("2026-12-24T12:00..2026-12-24", "half-day")


def test_schedule_except_names_may_be_any_letters() -> None:
    assert one("except 2027-02-06 .. 2027-02-13 llama 春节").name == "春节"
    assert one("except 2027-02-06 .. 2027-02-13 llama xmas_2026-b").name == "xmas_2026-b"


def test_schedule_except_is_read_in_the_files_zone() -> None:
    assert one("except 2026-12-24 .. 2026-12-24 llama", "Asia/Shanghai").start == utc(2026, 12, 23, 16)
    assert one("except 2026-07-01 .. 2026-07-01 llama", "Europe/Berlin").start == utc(2026, 6, 30, 22)


def test_schedule_except_lines_sit_among_entries_and_are_kept_in_time_order() -> None:
    s = sched(
        "TZ=UTC\n"
        "except 2027-02-01 .. 2027-02-02 off later\n"
        "0 8 * * * vllm\n"
        "# a comment\n"
        "except 2026-12-24 .. 2026-12-31 llama holidays\n"
        "0 20 * * * llama\n"
    )
    assert [e.line for e in s.entries] == [3, 6]
    assert [(x.line, x.name) for x in s.spans] == [(5, "holidays"), (2, "later")]
    assert s.targets == {"vllm", "llama", "off"}


def test_schedule_except_shows_as_an_entry_of_its_own_line() -> None:
    s = one("except 2026-12-24 .. 2026-12-31 llama holidays")
    assert (s.entry.line, s.entry.fields, s.entry.target) == (3, "except 2026-12-24..2026-12-31", "llama")


def test_schedule_except_ranges_may_touch_end_to_start() -> None:
    s = sched(
        "except 2026-12-24 .. 2026-12-31 llama a\n"
        "except 2027-01-01 .. 2027-01-01T08:00 off b\n"
        "except 2027-01-01T08:00 .. 2027-01-02 vllm c\n"
    )
    assert [x.name for x in s.spans] == ["a", "b", "c"]
    assert s.spans[0].end == s.spans[1].start and s.spans[1].end == s.spans[2].start


def test_schedule_except_names_configured_backends_or_off() -> None:
    s = sched("except 2026-12-24 .. 2026-12-31 off\n", backends={"vllm"})
    assert s.spans[0].target == "off"


def test_schedule_except_that_has_passed_still_parses_and_is_reported_as_passed() -> None:
    s = sched("except 2020-12-24 .. 2020-12-31 llama old\nexcept 2099-12-24 .. 2099-12-31 llama new\n")
    assert [x.name for x in s.passed(utc(2026, 1, 1))] == ["old"]
    assert [x.name for x in s.passed(utc(2020, 12, 31, 23, 59))] == []
    assert [x.name for x in s.passed(utc(2021, 1, 1))] == ["old"]  # the end itself: passed (half-open)


# ---- DST at FROM and UNTIL (the entries' rule) ---------------------------------------------------


def test_schedule_except_from_in_the_spring_gap_starts_at_the_end_of_the_gap() -> None:
    # Berlin, 29 March 2026: 02:00 CET -> 03:00 CEST; 02:30 does not exist
    s = one("except 2026-03-29 02:30 .. 2026-03-29 12:00 llama")
    assert s.start == utc(2026, 3, 29, 1, 0)  # 03:00 CEST
    assert s.end == utc(2026, 3, 29, 10, 0)  # 12:00 CEST


def test_schedule_except_until_in_the_autumn_fold_ends_at_the_first_occurrence() -> None:
    # Berlin, 25 October 2026: 03:00 CEST -> 02:00 CET; 02:30 exists twice
    s = one("except 2026-10-24 .. 2026-10-25 02:30 llama")
    assert s.end == utc(2026, 10, 25, 0, 30)  # 02:30 CEST, not 02:30 CET (01:30 UTC)


def test_schedule_except_whole_days_across_a_dst_change_are_not_24h_multiples() -> None:
    s = one("except 2026-10-24 .. 2026-10-25 llama")  # Saturday and Sunday of the autumn change
    assert (s.start, s.end) == (utc(2026, 10, 23, 22), utc(2026, 10, 25, 23))
    assert s.end - s.start == timedelta(hours=49)


# ---- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field", "expected"),
    [
        ("except 2026-12-24 2026-12-31 llama", "except", "missing '..'"),
        ("except", "except", "missing '..'"),
        ("except .. 2026-12-31 llama", "from", "missing"),
        ("except 2026-12-24 ..", "until", "missing"),
        ("except 2026-12-24 .. llama", "until", "'llama' is not a date"),
        ("except 2026-13-01 .. 2026-12-31 llama", "from", "not a date of the calendar"),
        ("except 2026-02-29 .. 2026-03-01 llama", "from", "not a date of the calendar"),
        ("except 0000-01-01 .. 2026-03-01 llama", "from", "not a date of the calendar"),
        ("except 26-12-24 .. 2026-12-31 llama", "from", "is not a date (expected YYYY-MM-DD"),
        ("except 2026/12/24 .. 2026-12-31 llama", "from", "is not a date"),
        ("except 24.12.2026 .. 31.12.2026 llama", "from", "is not a date"),
        ("except 2026-12-24 24:00 .. 2026-12-31 llama", "from", "'24:00' is not a time of day"),
        ("except 2026-12-24 8 .. 2026-12-31 llama", "from", "'8' is not a time of day"),
        ("except 2026-12-24T18 .. 2026-12-31 llama", "from", "'18' is not a time of day"),
        ("except 2026-12-24 18:00:30 .. 2026-12-31 llama", "from", "not a time of day"),
        ("except 2026-12-24 18:00 19:00 .. 2026-12-31 llama", "from", "unexpected text '19:00'"),
        ("except 2026-12-24T18:00 19:00 .. 2026-12-31 llama", "from", "unexpected text '19:00'"),
        ("except 2026-12-24 .. 2026-12-31 25:61 llama", "until", "not a time of day"),
        ("except 2026-12-24 .. 2026-12-31", "backend", "missing"),
        ("except 2026-12-24 .. 2026-12-31 08:00", "backend", "missing"),
        ("except 2026-12-24 .. 2026-12-31 ll/ama", "backend", "not a backend name"),
        ("except 2026-12-24 .. 2026-12-31 llama # holidays", "name", "comments go on their own line"),
        ("except 2026-12-24 .. 2026-12-31 llama christmas week", "name", "unexpected text 'week'"),
        ("except 2026-12-24 .. 2026-12-31 llama x/y", "name", "'x/y' is not a name"),
        ("except 2026-12-31 .. 2026-12-24 llama", "until", "'2026-12-24' is not after '2026-12-31'"),
        ("except 2026-12-24T18:00 .. 2026-12-24T18:00 llama", "until", "is not after"),
        ("except 2026-12-24T18:00 .. 2026-12-24T08:00 llama", "until", "is not after"),
        ("except 2026-12-24 .. 2026-12-24T00:00 llama", "until", "is not after"),
        ("except 9999-12-31 .. 9999-12-31 llama", "until", "out of range"),
    ],
)
def test_schedule_except_error_names_file_line_field_and_expectation(
    line: str, field: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as ei:
        sched(f"# holidays\nTZ=Europe/Berlin\n\n{line}\n0 8 * * * vllm\n", path="/etc/gpushift/schedule")
    msg = str(ei.value)
    assert msg.startswith(f"/etc/gpushift/schedule:4: {field}: "), msg
    assert expected in msg, msg
    assert "\n" not in msg


def test_schedule_except_unknown_backend_is_an_error_like_for_entries() -> None:
    with pytest.raises(ConfigError) as ei:
        sched("0 8 * * * vllm\nexcept 2026-12-24 .. 2026-12-31 lama\n", backends={"vllm", "llama"})
    assert (
        str(ei.value)
        == "s:2: backend: 'lama' is not a configured backend (expected one of: llama, vllm, off)"
    )


def test_schedule_except_empty_in_the_spring_gap_is_an_error() -> None:
    with pytest.raises(ConfigError) as ei:
        sched("TZ=Europe/Berlin\nexcept 2026-03-29T02:00 .. 2026-03-29T02:30 llama\n")
    msg = str(ei.value)
    assert msg.startswith("s:2: until: 2026-03-29T02:00..2026-03-29T02:30 is empty in Europe/Berlin"), msg
    assert "2026-03-29 01:00 UTC" in msg


@pytest.mark.parametrize(
    ("first", "second", "other"),
    [
        ("2026-12-24 .. 2026-12-31", "2026-12-28 .. 2027-01-02", "2026-12-24..2026-12-31"),
        ("2026-12-24 .. 2026-12-31", "2026-12-20 .. 2026-12-24", "2026-12-24..2026-12-31"),  # shares the 24th
        ("2026-12-24 .. 2026-12-31", "2026-12-26 .. 2026-12-27", "2026-12-24..2026-12-31"),  # inside
        ("2026-12-26 .. 2026-12-27", "2026-12-24 .. 2026-12-31", "2026-12-26..2026-12-27"),  # around
        (
            "2026-12-24T08:00 .. 2026-12-24T12:00",
            "2026-12-24T11:59 .. 2026-12-24T13:00",
            "2026-12-24T08:00..",
        ),
        ("2026-12-24 .. 2026-12-24", "2026-12-24 .. 2026-12-24", "2026-12-24..2026-12-24"),
    ],
)
def test_schedule_except_overlap_is_an_error_naming_both_lines(first: str, second: str, other: str) -> None:
    text = f"TZ=UTC\nexcept {first} llama a\n0 8 * * * vllm\nexcept {second} off b\n"
    with pytest.raises(ConfigError) as ei:
        sched(text)
    msg = str(ei.value)
    assert re.match(r"^s:4: except: \S+ overlaps line 2 \(", msg), msg
    assert other in msg and "must not overlap" in msg


def test_schedule_except_tz_must_come_before_it() -> None:
    with pytest.raises(ConfigError, match=r"^s:2: TZ: TZ= must come before the first entry \(line 1\)"):
        sched("except 2026-12-24 .. 2026-12-31 llama\nTZ=Europe/Berlin\n")


def test_schedule_except_reports_the_first_bad_line() -> None:
    with pytest.raises(ConfigError, match=r"^s:2: until: "):
        sched("0 8 * * * a\nexcept 2026-12-31 .. 2026-12-24 a\n0 99 * * * a\n")


# ---- fuzzing -------------------------------------------------------------------------------------

_DATEISH = st.text(alphabet="0123456789-:T. #a/\t", max_size=40)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=_DATEISH)
def test_schedule_except_fuzz_never_crashes_and_names_its_line(junk: str) -> None:
    text = f"TZ=Europe/Berlin\n0 8 * * * a\nexcept {junk} b\n0 9 * * * a\n"
    try:
        s = sched(text, path="fuzz")
    except ConfigError as e:
        assert re.match(r"^fuzz:3: (except|from|until|backend|name): \S", str(e)), str(e)
        return
    (span,) = s.spans
    assert span.start < span.end
    t = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    s.in_effect(t)
    s.next(t, 3)
    s.next_change(t)


def test_schedule_except_examples_in_the_shipped_file_parse_when_uncommented() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "etc/gpushift/schedule").read_text(encoding="utf-8")
    examples = [line.lstrip("# ") for line in text.splitlines() if line.lstrip("# ").startswith("except ")]
    assert len(examples) == 2
    s = parse_schedule(text + "\n".join(examples) + "\n", "etc/gpushift/schedule", {"vllm", "llama"})
    assert [(x.written, x.target, x.name) for x in s.spans] == [
        ("2026-12-24..2026-12-31", "llama", "holidays"),
        ("2027-01-04T08:00..2027-01-04T12:00", "off", "maintenance"),
    ]
