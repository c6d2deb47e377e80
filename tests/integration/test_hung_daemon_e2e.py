"""A daemon that holds its bus name but does not answer (stopped, hung) is reported as such, not as
absent: ``gpushift switch`` exits 6 saying it is not answering.  The shipped gpushift.service under a
real systemd user manager, its watchdog turned off by a drop-in so that systemd does not restart the
stopped daemon while the test asks it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from gpushift_env import Backend, GpushiftEnv, free_port


def test_switch_against_a_daemon_that_holds_its_name_but_does_not_answer_says_not_answering(sandbox):
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=1000)
    b = Backend("b", free_port(), [0, 1], version="2.0.0", vram_mib=1000)
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "hung", [a, b], reconcile_interval_s=2)
    env.install()
    sandbox.install_dropin("gpushift.service", "60-no-watchdog.conf", "[Service]\nWatchdogSec=0\n")
    sandbox.daemon_reload()
    env.start_daemon()
    env.cli("switch", "a", check=True)
    pid = env.main_pid("gpushift.service")
    os.kill(pid, signal.SIGSTOP)  # it keeps its connection and its name, and answers nothing
    try:
        r = env.cli("switch", "b", timeout_s=120)
        assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
        assert "not answering" in r.stderr, r.stderr
        assert "not running on this bus" not in r.stderr, r.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert env.main_pid("gpushift.service") == pid
    assert env.active_state("gs-a.service") == "active"  # nothing was switched
    env.cli("switch", "b", check=True)  # and once it runs again, it answers
