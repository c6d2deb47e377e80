"""The bound on a schedule's size (issue 20: what `schedule check` accepts, the daemon runs).

At most ``MAX_ENTRIES`` (1000) entries and calendar exceptions together; the first line over it is
refused naming the file, that line and the bound, by the parser that `schedule check`, the daemon's
start and its reload all use.  Evaluating the largest accepted schedule searches the calendar once
per entry and then only for the entries that fired since (counted here, not timed), and its answers
are those of asking every entry, whatever was asked before.
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushift.cli.schedule import schedule as schedule_cli
from gpushift.config import schema as config_mod
from gpushift.daemon.settings import load_schedule_of
from gpushift.errors import ConfigError
from gpushift.schedule import Schedule, parse_schedule
from gpushift.schedule import fires as fires_mod
from gpushift.schedule import index as index_mod
from gpushift.schedule.parse import MAX_ENTRIES

UTC = timezone.utc
PATH = "/etc/gpushift/schedule"
BACKENDS = {"day", "night"}
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def entries(n: int, start: int = 0) -> list[str]:
    """``n`` entries with different time fields (some firing daily, some once in decades)."""
    out = []
    for i in range(start, start + n):
        if i % 3 == 0:  # a 29 February that is a Sunday: every 28 years or so
            out.append(f"{i % 60} {(i // 60) % 24} 29 2 */7 {'day' if i % 2 else 'night'}")
        else:
            out.append(f"{i % 60} {(i // 60) % 24} * * {i % 7} {'day' if i % 2 else 'night'}")
    return out


def exceptions(n: int) -> list[str]:
    first = date(2090, 1, 1)
    return [
        f"except {first + timedelta(days=2 * k)} .. {first + timedelta(days=2 * k)} day" for k in range(n)
    ]


def at_the_bound() -> str:
    return (
        "\n".join(
            ["# the largest schedule accepted", "TZ=Europe/Berlin", "", *entries(900), *exceptions(100)]
        )
        + "\n"
    )


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_schedule(text, PATH, backends=BACKENDS)
    return str(exc.value)


def test_the_bound_is_a_thousand_entries_and_exceptions_together() -> None:
    assert MAX_ENTRIES == 1000
    s = parse_schedule(at_the_bound(), PATH, backends=BACKENDS)
    assert (len(s.entries), len(s.spans)) == (900, 100)


@pytest.mark.parametrize(
    "extra",
    ["0 9 1 1 * day", "except 2099-01-01 .. 2099-01-02 night", "@daily night"],
    ids=["entry", "except", "@"],
)
def test_one_over_the_bound_is_refused_naming_file_line_and_bound(extra: str) -> None:
    text = at_the_bound() + "# comments and blank lines do not count\n\n" + extra + "\n0 10 * * * day\n"
    line = text.split("\n").index(extra) + 1
    msg = refused(text)
    assert msg.startswith(f"{PATH}:{line}: entries: more than 1000 entries and calendar exceptions"), msg
    assert "a schedule holds at most 1000" in msg and "number 1001" in msg, msg


def test_a_file_of_a_mebibyte_stops_at_the_first_line_over_the_bound() -> None:
    lines = [f"{i % 60} {(i // 60) % 24} * * * day" for i in range(70_000)]  # ~1 MiB, as in issue 20
    msg = refused("TZ=UTC\n" + "\n".join(lines) + "\n")
    assert msg.startswith(f"{PATH}:1002: entries: "), msg


def test_an_error_above_the_bound_is_reported_first() -> None:
    lines = entries(1200)
    lines[500] = "0 25 * * * day"
    msg = refused("TZ=UTC\n" + "\n".join(lines) + "\n")
    assert msg.startswith(f"{PATH}:502: hour: "), msg


def write_config(tmp_path: Path, sched: Path) -> Path:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nschedule = "{sched}"\n'
        '[backends.day]\nunit = "gs-day.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        '[backends.night]\nunit = "gs-night.service"\nhealth_url = "http://127.0.0.1:8080/health"\n',
        encoding="utf-8",
    )
    return cfg


def test_schedule_check_and_the_daemons_load_refuse_one_over_the_bound(tmp_path: Path) -> None:
    sched = tmp_path / "schedule"
    sched.write_text(at_the_bound(), encoding="utf-8")
    cfg = write_config(tmp_path, sched)
    runner = CliRunner()
    ok = runner.invoke(schedule_cli, ["check", str(sched)], obj={"config_path": str(cfg)})
    assert ok.exit_code == 0 and "OK: 900 entries, 100 calendar exceptions" in ok.output, ok.output
    assert load_schedule_of(config_mod.load(str(cfg))) is not None

    sched.write_text(at_the_bound() + "0 9 1 1 * day\n", encoding="utf-8")
    line = at_the_bound().count("\n") + 1
    r = runner.invoke(schedule_cli, ["check", str(sched)], obj={"config_path": str(cfg)})
    assert r.exit_code == 2, r.output
    assert f"gpushift: {sched}:{line}: entries: more than 1000 entries" in r.output, r.output
    with pytest.raises(ConfigError, match=rf"^{sched}:{line}: entries: more than 1000 entries"):
        load_schedule_of(config_mod.load(str(cfg)))


# ---- evaluating the largest schedule: the calendar is searched once per entry, then kept -------


class Searches:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("prev_fire", "next_fire"):  # the searches the index makes
            monkeypatch.setattr(index_mod, name, self.counted(getattr(index_mod, name)))

    def counted(self, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            self.count += 1
            return fn(*a, **k)

        return wrapper


def test_asking_again_searches_only_for_the_entries_that_fired(monkeypatch: pytest.MonkeyPatch) -> None:
    s = parse_schedule(at_the_bound(), PATH, backends=BACKENDS)
    soon = [e for e in s.entries if (fires_mod.next_fire(e, s.tz, NOW) or NOW) <= NOW + timedelta(minutes=1)]
    searches = Searches(monkeypatch)
    s.in_effect(NOW)
    assert searches.count <= 2 * 900  # once back and once forward per entry
    searches.count = 0
    for k in range(60):  # the daemon asks every second: status, properties, the look-ahead
        t = NOW + timedelta(seconds=k)
        s.in_effect(t), s.next_boundary(t), s.next_change(t)
    assert searches.count <= 10 * (len(soon) + 1), searches.count


def test_a_shadowed_schedule_gives_up_within_its_work_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry naming 'night' fires at an instant where the last line, naming 'day', fires too
    and wins: on main this searched 2000 instants over every entry (about 30 s at 1000 lines)."""
    lines = [f"{i % 60} {(i // 60) % 24},{(i // 60 + 12) % 24} * * * night" for i in range(999)] + [
        "* * * * * day"
    ]
    s = parse_schedule("TZ=UTC\n" + "\n".join(lines) + "\n", PATH, backends=BACKENDS)
    searches = Searches(monkeypatch)
    assert s.in_effect(NOW).target == "day"  # type: ignore[union-attr]
    assert s.next_change(NOW) is None
    bound = 2 * len(lines) + index_mod.CHANGE_SEARCH_WORK // index_mod.NEXT_FIRE_WORK + 1000
    assert searches.count <= bound, searches.count


def naive(s: Schedule, t: datetime) -> tuple[datetime, int] | None:
    """The weekly entry in effect at ``t``, asking every entry (no index, no spans)."""
    best = None
    for e in s.entries:
        p = fires_mod.prev_fire(e, s.tz, t)
        if p is not None and (best is None or (p[0], p[1], e.line) > best):
            best = (p[0], p[1], e.line)
    return (best[0], best[2]) if best else None


def test_the_answers_do_not_depend_on_what_was_asked_before() -> None:
    text = "\n".join(["TZ=America/New_York", *entries(60), "30 2 * * * day", "0 3 * 3 0 night"]) + "\n"
    rng = random.Random(20)
    times = [NOW + timedelta(minutes=rng.randint(-3 * 525_600, 3 * 525_600)) for _ in range(40)]
    kept = parse_schedule(text, PATH, backends=BACKENDS)
    for t in times:
        fresh = parse_schedule(text, PATH, backends=BACKENDS)
        e = kept.in_effect(t)
        assert e == fresh.in_effect(t)
        assert e is not None and naive(fresh, t) == (e.at, e.entry.line)
        assert kept.next_change(t) == fresh.next_change(t)
        assert kept.next(t, 5) == fresh.next(t, 5)


def test_exceptions_alone_change_nothing_once_ended() -> None:
    """After an exception ends with no entry ever fired, nothing is in effect (no fire): the next
    change seen from inside it is not the next change seen from after it."""
    text = "TZ=UTC\nexcept 2026-01-15 .. 2026-01-20 day\nexcept 2028-01-20 .. 2028-01-20 day\n"
    s = parse_schedule(text, PATH, backends=BACKENDS)
    assert s.next_change(datetime(2026, 1, 16, tzinfo=UTC)) is None
    later = s.next_change(datetime(2027, 3, 1, tzinfo=UTC))
    assert later is not None and later.at == datetime(2028, 1, 20, tzinfo=UTC)


def test_the_docs_state_the_bound_and_its_message() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "schedule.md").read_text(encoding="utf-8")
    assert (
        "## How big a schedule may be" in doc
        and f"at most **{MAX_ENTRIES} entries and calendar exceptions" in doc
    )
    lines = ["# a comment", "TZ=UTC", *entries(MAX_ENTRIES), "0 9 * * * day"]
    msg = refused("\n".join(lines) + "\n")
    assert msg in doc, msg
