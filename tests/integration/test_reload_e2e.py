"""`gpushift reload` on the real daemon: `log_level` is applied at once (debug lines follow the
reload; before, none until a restart), the answer lists the keys it applied, and a file that
changes a key only a restart can apply is refused naming that key while the old config stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port


def test_reload_applies_log_level_live_and_names_what_needs_a_restart(sandbox: Any) -> None:
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [Backend("a", free_port(), [0, 1])]).up()
    assert not env.daemon_journal("GPUSHIFT_EVENT=tick"), "debug lines before the reload"

    env.opts["daemon_lines"] = ['log_level = "debug"']
    env.write_config()
    r = env.cli("reload", check=True)
    assert "applied: daemon.log_level" in r.stdout, r.stdout
    env.wait_for(lambda: env.daemon_journal("GPUSHIFT_EVENT=tick"), 30, "a debug line after the reload")

    env.opts["residual_mib"] = 512
    env.write_config()
    r = env.cli("reload")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "gpu.residual_mib" in r.stderr and "systemctl restart gpushift" in r.stderr, r.stderr
    st = env.status()
    assert "gpu.residual_mib" in (st["daemon"]["reload_error"] or ""), st["daemon"]
