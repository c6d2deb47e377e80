"""`gpushift schedule [--next N] [--json]` and `gpushift schedule check [FILE]`, without a daemon."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpushift.cli.schedule import schedule

UTC = timezone.utc
REPO = Path(__file__).resolve().parents[3]

SCHEDULE = """# test schedule
TZ=Asia/Shanghai
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
"""


def write_config(tmp_path: Path, schedule_path: Path | None) -> Path:
    cfg = tmp_path / "gpushift.toml"
    daemon = f'[daemon]\nschedule = "{schedule_path}"\n' if schedule_path else ""
    cfg.write_text(
        daemon
        + '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        + '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n',
        encoding="utf-8",
    )
    return cfg


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    sched = tmp_path / "schedule"
    sched.write_text(SCHEDULE, encoding="utf-8")
    return write_config(tmp_path, sched), sched


def run(config: Path | None, *args: str) -> Result:
    # An explicit config path: the test never reads /etc/gpushift or $GPUSHIFT_CONFIG.
    return CliRunner().invoke(schedule, list(args), obj={"config_path": str(config) if config else None})


# ---- listing -------------------------------------------------------------------------------------


def test_schedule_cli_lists_next_switches_with_local_and_utc_times(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    r = run(cfg, "--next", "3", "--from", "2026-12-04 12:00")  # Friday noon, Shanghai time
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"Schedule {sched} (time zone Asia/Shanghai, TZ= on line 2)"
    assert "In effect at Fri 2026-12-04 12:00 CST: vllm, since Fri 2026-12-04 08:00 CST (line 3" in lines[1]
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == 4  # header + 3
    assert rows[0][:5] == ["LOCAL", "UTC", "BACKEND", "LINE", "ENTRY"]
    assert rows[1][:9] == ["Fri", "2026-12-04", "20:00", "CST", "2026-12-04", "12:00", "UTC", "llama", "4"]
    assert rows[2][:9] == ["Sat", "2026-12-05", "00:00", "CST", "2026-12-04", "16:00", "UTC", "llama", "5"]
    assert lines[5].endswith("(already in effect)")
    assert rows[3][:9] == ["Sun", "2026-12-06", "00:00", "CST", "2026-12-05", "16:00", "UTC", "llama", "5"]


def test_schedule_cli_json_is_machine_readable(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    r = run(cfg, "--json", "--next", "2", "--from", "2026-12-04T21:00:00+08:00")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schedule"] == str(sched) and doc["tz"] == "Asia/Shanghai" and doc["tz_line"] == 2
    assert doc["at"] == "2026-12-04T13:00:00Z"
    assert doc["in_effect"] == {
        "utc": "2026-12-04T12:00:00Z",
        "local": "2026-12-04T20:00:00+08:00",
        "target": "llama",
        "line": 4,
        "entry": "0 20 * * 1-5",
        "exception": None,
        "exception_ends": None,
    }
    assert doc["exceptions"] == []
    assert doc["next"] == [
        {
            "utc": "2026-12-04T16:00:00Z",
            "local": "2026-12-05T00:00:00+08:00",
            "target": "llama",
            "line": 5,
            "entry": "0 0 * * sat,sun",
            "exception": None,
            "exception_ends": None,
            "changes": False,
        },
        {
            "utc": "2026-12-05T16:00:00Z",
            "local": "2026-12-06T00:00:00+08:00",
            "target": "llama",
            "line": 5,
            "entry": "0 0 * * sat,sun",
            "exception": None,
            "exception_ends": None,
            "changes": False,
        },
    ]


def test_schedule_cli_lists_from_now_by_default(files: tuple[Path, Path]) -> None:
    cfg, _ = files
    before = datetime.now(UTC).replace(microsecond=0)
    r = run(cfg, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["next"]) == 10
    first = datetime.fromisoformat(doc["next"][0]["utc"].replace("Z", "+00:00"))
    assert first > before
    assert doc["in_effect"]["target"] in {"vllm", "llama"}


def test_schedule_cli_bad_from_time_is_a_usage_error(files: tuple[Path, Path]) -> None:
    cfg, _ = files
    r = run(cfg, "--from", "next tuesday")
    assert r.exit_code == 2
    assert "--from" in r.stderr and "not a time" in r.stderr


def test_schedule_cli_listing_fails_on_an_invalid_schedule(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    sched.write_text("TZ=Asia/Shanghai\n0 8 * * 1-5 vllm\n0 25 * * 1-5 llama\n", encoding="utf-8")
    r = run(cfg)
    assert r.exit_code == 2
    assert f"{sched}:3: hour: " in r.stderr


def test_schedule_cli_listing_fails_on_a_broken_config(tmp_path: Path) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text("[daemon\n", encoding="utf-8")
    r = run(cfg)
    assert r.exit_code == 2
    assert f"{cfg}:1:8: not valid TOML" in r.stderr


def test_schedule_cli_empty_schedule_says_it_never_switches(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    sched.write_text("# nothing\n", encoding="utf-8")
    r = run(cfg)
    assert r.exit_code == 0, r.output
    assert "no entries: it never switches" in r.stdout


# ---- check ---------------------------------------------------------------------------------------


def test_schedule_cli_check_valid_file_exits_zero_with_a_summary(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    r = run(cfg, "check", str(sched))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{sched}: OK: 3 entries, time zone Asia/Shanghai (TZ= on line 2)\n")
    assert "  line 5: 0 0 * * sat,sun -> llama\n" in r.stdout
    assert f"backend names checked against {cfg}" in r.stdout
    assert "next switch: " in r.stdout


def test_schedule_cli_check_defaults_to_the_configured_schedule(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    r = run(cfg, "check")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{sched}: OK: 3 entries")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("TZ=Asia/Shanghai\n0 8 * * 1-5 vllm\n0 8 * * fry llama\n", ":3: day-of-week: "),
        ("0 8 * * 1-5 vllm\nTZ=Asia/Shanghai\n", ":2: TZ: "),
        (
            "# c\n0 8 * * 1-5 vlm\n",
            ":2: backend: 'vlm' is not a configured backend (expected one of: llama, vllm, off)",
        ),
    ],
)
def test_schedule_cli_check_invalid_file_exits_nonzero_naming_file_line_field(
    files: tuple[Path, Path], tmp_path: Path, text: str, where: str
) -> None:
    cfg, _ = files
    bad = tmp_path / "bad-schedule"
    bad.write_text(text, encoding="utf-8")
    r = run(cfg, "check", str(bad))
    assert r.exit_code == 2
    assert r.stdout == ""
    assert f"{bad}{where}" in r.stderr


def test_schedule_cli_check_missing_file(files: tuple[Path, Path], tmp_path: Path) -> None:
    cfg, _ = files
    r = run(cfg, "check", str(tmp_path / "nope"))
    assert r.exit_code == 2
    assert f"{tmp_path / 'nope'}: schedule file not found" in r.stderr


def test_schedule_cli_check_without_config_still_checks_syntax(tmp_path: Path) -> None:
    sched = tmp_path / "schedule"
    sched.write_text("TZ=Europe/Berlin\n0 8 * * 1-5 anything\n", encoding="utf-8")
    missing_cfg = tmp_path / "missing.toml"
    r = run(missing_cfg, "check", str(sched))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{sched}: OK: 1 entry, time zone Europe/Berlin")
    assert "backend names were NOT checked" in r.stderr and str(missing_cfg) in r.stderr
    sched.write_text("TZ=Europe/Berlin\n0 8 * * 1-9 anything\n", encoding="utf-8")
    r = run(missing_cfg, "check", str(sched))
    assert r.exit_code == 2
    assert f"{sched}:2: day-of-week: " in r.stderr


def test_schedule_cli_check_without_config_or_file_fails_with_a_hint(tmp_path: Path) -> None:
    r = run(tmp_path / "missing.toml", "check")
    assert r.exit_code == 2
    assert "config file not found" in r.stderr and "gpushift schedule check FILE" in r.stderr


def test_schedule_cli_check_the_shipped_example(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, None)
    r = run(cfg, "check", str(REPO / "etc/gpushift/schedule"))
    assert r.exit_code == 0, r.output
    assert ": OK: 3 entries, time zone Asia/Shanghai" in r.stdout


# ---- calendar exceptions -------------------------------------------------------------------------

HOLIDAYS = """TZ=Europe/Berlin
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
except 2026-12-24 .. 2026-12-31 llama holidays
except 2027-01-04 08:00 .. 2027-01-04 12:00 off
except 2020-12-24 .. 2020-12-31 llama old
"""


def test_schedule_cli_check_lists_exceptions_and_notes_the_passed_ones(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    cfg, _ = files
    f = tmp_path / "holidays"
    f.write_text(HOLIDAYS, encoding="utf-8")
    r = run(cfg, "check", str(f))
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"{f}: OK: 3 entries, 3 calendar exceptions, time zone Europe/Berlin (TZ= on line 1)"
    assert lines[4:7] == [
        "  line 5: except 2026-12-24..2026-12-31 -> llama (holidays): "
        "Thu 2026-12-24 00:00 CET .. Fri 2027-01-01 00:00 CET",
        "  line 6: except 2027-01-04T08:00..2027-01-04T12:00 -> off: "
        "Mon 2027-01-04 08:00 CET .. Mon 2027-01-04 12:00 CET",
        "  line 7: except 2020-12-24..2020-12-31 -> llama (old): "
        "Thu 2020-12-24 00:00 CET .. Fri 2021-01-01 00:00 CET",
    ]
    assert r.stderr == (
        "note: line 7: calendar exception old has passed (it ended Fri 2021-01-01 00:00 CET); "
        "it is ignored, the line can go\n"
    )


@pytest.mark.parametrize(
    ("line", "where"),
    [
        (
            "except 2026-12-30 .. 2027-01-02 off",
            ":6: except: 2026-12-30..2027-01-02 overlaps line 5 (2026-12-24..2026-12-31): "
            "calendar exceptions must not overlap",
        ),
        ("except 2027-01-02 .. 2027-01-01 off", ":6: until: '2027-01-01' is not after '2027-01-02'"),
        (
            "except 2027-01-02 .. 2027-01-03 lama",
            ":6: backend: 'lama' is not a configured backend (expected one of: llama, vllm, off)",
        ),
        ("except 2027-01-02 to 2027-01-03 off", ":6: except: missing '..' between FROM and UNTIL"),
    ],
)
def test_schedule_cli_check_bad_exception_exits_nonzero_naming_its_line(
    files: tuple[Path, Path], tmp_path: Path, line: str, where: str
) -> None:
    cfg, _ = files
    bad = tmp_path / "bad-schedule"
    bad.write_text("\n".join(HOLIDAYS.splitlines()[:5]) + f"\n{line}\n", encoding="utf-8")
    r = run(cfg, "check", str(bad))
    assert r.exit_code == 2
    assert r.stdout == ""
    assert f"{bad}{where}" in r.stderr


def test_schedule_cli_next_shows_exceptions_and_their_boundaries(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    sched.write_text(HOLIDAYS, encoding="utf-8")
    r = run(cfg, "--next", "4", "--from", "2026-12-28 12:00")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1] == (
        "In effect at Mon 2026-12-28 12:00 CET: llama, since Thu 2026-12-24 00:00 CET "
        "(line 5: except 2026-12-24..2026-12-31), calendar exception holidays until Fri 2027-01-01 00:00 CET"
    )
    assert lines[2] == "Calendar exceptions (1 passed, ignored):"
    assert lines[3].split() == ["LINE", "NAME", "BACKEND", "FROM", "UNTIL", "FROM", "(UTC)", "UNTIL", "(UTC)"]
    assert lines[4].split() == [
        "5", "holidays", "llama",
        "Thu", "2026-12-24", "00:00", "CET", "Fri", "2027-01-01", "00:00", "CET",
        "2026-12-23", "23:00", "UTC", "2026-12-31", "23:00", "UTC", "in", "force",
    ]  # fmt: skip
    assert lines[5].split() == [
        "6", "-", "off",
        "Mon", "2027-01-04", "08:00", "CET", "Mon", "2027-01-04", "12:00", "CET",
        "2027-01-04", "07:00", "UTC", "2027-01-04", "11:00", "UTC", "coming",
    ]  # fmt: skip
    assert lines[6] == "Next 4 times the schedule fires:"
    rows = lines[8:]
    # the end of the holidays: Thursday's 20:00 entry (llama) is in effect again, nothing changes
    assert rows[0].split()[:10] == [
        "Fri",
        "2027-01-01",
        "00:00",
        "CET",
        "2026-12-31",
        "23:00",
        "UTC",
        "llama",
        "3",
        "0",
    ]
    assert rows[0].endswith("exception holidays ends (already in effect)")
    assert rows[1].split()[7:9] == ["vllm", "2"] and rows[1].rstrip().endswith("1-5")
    assert rows[3].split()[:9] == [
        "Sat",
        "2027-01-02",
        "00:00",
        "CET",
        "2027-01-01",
        "23:00",
        "UTC",
        "llama",
        "4",
    ]
    r = run(cfg, "--next", "2", "--from", "2027-01-04 07:00")
    rows = r.stdout.splitlines()[-2:]
    assert rows[0].split()[7:10] == ["off", "6", "except"]
    assert rows[0].endswith("except 2027-01-04T08:00..2027-01-04T12:00  exception on line 6 begins")
    assert rows[1].split()[7:9] == ["vllm", "2"] and rows[1].endswith("exception on line 6 ends")


def test_schedule_cli_json_shows_exceptions(files: tuple[Path, Path]) -> None:
    cfg, sched = files
    sched.write_text(HOLIDAYS, encoding="utf-8")
    r = run(cfg, "--json", "--next", "2", "--from", "2026-12-28T12:00:00+01:00")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["in_effect"]["exception"] == "holidays" and doc["in_effect"]["line"] == 5
    assert doc["in_effect"]["entry"] == "except 2026-12-24..2026-12-31"
    assert [x["line"] for x in doc["exceptions"]] == [7, 5, 6]  # in time order
    assert doc["exceptions"][1] == {
        "line": 5,
        "name": "holidays",
        "target": "llama",
        "range": "2026-12-24..2026-12-31",
        "from_utc": "2026-12-23T23:00:00Z",
        "from_local": "2026-12-24T00:00:00+01:00",
        "until_utc": "2026-12-31T23:00:00Z",
        "until_local": "2027-01-01T00:00:00+01:00",
        "state": "in force",
    }
    assert [x["state"] for x in doc["exceptions"]] == ["passed", "in force", "coming"]
    assert doc["exceptions"][2]["name"] is None
    assert doc["next"][0] == {
        "utc": "2026-12-31T23:00:00Z",
        "local": "2027-01-01T00:00:00+01:00",
        "target": "llama",
        "line": 3,
        "entry": "0 20 * * 1-5",
        "exception": None,
        "exception_ends": "holidays",
        "changes": False,
    }
    assert (doc["next"][1]["target"], doc["next"][1]["exception_ends"]) == ("vllm", None)


def test_status_text_names_the_exception_in_force() -> None:
    from gpushift.cli import render_status

    exc = {"name": "holidays", "line": 5, "until_local": "2027-01-01T00:00:00+01:00"}
    text = render_status({"schedule": {"wants": "llama", "exception": exc}})
    assert "schedule: wants llama now (calendar exception holidays until 2027-01-01T00:00:00+01:00)\n" in text
    assert "schedule: wants vllm now\n" in render_status({"schedule": {"wants": "vllm", "exception": None}})


@pytest.mark.parametrize(
    "start", ["9999-12-31 23:00", "9001-01-01 00:00+14:00", "1969-12-31 23:00", "0001-01-01"]
)
def test_schedule_cli_from_outside_its_years_is_a_usage_error(files: tuple[Path, Path], start: str) -> None:
    """``--from`` near the end of what a datetime holds overflowed while listing; now it is
    refused as a usage error (exit 2) naming the range."""
    cfg, _sched = files
    r = CliRunner().invoke(schedule, ["--from", start], obj={"config_path": str(cfg)}, catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "--from" in r.output and "1970 to 9000" in r.output


# ---- a staggered host ([daemon] stagger_s) --------------------------------------------------------


def staggered(tmp_path: Path, sched: Path, host: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path, sched)
    text = cfg.read_text().replace("[daemon]\n", "[daemon]\nstagger_s = 600\n")
    cfg.write_text(text + f'[mirror]\nhost_name = "{host}"\n')
    return cfg


def test_a_staggered_host_lists_its_shifted_boundaries(files: tuple[Path, Path], tmp_path: Path) -> None:
    _cfg, sched = files
    out = {}
    for host in ("gpu-a", "gpu-b"):
        r = run(
            staggered(tmp_path / host, sched, host), "--next", "2", "--from", "2026-12-04 12:00", "--json"
        )
        assert r.exit_code == 0, r.output
        out[host] = json.loads(r.stdout)
    a, b = out["gpu-a"], out["gpu-b"]
    assert a["stagger"] == {"host_name": "gpu-a", "stagger_s": 600, "offset_s": 514}
    assert b["stagger"] == {"host_name": "gpu-b", "stagger_s": 600, "offset_s": 123}
    # Friday 20:00 Shanghai is 12:00 UTC: each host's boundary comes its offset later.
    assert a["next"][0]["utc"] == "2026-12-04T12:08:34Z" and a["next"][0]["target"] == "llama"
    assert b["next"][0]["utc"] == "2026-12-04T12:02:03Z"
    assert a["in_effect"]["utc"] == "2026-12-04T00:08:34Z"  # since 08:00 CST + 514 s
    text = run(staggered(tmp_path / "gpu-a", sched, "gpu-a"), "--next", "1", "--from", "2026-12-04 12:00")
    assert (
        "Staggered: every boundary 514 s later on this host (gpu-a; [daemon] stagger_s = 600)" in text.stdout
    )
    assert "Fri 2026-12-04 20:08:34 CST" in text.stdout and "2026-12-04 12:08:34 UTC" in text.stdout
