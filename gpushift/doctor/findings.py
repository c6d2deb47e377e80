"""The doctor's vocabulary: severities, the stable finding codes, :class:`Finding`, and the facts
the rules read (:class:`BackendInput`, :class:`CheckpointFacts`, :class:`Launch`).

``Finding.code`` values are part of ``gpushift check --json``: keep them stable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.config.schema import BackendConfig
from gpushift.values import GpuInfo, HostGpuFacts, UnitState

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
class BackendInput:
    """Everything :func:`gpushift.doctor.check_all` needs about one backend."""

    backend: BackendConfig
    unit: UnitState | None
    argv: Sequence[str] | None = None  # None: the unit's ExecStart
    env: Mapping[str, str] | None = None  # None: the unit's Environment=
    version: str | None = None
    checkpoint: CheckpointFacts | None = None


@dataclass(frozen=True)
class Launch:
    """One backend's launch as a kind's rules see it.

    Attributes:
        backend: the backend's config.
        args: its command line with the unit's ``${VAR}`` expanded.
        env: the unit's ``Environment=``.
        facts: the host's GPU facts (``facts.error`` set: they could not be read).
        gpus: the GPUs the backend runs on (:func:`gpushift.doctor.gpus.backend_gpus`).
        checkpoint: the model's ``config.json`` facts, if the caller could read them.
    """

    backend: BackendConfig
    args: Sequence[str]
    env: Mapping[str, str]
    facts: HostGpuFacts
    gpus: tuple[GpuInfo, ...]
    checkpoint: CheckpointFacts | None = None

    @property
    def name(self) -> str:
        return self.backend.name
