"""Contract tests of the NVML provider against a fake ``pynvml`` module, with real holder processes.

The fake keeps state like the real library: an init/shutdown session, devices with v1 and v2 memory
figures, compute and graphics process lists, and ``NVMLError`` carrying NVML's error codes.  The
device files are temp files held open by real processes, found by the real fd scan.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpushift.host.nvml import NvmlGpuProbe
from gpushift.values import GateState

MIB = 1024 * 1024
RESIDUAL_MIB = 256.0

# NVML's error codes (nvml.h).
UNINITIALIZED = 1
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNKNOWN = 999
ARGUMENT_VERSION_MISMATCH = 25

MESSAGES = {
    UNINITIALIZED: "Uninitialized",
    NOT_SUPPORTED: "Not Supported",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    UNKNOWN: "Unknown Error",
    ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
}


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeDevice:
    """One GPU; memory in MiB.  v2 ``used`` excludes ``reserved``; v1 ``used`` includes it."""

    name: str = "Tesla V100-PCIE-16GB"
    uuid: str = "GPU-6f1c2a9e-0000-0000-0000-000000000000"
    total_mib: float = 16384.0
    used_mib: float = 0.0
    reserved_mib: float = 615.0
    minor: int = 0
    compute: list[tuple[int, float | None]] = field(default_factory=list)  # (pid, MiB)
    graphics: list[tuple[int, float | None]] | None = field(default_factory=list)  # None: NotSupported
    cc: tuple[int, int] = (7, 0)
    ecc_mode: tuple[int, int] | None = (1, 1)  # None: NotSupported
    ecc_uncorrected: int = 0
    ecc_corrected: int = 3
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


class FakeNvml:
    """A stand-in for the pynvml module with the functions gpushift calls."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = FUNCTION_NOT_FOUND
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = ARGUMENT_VERSION_MISMATCH
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_AGGREGATE_ECC = 1

    def __init__(
        self,
        devices: list[FakeDevice],
        driver: str = "580.159.04",
        cuda: int = 13000,
        module_has_v2: bool = True,
        driver_has_v2: bool = True,
    ) -> None:
        self.devices = devices
        self.driver = driver
        self.cuda = cuda
        self.driver_has_v2 = driver_has_v2
        if module_has_v2:
            self.nvmlMemory_v2 = 0x02000028
        self.initialized = False
        self.init_calls = 0
        self.fail: dict[str, int] = {}  # function name -> code, for every device
        self.broken: int | None = None  # every call fails with this code (driver gone)
        self.calls: list[str] = []

    def _enter(self, fn: str, dev: FakeDevice | None = None) -> None:
        self.calls.append(fn)
        if self.broken is not None:
            raise FakeNVMLError(self.broken)
        if fn in self.fail:
            raise FakeNVMLError(self.fail[fn])
        if dev is not None and fn in dev.fail:
            raise FakeNVMLError(dev.fail[fn])
        if not self.initialized:
            raise FakeNVMLError(UNINITIALIZED)

    # session
    def nvmlInit(self) -> None:
        self.init_calls += 1
        self.calls.append("nvmlInit")
        if self.broken is not None:
            raise FakeNVMLError(self.broken)
        if "nvmlInit" in self.fail:
            raise FakeNVMLError(self.fail["nvmlInit"])
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    # system
    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.devices[index]

    # device
    def nvmlDeviceGetName(self, h: FakeDevice) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetMinorNumber(self, h: FakeDevice) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h)
        return h.minor

    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice, version: int | None = None) -> Any:
        if version is None:
            self._enter("nvmlDeviceGetMemoryInfo", h)
            used = h.used_mib + h.reserved_mib
            return SimpleNamespace(
                total=int(h.total_mib * MIB), used=int(used * MIB), free=int((h.total_mib - used) * MIB)
            )
        self._enter("nvmlDeviceGetMemoryInfo_v2", h)
        if not self.driver_has_v2:  # drivers < 510 lack the symbol
            raise FakeNVMLError(FUNCTION_NOT_FOUND)
        return SimpleNamespace(
            version=version,
            total=int(h.total_mib * MIB),
            reserved=int(h.reserved_mib * MIB),
            used=int(h.used_mib * MIB),
            free=int((h.total_mib - h.used_mib - h.reserved_mib) * MIB),
        )

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeDevice) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return [_proc(pid, mib) for pid, mib in h.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeDevice) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", h)
        if h.graphics is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return [_proc(pid, mib) for pid, mib in h.graphics]

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeDevice) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h)
        return h.cc

    def nvmlDeviceGetEccMode(self, h: FakeDevice) -> list[int]:
        self._enter("nvmlDeviceGetEccMode", h)
        if h.ecc_mode is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return list(h.ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeDevice, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        assert counter_type == self.NVML_AGGREGATE_ECC
        return h.ecc_uncorrected if error_type == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else h.ecc_corrected


def _proc(pid: int, mib: float | None) -> Any:
    return SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib * MIB))


def two_v100s() -> list[FakeDevice]:
    return [
        FakeDevice(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", minor=0),
        FakeDevice(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001", minor=1),
    ]


def make_probe(fake: FakeNvml, tmp: str | Path, **kw: Any) -> NvmlGpuProbe:
    """A probe whose device files are temp files ``<tmp>/nvidia<minor>`` (created here)."""
    for d in fake.devices:
        p = Path(tmp) / f"nvidia{d.minor}"
        p.touch()
        p.chmod(0o644)
    return NvmlGpuProbe(device_path_pattern=os.path.join(str(tmp), "nvidia{minor}"), nvml=fake, **kw)


def states(readings: list[Any]) -> list[GateState]:
    return [r.state(RESIDUAL_MIB) for r in readings]


# ------------------------------------------------------------------------------------------- memory


def test_nvml_probe_does_not_touch_nvml_before_the_first_call(tmp_path):
    fake = FakeNvml(two_v100s())
    probe = make_probe(fake, tmp_path)
    assert fake.calls == []
    probe.read()
    assert fake.init_calls == 1


def test_nvml_read_counts_v2_used_without_driver_reserved_memory(tmp_path):
    devices = two_v100s()
    devices[1].used_mib = 9318.0
    probe = make_probe(FakeNvml(devices), tmp_path)

    r0, r1 = probe.read()

    # An idle GPU shows 615 MiB reserved by the driver: that is not "held".
    assert r0.used_mib == 0.0 and r0.state(RESIDUAL_MIB) is GateState.RELEASED
    assert r1.used_mib == pytest.approx(9318.0) and r1.state(RESIDUAL_MIB) is GateState.HELD
    assert (r0.name, r0.total_mib, r0.error) == ("Tesla V100-PCIE-16GB", 16384.0, None)
    assert not probe.uses_v1_fallback


def test_nvml_read_only_the_asked_gpus_in_the_asked_order(tmp_path):
    probe = make_probe(FakeNvml(two_v100s()), tmp_path)
    assert [r.index for r in probe.read([1, 0])] == [1, 0]
    assert [r.index for r in probe.read([1])] == [1]


def test_nvml_v1_fallback_when_the_module_has_no_v2(tmp_path):
    devices = two_v100s()
    devices[1].used_mib = 9000.0
    probe = make_probe(FakeNvml(devices, module_has_v2=False), tmp_path, v1_baseline_mib=600)

    r0, r1 = probe.read()

    assert r0.used_mib == pytest.approx(15.0)  # 615 reserved seen as used by v1, minus the baseline
    assert r0.state(RESIDUAL_MIB) is GateState.RELEASED
    assert r1.used_mib == pytest.approx(9015.0) and r1.state(RESIDUAL_MIB) is GateState.HELD
    assert probe.uses_v1_fallback


@pytest.mark.parametrize("code", [FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH])
def test_nvml_v1_fallback_when_the_driver_lacks_the_v2_call(tmp_path, code):
    devices = two_v100s()
    devices[0].used_mib = 4096.0
    fake = FakeNvml(devices)
    fake.fail["nvmlDeviceGetMemoryInfo_v2"] = code
    probe = make_probe(fake, tmp_path, v1_baseline_mib=615)

    r0, r1 = probe.read()

    assert r0.used_mib == pytest.approx(4096.0) and r0.error is None
    assert r1.used_mib == pytest.approx(0.0) and r1.state(RESIDUAL_MIB) is GateState.RELEASED
    assert probe.uses_v1_fallback
    # Asked once: later reads go straight to v1.
    fake.calls.clear()
    probe.read()
    assert "nvmlDeviceGetMemoryInfo_v2" not in fake.calls


def test_nvml_v1_fallback_never_goes_below_zero(tmp_path):
    devices = [FakeDevice(reserved_mib=300.0)]
    probe = make_probe(FakeNvml(devices, module_has_v2=False), tmp_path, v1_baseline_mib=600)
    assert probe.read()[0].used_mib == 0.0


def test_nvml_other_v2_failure_is_unknown_not_a_silent_v1_reading(tmp_path):
    devices = two_v100s()
    devices[1].fail["nvmlDeviceGetMemoryInfo_v2"] = GPU_IS_LOST
    probe = make_probe(FakeNvml(devices), tmp_path)

    r0, r1 = probe.read()

    assert r0.state(RESIDUAL_MIB) is GateState.RELEASED
    assert r1.used_mib is None and r1.error == "NVML: GPU is lost"
    assert r1.state(RESIDUAL_MIB) is GateState.UNKNOWN
    assert not probe.uses_v1_fallback


# ------------------------------------------------------------------------------------------- errors


def test_nvml_init_failure_makes_every_reading_unknown(tmp_path):
    fake = FakeNvml(two_v100s())
    fake.fail["nvmlInit"] = DRIVER_NOT_LOADED
    probe = make_probe(fake, tmp_path)

    asked = probe.read([0, 1])
    everything = probe.read()

    assert states(asked) == [GateState.UNKNOWN, GateState.UNKNOWN]
    assert all(r.used_mib is None and r.error == "NVML: init failed: Driver Not Loaded" for r in asked)
    # Never an empty list (which would read as "nothing held"), even with no GPU count known.
    assert everything and states(everything) == [GateState.UNKNOWN] * len(everything)
    facts = probe.facts()
    assert facts.error is not None and "Driver Not Loaded" in facts.error and facts.gpus == ()


def test_nvml_missing_library_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    probe = NvmlGpuProbe(device_path_pattern=str(tmp_path / "nvidia{index}"))

    (r,) = probe.read([0])

    assert r.state(RESIDUAL_MIB) is GateState.UNKNOWN
    assert r.error is not None and "nvidia-ml-py" in r.error


def test_nvml_per_gpu_call_failure_is_unknown_for_that_gpu_only(tmp_path):
    devices = two_v100s()
    devices[0].fail["nvmlDeviceGetComputeRunningProcesses"] = GPU_IS_LOST
    probe = make_probe(FakeNvml(devices), tmp_path)

    r0, r1 = probe.read()

    assert r0.state(RESIDUAL_MIB) is GateState.UNKNOWN and r0.error == "NVML: GPU is lost"
    assert r0.name == "Tesla V100-PCIE-16GB"  # still says which GPU it is
    assert r1.state(RESIDUAL_MIB) is GateState.RELEASED


def test_nvml_graphics_list_not_supported_is_no_error(tmp_path):
    devices = [FakeDevice(graphics=None, compute=[])]
    probe = make_probe(FakeNvml(devices), tmp_path)
    (r,) = probe.read()
    assert r.error is None and r.state(RESIDUAL_MIB) is GateState.RELEASED


def test_nvml_failure_after_working_is_unknown_then_reinitialises(tmp_path):
    fake = FakeNvml(two_v100s())
    probe = make_probe(fake, tmp_path)
    assert states(probe.read()) == [GateState.RELEASED, GateState.RELEASED]
    assert fake.init_calls == 1

    # "Failed to initialize NVML: Unknown Error" after a daemon-reload (nvidia-docker#1650).
    fake.broken = UNKNOWN
    assert states(probe.read()) == [GateState.UNKNOWN, GateState.UNKNOWN]
    assert states(probe.read()) == [GateState.UNKNOWN, GateState.UNKNOWN]
    assert fake.init_calls == 2  # the second read tried a fresh init, which failed too
    assert probe.read([1])[0].error == "NVML: init failed: Unknown Error"
    assert probe.facts().error is not None

    fake.broken = None
    fake.initialized = False  # the driver came back; the old session is gone
    readings = probe.read()
    assert states(readings) == [GateState.RELEASED, GateState.RELEASED]
    assert all(r.error is None for r in readings)


def test_nvml_unknown_gpu_index_is_unknown(tmp_path):
    probe = make_probe(FakeNvml(two_v100s()), tmp_path)
    (r,) = probe.read([5])
    assert r.state(RESIDUAL_MIB) is GateState.UNKNOWN and "no GPU 5" in (r.error or "")


# ------------------------------------------------------------------------------------------- holders

FORKING_SERVER = textwrap.dedent(
    """
    import os, sys, time
    f = open(sys.argv[1], "rb")          # the server maps the device
    child = os.fork()                    # its worker inherits the device file
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
    """
)


def test_nvml_dead_pid_in_nvml_list_does_not_hide_the_live_holder(procs, tmp_path):
    devices = two_v100s()
    probe = make_probe(FakeNvml(devices), tmp_path)
    dev1 = str(tmp_path / "nvidia1")
    parent = procs.start([sys.executable, "-c", FORKING_SERVER, dev1])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    procs.adopt(child)
    parent.kill()
    parent.wait(timeout=10)
    # NVML keeps listing the dead parent with its memory until the child dies (FACTS.md, measured).
    devices[1].used_mib = 8300.0
    devices[1].compute = [(parent.pid, 8300.0)]

    r1 = probe.read([1])[0]

    assert r1.state(RESIDUAL_MIB) is GateState.HELD
    assert [h.pid for h in r1.holders] == [child]
    assert r1.holders[0].user == "root" and r1.holders[0].command.startswith("python")
    assert parent.pid not in [h.pid for h in r1.holders]


def test_nvml_fd_holder_gets_nvml_per_process_memory(procs, tmp_path):
    devices = two_v100s()
    probe = make_probe(FakeNvml(devices), tmp_path)
    holder = procs.hold(str(tmp_path / "nvidia0"))
    devices[0].used_mib = 9318.0
    devices[0].compute = [(holder.pid, 9318.0)]
    devices[0].graphics = [(holder.pid, 9318.0)]  # a process in both lists is counted once

    r0, r1 = probe.read()

    assert [(h.pid, h.used_mib) for h in r0.holders] == [(holder.pid, pytest.approx(9318.0))]
    assert r0.holders[0].cmdline[-1] == str(tmp_path / "nvidia0")
    assert r1.holders == ()


def test_nvml_holder_without_memory_is_named_but_does_not_block(procs, tmp_path):
    # nvidia-persistenced, nvidia-smi, DCGM keep the device open while holding no memory.
    probe = make_probe(FakeNvml(two_v100s()), tmp_path)
    holder = procs.hold(str(tmp_path / "nvidia0"))

    r0 = probe.read([0])[0]

    assert [h.pid for h in r0.holders] == [holder.pid]
    assert r0.holders[0].used_mib is None
    assert r0.state(RESIDUAL_MIB) is GateState.RELEASED


def test_nvml_live_process_listed_by_nvml_is_named_even_without_the_fd(procs, tmp_path):
    devices = two_v100s()
    probe = make_probe(FakeNvml(devices), tmp_path)
    other = procs.start([sys.executable, "-c", "import time; time.sleep(600)"])
    devices[0].used_mib = 2048.0
    devices[0].compute = [(other.pid, 2048.0), (os.getpid(), None)]

    r0 = probe.read([0])[0]

    assert [(h.pid, h.used_mib) for h in r0.holders] == [(other.pid, pytest.approx(2048.0))]


def test_nvml_minor_number_names_the_device_file(procs, tmp_path):
    # NVML index 0 is /dev/nvidia1 on this host and the other way round.
    devices = two_v100s()
    devices[0].minor, devices[1].minor = 1, 0
    probe = make_probe(FakeNvml(devices), tmp_path)
    holder = procs.hold(str(tmp_path / "nvidia1"))

    r0, r1 = probe.read()

    assert [h.pid for h in r0.holders] == [holder.pid]
    assert r1.holders == ()


# A probe run as user nobody beside a root holder: the probe runs in a subprocess with a fake NVML
# that says the GPU is idle; only the unreadable /proc/PID/fd of the root process stands in the way.
PROBE_AS_NOBODY = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import test_nvml as t
    fake = t.FakeNvml([t.FakeDevice(minor=0)])
    probe = t.NvmlGpuProbe(device_path_pattern=sys.argv[2], nvml=fake)
    (r,) = probe.read()
    print(json.dumps({
        "state": r.state(t.RESIDUAL_MIB).value,
        "used_mib": r.used_mib,
        "holders": [h.pid for h in r.holders],
        "holders_complete": r.holders_complete,
        "unreadable": list(r.unreadable_pids),
    }))
    """
)


def _probe_in_subprocess(as_nobody: bool, device_pattern: str) -> dict[str, Any]:
    import subprocess

    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    out = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE_AS_NOBODY, os.path.dirname(__file__), device_pattern],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_nvml_unreadable_proc_fd_is_named_and_memory_decides(procs, shared_dir):
    procs.require_setpriv()
    dev = os.path.join(shared_dir, "nvidia0")
    Path(dev).touch()
    os.chmod(dev, 0o644)
    root_holder = procs.hold(dev)
    pattern = os.path.join(shared_dir, "nvidia{minor}")

    as_root = _probe_in_subprocess(False, pattern)
    as_nobody = _probe_in_subprocess(True, pattern)

    # Root sees the holder (holding no memory): released.
    assert as_root["state"] == "released" and root_holder.pid in as_root["holders"]
    # Nobody cannot read root's fds: the holder list says so, but NVML's 0 MiB decides (the gate
    # decides on memory; the scan only names who holds it).
    assert as_nobody["used_mib"] == 0.0
    assert as_nobody["state"] == "released"
    assert as_nobody["holders_complete"] is False
    assert root_holder.pid in as_nobody["unreadable"]


# ------------------------------------------------------------------------------------------- facts


def test_nvml_facts_report_driver_cuda_and_every_gpu(tmp_path):
    devices = two_v100s()
    devices[1].ecc_uncorrected = 2
    devices[1].name = b"Tesla V100-PCIE-16GB"  # type: ignore[assignment]  # old pynvml returns bytes
    probe = make_probe(FakeNvml(devices, cuda=12040), tmp_path)

    f = probe.facts()

    assert f.error is None and f.simulated is False
    assert (f.driver_version, f.cuda_version) == ("580.159.04", "12.4")
    assert [g.uuid for g in f.gpus] == [d.uuid for d in devices]
    g0, g1 = f.gpus
    assert (g0.index, g0.name, g0.total_mib, g0.compute_capability) == (
        0,
        "Tesla V100-PCIE-16GB",
        16384.0,
        (7, 0),
    )
    assert (g0.ecc_enabled, g0.ecc_uncorrected, g0.ecc_corrected) == (True, 0, 3)
    assert (g1.name, g1.ecc_uncorrected) == ("Tesla V100-PCIE-16GB", 2)


def test_nvml_facts_format_cuda_13(tmp_path):
    assert make_probe(FakeNvml(two_v100s(), cuda=13000), tmp_path).facts().cuda_version == "13.0"


def test_nvml_facts_ecc_not_supported_is_none(tmp_path):
    devices = [FakeDevice(ecc_mode=None)]
    f = make_probe(FakeNvml(devices), tmp_path).facts()
    assert f.error is None
    assert (f.gpus[0].ecc_enabled, f.gpus[0].ecc_uncorrected, f.gpus[0].ecc_corrected) == (None, None, None)


def test_nvml_facts_error_mid_way_says_so(tmp_path):
    devices = two_v100s()
    devices[1].fail["nvmlDeviceGetUUID"] = GPU_IS_LOST
    f = make_probe(FakeNvml(devices), tmp_path).facts()
    assert f.error == "NVML: GPU is lost"
    assert [g.index for g in f.gpus] == [0]
