"""``gpushift frontdoor``: refuses a config it cannot serve (exit 2, the reason on stderr, nothing
started), and takes ``--config`` before or after the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushift.cli import main

NO_FRONTDOOR = """\
[daemon]
bus = "session"
schedule = ""
[gpu]
provider = "simulated"
[backends.day]
unit = "day.service"
health_url = "http://127.0.0.1:8001/health"
"""


@pytest.mark.parametrize("where", ["after", "before"])
def test_a_config_without_a_frontdoor_table_is_refused_with_exit_2(tmp_path: Path, where: str) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(NO_FRONTDOOR)
    args = ["frontdoor", "--config", str(cfg)] if where == "after" else ["--config", str(cfg), "frontdoor"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert "refusing to start" in r.output and "no [frontdoor] table" in r.output
    assert "docs/frontdoor.md" in r.output


def test_a_bad_config_is_refused_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(NO_FRONTDOOR + '\n[frontdoor]\nlisten = ["127.0.0.1:8001"]\n')
    r = CliRunner().invoke(main, ["frontdoor", "--config", str(cfg)])
    assert r.exit_code == 2, r.output
    assert "frontdoor.listen" in r.output and "Moving an existing host" in r.output
