"""The holder scan keeps seeing under the credentials the shipped unit gives the daemon.

``units/gpushift.service`` runs the daemon as root with a cut-down ``CapabilityBoundingSet=``,
no ambient capabilities, ``NoNewPrivileges=yes`` and ``ProtectProc=`` (a ``/proc`` mounted with
``hidepid=``).  These tests read those lines from the shipped file, run a small program as root
under the same credentials (``setpriv``) in a mount namespace whose ``/proc`` has the unit's
options (``unshare``), and hold a simulated GPU device file in a process owned by ``nobody``: the
scan and the simulated provider must still name that holder.  Taking away a capability the unit
keeps for the scan must make the holder unreadable (the reading UNKNOWN), so these tests can fail.

They run as root (setpriv and unshare need it) and fail, never skip, without setpriv or unshare.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpushift.config import schema as config
from gpushift.host.simgpu import SimulatedGpuProbe
from tests.support import unitfile

UNIT = Path(__file__).resolve().parents[3] / "units" / "gpushift.service"

#: The capabilities the scan needs to read another user's /proc/PID/fd: listing the fd directory
#: (mode 0500, owned by the holder) and readlink of each entry (ptrace read access).
SCAN_CAPS = ("dac_read_search", "sys_ptrace")

#: Runs a command as user nobody, without root's groups.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

#: Two simulated GPUs whose device files live under ``state_dir``.
SIM_CONFIG = """\
[daemon]
state_dir = "{state_dir}"

[gpu]
provider = "simulated"
simulated_gpus = 2

[backends.alpha]
unit = "gpushift-alpha.service"
health_url = "http://127.0.0.1:1/health"
"""

#: Runs inside the confined process: the fd scan and the simulated provider on one device file.
PROBE = textwrap.dedent(
    """
    import json, sys
    from gpushift.config import schema as config
    from gpushift.host import procscan
    from gpushift.host.simgpu import SimulatedGpuProbe
    conf_path, index = sys.argv[1], int(sys.argv[2])
    probe = SimulatedGpuProbe(config.load(conf_path))
    scan = procscan.scan_holders({index: probe.device_path(index)})
    reading = probe.read([index])[0]
    with open("/proc/self/status") as f:
        status = dict(line.split(":\\t", 1) for line in f.read().splitlines() if ":\\t" in line)
    print(json.dumps({
        "scan_holders": [[h.pid, h.user] for h in scan.holders_of(index)],
        "scan_unreadable": list(scan.unreadable),
        "scan_complete": scan.complete,
        "state": reading.state(256).value,
        "holders": [[h.pid, h.user] for h in reading.holders],
        "holders_complete": reading.holders_complete,
        "unreadable_pids": list(reading.unreadable_pids),
        "cap_eff": status["CapEff"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip(),
    }))
    """
)


def _require_tools() -> None:
    missing = [t for t in ("setpriv", "unshare") if shutil.which(t) is None]
    if missing:
        raise AssertionError(f"{', '.join(missing)} (util-linux) needed to run the scan as the unit runs it")
    if os.geteuid() != 0:
        raise AssertionError("these tests must run as root: they confine a root process as the unit does")


def _unit_text() -> str:
    assert UNIT.is_file(), f"{UNIT} is missing"
    return UNIT.read_text()


@pytest.fixture
def sim(shared_dir):
    """A simulated GPU host whose device files user nobody can open, and its config file."""
    state = os.path.join(shared_dir, "state")
    conf_path = os.path.join(shared_dir, "gpushift.toml")
    Path(conf_path).write_text(SIM_CONFIG.format(state_dir=state))
    os.chmod(conf_path, 0o644)
    probe = SimulatedGpuProbe(config.load(conf_path))  # creates the device files (0755 dir, 0644 files)
    os.chmod(state, 0o755)
    return conf_path, probe


def _hold_as_nobody(procs, path: str) -> int:
    p = procs.start([*AS_NOBODY, sys.executable, "-m", "gpushift.host.simgpu", "hold", path])
    line = p.stdout.readline() if p.stdout else ""
    if not line.startswith("holding"):
        err = p.stderr.read() if p.stderr else ""
        raise AssertionError(f"the holder run as nobody did not start: {line!r} {err!r}")
    return p.pid


def _run_confined(text: str, conf_path: str, index: int, drop: tuple[str, ...] = ()) -> dict:
    """PROBE as root under the unit's capability lines, in a namespace with the unit's /proc."""
    confine = ["setpriv", *unitfile.setpriv_args(text, drop=drop), sys.executable, "-c", PROBE]
    options = unitfile.hidepid_options(text)
    mount = f"mount -t proc -o {options} proc /proc" if options else "mount -t proc proc /proc"
    script = f'{mount} && exec {shlex.join(confine)} "$@"'
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", conf_path, str(index)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(UNIT.parents[1]),
    )
    assert r.returncode == 0, f"confined probe failed ({r.returncode}): {r.stderr}"
    return dict(json.loads(r.stdout))


def test_unit_keeps_the_capabilities_the_scan_needs_and_no_ambient_ones():
    text = _unit_text()
    bounding = unitfile.capability_set(text, "CapabilityBoundingSet")
    assert bounding is not None, "the unit must name the capabilities it keeps (CapabilityBoundingSet=)"
    for cap in SCAN_CAPS:
        assert cap in bounding, (
            f"CapabilityBoundingSet= lacks CAP_{cap.upper()}: the holder scan would be blind"
        )
    assert not unitfile.capability_set(text, "AmbientCapabilities")
    assert unitfile.is_true(unitfile.last(text, "NoNewPrivileges"))


def test_confined_scan_names_a_holder_owned_by_another_user(procs, sim):
    _require_tools()
    conf_path, probe = sim
    holder = _hold_as_nobody(procs, probe.device_path(1))

    out = _run_confined(_unit_text(), conf_path, 1)

    # The confinement really applied: not root's full set, and no new privileges.
    assert out["no_new_privs"] == "1"
    assert int(out["cap_eff"], 16) != 0 and int(out["cap_eff"], 16) < int("1ffffffffff", 16)
    assert out["scan_holders"] == [[holder, "nobody"]]
    assert out["scan_complete"] is True and out["scan_unreadable"] == []
    # The simulated provider over the same scan: memory held, by nobody's process, fully seen.
    assert out["state"] == "held"
    assert out["holders"] == [[holder, "nobody"]]
    assert out["holders_complete"] is True


@pytest.mark.parametrize("cap", SCAN_CAPS)
def test_confined_scan_without_a_kept_capability_fails_closed(procs, sim, cap):
    _require_tools()
    conf_path, probe = sim
    holder = _hold_as_nobody(procs, probe.device_path(1))

    out = _run_confined(_unit_text(), conf_path, 1, drop=(cap,))

    # Blind to nobody's files: the holder is not named, but it is counted as unreadable (it is
    # still listed in the unit's /proc), so the reading is UNKNOWN, never "released".
    assert out["scan_holders"] == []
    assert holder in out["scan_unreadable"] and out["scan_complete"] is False
    assert out["state"] == "unknown" and out["holders_complete"] is False
    assert holder in out["unreadable_pids"]
