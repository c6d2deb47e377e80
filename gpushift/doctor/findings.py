"""The doctor's vocabulary: severities, the stable finding codes, :class:`Finding`, and the facts
the rules read (:class:`BackendInput`, :class:`CheckpointFacts`, :class:`Launch`).

All but :class:`BackendInput` live in :mod:`gpushift.backends.rules`, below the config, where a
kind's module states its rules in them; they are named here too, the doctor's one vocabulary.
``Finding.code`` values are part of ``gpushift check --json``: keep them stable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpushift.backends.rules import (
    BF16_EMULATED as BF16_EMULATED,
)
from gpushift.backends.rules import (
    ECC_CORRECTABLE_GROWING as ECC_CORRECTABLE_GROWING,
)
from gpushift.backends.rules import (
    ECC_UNCORRECTABLE as ECC_UNCORRECTABLE,
)
from gpushift.backends.rules import (
    ENV_UNDEFINED as ENV_UNDEFINED,
)
from gpushift.backends.rules import (
    ERROR as ERROR,
)
from gpushift.backends.rules import (
    FP8_UNSUPPORTED as FP8_UNSUPPORTED,
)
from gpushift.backends.rules import (
    GPU_FACTS_UNAVAILABLE as GPU_FACTS_UNAVAILABLE,
)
from gpushift.backends.rules import (
    GPU_IDENTITY_CHANGED as GPU_IDENTITY_CHANGED,
)
from gpushift.backends.rules import (
    GPU_ORDER_AMBIGUOUS as GPU_ORDER_AMBIGUOUS,
)
from gpushift.backends.rules import (
    GPUS_MISMATCH as GPUS_MISMATCH,
)
from gpushift.backends.rules import (
    HEALTH_URL_PORT as HEALTH_URL_PORT,
)
from gpushift.backends.rules import (
    MODEL_PATH_MISSING as MODEL_PATH_MISSING,
)
from gpushift.backends.rules import (
    PORT_DUPLICATE as PORT_DUPLICATE,
)
from gpushift.backends.rules import (
    PORT_TAKEN as PORT_TAKEN,
)
from gpushift.backends.rules import (
    SPLIT_MODE_NONE as SPLIT_MODE_NONE,
)
from gpushift.backends.rules import (
    TENSOR_PARALLEL_TOO_LARGE as TENSOR_PARALLEL_TOO_LARGE,
)
from gpushift.backends.rules import (
    UNIT_KILL_MODE as UNIT_KILL_MODE,
)
from gpushift.backends.rules import (
    UNIT_NO_CONFLICTS as UNIT_NO_CONFLICTS,
)
from gpushift.backends.rules import (
    UNIT_NO_SIGKILL as UNIT_NO_SIGKILL,
)
from gpushift.backends.rules import (
    UNIT_NOT_LOADED as UNIT_NOT_LOADED,
)
from gpushift.backends.rules import (
    UNIT_TIMEOUT_STOP_INFINITE as UNIT_TIMEOUT_STOP_INFINITE,
)
from gpushift.backends.rules import (
    UNIT_TIMEOUT_STOP_SHORT as UNIT_TIMEOUT_STOP_SHORT,
)
from gpushift.backends.rules import (
    VERSION_NOT_PINNED as VERSION_NOT_PINNED,
)
from gpushift.backends.rules import (
    WARNING as WARNING,
)
from gpushift.backends.rules import (
    CheckpointFacts as CheckpointFacts,
)
from gpushift.backends.rules import (
    Finding as Finding,
)
from gpushift.backends.rules import (
    Launch as Launch,
)
from gpushift.backends.rules import (
    checkpoint_facts_from_config as checkpoint_facts_from_config,
)
from gpushift.config.schema import BackendConfig
from gpushift.values import UnitState


@dataclass(frozen=True)
class BackendInput:
    """Everything :func:`gpushift.doctor.check_all` needs about one backend."""

    backend: BackendConfig
    unit: UnitState | None
    argv: Sequence[str] | None = None  # None: the unit's ExecStart
    env: Mapping[str, str] | None = None  # None: the unit's Environment=
    env_unread: tuple[str, ...] = ()  # its EnvironmentFile=s that could not be read, one line each
    version: str | None = None
    checkpoint: CheckpointFacts | None = None
    # A backend of several instances: each instance's unit as systemd reports it, by unit name
    # (None: not asked or unreadable), read by gpushift/doctor/instances.py.
    instance_units: Mapping[str, UnitState | None] | None = None
    # ... and the variables each instance's command sees (Environment=, EnvironmentFile=), by unit
    instance_env: Mapping[str, Mapping[str, str]] | None = None


# The front door's codes (``gpushift check``'s front door section, gpushift/doctor/frontdoor.py).
FRONTDOOR_PORT_CLASH = "frontdoor-port-clash"
FRONTDOOR_BACKEND_EXPOSED = "frontdoor-backend-exposed"
FRONTDOOR_MODELS_UNKNOWN = "frontdoor-models-unknown"
FRONTDOOR_MODELS_UNREADABLE = "frontdoor-models-unreadable"
FRONTDOOR_MODEL_MISMATCH = "frontdoor-model-mismatch"
FRONTDOOR_SOCKET_LISTEN = "frontdoor-socket-listen"
