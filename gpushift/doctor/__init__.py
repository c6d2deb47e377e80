"""The preflight doctor: launches that cannot work (or work badly) on this GPU host.

Pure rules, no I/O.  The caller gathers the facts -- the unit's command line and ``Environment=``
from systemd, the GPU facts from the GPU provider, who listens on which port, whether a path
exists, the backend's version, the ECC counts of the last launch -- and :func:`check_backend` /
:func:`check_all` turn them into :class:`Finding` values.  An ``error`` means "refuse to switch";
a ``warning`` means "switch, but log it and record it in the ledger".

The rules come from field reports of a 2xV100 host (see ``shared/seeds``): vLLM refusing FP8 on
sm_70, BF16 emulated on Volta, ``--split-mode none`` leaving the second GPU idle, ECC errors
garbling output, vLLM pinned on old cards because newer releases regressed there.

The package, one job a module:

* ``findings`` -- :class:`Finding`, the severities, the stable codes (``gpushift check --json``
  prints them: keep them stable), and the facts the rules read.
* ``common`` -- the rules for every backend: environment, GPU facts, model paths, ECC, pinned
  version, ports, the unit's stop settings.
* ``kinds`` -- the table ``KINDS`` that maps a config ``kind`` to its rules (default port, launch
  rules, model paths, stop rules), read from the one table of kinds
  (:data:`gpushift.backends.kinds.KINDS`).  A kind without rules (``generic``) gets only the
  common rules.
* ``gpus`` -- which GPUs a backend runs on.
* ``identity`` -- GPUs that changed since the last launch, and index selection that CUDA and NVML
  would read as different cards.

A kind's own rules live in its module, ``gpushift/backends/<kind>.py`` (``vllm.py``, ``llama.py``),
beside everything else gpushift knows about it: a ``launch_rules(launch)`` on a
:class:`Launch` (plain values: the expanded command line, the environment, the GPU facts, the GPUs
it is given), a ``model_paths(args)``, and ``stop_rules`` if its server drains for a time of its
own (see ``vllm.py``), gathered in the ``doctor`` field of its :class:`gpushift.backends.kind.Kind`.
They speak the vocabulary of :mod:`gpushift.backends.rules` (:class:`Finding`, the codes).
Command lines are read with :mod:`gpushift.backends.cmdline`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from gpushift.backends import cmdline
from gpushift.backends.vllm import BF16_MIN_CC, FP8_MIN_CC
from gpushift.config.schema import BackendConfig
from gpushift.doctor import common, identity
from gpushift.doctor.common import USEC_INFINITY, backend_port, version_matches
from gpushift.doctor.findings import (
    BF16_EMULATED,
    ECC_CORRECTABLE_GROWING,
    ECC_UNCORRECTABLE,
    ENV_UNDEFINED,
    ERROR,
    FP8_UNSUPPORTED,
    GPU_FACTS_UNAVAILABLE,
    GPU_IDENTITY_CHANGED,
    GPU_ORDER_AMBIGUOUS,
    GPUS_MISMATCH,
    HEALTH_URL_PORT,
    MODEL_PATH_MISSING,
    PORT_DUPLICATE,
    PORT_TAKEN,
    SPLIT_MODE_NONE,
    TENSOR_PARALLEL_TOO_LARGE,
    UNIT_KILL_MODE,
    UNIT_NO_CONFLICTS,
    UNIT_NO_SIGKILL,
    UNIT_NOT_LOADED,
    UNIT_TIMEOUT_STOP_INFINITE,
    UNIT_TIMEOUT_STOP_SHORT,
    VERSION_NOT_PINNED,
    WARNING,
    BackendInput,
    CheckpointFacts,
    Finding,
    Launch,
    checkpoint_facts_from_config,
)
from gpushift.doctor.gpus import backend_gpus
from gpushift.doctor.instances import instance_findings
from gpushift.doctor.kinds import KINDS, KindRules
from gpushift.values import Holder, HostGpuFacts, UnitState

__all__ = [
    "BF16_EMULATED",
    "BF16_MIN_CC",
    "ECC_CORRECTABLE_GROWING",
    "ECC_UNCORRECTABLE",
    "ENV_UNDEFINED",
    "ERROR",
    "FP8_MIN_CC",
    "FP8_UNSUPPORTED",
    "GPU_FACTS_UNAVAILABLE",
    "GPU_IDENTITY_CHANGED",
    "GPU_ORDER_AMBIGUOUS",
    "GPUS_MISMATCH",
    "HEALTH_URL_PORT",
    "KINDS",
    "MODEL_PATH_MISSING",
    "PORT_DUPLICATE",
    "PORT_TAKEN",
    "SPLIT_MODE_NONE",
    "TENSOR_PARALLEL_TOO_LARGE",
    "UNIT_KILL_MODE",
    "UNIT_NOT_LOADED",
    "UNIT_NO_CONFLICTS",
    "UNIT_NO_SIGKILL",
    "UNIT_TIMEOUT_STOP_INFINITE",
    "UNIT_TIMEOUT_STOP_SHORT",
    "USEC_INFINITY",
    "VERSION_NOT_PINNED",
    "WARNING",
    "BackendInput",
    "CheckpointFacts",
    "Finding",
    "KindRules",
    "Launch",
    "backend_gpus",
    "backend_port",
    "check_all",
    "check_backend",
    "checkpoint_facts_from_config",
    "has_errors",
    "version_matches",
]


def check_backend(
    backend: BackendConfig,
    argv: Sequence[str],
    env: Mapping[str, str],
    facts: HostGpuFacts,
    unit: UnitState | None,
    *,
    path_exists: Callable[[str], bool] | None = None,
    version: str | None = None,
    checkpoint: CheckpointFacts | None = None,
    previous_ecc_corrected: Mapping[str, int] | None = None,
    accepted_ecc_uncorrected: Mapping[str, int] | None = None,
    other_ports: Mapping[str, int] | None = None,
    other_units: Collection[str] = (),
    listeners: Mapping[int, Holder] | None = None,
    known_gpus: Mapping[int, str] | None = None,
    accepted_gpu_uuids: Collection[str] = (),
    env_unread: Sequence[str] = (),
) -> list[Finding]:
    """Every finding about launching one backend on this host.

    Rules whose facts were not given are not evaluated (e.g. no ``path_exists``: no path check).

    Args:
        backend: the backend's config (its ``kind`` selects its row of ``KINDS``).
        argv: its command as written in the unit (``${VAR}`` may be unexpanded) or as run.
        env: the unit's ``Environment=`` and its ``EnvironmentFile=``s' variables
            (:func:`gpushift.doctor.facts.unit_environment`).
        facts: the host's GPU facts from the GPU provider.
        unit: systemd's view of the unit, or ``None`` when it could not be read.
        path_exists: tells whether a filesystem path exists (relative paths are resolved against
            the unit's ``WorkingDirectory=`` first).
        version: the backend's version as reported (``/version``, ``--version``), if known.
        checkpoint: the model's ``config.json`` facts, if the caller could read them.
        previous_ecc_corrected: corrected ECC counts at the last launch, by GPU UUID.
        accepted_ecc_uncorrected: uncorrectable ECC counts a person has examined and accepted, by
            GPU UUID; only errors beyond them refuse the launch (NVML's aggregate count never
            goes down).
        other_ports: the other backends' ports, by backend name.
        other_units: the other backends' unit names.
        listeners: who listens on which TCP port right now.
        known_gpus: the GPUs (index -> UUID) as the last launch saw them.
        accepted_gpu_uuids: new UUIDs a person accepted after replacing a card.
        env_unread: the unit's environment files that could not be read, one line each.

    Returns:
        The findings, in rule order (not sorted by severity).
    """
    name = backend.name
    kind = KINDS.get(backend.kind)
    out = common.environment_rules(name, argv, env, env_unread)
    args = cmdline.expand(argv, env)
    gpus = backend_gpus(backend, env, facts)
    out.extend(common.gpu_facts_rules(name, facts))
    out.extend(identity.identity_rules(name, backend, env, facts, known_gpus, accepted_gpu_uuids))
    if kind is not None:
        out.extend(kind.launch(Launch(name, args, env, facts, gpus, backend.gpus, checkpoint)))
        if path_exists is not None and not common.in_container(args):
            out.extend(common.model_path_rules(name, kind.model_paths(args), unit, path_exists))
    out.extend(common.ecc_rules(name, gpus, previous_ecc_corrected, accepted_ecc_uncorrected))
    out.extend(common.version_rules(name, backend, version))
    out.extend(common.port_rules(name, backend, args, other_ports, other_units, listeners))
    if unit is not None:
        out.extend(common.unit_rules(name, backend, args, unit, other_units))
    return out


def check_all(
    inputs: Sequence[BackendInput],
    facts: HostGpuFacts,
    *,
    path_exists: Callable[[str], bool] | None = None,
    previous_ecc_corrected: Mapping[str, int] | None = None,
    accepted_ecc_uncorrected: Mapping[str, int] | None = None,
    listeners: Mapping[int, Holder] | None = None,
    known_gpus: Mapping[int, str] | None = None,
    accepted_gpu_uuids: Collection[str] = (),
    only: str | None = None,
) -> list[Finding]:
    """Check every backend, including the rules that compare backends (ports, Conflicts=).

    Each input's ``argv``/``env`` default to its unit's ``ExecStart`` argv and ``Environment=``.

    Args:
        inputs: one entry per configured backend.
        facts: the host's GPU facts.
        path_exists: see :func:`check_backend`.
        previous_ecc_corrected: see :func:`check_backend`.
        accepted_ecc_uncorrected: see :func:`check_backend`.
        listeners: see :func:`check_backend`.
        known_gpus: see :func:`check_backend`.
        accepted_gpu_uuids: see :func:`check_backend`.
        only: check this backend alone (a switch's preflight: only its target's findings count);
            the others are still compared with it.

    Returns:
        The findings of every backend (of ``only``), backend by backend in the order given.
    """
    resolved = []
    for item in inputs:
        env = (
            dict(item.env)
            if item.env is not None
            else cmdline.environment(item.unit.environment if item.unit else ())
        )
        raw = list(item.argv) if item.argv is not None else list(item.unit.exec_start if item.unit else ())
        resolved.append((item, env, raw, backend_port(item.backend, cmdline.expand(raw, env))))
    out: list[Finding] = []
    for item, env, raw, _port in resolved:
        if only is not None and item.backend.name != only:
            continue
        others = [r for r in resolved if r[0].backend.name != item.backend.name]
        out.extend(
            check_backend(
                item.backend,
                raw,
                env,
                facts,
                item.unit,
                path_exists=path_exists,
                version=item.version,
                checkpoint=item.checkpoint,
                previous_ecc_corrected=previous_ecc_corrected,
                accepted_ecc_uncorrected=accepted_ecc_uncorrected,
                other_ports={r[0].backend.name: r[3] for r in others if r[3] is not None},
                other_units=[r[0].backend.unit for r in others],
                listeners=listeners,
                known_gpus=known_gpus,
                accepted_gpu_uuids=accepted_gpu_uuids,
                env_unread=item.env_unread,
            )
        )
        out.extend(instance_findings(item.backend, item.instance_units, item.instance_env))
    return out


def has_errors(findings: Sequence[Finding]) -> bool:
    """Whether any finding refuses the launch."""
    return any(f.is_error for f in findings)
