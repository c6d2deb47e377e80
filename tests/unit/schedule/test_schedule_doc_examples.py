"""docs/schedule.md's examples of daylight saving time and calendar exceptions, read from the document
and checked against the schedule: a table row or a command output that the code does not produce
fails here, so the document cannot drift from the behaviour."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

from gpushift.cli import render_status
from gpushift.cli.schedule import schedule as schedule_cli
from gpushift.errors import ConfigError
from gpushift.schedule import Schedule, parse_schedule

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
DOC = (Path(__file__).resolve().parents[3] / "docs" / "schedule.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text under a ``#``-heading, up to the next heading of any level."""
    m = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", DOC, re.M | re.S)
    assert m, f"docs/schedule.md has no section {title!r}"
    return m.group(1)


def blocks(text: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```", text, re.M | re.S)


def table(text: str) -> list[list[str]]:
    """The rows of the (first) markdown table in ``text``, cells stripped, header and rule dropped."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    assert len(rows) > 2, text
    return rows[2:]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def one_line(text: str) -> str:
    return " ".join(text.split())


# ---- daylight saving time ------------------------------------------------------------------------

# The window of each night within which a row lists EVERY fire of its entry (so a second fire in the
# repeated hour, or a fire for a skipped time, would show up).
NIGHTS = {
    "Spring forward: Europe/Berlin, Sunday 29 March 2026": (utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)),
    "Fall back: Europe/Berlin, Sunday 25 October 2026": (utc(2026, 10, 25, 0), utc(2026, 10, 25, 2, 30)),
}
_TIME = re.compile(r"(\d\d):(\d\d) (CET|CEST) = (\d\d):(\d\d) UTC")


def fires_between(entry: str, start: datetime, end: datetime) -> list[datetime]:
    s = parse_schedule(f"TZ=Europe/Berlin\n{entry} x\n", "doc", None)
    return [f.at for f in s.next(start - timedelta(seconds=1), 50) if f.at <= end]


@pytest.mark.parametrize("night", list(NIGHTS))
def test_doc_dst_tables_list_every_fire_of_each_entry_that_night(night: str) -> None:
    start, end = NIGHTS[night]
    rows = table(section(night))
    entries = [r[0].strip("`") for r in rows]
    assert entries[:3] == ["30 2 * * *", "0 * * * *", "30 * * * *"], "the doc's examples changed"
    for row in rows:
        entry, ours = row[0].strip("`"), row[1]
        listed = []
        for h, m, zone, uh, um in _TIME.findall(ours):
            at = start.replace(hour=int(uh), minute=int(um))
            local = at.astimezone(BERLIN)
            assert (f"{local:%H:%M}", local.tzname()) == (f"{h}:{m}", zone), row  # the row's two clocks agree
            listed.append(at)
        assert listed, row
        assert fires_between(entry, start, end) == listed, row
        if "once" in ours:
            assert len(listed) == 1


def test_doc_dst_spring_gap_tie_and_repeated_hour_examples() -> None:
    text = one_line(section("Fall back: Europe/Berlin, Sunday 25 October 2026"))
    assert (
        "with `0 2 * * * b` and `30 2 * * * a`, at 02:15 CET (01:15 UTC, the second pass) `a` is in effect, since 02:30 CEST"
        in text
    )
    s = parse_schedule("TZ=Europe/Berlin\n0 2 * * * b\n30 2 * * * a\n", "doc", None)
    f = s.in_effect(utc(2026, 10, 25, 1, 15))
    assert f is not None and (f.target, f.at) == ("a", utc(2026, 10, 25, 0, 30))
    assert utc(2026, 10, 25, 1, 15).astimezone(BERLIN).strftime("%H:%M %Z") == "02:15 CET"
    # America/New_York: "8 March 2026: 02:30 fires at 03:00 EDT = 07:00 UTC; 1 November 2026: 01:30
    # fires at 01:30 EDT = 05:30 UTC only"
    assert "8 March 2026: 02:30 fires at 03:00 EDT = 07:00 UTC" in text
    assert "1 November 2026: 01:30 fires at 01:30 EDT = 05:30 UTC only" in text
    ny = parse_schedule("30 2 * * * x\n", "doc", None, default_tz=NEW_YORK)
    assert ny.next(utc(2026, 3, 8), 1)[0].at == utc(2026, 3, 8, 7)
    ny = parse_schedule("30 1 * * * x\n", "doc", None, default_tz=NEW_YORK)
    assert [f.at for f in ny.next(utc(2026, 11, 1), 2)] == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]
    # "An entry written for 03:00 that names another backend than a 02:30 entry wins at that instant"
    s = parse_schedule("TZ=Europe/Berlin\n0 3 * * * day\n30 2 * * * night\n", "doc", None)
    (f,) = s.next(utc(2026, 3, 29, 0, 30), 1)
    assert (f.at, f.target) == (utc(2026, 3, 29, 1), "day")


def test_doc_dst_quotes_the_rule_of_evaluate() -> None:
    from gpushift.schedule import evaluate

    rule = one_line(evaluate._to_utc.__doc__ or "")
    assert "does not exist (spring-forward night) → the first instant after the gap" in rule
    assert "exists twice (fall-back night) → the first occurrence" in rule
    text = one_line(section("Daylight saving time"))
    assert (
        "a time that does not exist (the clock jumps over it) fires **at the first instant after the gap**"
        in text
    )
    assert (
        "a time that exists twice (the clock goes back over it) fires **at its first occurrence only**"
        in text
    )


# ---- calendar exceptions -------------------------------------------------------------------------

CAL = section("Calendar exceptions")
EXAMPLE = blocks(CAL)[0]


def example() -> Schedule:
    return parse_schedule(EXAMPLE, "schedule", {"vllm", "llama"})


def test_doc_exceptions_example_table_is_what_is_in_effect() -> None:
    s = example()
    # per row: the line behind the fire, the exception in force, the exception that ended there
    why = {
        "Wed 23 Dec 20:00": (3, None, None),
        "Thu 24 Dec 00:00": (5, "holidays", None),
        "Thu 24 Dec 08:00": (5, "holidays", None),
        "Fri 1 Jan 00:00": (3, None, "holidays"),
        "Fri 1 Jan 08:00": (2, None, None),
        "Mon 4 Jan 08:00": (6, "maintenance", None),
        "Mon 4 Jan 12:00": (2, None, "maintenance"),
    }
    rows = table(CAL)
    assert [r[0] for r in rows] == list(why)
    for when, target, _why in rows:
        at = datetime.strptime(f"{when} {2026 if 'Dec' in when else 2027}", "%a %d %b %H:%M %Y")
        f = s.in_effect(at.replace(tzinfo=BERLIN))
        assert f is not None, when
        ended = f.span.label if f.span is not None and f.ends else None
        assert (f.target, f.entry.line, f.exception, ended) == (target, *why[when]), when


def test_doc_exceptions_schedule_output_is_what_the_cli_prints(tmp_path: Path) -> None:
    (out,) = [b for b in blocks(CAL) if b.startswith("$ gpushift schedule --from")]
    command, *expected = out.rstrip("\n").splitlines()
    args = command.split(" ", 3)[3]  # after "$ gpushift schedule"
    m = re.fullmatch(r'--from "([^"]+)" --next (\d+)', args)
    assert m, command
    sched = tmp_path / "schedule"
    sched.write_text(EXAMPLE, encoding="utf-8")
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nschedule = "{sched}"\n'
        '[backends.vllm]\nunit = "v.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        '[backends.llama]\nunit = "l.service"\nhealth_url = "http://127.0.0.1:8080/health"\n',
        encoding="utf-8",
    )
    r = CliRunner().invoke(
        schedule_cli, ["--from", m.group(1), "--next", m.group(2)], obj={"config_path": str(cfg)}
    )
    assert r.exit_code == 0, r.output
    assert r.stdout.replace(str(sched), "/etc/gpushift/schedule").splitlines() == expected


def test_doc_exceptions_error_messages_are_the_parsers() -> None:
    (errors,) = [b for b in blocks(CAL) if b.startswith("schedule:6:")]
    lines = [
        "except 2026-12-30 .. 2027-01-02 off",
        "except 2027-01-02 .. 2027-01-01 off",
        "except 2027-01-02 .. 2027-01-03 lama",
        "except 2027-01-02 to 2027-01-03 off",
    ]
    head = "\n".join(EXAMPLE.splitlines()[:5])
    got = []
    for line in lines:
        with pytest.raises(ConfigError) as ei:
            parse_schedule(f"{head}\n{line}\n", "schedule", {"vllm", "llama"})
        got.append(str(ei.value))
    assert got == errors.rstrip("\n").splitlines()


def test_doc_exceptions_dst_examples() -> None:
    text = one_line(CAL)
    assert "(`except 2026-03-29 02:30 .. ...` in Berlin starts at 03:00 CEST)" in text
    assert "(`... .. 2026-10-25 02:30` ends at 02:30 CEST, 00:30 UTC)" in text
    assert "`2026-10-24 .. 2026-10-25` lasts 49 hours" in text

    def span(line: str) -> tuple[datetime, datetime]:
        (sp,) = parse_schedule(f"TZ=Europe/Berlin\n{line}\n", "doc", None).spans
        return sp.start, sp.end

    start, _ = span("except 2026-03-29 02:30 .. 2026-03-30 llama")
    assert start.astimezone(BERLIN).strftime("%H:%M %Z") == "03:00 CEST"
    _, end = span("except 2026-10-24 .. 2026-10-25 02:30 llama")
    assert end == utc(2026, 10, 25, 0, 30) and end.astimezone(BERLIN).strftime("%H:%M %Z") == "02:30 CEST"
    start, end = span("except 2026-10-24 .. 2026-10-25 llama")
    assert end - start == timedelta(hours=49)
    with pytest.raises(ConfigError, match="is empty in Europe/Berlin"):
        span("except 2026-03-29 02:00 .. 2026-03-29 02:59 llama")


def test_doc_exceptions_status_and_ledger_reasons() -> None:
    text = one_line(CAL)
    s = example()
    start = s.in_effect(datetime(2027, 1, 4, 8, tzinfo=BERLIN))
    end = s.in_effect(datetime(2027, 1, 4, 12, tzinfo=BERLIN))
    assert start is not None and end is not None
    assert (
        f"The ledger row of the switch says why: `{start.describe()}`, and at its end `{end.describe()}`."
        in text
    )
    holidays = s.in_effect(datetime(2026, 12, 28, tzinfo=BERLIN))
    assert holidays is not None and holidays.in_force is not None
    st = {"schedule": {"wants": holidays.target, "exception": holidays.in_force.as_dict(s.tz)}}
    (line,) = [x for x in render_status(st).splitlines() if x.startswith("schedule:")]
    assert f"`gpushift status` shows `{line}`" in text
    assert sorted(holidays.in_force.as_dict(s.tz)) == sorted(
        ["name", "line", "target", "from", "until", "until_local"]
    )
    assert "`schedule.exception` (`name`, `line`, `target`, `from`, `until`, `until_local`)" in text
