"""The `gpushift` command in front of hostile text: what the daemon reports (a holder's process name,
a reason, a version, a progress detail) reaches the terminal with its escape sequences shown as
text and its credentials masked, in text and in JSON; colour only on a terminal and never with
NO_COLOR (https://no-color.org).  The daemon's side is replaced at the client (click's CliRunner)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpushift.bus import lightclient
from gpushift.cli import main

ESC = "\x1b]0;owned\x07\x1b[2J"
ARGV = ["vllm", "serve", "/m", "--api-key", "s3cret", "--port", "8000"]
SGR = re.compile(r"\x1b\[[0-9;]*m")


def raw_controls(text: str) -> list[str]:
    """Control characters in ``text`` other than newlines and gpushift's own colour codes."""
    return [c for c in SGR.sub("", text) if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


def hostile_status() -> dict[str, Any]:
    return {
        "daemon": {"running": True, "pid": 42, "state": "idle", "version": "0.1"},
        "active": "a",
        "running": ["a"],
        "backends": {
            "a": {
                "unit": "gs-a.service",
                "active_state": "active",
                "sub_state": "running",
                "main_pid": 43,
                "health": {"state": "failing", "ok": False, "status": 503, "detail": "loading" + ESC},
            }
        },
        "gpus": [
            {
                "index": 0,
                "name": "V100",
                "used_mib": 6000,
                "total_mib": 16384,
                "state": "held",
                "holders": [
                    {"pid": 43, "command": "vllm" + ESC, "user": "llm", "cmdline": ARGV, "used_mib": 6000}
                ],
            }
        ],
        "last_switch": {
            "id": 7,
            "from": None,
            "to": "a",
            "outcome": "failed",
            "trigger": "manual",
            "requested_by": "alice",
            "reason": "because" + ESC,
            "message": "a exited: HF_TOKEN=hf_x --api-key s3cret\nforged line",
            "argv": ARGV,
        },
        "ledger": {"state": "ok"},
    }


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        '[daemon]\nbus = "session"\n[backends.a]\nunit = "gs-a.service"\nhealth_url = "http://127.0.0.1:9/health"\n'
    )
    return cfg


def run(config: Path, *args: str, color: bool = False, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--config", str(config), *args], color=color, env=env)


@pytest.fixture
def status_from_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lightclient, "get_status", lambda bus, *a, **k: hostile_status())


def test_cli_status_text_shows_escapes_and_no_secret(config: Path, status_from_daemon: None) -> None:
    r = run(config, "status")
    assert r.exit_code == 0, r.output
    assert raw_controls(r.output) == []
    assert "vllm\\x1b]0;owned\\x07\\x1b[2J" in r.output  # the holder's name, shown as text
    assert "s3cret" not in r.output and "hf_x" not in r.output
    assert "--api-key ***\\nforged line" in r.output
    assert "forged line" not in r.output.splitlines()  # a newline in a value forges no line


def test_cli_status_json_is_json_without_secrets(config: Path, status_from_daemon: None) -> None:
    r = run(config, "status", "--json")
    s = json.loads(r.output)
    assert raw_controls(r.output) == []
    assert s["last_switch"]["reason"] == "because" + ESC  # JSON keeps the value, escaped as JSON
    assert "s3cret" not in r.output and "hf_x" not in r.output
    assert s["gpus"][0]["holders"][0]["cmdline"][4] == "***"


def test_cli_status_colour_only_on_a_terminal_and_never_with_no_color(
    config: Path, status_from_daemon: None
) -> None:
    plain = run(config, "status").output  # CliRunner's output is not a terminal
    assert not SGR.search(plain)
    coloured = run(config, "status", color=True).output
    assert "\x1b[31m" in coloured and SGR.sub("", coloured) == plain  # red "failed"; nothing else changes
    assert not SGR.search(run(config, "status", color=True, env={"NO_COLOR": "1"}).output)
    # no-color.org: an empty NO_COLOR does not count
    assert SGR.search(run(config, "status", color=True, env={"NO_COLOR": ""}).output)


class FakeClient:
    """Stands in for the D-Bus client: a switch whose progress and result carry hostile text."""

    def __init__(self, bus: str) -> None:
        self.bus = bus

    def switch(
        self, backend: str, options: dict[str, Any], on_progress: Callable[[str, str], None], wait: bool
    ) -> dict[str, Any]:
        on_progress("start", "waiting for http://probe:pw@127.0.0.1/health" + ESC)
        on_progress("ready", "a: HTTP 503\r\x1b[1A\x1b[2Kok: switched")
        return {
            "ok": False,
            "outcome": "failed",
            "message": "a exited" + ESC + " --api-key s3cret",
            "error": "org.gpushift.Error.SwitchFailed",
        }


def test_cli_switch_progress_and_result_lines_are_escaped_and_redacted(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lightclient, "switch", lambda bus, *a, **k: FakeClient(bus).switch(*a, **k))
    r = run(config, "switch", "a", "--reason", "x")
    assert r.exit_code == 7
    assert raw_controls(r.output) == []
    assert "\\r\\x1b[1A\\x1b[2Kok: switched" in r.output  # the forged "ok" stays on the progress line
    assert "pw@" not in r.output and "s3cret" not in r.output
    j = run(config, "switch", "a", "--json")
    assert raw_controls(j.stdout) == [] and "s3cret" not in j.output
    assert json.loads(j.stdout)["outcome"] == "failed"


def test_cli_schedule_check_shows_a_hostile_line_escaped(tmp_path: Path, config: Path) -> None:
    sched = tmp_path / "schedule"
    sched.write_text("0 8 * * * a\x1b]0;owned\x07\n", encoding="utf-8")
    r = run(config, "schedule", "check", str(sched))
    assert r.exit_code != 0 and raw_controls(r.output) == []
