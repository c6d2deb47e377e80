"""The vocabulary a kind's doctor rules speak: severities, the stable finding codes,
:class:`Finding`, the launch a rule reads (:class:`Launch`), a kind's rules (:class:`KindRules`),
and how the messages name GPUs.

It lives here, below the config and the doctor, so that a kind's module (``backends/vllm.py``)
can state its rules; the doctor (``gpushift.doctor``) gives them their facts and re-exports all of
it.  Everything is plain values: a launch is its name, command line, environment, the host's GPU
facts and the GPUs it was given, never the config's types.

``Finding.code`` values are part of ``gpushift check --json``: keep them stable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.values import GpuInfo, HostGpuFacts

ERROR = "error"
WARNING = "warning"

# Finding codes (stable: scripts read them from `gpushift check --json`).
FP8_UNSUPPORTED = "fp8-unsupported"
BF16_EMULATED = "bf16-emulated"
TENSOR_PARALLEL_TOO_LARGE = "tensor-parallel-too-large"
SPLIT_MODE_NONE = "split-mode-none"
MODEL_PATH_MISSING = "model-path-missing"
ECC_UNCORRECTABLE = "ecc-uncorrectable"
ECC_CORRECTABLE_GROWING = "ecc-correctable-growing"
VERSION_NOT_PINNED = "version-not-pinned"
PORT_DUPLICATE = "port-duplicate"
INSTANCE_GPU_SHARED = "instance-gpu-shared"  # two instances of one backend on one GPU (issue 23)
INSTANCE_PORT_DUPLICATE = "instance-port-duplicate"  # two instances of one backend on one port
PORT_TAKEN = "port-taken"
HEALTH_URL_PORT = "health-url-port"
ENV_UNDEFINED = "env-undefined"
GPU_FACTS_UNAVAILABLE = "gpu-facts-unavailable"
UNIT_NOT_LOADED = "unit-not-loaded"
UNIT_KILL_MODE = "unit-kill-mode"
UNIT_NO_SIGKILL = "unit-no-sigkill"
UNIT_TIMEOUT_STOP_INFINITE = "unit-timeout-stop-infinite"
UNIT_TIMEOUT_STOP_SHORT = "unit-timeout-stop-short"
UNIT_NO_CONFLICTS = "unit-no-conflicts"
GPU_IDENTITY_CHANGED = "gpu-identity-changed"
GPU_ORDER_AMBIGUOUS = "gpu-order-ambiguous"
GPUS_MISMATCH = "gpus-mismatch"


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found about one backend.

    Attributes:
        severity: ``"error"`` (refuse to switch) or ``"warning"`` (switch, log, record).
        code: a stable identifier such as ``"fp8-unsupported"``.
        backend: the backend's name from the config.
        message: what is wrong, for a person, one or two sentences.
        hint: what to do about it.
    """

    severity: str
    code: str
    backend: str
    message: str
    hint: str = ""

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def to_dict(self) -> dict[str, str]:
        """The stable JSON shape of ``gpushift check --json``."""
        return {
            "severity": self.severity,
            "code": self.code,
            "backend": self.backend,
            "message": self.message,
            "hint": self.hint,
        }


@dataclass(frozen=True)
class CheckpointFacts:
    """What a model's ``config.json`` says, when the caller could read it (local checkpoints)."""

    torch_dtype: str | None = None  # "bfloat16", "float16", ...
    quant_method: str | None = None  # quantization_config.quant_method: "fp8", "awq", ...


def checkpoint_facts_from_config(config: Mapping[str, Any]) -> CheckpointFacts:
    """Read the fields the rules need from a Hugging Face ``config.json`` already parsed.

    Args:
        config: the parsed JSON object.

    Returns:
        The checkpoint's dtype and quantization method, each ``None`` when absent.
    """
    dtype = config.get("torch_dtype", config.get("dtype"))
    qc = config.get("quantization_config")
    quant = qc.get("quant_method") if isinstance(qc, Mapping) else None
    return CheckpointFacts(
        torch_dtype=str(dtype).lower() if isinstance(dtype, str) else None,
        quant_method=str(quant).lower() if isinstance(quant, str) else None,
    )


@dataclass(frozen=True)
class Launch:
    """One backend's launch as a kind's rules see it.

    Attributes:
        name: the backend's name from the config.
        args: its command line with the unit's ``${VAR}`` expanded.
        env: the unit's ``Environment=``.
        facts: the host's GPU facts (``facts.error`` set: they could not be read).
        gpus: the GPUs the backend runs on (:func:`gpushift.doctor.gpus.backend_gpus`).
        configured_gpus: the config's ``gpus`` list of the backend (None: it names none).
        checkpoint: the model's ``config.json`` facts, if the caller could read them.
    """

    name: str
    args: Sequence[str]
    env: Mapping[str, str]
    facts: HostGpuFacts
    gpus: tuple[GpuInfo, ...]
    configured_gpus: tuple[int, ...] | None = None
    checkpoint: CheckpointFacts | None = None

    @property
    def gpu_count(self) -> int:
        """How many GPUs the backend is given: the config's ``gpus`` (even those the host lacks),
        else those ``CUDA_VISIBLE_DEVICES`` names, else every GPU of the host."""
        if self.configured_gpus is not None:
            return len(self.configured_gpus)
        visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return len([s for s in visible.split(",") if s.strip()])
        return len(self.facts.gpus)


def no_stop_rules(name: str, args: Sequence[str], timeout_stop_usec: int) -> list[Finding]:
    """For a kind whose server has no drain time of its own to compare ``TimeoutStopSec=`` with."""
    return []


@dataclass(frozen=True)
class KindRules:
    """What the doctor knows about one backend kind.

    Attributes:
        default_port: the port the server listens on when its command line has no ``--port``.
        launch: the kind's own rules on a launch (its flags against the GPUs), in rule order.
        model_paths: the filesystem paths on a command line (expanded) that must exist.
        stop: the kind's rules on a finite, non-zero ``TimeoutStopSec=`` (in microseconds).
    """

    default_port: int
    launch: Callable[[Launch], list[Finding]]
    model_paths: Callable[[Sequence[str]], list[str]]
    stop: Callable[[str, Sequence[str], int], list[Finding]] = no_stop_rules


def cc_text(cc: tuple[int, int]) -> str:
    """A compute capability as people write it: ``7.0``."""
    return f"{cc[0]}.{cc[1]}"


def oldest(gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """The GPU with the lowest known compute capability (what a multi-GPU launch is limited by)."""
    known = [g for g in gpus if g.compute_capability is not None]
    return min(known, key=lambda g: g.compute_capability or (0, 0)) if known else None


def names(gpus: Sequence[GpuInfo]) -> str:
    """``GPU 0 (Tesla V100-PCIE-16GB), GPU 1 (...)``."""
    return ", ".join(f"GPU {g.index} ({g.name})" for g in gpus)
