"""An override.json the daemon did not write (an admin's hand edit with a naive time) on the real
daemon: it starts, ignores the file, follows the schedule, says so in the journal
(``override_ignored``) and in ``gpushift status`` (text and ``--json``), and the next override a
person sets replaces the file and clears the note.  Before, the naive time crashed every keeper
tick: the daemon restarted in a loop and nothing followed the schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

NAIVE = {
    "mode": "override",
    "backend": "b",
    "until": "2099-01-01T08:00:00",  # no UTC offset
    "set_by": "admin",
    "set_at": "2026-01-01T08:00:00+00:00",
    "reason": "edited by hand",
    "source": "manual",
    "when_idle": False,
}


def test_a_naive_override_file_is_ignored_and_the_schedule_obeyed(sandbox: Any) -> None:
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True, exist_ok=True)
    schedule = base / "schedule"
    schedule.write_text("TZ=UTC\n0 0 * * * a\n")  # a, all day
    env = GpushiftEnv(
        sandbox,
        base,
        [Backend("a", free_port(), [0, 1], vram_mib=6000), Backend("b", free_port(), [0, 1], vram_mib=6000)],
        schedule=str(schedule),
        reconcile_interval_s=2,
    )
    env.install()
    env.state_dir.mkdir(parents=True, exist_ok=True)
    (env.state_dir / "override.json").write_text(json.dumps(NAIVE))
    env.start_daemon()

    env.wait_for(lambda: "a" in (env.status().get("running") or []), 60, "the schedule's backend a to serve")
    st = env.status()
    why = st["daemon"]["override_ignored"]
    assert why and "until" in why and "no UTC offset" in why, st["daemon"]
    assert st["mode"] == "schedule"
    text = env.cli("status").stdout
    assert f"override: IGNORED, obeying the schedule: {why}" in text, text
    assert env.daemon_journal("GPUSHIFT_EVENT=override_ignored"), env.daemon_log()
    assert env.sb.show("gpushift.service", "NRestarts")["NRestarts"] == "0"
    (row,) = env.ledger()
    assert (row["to"], row["outcome"]) == ("a", "ok") and row["trigger"] in ("reconcile", "schedule")

    env.cli("switch", "b", "--reason", "by hand", check=True)
    st = env.status()
    assert st["daemon"]["override_ignored"] is None and st["active"] == "b"
    assert "IGNORED" not in env.cli("status").stdout
    saved = json.loads((env.state_dir / "override.json").read_text())
    assert saved["backend"] == "b" and saved["set_at"].endswith("+00:00")
