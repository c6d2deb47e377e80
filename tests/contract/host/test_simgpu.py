"""Contract tests of the simulated GPU provider: real processes holding its device files."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpushift.config import schema as cfg
from gpushift.host.simgpu import SimulatedGpuProbe
from gpushift.values import GateState

RESIDUAL_MIB = 256.0
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def make_config(
    state_dir: str, delay_s: float = 0.5, foreign_mib: float = 9318.0, gpus: int = 2
) -> cfg.Config:
    return cfg.parse(
        f"""
        [daemon]
        bus = "session"
        state_dir = "{state_dir}"

        [gpu]
        provider = "simulated"
        simulated_gpus = {gpus}
        simulated_total_mib = 16384
        simulated_foreign_mib = {foreign_mib}
        simulated_release_delay_s = {delay_s}

        [backends.alpha]
        unit = "gpushift-alpha.service"
        health_url = "http://127.0.0.1:8000/health"
        simulated_vram_mib = 14500

        [backends.beta]
        unit = "gpushift-beta.service"
        health_url = "http://127.0.0.1:8080/health"
        simulated_vram_mib = 6800
        """,
        "test.toml",
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_simgpu_creates_device_files_any_user_can_open_read_only(shared_dir):
    conf = make_config(os.path.join(shared_dir, "state"))
    probe = SimulatedGpuProbe(conf)
    inodes = [os.stat(p).st_ino for p in probe.device_paths().values()]
    SimulatedGpuProbe(conf)  # a second daemon start: same files, nothing recreated

    d = conf.simulated_dir
    assert d == os.path.join(shared_dir, "state", "simgpu")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert sorted(os.listdir(d)) == ["nvidia0", "nvidia1"]
    for path, ino in zip(probe.device_paths().values(), inodes, strict=True):
        st = os.stat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert st.st_ino == ino
    os.chmod(os.path.join(shared_dir, "state"), 0o755)
    opened = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", f"open({probe.device_path(1)!r}, 'rb').close()"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert opened.returncode == 0, opened.stderr


def test_simgpu_restores_modes_of_existing_files(tmp_path):
    conf = make_config(str(tmp_path))
    os.makedirs(conf.simulated_dir, mode=0o700)
    Path(conf.simulated_dir, "nvidia0").touch(mode=0o600)

    probe = SimulatedGpuProbe(conf)

    assert stat.S_IMODE(os.stat(conf.simulated_dir).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(probe.device_path(0)).st_mode) == 0o644


def test_simgpu_idle_gpus_are_released(tmp_path):
    readings = SimulatedGpuProbe(make_config(str(tmp_path))).read()
    assert [(r.index, r.used_mib, r.holders) for r in readings] == [(0, 0.0, ()), (1, 0.0, ())]
    assert all(r.state(RESIDUAL_MIB) is GateState.RELEASED for r in readings)


def test_simgpu_foreign_holder_is_found_named_and_holds_the_foreign_amount(procs, tmp_path):
    probe = SimulatedGpuProbe(make_config(str(tmp_path)))
    p = procs.hold(probe.device_path(1))

    r0, r1 = probe.read()

    assert r0.state(RESIDUAL_MIB) is GateState.RELEASED  # a holder on another GPU does not count here
    assert r1.state(RESIDUAL_MIB) is GateState.HELD
    assert r1.used_mib == 9318.0
    (h,) = r1.holders
    assert (h.pid, h.user, h.used_mib) == (p.pid, "root", 9318.0)
    assert h.command.startswith("python") and h.cmdline[-1] == probe.device_path(1)
    assert "SIMULATED" in r1.name


def test_simgpu_memory_comes_back_after_the_release_delay(procs, tmp_path):
    clock = FakeClock()
    probe = SimulatedGpuProbe(make_config(str(tmp_path), delay_s=2.0), clock=clock)
    p = procs.hold(probe.device_path(0))
    assert probe.read([0])[0].used_mib == 9318.0

    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    clock.t += 0.5
    first = probe.read([0])[0]
    clock.t += 1.0
    still = probe.read([0])[0]
    clock.t += 0.6
    back = probe.read([0])[0]

    # Closed, but the memory is not back yet: held, and nobody left to name.
    assert (first.used_mib, first.holders, first.state(RESIDUAL_MIB)) == (9318.0, (), GateState.HELD)
    assert still.used_mib == 9318.0
    assert back.used_mib == 0.0 and back.state(RESIDUAL_MIB) is GateState.RELEASED


def test_simgpu_memory_comes_back_on_the_real_clock(procs, tmp_path):
    probe = SimulatedGpuProbe(make_config(str(tmp_path), delay_s=0.5))
    p = procs.hold(probe.device_path(0))
    assert probe.read([0])[0].state(RESIDUAL_MIB) is GateState.HELD
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)

    assert procs.wait_until(lambda: probe.read([0])[0].state(RESIDUAL_MIB) is GateState.RELEASED, timeout_s=5)


def test_simgpu_read_long_after_the_close_shows_no_stale_memory(procs, tmp_path):
    # A status or preflight read long after the holder left must not show memory a real driver
    # freed long ago.
    clock = FakeClock()
    probe = SimulatedGpuProbe(make_config(str(tmp_path), delay_s=2.0), clock=clock)
    p = procs.hold(probe.device_path(0))
    probe.read([0])
    p.kill()
    p.wait(timeout=10)
    clock.t += 600

    assert probe.read([0])[0].used_mib == 0.0


def test_simgpu_backend_unit_holder_holds_the_backends_amount(procs, tmp_path):
    conf = make_config(str(tmp_path))
    units: dict[int, str] = {}
    probe = SimulatedGpuProbe(conf, unit_of=units.get)
    server = procs.hold(probe.device_path(0), probe.device_path(1))
    worker = procs.hold(probe.device_path(1))
    stray = procs.hold(probe.device_path(1))
    units[server.pid] = units[worker.pid] = "gpushift-alpha.service"
    units[stray.pid] = "run-u42.scope"  # a unit, but no backend's

    r0, r1 = probe.read()

    assert r0.used_mib == 14500.0
    assert [(h.pid, h.unit, h.used_mib) for h in r0.holders] == [
        (server.pid, "gpushift-alpha.service", 14500.0)
    ]
    # GPU 1: the backend's amount once for its unit (split between its two processes), plus a
    # foreign holder; more than the GPU has, so capped at its total.
    by_pid = {h.pid: h.used_mib for h in r1.holders}
    assert by_pid == {server.pid: 7250.0, worker.pid: 7250.0, stray.pid: 9318.0}
    assert r1.used_mib == 16384.0


def test_simgpu_other_backend_gets_its_own_amount(procs, tmp_path):
    units: dict[int, str] = {}
    probe = SimulatedGpuProbe(make_config(str(tmp_path)), unit_of=units.get)
    p = procs.hold(probe.device_path(0))
    units[p.pid] = "gpushift-beta.service"

    assert probe.read([0])[0].used_mib == 6800.0


def test_simgpu_facts_say_simulated(tmp_path):
    f = SimulatedGpuProbe(make_config(str(tmp_path), gpus=3)).facts()

    assert f.simulated is True and f.error is None
    assert (f.driver_version, f.cuda_version) == ("SIMULATED", "SIMULATED")
    assert [g.name for g in f.gpus] == ["SIMULATED Tesla V100-PCIE-16GB"] * 3
    assert [g.uuid for g in f.gpus] == [
        "GPU-SIMULATED-0000-0000-0000-000000000000",
        "GPU-SIMULATED-0000-0000-0000-000000000001",
        "GPU-SIMULATED-0000-0000-0000-000000000002",
    ]
    assert all(g.compute_capability == (7, 0) and g.total_mib == 16384.0 for g in f.gpus)
    assert SimulatedGpuProbe.simulated is True


def test_simgpu_unknown_index_is_unknown(tmp_path):
    (r,) = SimulatedGpuProbe(make_config(str(tmp_path))).read([2])
    assert r.state(RESIDUAL_MIB) is GateState.UNKNOWN and "no GPU 2" in (r.error or "")


def test_simgpu_device_files_that_cannot_exist_make_readings_unknown(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    probe = SimulatedGpuProbe(make_config(str(blocker)))  # state_dir below a regular file

    readings = probe.read()

    assert probe.create_error is not None and probe.facts().error == probe.create_error
    assert [r.state(RESIDUAL_MIB) for r in readings] == [GateState.UNKNOWN, GateState.UNKNOWN]


def test_simgpu_recreates_a_deleted_device_file(tmp_path):
    probe = SimulatedGpuProbe(make_config(str(tmp_path)))
    os.unlink(probe.device_path(1))

    readings = probe.read()

    assert os.path.exists(probe.device_path(1))
    assert all(r.state(RESIDUAL_MIB) is GateState.RELEASED for r in readings)


def test_simgpu_unreadable_holder_is_unknown_as_non_root(procs, shared_dir):
    procs.require_setpriv()
    conf = make_config(os.path.join(shared_dir, "state"))
    probe = SimulatedGpuProbe(conf)
    os.chmod(os.path.join(shared_dir, "state"), 0o755)
    root_holder = procs.hold(probe.device_path(0))
    script = (
        "import sys\n"
        "from gpushift.config import schema as config\n"
        "from gpushift.host.simgpu import SimulatedGpuProbe\n"
        "p = SimulatedGpuProbe(config.load(sys.argv[1]))\n"
        "r = p.read([0])[0]\n"
        "print(r.state(256).value, r.used_mib, r.holders_complete, sys.argv[2] in map(str, r.unreadable_pids))\n"
    )
    conf_path = os.path.join(shared_dir, "gpushift.toml")
    Path(conf_path).write_text(
        f'[daemon]\nstate_dir = "{os.path.join(shared_dir, "state")}"\n'
        '[gpu]\nprovider = "simulated"\n'
        '[backends.alpha]\nunit = "gpushift-alpha.service"\nhealth_url = "http://127.0.0.1:1/health"\n'
    )
    os.chmod(conf_path, 0o644)

    out = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", script, conf_path, str(root_holder.pid)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert out.returncode == 0, out.stderr
    # Nobody cannot see root's holder: simulated memory IS the holders' memory, so it is unknown.
    assert out.stdout.split() == ["unknown", "None", "False", "True"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_simgpu_hold_program_exits_zero_on_signal(procs, tmp_path, sig):
    probe = SimulatedGpuProbe(make_config(str(tmp_path)))
    p = procs.hold(probe.device_path(0))
    assert [h.pid for h in probe.read([0])[0].holders] == [p.pid]

    p.send_signal(sig)

    assert p.wait(timeout=10) == 0


def test_simgpu_hold_program_fails_on_a_missing_file(procs, tmp_path):
    p = procs.start([sys.executable, "-m", "gpushift.host.simgpu", "hold", str(tmp_path / "missing")])
    assert p.wait(timeout=30) == 1
    assert p.stderr is not None and "cannot open" in p.stderr.read()
