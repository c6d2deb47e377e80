"""`gpushift status` reads only ``[daemon] bus`` from the config before it asks the daemon
(textfile.daemon_bus): the daemon validated its own config, and importing and running the whole
validation cost status more than the daemon's answer.  A config that is not TOML, or names no valid
bus, is loaded in full so that its error is reported as before.  (`gpushift switch` still checks the
whole file first: tests/integration/test_switch_e2e.py, a broken config changes nothing.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpushift.bus import lightclient
from gpushift.cli import main
from gpushift.config import textfile


@pytest.mark.parametrize(
    ("text", "bus"),
    [
        ('[daemon]\nbus = "session"\n', "session"),
        ("[daemon]\n", "system"),  # the default
        ("", "system"),
        ('[daemon]\nbus = "session"\n[backends.a]\nkind = "nope"\n', "session"),  # the rest is not checked
        ('[daemon]\nbus = "tcp:host=x"\n', None),
        ('daemon = "x"\n', None),
        ("[daemon\n", None),  # not TOML
    ],
)
def test_daemon_bus_peeks_at_the_one_key(tmp_path: Path, text: str, bus: str | None) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(text)
    assert textfile.daemon_bus(str(cfg)) == bus


def test_daemon_bus_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert textfile.daemon_bus(str(tmp_path / "absent.toml")) is None


def test_status_asks_the_daemon_on_the_peeked_bus_without_validating_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text('[daemon]\nbus = "session"\n[backends.a]\nunit = "a.service"\n')  # no health_url: invalid
    asked: list[str] = []

    def get_status(bus: str, *a: Any, **k: Any) -> dict[str, Any]:
        asked.append(bus)
        return {"daemon": {"running": True, "state": "idle"}, "backends": {}, "gpus": []}

    monkeypatch.setattr(lightclient, "get_status", get_status)
    monkeypatch.delitem(sys.modules, "gpushift.config.schema", raising=False)
    r = CliRunner().invoke(main, ["--config", str(cfg), "status", "--json"])
    assert r.exit_code == 0, r.output
    assert asked == ["session"]
    assert "gpushift.config.schema" not in sys.modules  # nothing validated the config on this path


def test_status_reports_a_config_that_is_not_toml_as_before(tmp_path: Path) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text("[daemon\n")
    r = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert r.exit_code == 2 and "not valid TOML" in r.output, r.output
