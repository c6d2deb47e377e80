"""``gpushift schedule --week`` and ``gpushift schedule check FILE --week``: the exact text for a fixed
schedule (a calendar exception, an override, the fall-back day of Europe/Berlin), with and without
colour, the JSON, where the override comes from, and the errors for bad options."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpushift.bus import lightclient
from gpushift.cli import schedule_week
from gpushift.cli.schedule import schedule
from gpushift.errors import DaemonUnavailable

UTC = timezone.utc
NOW = datetime(2026, 10, 21, 8, 30, tzinfo=UTC)  # Wed 10:30 CEST

SCHEDULE = """TZ=Europe/Berlin
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
30 2  *  *  sun      vllm
0  9  *  *  sun      off
5  12 *  *  sun      llama
except 2026-10-23 18:00 .. 2026-10-24 12:00 vllm eval
"""

OVERRIDE = {
    "mode": "override",
    "backend": "llama",
    "until": "2026-10-21T18:00:00+00:00",
    "set_by": "alice",
    "set_at": "2026-10-21T07:45:00+00:00",
    "reason": "nightly eval",
    "source": "manual",
    "when_idle": False,
}

GRID = """\
        00    02    04    06    08    10    12    14    16    18    20    22
Mon 19  llllllllllllllllllllllllvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvllllllllllll
Tue 20  llllllllllllllllllllllllvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvllllllllllll
Wed 21  llllllllllllllllllllllllvvvvvLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLllllllllllll
                                     ^ override llama from 09:45
                                       ^ now 10:30 CEST
                             override ends 20:00, then the schedule ^
Thu 22  llllllllllllllllllllllllvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvllllllllllll
Fri 23  llllllllllllllllllllllllvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvVVVVVVVVVVVVVVVVVV
                                   eval (line 8) begins 18:00 ^
Sat 24  VVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVVllllllllllllllllllllllllllllllllllll
                                            ^ eval ends 12:00
Sun 25  lllllllvvvvvvvvvvvvvvvvvvvv---------llllllllllllllllllllllllllllllllllll
              ^^^ 02:00-03:00 twice: clocks go back (CEST to CET)

  v vllm   l llama   - off
  UPPER CASE and =: a calendar exception, an override or a hold
  calendar exceptions:
    eval (line 8): vllm, 2026-10-23 18:00 CEST to 2026-10-24 12:00 CEST
  override in effect: llama until 2026-10-21 20:00 CEST
"""


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "schedule").write_text(SCHEDULE, encoding="utf-8")
    for d in ("state", "run"):
        (tmp_path / d).mkdir()
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nschedule = "{tmp_path}/schedule"\nstate_dir = "{tmp_path}/state"\n'
        f'runtime_dir = "{tmp_path}/run"\nbus = "session"\n'
        '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n',
        encoding="utf-8",
    )
    monkeypatch.setattr(schedule_week, "now", lambda: NOW)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return cfg


def run(cfg: Path, *args: str, color: bool = False, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(schedule, list(args), obj={"config_path": str(cfg)}, color=color, env=env)


def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(bus: str, timeout_s: float = 0) -> dict[str, Any]:
        raise DaemonUnavailable("the gpushift daemon (gpushift.service) is not running on the session bus")

    monkeypatch.setattr(lightclient, "get_status", down)


def header(cfg: Path) -> str:
    return (
        f"Schedule {cfg.parent}/schedule (time zone Europe/Berlin, TZ= on line 1)\n"
        "Mon 2026-10-19 to Sun 2026-10-25, 3 columns an hour (20 minutes each):\n"
    )


def test_week_text_with_an_exception_an_override_from_the_file_and_the_fall_back_day(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)  # the real client: no bus to ask
    (files.parent / "state" / "override.json").write_text(json.dumps(OVERRIDE), encoding="utf-8")
    r = run(files, "--week", "--from", "2026-10-19")
    assert r.exit_code == 0, r.output
    assert r.stdout == header(files) + GRID
    assert r.stderr == (
        f"note: the daemon did not answer: override and hold read from {files.parent}/state/override.json\n"
    )
    assert "alice" not in r.output and "nightly" not in r.output


def test_week_text_in_colour_is_the_same_text_with_colour_around_runs(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_daemon(monkeypatch)
    (files.parent / "state" / "override.json").write_text(json.dumps(OVERRIDE), encoding="utf-8")
    r = run(files, "--week", "--from", "2026-10-19", color=True)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    esc = "\x1b["
    assert (
        lines[2]
        == f"        {esc}2m00    02    04    06    08    10    12    14    16    18    20    22{esc}0m"
    )
    # vllm cyan and llama magenta backgrounds (the config's order); the override bold, underlined.
    assert lines[5] == (
        f"Wed 21  {esc}30m{esc}45m{'l' * 24}{esc}0m{esc}30m{esc}46m{'v' * 5}{esc}0m"
        f"{esc}30m{esc}45m{esc}1m{esc}4m{'L' * 31}{esc}0m{esc}30m{esc}45m{'l' * 12}{esc}0m"
    )
    assert lines[6] == f"{' ' * 37}{esc}1m^ override llama from 09:45{esc}0m"
    assert lines[14] == (
        f"Sun 25  {esc}30m{esc}45m{'l' * 7}{esc}0m{esc}30m{esc}46m{'v' * 20}{esc}0m"
        f"{esc}90m{'-' * 9}{esc}0m{esc}30m{esc}45m{'l' * 36}{esc}0m"
    )
    assert re.sub(r"\x1b\[[0-9;]*m", "", r.stdout) == header(files) + GRID


def test_no_color_or_no_terminal_gives_letters_only(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_daemon(monkeypatch)
    (files.parent / "state" / "override.json").write_text(json.dumps(OVERRIDE), encoding="utf-8")
    r = run(files, "--week", "--from", "2026-10-19", color=True, env={"NO_COLOR": "1"})
    assert r.exit_code == 0 and "\x1b" not in r.stdout and r.stdout == header(files) + GRID
    r = run(files, "--week", "--from", "2026-10-19")  # not a terminal
    assert "\x1b" not in r.stdout and r.stdout == header(files) + GRID


def test_the_daemons_hold_is_drawn_when_it_answers(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, float]] = []
    hold = {**OVERRIDE, "mode": "hold", "backend": "vllm", "until": None}

    def status(bus: str, timeout_s: float = 0) -> dict[str, Any]:
        asked.append((bus, timeout_s))
        return {"override": hold, "mode": "hold vllm (until gpushift resume)"}

    monkeypatch.setattr(lightclient, "get_status", status)
    (files.parent / "state" / "override.json").write_text(json.dumps(OVERRIDE), encoding="utf-8")  # not read
    r = run(files, "--week", "--from", "2026-10-21", "--days", "2")
    assert r.exit_code == 0, r.output
    assert asked == [("session", schedule_week.DAEMON_TIMEOUT_S)]
    lines = r.stdout.splitlines()
    assert lines[3] == "Wed 21  " + "l" * 24 + "v" * 5 + "V" * 43
    assert lines[4] == " " * 37 + "^ hold vllm from 09:45"
    assert lines[6] == "Thu 22  " + "V" * 72
    assert lines[-1] == "  hold in effect: vllm until `gpushift resume`"
    assert r.stderr == ""


def test_week_json_gives_the_stretches_and_the_days(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_daemon(monkeypatch)
    (files.parent / "state" / "override.json").write_text(json.dumps(OVERRIDE), encoding="utf-8")
    r = run(files, "--week", "--from", "2026-10-21", "--days", "1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["tz"] == "Europe/Berlin" and doc["now"] == "2026-10-21T08:30:00Z"
    assert doc["override"] == {
        "mode": "override",
        "backend": "llama",
        "from_utc": "2026-10-21T07:45:00Z",
        "until_utc": "2026-10-21T18:00:00Z",
    }
    assert doc["override_from"] == f"{files.parent}/state/override.json"
    got = [(s["from_utc"], s["until_utc"], s["backend"], s["source"], s["line"]) for s in doc["stretches"]]
    assert got == [
        ("2026-10-20T22:00:00Z", "2026-10-21T06:00:00Z", "llama", "schedule", 3),
        ("2026-10-21T06:00:00Z", "2026-10-21T07:45:00Z", "vllm", "schedule", 2),
        ("2026-10-21T07:45:00Z", "2026-10-21T18:00:00Z", "llama", "override", None),
        ("2026-10-21T18:00:00Z", "2026-10-21T22:00:00Z", "llama", "schedule", 3),
    ]
    assert doc["stretches"][1]["from_local"] == "2026-10-21T08:00:00+02:00"
    assert doc["days"] == [
        {
            "date": "2026-10-21",
            "from_utc": "2026-10-20T22:00:00Z",
            "until_utc": "2026-10-21T22:00:00Z",
            "hours": 24.0,
            "clock_changes": [],
        }
    ]
    r = run(files, "--week", "--from", "2026-10-25", "--days", "1", "--json")
    (day,) = json.loads(r.stdout)["days"]
    assert day["hours"] == 25.0 and day["clock_changes"] == [
        {
            "kind": "repeat",
            "at_utc": "2026-10-25T01:00:00Z",
            "from": "02:00",
            "until": "03:00",
            "before": "CEST",
            "after": "CET",
        }
    ]


def test_check_file_week_draws_a_file_that_is_not_installed(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(lightclient, "get_status", lambda *a, **k: asked.append("asked") or {})
    new = files.parent / "schedule.new"
    new.write_text("TZ=Europe/Berlin\n0 0 * * * llama\n0 12 * * * off\n", encoding="utf-8")
    r = run(files, "check", str(new), "--week", "--from", "2027-03-28", "--days", "1")
    assert r.exit_code == 0, r.output
    out = r.stdout.split("\n\n", 1)[1]
    assert out.splitlines()[:5] == [
        f"Schedule {new} (time zone Europe/Berlin, TZ= on line 1)",
        "Sun 2027-03-28 to Sun 2027-03-28, 3 columns an hour (20 minutes each):",
        "        00    02    04    06    08    10    12    14    16    18    20    22",
        "Sun 28  llllll   " + "l" * 27 + "-" * 36,
        "              ^^^ 02:00-03:00 skipped: clocks go forward (CET to CEST)",
    ]
    assert asked == [] and "in effect:" not in out  # not installed: no override laid over it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--week", "--from", "2026-13-01"], "Invalid value for --from: '2026-13-01': not a date"),
        (["--week", "--from", "next tuesday"], "Invalid value for --from: 'next tuesday': not a date"),
        (["--week", "--from", "0999-01-01"], "'0999-01-01': expected a date from the year 1970 to 9000"),
        (["--week", "--days", "0"], "Invalid value for '--days': 0 is not in the range 1<=x<=31"),
        (["--week", "--days", "32"], "Invalid value for '--days': 32 is not in the range 1<=x<=31"),
        (["--week", "--days", "many"], "Invalid value for '--days': 'many' is not a valid integer"),
        (["--days", "3"], "--days 3 needs --week"),
        (["--week", "--next", "3"], "--next counts switches, --week draws days: give one of them"),
        (["check", "--from", "2026-10-19"], "--from needs --week"),
        (["check", "--week", "--from", "2026-02-30"], "Invalid value for --from: '2026-02-30': not a date"),
    ],
)
def test_bad_week_options_are_refused_naming_the_value(files: Path, args: list[str], message: str) -> None:
    r = run(files, *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output


def test_the_examples_of_docs_schedule_md_are_what_the_command_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "schedule.md").read_text(encoding="utf-8")
    section = doc.split("## The week at a glance\n", 1)[1].split("\n## ", 1)[0]
    holidays = doc.split("## Calendar exceptions\n", 1)[1].split("```\n", 2)[1]
    first, dst = re.findall(r"^```\n\$ (.*?)\n(.*?)^```", section, re.M | re.S)
    (tmp_path / "schedule").write_text(holidays, encoding="utf-8")
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nschedule = "{tmp_path}/schedule"\nstate_dir = "{tmp_path}"\nruntime_dir = "{tmp_path}"\n'
        '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n',
        encoding="utf-8",
    )
    no_daemon(monkeypatch)
    monkeypatch.setattr(schedule_week, "now", lambda: datetime(2026, 12, 22, 14, 10, tzinfo=UTC))
    for (command, shown), drop in ((first, 0), (dst, 3)):
        r = run(cfg, *command.split()[2:])
        assert r.exit_code == 0, r.output
        out = r.stdout.replace(f"{tmp_path}/schedule", "/etc/gpushift/schedule")
        lines = shown.splitlines()
        if drop:  # an excerpt: "..." and then the lines shown
            assert lines[0] == "..." and "\n".join(lines[1:]) in out
        else:
            assert out == shown
