"""The doctor's GPU identity rules: the gate must watch the cards the backends really use."""

from __future__ import annotations

from gpushift import doctor
from gpushift.config.schema import BackendConfig
from gpushift.values import GpuInfo, HostGpuFacts, UnitState

ARGV = ["/usr/bin/llama-server", "-m", "/m/q.gguf"]


def gpu(index: int, name: str, uuid: str, total: float = 16384.0, cc: tuple[int, int] = (7, 0)) -> GpuInfo:
    return GpuInfo(index, name, uuid, total, cc)


SAME = HostGpuFacts(False, "580", "13.0", (gpu(0, "Tesla V100", "GPU-a"), gpu(1, "Tesla V100", "GPU-b")))
MIXED = HostGpuFacts(
    False, "580", "13.0", (gpu(0, "Tesla V100", "GPU-a"), gpu(1, "RTX 4090", "GPU-b", 24564.0, (8, 9)))
)


def backend(gpus: tuple[int, ...] | None = None) -> BackendConfig:
    return BackendConfig("llama", "gpushift-llama.service", "http://127.0.0.1:8080/health", gpus=gpus)


def codes(
    env: dict[str, str], facts: HostGpuFacts = MIXED, gpus: tuple[int, ...] | None = None, **kw: object
):
    unit = UnitState("gpushift-llama.service", "loaded", "inactive", "dead")
    found = doctor.check_backend(backend(gpus), ARGV, env, facts, unit, **kw)  # type: ignore[arg-type]
    return {f.code: f for f in found if f.code.startswith("gpu")}


def test_doctor_index_selection_on_a_mixed_host_without_pci_order_is_an_error() -> None:
    found = codes({"CUDA_VISIBLE_DEVICES": "0"})
    f = found[doctor.GPU_ORDER_AMBIGUOUS]
    assert f.is_error and "fastest first" in f.message and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in f.hint


def test_doctor_index_selection_is_fine_with_pci_order_uuids_or_identical_gpus() -> None:
    assert doctor.GPU_ORDER_AMBIGUOUS not in codes(
        {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    assert doctor.GPU_ORDER_AMBIGUOUS not in codes({"CUDA_VISIBLE_DEVICES": "GPU-a"})  # a UUID names one card
    assert doctor.GPU_ORDER_AMBIGUOUS not in codes({"CUDA_VISIBLE_DEVICES": "0"}, facts=SAME)


def test_doctor_config_gpus_and_cuda_visible_devices_naming_other_cards_warn() -> None:
    f = codes({"CUDA_VISIBLE_DEVICES": "GPU-b"}, gpus=(0,))[doctor.GPUS_MISMATCH]
    assert not f.is_error and "GPU 0" in f.message and "GPU 1" in f.message
    assert doctor.GPUS_MISMATCH not in codes({"CUDA_VISIBLE_DEVICES": "GPU-a"}, gpus=(0,))


def test_doctor_gpu_replaced_since_the_last_launch_refuses_until_accepted() -> None:
    known = {0: "GPU-a", 1: "GPU-old"}
    f = codes({}, known_gpus=known)[doctor.GPU_IDENTITY_CHANGED]
    assert f.is_error and "GPU-old -> GPU-b" in f.message and "accepted_gpu_uuids" in f.hint
    assert doctor.GPU_IDENTITY_CHANGED not in codes({}, known_gpus=known, accepted_gpu_uuids=("GPU-b",))


def test_doctor_gpu_gone_since_the_last_launch_is_an_error() -> None:
    one = HostGpuFacts(False, "580", "13.0", (gpu(0, "Tesla V100", "GPU-a"),))
    f = codes({}, facts=one, known_gpus={0: "GPU-a", 1: "GPU-b"})[doctor.GPU_IDENTITY_CHANGED]
    assert "GPU 1 is not visible" in f.message
