"""The schedule file: every field form, the TZ line, error messages, fuzzing."""

from __future__ import annotations

import re
from datetime import date, datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushift.errors import ConfigError
from gpushift.schedule import Schedule, load_schedule, parse_schedule

UTC = timezone.utc
REPO = Path(__file__).resolve().parents[3]


def sched(text: str, tz: str = "UTC", backends: set[str] | None = None, path: str = "test.sched") -> Schedule:
    return parse_schedule(text, path, backends, default_tz=ZoneInfo(tz))


def fire_days(text: str, start: datetime, n: int) -> list[date]:
    """The calendar days (in UTC) of the next n fires of a one-entry UTC schedule."""
    return [f.at.date() for f in sched(text + " a\n").next(start, n)]


START = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)  # a Saturday


# ---- field forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "minutes", "hours"),
    [
        ("5 3 * * *", (5,), (3,)),
        ("05 03 * * *", (5,), (3,)),
        ("0,15,45 1,13 * * *", (0, 15, 45), (1, 13)),
        ("10-13 22-23 * * *", (10, 11, 12, 13), (22, 23)),
        ("*/15 */6 * * *", (0, 15, 30, 45), (0, 6, 12, 18)),
        ("1-10/3 8-18/5 * * *", (1, 4, 7, 10), (8, 13, 18)),
        ("0-4,50-59/5 0 * * *", (0, 1, 2, 3, 4, 50, 55), (0,)),
        ("*/60 0 * * *", (0,), (0,)),
        ("59 23 * * *", (59,), (23,)),
    ],
)
def test_schedule_parse_minute_and_hour_forms(
    fields: str, minutes: tuple[int, ...], hours: tuple[int, ...]
) -> None:
    s = sched(f"{fields} a\n")
    e = s.entries[0]
    assert (e.minutes, e.hours) == (minutes, hours)
    # ... and the fires of one day are exactly those times
    day = [f.at for f in s.next(datetime(2026, 1, 4, 23, 59, 59, tzinfo=UTC), len(minutes) * len(hours))]
    assert [(t.hour, t.minute) for t in day] == [(h, m) for h in hours for m in minutes]
    assert {t.date() for t in day} == {date(2026, 1, 5)}


def test_schedule_parse_asterisk_minute_fires_every_minute() -> None:
    fires = sched("* * * * * a\n").next(datetime(2026, 1, 1, 10, 0, 30, tzinfo=UTC), 3)
    assert [f.at for f in fires] == [datetime(2026, 1, 1, 10, m, tzinfo=UTC) for m in (1, 2, 3)]


@pytest.mark.parametrize(
    ("fields", "months"),
    [
        ("0 0 1 jan *", {1}),
        ("0 0 1 JAN,Jul *", {1, 7}),
        ("0 0 1 mar-may *", {3, 4, 5}),
        ("0 0 1 */4 *", {1, 5, 9}),
        ("0 0 1 feb-dec/5 *", {2, 7, 12}),
        ("0 0 1 12 *", {12}),
    ],
)
def test_schedule_parse_month_forms(fields: str, months: set[int]) -> None:
    days = fire_days(fields, datetime(2026, 12, 31, tzinfo=UTC), len(months))
    assert days == sorted(date(2027, m, 1) for m in months)


def test_schedule_parse_day_of_month_forms() -> None:
    start = datetime(2026, 12, 31, tzinfo=UTC)
    assert fire_days("0 0 1,15 1 *", start, 2) == [date(2027, 1, 1), date(2027, 1, 15)]
    assert fire_days("0 0 10-12 1 *", start, 3) == [date(2027, 1, d) for d in (10, 11, 12)]
    assert fire_days("0 0 */10 1 *", start, 4) == [date(2027, 1, d) for d in (1, 11, 21, 31)]
    assert fire_days("0 0 5-25/10 1 *", start, 3) == [date(2027, 1, d) for d in (5, 15, 25)]


# 2026-11-29 is a Sunday, 2026-11-30 a Monday, 2026-12-05 a Saturday.
@pytest.mark.parametrize(
    ("dow", "first_days"),
    [
        ("0", [date(2026, 11, 29), date(2026, 12, 6)]),
        ("7", [date(2026, 11, 29), date(2026, 12, 6)]),
        ("1", [date(2026, 11, 30), date(2026, 12, 7)]),
        ("6", [date(2026, 12, 5), date(2026, 12, 12)]),
        ("sun", [date(2026, 11, 29), date(2026, 12, 6)]),
        ("MON", [date(2026, 11, 30), date(2026, 12, 7)]),
        ("Sat,sun", [date(2026, 11, 29), date(2026, 12, 5)]),
        ("1-5", [date(2026, 11, 30), date(2026, 12, 1)]),
        ("mon-fri", [date(2026, 11, 30), date(2026, 12, 1)]),
        ("5-7", [date(2026, 11, 29), date(2026, 12, 4)]),  # Fri, Sat, Sun
        ("fri-sun", [date(2026, 11, 29), date(2026, 12, 4)]),
        ("0,7", [date(2026, 11, 29), date(2026, 12, 6)]),
        ("*/3", [date(2026, 11, 29), date(2026, 12, 2)]),  # Sun, Wed, Sat
        ("1-7/2", [date(2026, 11, 29), date(2026, 11, 30)]),  # Mon, Wed, Fri, Sun
    ],
)
def test_schedule_parse_weekday_numbers_and_names_are_cron_days(dow: str, first_days: list[date]) -> None:
    assert fire_days(f"0 12 * * {dow}", START, 2) == first_days


def test_schedule_parse_weekday_zero_one_seven_are_sunday_monday_sunday() -> None:
    # The APScheduler trap (0 = Monday in from_crontab): pinned over a whole year.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for dow, weekday in (("0", 6), ("1", 0), ("7", 6)):
        days = fire_days(f"0 8 * * {dow}", start, 52)
        assert {d.weekday() for d in days} == {weekday}, dow
        assert len(set(days)) == 52


def test_schedule_parse_mon_sun_range_is_the_whole_week() -> None:
    assert len(set(d.weekday() for d in fire_days("0 8 * * mon-sun", START, 14))) == 7
    assert fire_days("0 8 * * sun-sun", START, 2) == [date(2026, 11, 29), date(2026, 12, 6)]


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_schedule_parse_at_forms(macro: str, equivalent: str) -> None:
    a = sched(f"{macro} x\n").next(START, 5)
    b = sched(f"{equivalent} x\n").next(START, 5)
    assert [f.at for f in a] == [f.at for f in b]
    assert a[0].entry.fields == macro


def test_schedule_parse_comments_blank_lines_and_whitespace() -> None:
    s = sched("# header\n\n   # indented comment\n\t0\t8 * *  1-5\tvllm   \n\n0 20 * * 1-5 llama\n")
    assert [(e.line, e.fields, e.target) for e in s.entries] == [
        (4, "0 8 * * 1-5", "vllm"),
        (6, "0 20 * * 1-5", "llama"),
    ]


def test_schedule_parse_empty_file_has_no_entries() -> None:
    s = sched("# nothing yet\n")
    assert s.entries == ()
    assert s.in_effect(START) is None
    assert s.next(START, 3) == []
    assert s.next_boundary(START) is None and s.next_change(START) is None


def test_schedule_parse_tz_line_sets_the_zone() -> None:
    s = sched("# c\nTZ=Asia/Shanghai\n0 8 * * * a\n", tz="Europe/Berlin")
    assert str(s.tz) == "Asia/Shanghai" and s.tz_line == 2
    assert s.next(START, 1)[0].at == datetime(2026, 11, 29, 0, 0, tzinfo=UTC)  # 08:00 CST
    assert str(sched("TZ = 'America/New_York'\n").tz) == "America/New_York"
    assert str(sched('TZ="UTC"\n').tz) == "UTC"


def test_schedule_parse_without_tz_line_uses_the_default_zone() -> None:
    s = sched("0 8 * * * a\n", tz="Europe/Berlin")
    assert str(s.tz) == "Europe/Berlin" and s.tz_line is None


def test_schedule_parse_off_is_always_a_valid_target() -> None:
    s = sched("0 1 * * * off\n", backends={"vllm"})
    assert s.entries[0].target == "off"


def test_schedule_parse_targets_are_the_named_backends() -> None:
    s = sched("0 1 * * * vllm\n0 2 * * * off\n0 3 * * * vllm\n", backends={"vllm", "llama"})
    assert s.targets == {"vllm", "off"}


def test_schedule_parse_both_day_fields_restricted_can_name_a_rare_day() -> None:
    # 31 February never exists, but with a weekday too the entry fires on Mondays in February.
    s = sched("0 8 31 2 mon a\n")
    assert fire_days("0 8 31 2 mon", START, 1) == [date(2027, 2, 1)]
    assert s.entries[0].dom_restricted and s.entries[0].dow_restricted


# ---- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field", "expected"),
    [
        ("60 8 * * * a", "minute", "0-59"),
        ("-1 8 * * * a", "minute", "0-59"),
        ("0 24 * * * a", "hour", "0-23"),
        ("0 8 0 * * a", "day-of-month", "1-31"),
        ("0 8 32 * * a", "day-of-month", "1-31"),
        ("0 8 * 13 * a", "month", "1-12 or jan..dec"),
        ("0 8 * 0 * a", "month", "1-12"),
        ("0 8 * january * a", "month", "jan..dec"),
        ("0 8 * * 8 a", "day-of-week", "0-7"),
        ("0 8 * * fry a", "day-of-week", "sun..sat"),
        ("0 8 * * monday a", "day-of-week", "sun..sat"),
        ("0 8 * mon * a", "month", "jan..dec"),
        ("0 8 * * jan a", "day-of-week", "sun..sat"),
        ("0 8 * * 5-1 a", "day-of-week", "runs backwards"),
        ("0 8 * * 1-0 a", "day-of-week", "runs backwards"),
        ("30-10 8 * * * a", "minute", "runs backwards"),
        ("*/0 8 * * * a", "minute", "step"),
        ("*/x 8 * * * a", "minute", "step"),
        ("*/ 8 * * * a", "minute", "step"),
        ("5/15 8 * * * a", "minute", "a step needs a range"),
        ("0 8 1,,2 * * a", "day-of-month", "empty list item"),
        ("0 8 1, * * a", "day-of-month", "empty list item"),
        ("0 8 L * * a", "day-of-month", "1-31"),
        ("0 8 ? * * a", "day-of-month", "1-31"),
        ("0 8 * * 1#2 a", "day-of-week", "0-7"),
        ("0 8 1- * * a", "day-of-month", "missing value"),
        ("0 8 *-3 * * a", "day-of-month", "1-31"),
        ("0 8 31 2 * a", "day-of-month", "never"),
        ("0 8 30,31 2 * a", "day-of-month", "never"),
        ("0 8 31 apr,jun,sep,nov * a", "day-of-month", "never"),
        ("0 8 * * *", "backend", "missing"),
        ("0 8 * *", "day-of-week", "missing"),
        ("0", "hour", "missing"),
        ("0 8 * * * a b", "backend", "unexpected text"),
        ("0 8 * * * a # comment", "backend", "own line"),
        ("0 8 * * * a/b", "backend", "not a backend name"),
        ("@reboot a", "@reboot", "not supported"),
        ("@fortnightly a", "@fortnightly", "unknown @-form"),
        ("@daily", "backend", "missing"),
        ("@daily a b", "backend", "unexpected text"),
        ("99999999999999999999 8 * * * a", "minute", "out of range"),
        ("٣ 8 * * * a", "minute", "0-59"),  # a non-ASCII digit is not a number here
    ],
)
def test_schedule_parse_error_names_file_line_field_and_expectation(
    line: str, field: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as ei:
        sched(f"# comment\nTZ=UTC\n\n{line}\n", path="/etc/gpushift/schedule")
    msg = str(ei.value)
    assert msg.startswith(f"/etc/gpushift/schedule:4: {field}: "), msg
    assert expected in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("0 8 * * * a\nTZ=UTC\n", 2, "before the first entry"),
        ("TZ=UTC\nTZ=Asia/Shanghai\n", 2, "given twice (first on line 1)"),
        ("TZ=Mars/Olympus\n", 1, "unknown time zone"),
        ("TZ=America\n", 1, "unknown time zone"),
        ("TZ=../../etc/passwd\n", 1, "not a zone name"),
        ("TZ=/etc/localtime\n", 1, "not a zone name"),
        ("TZ=\n", 1, "missing zone"),
        ("TZ=CST-8\n", 1, "IANA zone name"),
        ("CRON_TZ=UTC\n", 1, "only setting is TZ="),
        ("MAILTO=root\n", 1, "unknown setting"),
    ],
)
def test_schedule_parse_tz_errors(text: str, line: int, expected: str) -> None:
    with pytest.raises(ConfigError) as ei:
        sched(text, path="s")
    assert str(ei.value).startswith(f"s:{line}: "), str(ei.value)
    assert expected in str(ei.value)


def test_schedule_parse_unknown_backend_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as ei:
        sched("0 8 * * * vllm\n0 20 * * * lama\n", backends={"vllm", "llama"}, path="s")
    assert (
        str(ei.value)
        == "s:2: backend: 'lama' is not a configured backend (expected one of: llama, vllm, off)"
    )


def test_schedule_parse_reports_the_first_bad_line() -> None:
    with pytest.raises(ConfigError, match=r"^s:2: hour: "):
        sched("0 8 * * * a\n0 25 * * * a\n0 99 * * * a\n", path="s")


def test_schedule_load_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=re.escape(f"{missing}: schedule file not found")):
        load_schedule(str(missing))


def test_schedule_load_reads_the_file_and_names_it_in_errors(tmp_path: Path) -> None:
    p = tmp_path / "schedule"
    p.write_text("TZ=Europe/Berlin\n0 8 * * * vllm\n", encoding="utf-8")
    s = load_schedule(str(p), backends={"vllm"})
    assert s.path == str(p) and str(s.tz) == "Europe/Berlin" and len(s.entries) == 1
    p.write_bytes(b"\xef\xbb\xbfTZ=Asia/Tokyo\r\n0 8 * * * vllm\r\n")  # BOM and CRLF from an editor
    s = load_schedule(str(p), backends={"vllm"})
    assert str(s.tz) == "Asia/Tokyo" and s.entries[0].target == "vllm"
    p.write_bytes(b"TZ=UTC\n0 8 * * * v\xffllm\n")
    with pytest.raises(ConfigError, match=re.escape(f"{p}:2: not UTF-8: byte 0xff at offset 18")):
        load_schedule(str(p), backends={"vllm"})


def test_schedule_shipped_example_parses_and_means_what_it_says() -> None:
    s = load_schedule(str(REPO / "etc/gpushift/schedule"), backends={"vllm", "llama"})
    assert str(s.tz) == "Asia/Shanghai"
    assert [(e.fields, e.target) for e in s.entries] == [
        ("0 8 * * 1-5", "vllm"),
        ("0 20 * * 1-5", "llama"),
        ("0 0 * * sat,sun", "llama"),
    ]
    cst = ZoneInfo("Asia/Shanghai")
    # Monday 2026-11-30: llama until 08:00, vllm until 20:00, then llama.
    assert s.in_effect(datetime(2026, 11, 30, 7, 59, tzinfo=cst)).target == "llama"  # type: ignore[union-attr]
    assert s.in_effect(datetime(2026, 11, 30, 8, 0, tzinfo=cst)).target == "vllm"  # type: ignore[union-attr]
    assert s.in_effect(datetime(2026, 11, 30, 20, 0, tzinfo=cst)).target == "llama"  # type: ignore[union-attr]
    # Saturday noon: the weekend entry.
    sat = s.in_effect(datetime(2026, 12, 5, 12, 0, tzinfo=cst))
    assert sat is not None and sat.entry.line == s.entries[2].line


# ---- fuzzing -------------------------------------------------------------------------------------

_CRONISH = st.text(alphabet="0123456789*/-,@#=TZ abcdefjmnorstuvwy\t:LW?", max_size=40)


def _check_outcome(text: str, bad_line: int) -> None:
    try:
        s = sched(text, path="fuzz")
    except ConfigError as e:
        assert re.match(rf"^fuzz:{bad_line}: \S", str(e)), str(e)
        return
    # It parsed: it must also answer questions without crashing.
    t = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    s.in_effect(t)
    s.next(t, 3)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=_CRONISH)
def test_schedule_parse_fuzz_random_line_never_crashes(junk: str) -> None:
    _check_outcome(f"# ok\n0 8 * * * a\n{junk}\n0 9 * * * b\n", bad_line=3)


@settings(max_examples=400, deadline=None)
@given(
    index=st.integers(min_value=0, max_value=5),
    junk=st.text(max_size=12).filter(lambda s: s.strip() == s and s != "" and len(s.splitlines()) == 1),
)
def test_schedule_parse_fuzz_one_bad_field_is_reported_on_its_line(index: int, junk: str) -> None:
    tokens = ["0", "8", "*", "*", "*", "vllm"]
    tokens[index] = junk
    _check_outcome("TZ=Europe/Berlin\n\n" + " ".join(tokens) + "\n", bad_line=3)


@settings(max_examples=200, deadline=None)
@given(junk=st.text(max_size=30).filter(lambda s: len(f"TZ={s}".splitlines()) == 1))
def test_schedule_parse_fuzz_tz_value_never_crashes(junk: str) -> None:
    _check_outcome(f"TZ={junk}\n0 8 * * * a\n", bad_line=1)
