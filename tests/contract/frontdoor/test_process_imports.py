"""The front door's process imports nothing of the daemon's: no pydbus, no GLib, none of the daemon's,
the keeper's, the switcher's or the bus service's modules (a fresh interpreter, every module the
front door's command loads)."""

from __future__ import annotations

import subprocess
import sys


def test_the_front_door_process_imports_nothing_of_the_daemons() -> None:
    code = (
        "import sys\n"
        "import gpushift.cli, gpushift.cli.frontdoor, gpushift.frontdoor.main, gpushift.frontdoor.daemonlink\n"
        "import gpushift.frontdoor.listenfds, gpushift.host.logs, gpushift.host.sdnotify\n"
        "import gpushift.frontdoor.core, gpushift.frontdoor.server, gpushift.frontdoor.proxy\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('gi', 'pydbus') or\n"
        "             m.startswith(('gpushift.daemon', 'gpushift.keeper', 'gpushift.switch', 'gpushift.bus')))\n"
        "print(bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
