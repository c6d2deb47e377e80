"""The zone database, and the host's zone (the schedule's zone when its file has no TZ= line)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from gpushift.schedule import host_timezone

ZONEINFO = Path("/usr/share/zoneinfo")


def test_zoneinfo_database_present() -> None:
    # zoneinfo needs the system tz database (Debian: /usr/share/zoneinfo) or the tzdata package.
    assert ZONEINFO.is_dir(), "no /usr/share/zoneinfo: install the tzdata Debian package"
    assert str(ZoneInfo("Europe/Berlin")) == "Europe/Berlin"


def _root(tmp_path: Path, localtime_link: str | None = None, timezone_file: str | None = None) -> str:
    (tmp_path / "etc").mkdir()
    if localtime_link:
        os.symlink(str(ZONEINFO / localtime_link), tmp_path / "etc/localtime")
    if timezone_file is not None:
        (tmp_path / "etc/timezone").write_text(timezone_file, encoding="utf-8")
    return str(tmp_path)


def test_schedule_host_timezone_prefers_tz_variable(tmp_path: Path) -> None:
    root = _root(tmp_path, "Europe/Berlin", "Asia/Tokyo\n")
    assert str(host_timezone({"TZ": "America/New_York"}, root)) == "America/New_York"
    assert str(host_timezone({"TZ": ":Asia/Shanghai"}, root)) == "Asia/Shanghai"
    assert str(host_timezone({"TZ": str(ZONEINFO / "Asia/Kolkata")}, root)) == "Asia/Kolkata"


def test_schedule_host_timezone_skips_a_tz_variable_that_is_not_a_zone(tmp_path: Path) -> None:
    root = _root(tmp_path, "Europe/Berlin")
    assert str(host_timezone({"TZ": "CST-8"}, root)) == "Europe/Berlin"


def test_schedule_host_timezone_reads_the_localtime_link_before_etc_timezone(tmp_path: Path) -> None:
    root = _root(tmp_path, "Europe/Berlin", "Asia/Tokyo\n")
    assert str(host_timezone({}, root)) == "Europe/Berlin"


def test_schedule_host_timezone_reads_etc_timezone(tmp_path: Path) -> None:
    root = _root(tmp_path, None, "\n  Asia/Tokyo  \n")
    assert str(host_timezone({}, root)) == "Asia/Tokyo"


def test_schedule_host_timezone_uses_a_copied_localtime_file(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (tmp_path / "etc/localtime").write_bytes((ZONEINFO / "America/New_York").read_bytes())
    tz = host_timezone({}, root)
    assert datetime(2026, 7, 1, 12, tzinfo=tz).utcoffset() == ZoneInfo("America/New_York").utcoffset(
        datetime(2026, 7, 1, 12)
    )


def test_schedule_host_timezone_falls_back_to_utc(tmp_path: Path) -> None:
    root = _root(tmp_path, None, "Not/AZone\n")
    assert str(host_timezone({}, root)) == "UTC"
