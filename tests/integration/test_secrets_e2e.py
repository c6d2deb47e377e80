"""Secrets and terminals on the real daemon (the shipped gpushift.service under a real systemd user
manager and bus): a stand-in backend whose unit runs it with ``--api-key s3cret`` and
``Environment=HF_TOKEN=hf_x``, whose health URL carries ``probe:pr0bepw@``, whose version command
prints bytes that are not UTF-8 and an escape sequence.  A ``--reason`` that holds escape
sequences is refused before anything happens (exit 2, no switch, no row: ``gpushift/config/validate.py``);
the switch with a plain reason then succeeds; no credential appears in ``gpushift status`` (text, ``--json``), the
D-Bus ``GetStatus`` reply, the ``Progress``/``Finished`` signals, ``gpushift ledger`` (list, JSON,
show, diff, both exports), ``gpushift check`` or the daemon's journal; and no terminal output holds
a raw control character (escape sequences are shown as ``\\x1b``...)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, end, free_port

SECRETS = ("s3cret", "hf_x", "pr0bepw")
HOSTILE_REASON = "night shift\x1b]52;c;ZXZpbA==\x07\x1b[2J"
REASON = "night shift"
VERSION_COMMAND = ["printf", "build\\377\\nversion: 1.0 \\033]0;owned\\007\\n"]
BUS_NAME = "org.gpushift.Switcher1"
OBJECT_PATH = "/org/gpushift/Switcher1"


def raw_controls(text: str) -> list[str]:
    """Characters a terminal obeys (newlines of the output's own lines aside)."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


def get_status(sandbox: Any) -> str:
    from gpushift.host.dbus import connect

    bus = connect("session", sandbox.bus_address)
    try:
        return str(bus.get(BUS_NAME, OBJECT_PATH).GetStatus())
    finally:
        with contextlib.suppress(Exception):
            bus.con.close_sync(None)


def test_secrets_reach_no_output_and_escapes_reach_no_terminal(sandbox: Any) -> None:
    a = Backend(
        "a",
        free_port(),
        [0, 1],
        args=["--api-key", "s3cret"],
        environment={"HF_TOKEN": "hf_x"},
        version_command=VERSION_COMMAND,
        url_userinfo="probe:pr0bepw@",
    )
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a]).up()
    monitor = subprocess.Popen(
        ["dbus-monitor", "--address", sandbox.bus_address, f"type='signal',interface='{BUS_NAME}'"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    try:
        refused = env.cli("switch", "a", "--reason", HOSTILE_REASON)
        assert refused.returncode == 2 and "--reason" in refused.stderr, refused
        assert env.ledger() == []  # nothing happened
        switched = env.cli("switch", "a", "--reason", REASON, check=True)
    finally:
        end(monitor)
    signals = monitor.stdout.read() if monitor.stdout else ""
    assert "Progress" in signals and "Finished" in signals, signals  # the monitor saw the switch

    # a version that is not UTF-8 and carries an escape sequence does not fail the switch
    (row,) = env.ledger()
    assert row["outcome"] == "ok" and row["reason"] == REASON
    assert row["backend_version"] == "1.0 \x1b]0;owned\x07" and row["version_source"] == "command"

    status_json = env.cli("status", "--json").stdout
    holders = [h for g in json.loads(status_json)["gpus"] for h in g.get("holders") or []]
    assert any("--api-key" in h["cmdline"] for h in holders), status_json  # the holder is there...
    assert all("***" in h["cmdline"] for h in holders if "--api-key" in h["cmdline"])  # ...masked

    terminal_outputs = {
        "switch": switched.stdout + switched.stderr,
        "status": env.cli("status").stdout,
        "status --json": status_json,
        "ledger": env.cli("ledger", check=True).stdout,
        "ledger --json": env.cli("ledger", "--json", check=True).stdout,
        "ledger show": env.cli("ledger", "show", str(row["id"]), check=True).stdout,
        "ledger show --json": env.cli("ledger", "show", str(row["id"]), "--json", check=True).stdout,
        "ledger diff": env.cli("ledger", "diff", check=True).stdout,
        "ledger export jsonl": env.cli("ledger", "export", "--format", "jsonl", check=True).stdout,
        "ledger export markdown": env.cli("ledger", "export", "--format", "markdown", check=True).stdout,
        "check": env.cli("check").stdout,
        "check --json": env.cli("check", "--json").stdout,
    }
    other_outputs = {
        "GetStatus": get_status(sandbox),
        "D-Bus signals": signals,
        "daemon journal": json.dumps(env.daemon_journal()),
    }
    for name, text in {**terminal_outputs, **other_outputs}.items():
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, f"{name} shows {leaked}:\n{text}"
    for name, text in terminal_outputs.items():
        assert raw_controls(text) == [], f"{name} holds raw control characters:\n{text!r}"
    assert raw_controls(refused.stderr) == [], refused.stderr  # the refusal shows the escapes as text
    assert "1.0 \\x1b]0;owned\\x07" in terminal_outputs["ledger show"]
    assert "http://***@127.0.0.1" in terminal_outputs["switch"]  # the progress line names the URL, masked
