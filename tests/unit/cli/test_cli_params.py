"""`gpushift switch` checks its arguments before it reaches for the daemon: a backend name that
reads as an option or carries escapes, a reason of several lines or with a terminal's escape
sequences, an `--until` too long — each is a usage error (exit 2) naming the argument, and no
D-Bus call is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpushift.bus import client as client_mod
from gpushift.bus import lightclient
from gpushift.cli import main


class _NoDaemon:
    """Fails the test if the CLI reaches for the daemon."""

    calls: list[Any] = []

    def __init__(self, bus: str) -> None:
        pass

    def switch(self, backend: str, options: dict[str, Any], **kw: Any) -> dict[str, Any]:
        _NoDaemon.calls.append((backend, options))
        return {"ok": True, "ticket": "t-1", "message": "ok"}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        '[daemon]\nbus = "session"\nschedule = ""\n'
        '[backends.a]\nunit = "a.service"\nhealth_url = "http://127.0.0.1:1/h"\n',
        encoding="utf-8",
    )
    _NoDaemon.calls = []
    monkeypatch.setattr(client_mod, "Client", _NoDaemon)
    monkeypatch.setattr(lightclient, "switch", lambda bus, *a, **k: _NoDaemon(bus).switch(*a, **k))
    return cfg


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--", "--now"], "BACKEND"),
        (["--", "-h"], "BACKEND"),
        (["a\x1b[2J"], "BACKEND"),
        (["../x"], "BACKEND"),
        (["b" * 65], "BACKEND"),
        (["a", "--reason", "deploy\x1b]52;c;Zm9v\x07"], "--reason"),
        (["a", "--reason", "one\ntwo"], "--reason"),
        (["a", "--reason", "\u202etxt.exe"], "--reason"),
        (["a", "--reason", "r" * 1001], "--reason"),
        (["a", "--until", "2030-01-01 08:00" + " " * 60], "--until"),
    ],
)
def test_cli_switch_refuses_hostile_arguments_before_any_call(
    config: Path, args: list[str], named: str
) -> None:
    r = CliRunner().invoke(main, ["--config", str(config), "switch", "--no-wait", *args])
    assert r.exit_code == 2, r.output
    assert named in r.output and "Traceback" not in r.output
    assert _NoDaemon.calls == []


def test_cli_switch_passes_good_arguments(config: Path) -> None:
    r = CliRunner().invoke(
        main, ["--config", str(config), "switch", "--no-wait", "a", "--reason", "nightly run"]
    )
    assert r.exit_code == 0, r.output
    assert _NoDaemon.calls == [("a", {"reason": "nightly run", "now": False})]
