"""The hardened units/gpushift.service: its rating, and a daemon that still sees under it.

* ``systemd-analyze security --offline=true`` rates the shipped unit no worse than the figure
  docs/reliability.md ("Hardening") records, so a loosened line fails here.
* The daemon runs from the shipped unit in the sandbox's systemd manager (the test drop-in only
  points it at this test's files: see ``tests.support.demo.DAEMON_DROPIN``).  Its process really
  carries the unit's capability bounding set, no-new-privileges and system call filter, and it
  still names a holder of a (simulated) GPU run by another user, and refuses a switch onto it.
  With CAP_SYS_PTRACE taken away by a drop-in, the same holder makes the reading UNKNOWN.
"""

from __future__ import annotations

import grp
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushift_env import Backend, GpushiftEnv, end, free_port

from tests.support import unitfile

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "units" / "gpushift.service"
DOC = REPO / "docs" / "reliability.md"
EXPOSURE = re.compile(r"Overall exposure level for gpushift\.service: (\d+\.\d+)")
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _documented_exposure() -> float:
    """The rating recorded under "After" in docs/reliability.md's Hardening section."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Hardening", 1)
    assert len(section) == 2, f"{DOC} has no '## Hardening' section"
    after = section[1].split("### After", 1)
    assert len(after) == 2, f"{DOC}: the Hardening section has no '### After' table"
    m = EXPOSURE.search(after[1])
    assert m, f"{DOC}: no 'Overall exposure level' line under '### After'"
    return float(m.group(1))


def test_shipped_unit_exposure_is_at_most_the_documented_figure() -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is missing (Debian/Ubuntu: apt-get install systemd)", pytrace=False)
    r = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = EXPOSURE.search(r.stdout + r.stderr)
    assert m, f"no exposure level in the output (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    assert float(m.group(1)) <= _documented_exposure(), r.stdout


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory user nobody can traverse (the sandbox's and pytest's own are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="gpushift-hardening-"))
    d.chmod(0o755)
    (d / "state").mkdir(mode=0o755)  # made before the daemon, whose umask (0027) would close it
    (d / "state").chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _status_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return {k: v.strip() for k, v in (ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)}


def _unit_bounding_mask(text: str) -> str:
    """CapBnd of a root process given the unit's capability lines (the kernel's own spelling)."""
    r = subprocess.run(
        ["setpriv", *unitfile.setpriv_args(text), "cat", "/proc/self/status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return next(ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines() if ln.startswith("CapBnd:"))


def _hold_as_nobody(path: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-m", "gpushift.host.simgpu", "hold", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = p.stdout.readline() if p.stdout else ""
    if not line.startswith("holding"):
        end(p)
        err = p.stderr.read() if p.stderr else ""
        raise AssertionError(f"the holder run as nobody did not start: {line!r} {err!r}")
    return p


def _gpu(status: dict, index: int) -> dict:
    return next(g for g in status["gpus"] if g["index"] == index)


def test_hardened_daemon_is_confined_and_names_another_users_holder(sandbox, open_base) -> None:
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run a holder as user nobody", pytrace=False)
    env = GpushiftEnv(sandbox, open_base, [Backend("a", free_port(), [0])]).up()
    text = UNIT.read_text()

    daemon = _status_fields(env.main_pid("gpushift.service"))
    assert daemon["CapBnd"] == _unit_bounding_mask(text)
    assert daemon["CapEff"] == daemon["CapBnd"]  # root: exactly what the bounding set leaves
    assert daemon["NoNewPrivs"] == "1"
    assert daemon["Seccomp"] == "2"  # SystemCallFilter= and friends are in force

    holder = _hold_as_nobody(env.simdir / "nvidia0")
    try:
        # status answers from the sampler: wait for a sample taken after the holder opened the device
        env.wait_for(lambda: _gpu(env.status(), 0)["state"] != "released", 15, "a sample with the holder")
        gpu = _gpu(env.status(), 0)
        assert gpu["state"] == "held", gpu
        assert [(h["pid"], h["user"]) for h in gpu["holders"]] == [(holder.pid, "nobody")]
        assert gpu["holders_complete"] is True and gpu["unreadable_pids"] == []

        r = env.cli("switch", "a", timeout_s=90)
        assert r.returncode == 8, (r.returncode, r.stdout, r.stderr)
        assert f"pid {holder.pid}" in r.stderr and "nobody" in r.stderr, r.stderr
        assert env.active_state(env.backends["a"].unit) == "inactive"
    finally:
        end(holder)


def test_hardened_daemon_without_ptrace_cannot_see_the_holder(sandbox, open_base) -> None:
    # The same daemon with CAP_SYS_PTRACE taken away: blind to nobody's fds, so the reading is
    # UNKNOWN (fails closed) — the capability the unit keeps is what lets the gate see.
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run a holder as user nobody", pytrace=False)
    env = GpushiftEnv(sandbox, open_base, [Backend("a", free_port(), [0])])
    env.install()
    sandbox.install_dropin(
        "gpushift.service", "60-no-ptrace.conf", "[Service]\nCapabilityBoundingSet=~CAP_SYS_PTRACE\n"
    )
    sandbox.daemon_reload()
    env.start_daemon()

    holder = _hold_as_nobody(env.simdir / "nvidia0")
    try:
        # Other users' processes on the host may already make the reading UNKNOWN before the holder
        # starts, so wait for a sample that names the holder itself among the unreadable processes.
        env.wait_for(
            lambda: holder.pid in _gpu(env.status(), 0)["unreadable_pids"], 15, "a sample with the holder"
        )
        gpu = _gpu(env.status(), 0)
        assert gpu["state"] == "unknown", gpu
        assert gpu["holders"] == [] and gpu["holders_complete"] is False
    finally:
        end(holder)


@pytest.fixture
def gpushift_group() -> Iterator[int]:
    """Group ``gpushift`` (the ledger's): made for the test where missing, removed again only then."""
    for tool in ("groupadd", "groupdel"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed to make group gpushift (apt-get install passwd)", pytrace=False)
    made = False
    try:
        grp.getgrnam("gpushift")
    except KeyError:
        subprocess.run(["groupadd", "-r", "gpushift"], check=True, capture_output=True)
        made = True
    try:
        yield grp.getgrnam("gpushift").gr_gid
    finally:
        if made:
            subprocess.run(["groupdel", "gpushift"], check=False, capture_output=True)


@pytest.mark.parametrize("dropin", ["", "CapabilityBoundingSet=~CAP_CHOWN"], ids=["shipped", "no-chown"])
def test_hardened_daemon_gives_the_ledger_to_group_gpushift(
    sandbox, open_base, gpushift_group, dropin
) -> None:
    # Members of group gpushift read the ledger file directly; root is no member, so giving the
    # file that group takes CAP_CHOWN (and the chown calls the system call filter gives back).
    env = GpushiftEnv(sandbox, open_base, [Backend("a", free_port(), [0])])
    env.install()
    if dropin:
        sandbox.install_dropin("gpushift.service", "60-caps.conf", f"[Service]\n{dropin}\n")
        sandbox.daemon_reload()
    env.start_daemon()

    env.cli("switch", "a", check=True)

    db = env.state_dir / "ledger.db"
    assert db.is_file(), env.daemon_log()[-2000:]
    assert (db.stat().st_gid == gpushift_group) is (not dropin)


# ------------------------------------------------------------------ the example backend units

BACKEND_DOC = REPO / "docs" / "real-backends.md"
BACKEND_UNITS = ("gpushift-vllm.service", "gpushift-llama.service")
#: In both backend units' hardening block: no capability, no privilege to gain, a user of its own,
#: a read-only system, loopback only, the GPU's devices only.
BACKEND_HARDENING = {
    "DynamicUser": "yes",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "DevicePolicy": "closed",
    "DeviceAllow": "char-nvidia* rw",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "MemoryDenyWriteExecute": "yes",
    "IPAddressDeny": "any",
    "IPAddressAllow": "localhost",
    "UMask": "0077",
}
#: What the backends' stop and start rely on (tests/integration/test_units_verify.py, gpushift's
#: switch): the hardening must not have dropped any of it.
BACKEND_KEPT = {"Type": "simple", "KillMode": "control-group", "SendSIGKILL": "yes", "Restart": "no"}


def _backend_exposure_documented(unit: str) -> float:
    """The figure "After" for UNIT in docs/real-backends.md's "Hardening the backend units"."""
    text = BACKEND_DOC.read_text(encoding="utf-8")
    section = text.split("## Hardening the backend units", 1)
    assert len(section) == 2, f"{BACKEND_DOC} has no '## Hardening the backend units' section"
    m = re.search(rf"\| `{re.escape(unit)}` \| [^|]+ \| \*\*(\d+\.\d+) OK\*\* \|", section[1])
    assert m, f"{BACKEND_DOC}: no 'After' score for {unit} in the scores table"
    return float(m.group(1))


def _exposure(path: Path) -> float:
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(rf"Overall exposure level for {re.escape(path.name)}: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, f"no exposure level in the output (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    return float(m.group(1))


@pytest.mark.parametrize("name", BACKEND_UNITS)
def test_backend_unit_exposure_is_at_most_the_documented_figure(name: str) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing (Debian/Ubuntu: apt-get install systemd)", pytrace=False)
    documented = _backend_exposure_documented(name)
    assert documented < 4.5, f"docs/real-backends.md records {documented} for {name}: not OK any more"
    assert _exposure(REPO / "units" / name) <= documented


@pytest.mark.parametrize("name", BACKEND_UNITS)
def test_backend_unit_keeps_its_stop_and_carries_the_hardening_block(name: str) -> None:
    text = (REPO / "units" / name).read_text(encoding="utf-8")
    lines = text.splitlines()
    begins = [i for i, ln in enumerate(lines) if ln.startswith("# --- hardening (begin)")]
    ends = [i for i, ln in enumerate(lines) if ln.startswith("# --- hardening (end)")]
    assert len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0], "one hardening block, in order"
    service = [(k, v) for section, k, v in unitfile.directives(text) if section == "Service"]
    values: dict[str, list[str]] = {}
    for k, v in service:
        values.setdefault(k, []).append(v)
    for key, want in {**BACKEND_HARDENING, **BACKEND_KEPT}.items():
        assert values.get(key, [None])[-1] == want, (name, key, values.get(key))
    assert "TimeoutStopSec" in values and "ExecStart" in values
    block = "\n".join(lines[begins[0] : ends[0]])
    for key in BACKEND_HARDENING:  # the tests' helper reads the block: every line must be in it
        assert f"\n{key}=" in block, f"{name}: {key}= is outside the hardening block"
    cache = f"gpushift-{name.split('-')[1].split('.')[0]}"
    assert values["CacheDirectory"] == [cache]
    assert f"HOME=%C/{cache}" in values["Environment"], "HOME must point into the cache directory"
    # PrivateDevices= hides /dev/nvidia*; ProcSubset=pid hides /proc/meminfo, which vLLM reads (psutil)
    assert "PrivateDevices" not in values and "ProcSubset" not in values
    families = set(values["RestrictAddressFamilies"][-1].split())
    assert families >= {"AF_UNIX", "AF_INET", "AF_INET6"}
    # NCCL's bootstrap needs getifaddrs(), i.e. netlink (measured); llama-server runs no NCCL
    assert ("AF_NETLINK" in families) is (name == "gpushift-vllm.service")
