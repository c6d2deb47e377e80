"""L2: the preflight doctor: launches that cannot work (or work badly) on this GPU host.

Pure rules, no I/O.  The caller gathers the facts -- the unit's command line and ``Environment=``
from systemd, the GPU facts from the GPU provider, who listens on which port, whether a path
exists, the backend's version, the ECC counts of the last launch -- and :func:`check_backend` /
:func:`check_all` turn them into :class:`Finding` values.  An ``error`` means "refuse to switch";
a ``warning`` means "switch, but log it and record it in the ledger".

The rules come from field reports of a 2xV100 host (see ``shared/seeds``): vLLM refusing FP8 on
sm_70 ("FP8 is not supported on this GPU (sm_70). Please use a GPU with compute capability 8.9"),
BF16 emulated on Volta, ``--split-mode none`` leaving the second GPU idle, ECC errors garbling
output, vLLM pinned on old cards because newer releases regressed there.

``Finding.code`` values are part of ``gpushift check --json``: keep them stable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import cmdline
from .config import BackendConfig
from .model import GpuInfo, Holder, HostGpuFacts, UnitState

ERROR = "error"
WARNING = "warning"

#: systemd's USEC_INFINITY: ``TimeoutStopSec=infinity`` (and ``=0``) read back over D-Bus.
USEC_INFINITY = 2**64 - 1

#: The port each kind listens on when its command line names none.
DEFAULT_PORTS = {"vllm": 8000, "llama-server": 8080}

#: FP8 GEMM kernels need Ada (sm_89) or Hopper (sm_90) and newer.
FP8_MIN_CC = (8, 9)
#: Native BF16 arrived with Ampere (sm_80); below it BF16 is emulated.
BF16_MIN_CC = (8, 0)

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
    """Everything :func:`check_all` needs about one backend."""

    backend: BackendConfig
    unit: UnitState | None
    argv: Sequence[str] | None = None  # None: the unit's ExecStart
    env: Mapping[str, str] | None = None  # None: the unit's Environment=
    version: str | None = None
    checkpoint: CheckpointFacts | None = None


# ----------------------------------------------------------------------------------------------
# Command lines


_VLLM_TOKENIZER = ("--tokenizer",)
_VLLM_QUANT = ("--quantization", "-q")
_VLLM_DTYPE = ("--dtype",)
_VLLM_TP = ("--tensor-parallel-size", "-tp")
_VLLM_PP = ("--pipeline-parallel-size", "-pp")
_VLLM_SHUTDOWN = ("--shutdown-timeout",)
_LLAMA_SPLIT = ("-sm", "--split-mode")
_PORT = ("--port",)


def _looks_like_path(value: str) -> bool:
    # vLLM also takes Hugging Face ids ("Qwen/Qwen2.5-7B-Instruct"): only names that are plainly
    # filesystem paths are checked.
    return value.startswith(("/", "./", "../", "~"))


def _in_container(argv: Sequence[str]) -> bool:
    # `docker run -v /models:/models image --model /models/x`: the paths are the container's.
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in ("docker", "podman", "nerdctl")


def backend_port(backend: BackendConfig, argv: Sequence[str]) -> int | None:
    """The TCP port a backend will listen on.

    For ``vllm`` and ``llama-server``: ``--port`` on the command line, else the kind's default
    (8000, 8080).  For ``generic`` (and when ``--port`` is not a number): the port of the health URL.
    """
    if backend.kind in DEFAULT_PORTS:
        given = cmdline.parse(argv, backend.kind).value(_PORT)
        if given is None:
            return DEFAULT_PORTS[backend.kind]
        if given.isdigit():
            return int(given)
    return _url_port(backend.health_url)


def _url_port(url: str) -> int | None:
    try:
        parts = urlsplit(url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def _url_is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


# ----------------------------------------------------------------------------------------------
# GPUs


def backend_gpus(backend: BackendConfig, env: Mapping[str, str], facts: HostGpuFacts) -> tuple[GpuInfo, ...]:
    """The GPUs a backend runs on: its configured ``gpus``, else those ``CUDA_VISIBLE_DEVICES``
    names (by index or UUID), else every GPU of the host.  Indices the host lacks are left out."""
    by_index = {g.index: g for g in facts.gpus}
    if backend.gpus is not None:
        return tuple(by_index[i] for i in backend.gpus if i in by_index)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen: list[GpuInfo] = []
        for item in (s.strip() for s in visible.split(",")):
            if item.isdigit() and int(item) in by_index:
                chosen.append(by_index[int(item)])
            else:
                chosen.extend(g for g in facts.gpus if item and g.uuid.startswith(item))
        return tuple(chosen)
    return facts.gpus


def _gpu_count(backend: BackendConfig, env: Mapping[str, str], facts: HostGpuFacts) -> int:
    if backend.gpus is not None:
        return len(backend.gpus)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([s for s in visible.split(",") if s.strip()])
    return len(facts.gpus)


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _oldest(gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    known = [g for g in gpus if g.compute_capability is not None]
    return min(known, key=lambda g: g.compute_capability or (0, 0)) if known else None


def _names(gpus: Sequence[GpuInfo]) -> str:
    return ", ".join(f"GPU {g.index} ({g.name})" for g in gpus)


def version_matches(pinned: str, actual: str) -> bool:
    """Whether a reported version is the pinned one.

    Equal after trimming a leading ``v``; or the same release with a local build label
    (``0.32.0+cpu`` matches ``0.32.0``); or llama-server's ``N (commit)`` whose ``N`` (or
    ``bN``) is the pin.  ``0.6.3.post1`` does NOT match ``0.6.3``: a post release is another build.
    """

    def norm(v: str) -> str:
        v = v.strip()
        if v.lower().startswith("version:"):
            v = v[len("version:") :].strip()
        return v[1:] if v[:1] in ("v", "V") and v[1:2].isdigit() else v

    p, a = norm(pinned), norm(actual)
    if p == a:
        return True
    head = re.split(r"[\s(+]", a, maxsplit=1)[0]
    return head == p or head.lstrip("bB") == p.lstrip("bB")


# ----------------------------------------------------------------------------------------------
# The rules


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
) -> list[Finding]:
    """Every finding about launching one backend on this host.

    Rules whose facts were not given are not evaluated (e.g. no ``path_exists``: no path check).

    Args:
        backend: the backend's config (its ``kind`` selects the vLLM/llama-server rules).
        argv: its command as written in the unit (``${VAR}`` may be unexpanded) or as run.
        env: the unit's ``Environment=`` (see :func:`gpushift.cmdline.environment`).
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

    Returns:
        The findings, in rule order (not sorted by severity).
    """
    name = backend.name
    out: list[Finding] = []

    def add(severity: str, code: str, message: str, hint: str = "") -> None:
        out.append(Finding(severity, code, name, message, hint))

    missing = cmdline.undefined_variables(argv, env)
    if missing:
        add(
            WARNING,
            ENV_UNDEFINED,
            f"the command uses {', '.join('$' + v for v in missing)}, which the unit's Environment= does "
            "not set: systemd makes an unset variable empty (unless an EnvironmentFile= sets it)",
            "set it with Environment= in the unit or a drop-in",
        )
    args = cmdline.expand(argv, env)

    gpus = backend_gpus(backend, env, facts)
    if facts.error is not None:
        add(
            WARNING,
            GPU_FACTS_UNAVAILABLE,
            f"the GPU facts could not be read ({facts.error}): the FP8, BF16, tensor-parallel and ECC "
            "checks were not made",
            "check the NVIDIA driver with nvidia-smi",
        )

    if backend.kind == "vllm":
        out.extend(_vllm_rules(name, args, backend, env, facts, gpus, checkpoint))
    elif backend.kind == "llama-server":
        out.extend(_llama_rules(name, args, backend, env, facts))

    if path_exists is not None and backend.kind in DEFAULT_PORTS and not _in_container(args):
        wd = unit.working_directory if unit else ""
        for path in _model_paths(backend.kind, args):
            full = path if path.startswith("/") or not wd else f"{wd.rstrip('/')}/{path}"
            if not path_exists(full):
                add(
                    ERROR,
                    MODEL_PATH_MISSING,
                    f"{path!r} on the command line does not exist"
                    + (f" (resolved against WorkingDirectory={wd})" if full != path else ""),
                    "fix the path in the unit's ExecStart= (or the Environment= variable that holds it)",
                )

    out.extend(_ecc_rules(name, gpus, previous_ecc_corrected, accepted_ecc_uncorrected))

    if (
        backend.pinned_version is not None
        and version is not None
        and not version_matches(backend.pinned_version, version)
    ):
        add(
            WARNING,
            VERSION_NOT_PINNED,
            f"version {version} runs where the config pins {backend.pinned_version}",
            f"reinstall {backend.pinned_version}, or update pinned_version once {version} is validated "
            "on this GPU (newer releases have regressed on old GPUs)",
        )

    out.extend(_port_rules(name, backend, args, other_ports, other_units, listeners))
    if unit is not None:
        out.extend(_unit_rules(name, backend, args, unit, other_units))
    return out


def _model_paths(kind: str, args: Sequence[str]) -> list[str]:
    if kind == "vllm":
        candidates = [cmdline.vllm_model(args), cmdline.parse(args, kind).value(_VLLM_TOKENIZER)]
        return [c for c in candidates if c and _looks_like_path(c)]
    return [v for v in cmdline.parse(args, kind).values(cmdline.MODEL_FILE_FLAGS) if v]


def _is_fp8_name(model: str) -> bool:
    # Checkpoints name their format: "DeepSeek-R1-Distill-Qwen-7B-FP8", "Llama-3.1-8B-Instruct-FP8-dynamic".
    return re.search(r"(^|[^a-z0-9])fp8([^a-z0-9]|$)", model.lower()) is not None


def _vllm_rules(
    name: str,
    args: Sequence[str],
    backend: BackendConfig,
    env: Mapping[str, str],
    facts: HostGpuFacts,
    gpus: Sequence[GpuInfo],
    checkpoint: CheckpointFacts | None,
) -> list[Finding]:
    out: list[Finding] = []
    oldest = _oldest(gpus) if facts.error is None else None
    quant = (cmdline.parse(args, "vllm").value(_VLLM_QUANT) or "").lower()
    model = cmdline.vllm_model(args) or ""

    if (
        oldest is not None
        and oldest.compute_capability is not None
        and oldest.compute_capability < FP8_MIN_CC
    ):
        cc = _cc(oldest.compute_capability)
        why = None
        if "fp8" in quant:
            why = f"--quantization {quant}"
        elif (
            not quant
            and checkpoint is not None
            and checkpoint.quant_method
            and "fp8" in checkpoint.quant_method
        ):
            why = f"the checkpoint {model or '(model)'} is quantized with {checkpoint.quant_method}"
        elif not quant and model and _is_fp8_name(model):
            why = f"the checkpoint {model} is an FP8 checkpoint (by its name)"
        if why:
            out.append(
                Finding(
                    ERROR,
                    FP8_UNSUPPORTED,
                    name,
                    f"{why}: {oldest.name} (GPU {oldest.index}, sm_{oldest.compute_capability[0]}"
                    f"{oldest.compute_capability[1]}, compute capability {cc}) has no FP8 support; FP8 needs "
                    f'compute capability {_cc(FP8_MIN_CC)} (Ada, Hopper). vLLM stops with "FP8 is not '
                    f'supported on this GPU" or silently dequantizes to FP16 with no gain',
                    "serve FP16 weights (an FP16 checkpoint, --dtype float16) and save memory with "
                    "--kv-cache-dtype fp8_e5m2, which needs no FP8 hardware",
                )
            )

    dtype = (cmdline.parse(args, "vllm").value(_VLLM_DTYPE) or "auto").lower()
    if (
        oldest is not None
        and oldest.compute_capability is not None
        and oldest.compute_capability < BF16_MIN_CC
    ):
        bf16 = None
        if dtype in ("bfloat16", "bf16"):
            bf16 = f"--dtype {dtype}"
        elif dtype == "auto" and checkpoint is not None and checkpoint.torch_dtype == "bfloat16":
            bf16 = "--dtype auto with a BF16 checkpoint"
        if bf16:
            out.append(
                Finding(
                    WARNING,
                    BF16_EMULATED,
                    name,
                    f"{bf16} on {oldest.name} (GPU {oldest.index}, compute capability "
                    f"{_cc(oldest.compute_capability)}): BF16 has no native support below compute capability "
                    f"{_cc(BF16_MIN_CC)}; it is emulated and slow, and some vLLM releases refuse it",
                    "use --dtype float16",
                )
            )

    tp_s = cmdline.parse(args, "vllm").value(_VLLM_TP)
    pp_s = cmdline.parse(args, "vllm").value(_VLLM_PP)
    if facts.error is None and (tp_s or pp_s):
        tp = int(tp_s) if tp_s and tp_s.isdigit() else 1
        pp = int(pp_s) if pp_s and pp_s.isdigit() else 1
        have = _gpu_count(backend, env, facts)
        if tp * pp > have:
            asked = f"--tensor-parallel-size {tp}" + (f" x --pipeline-parallel-size {pp}" if pp > 1 else "")
            out.append(
                Finding(
                    ERROR,
                    TENSOR_PARALLEL_TOO_LARGE,
                    name,
                    f"{asked} needs {tp * pp} GPUs, but the backend has {have}"
                    + (f" ({_names(gpus)})" if gpus else ""),
                    f"lower --tensor-parallel-size to at most {have}, or give the backend more GPUs "
                    "(gpus = [...] in the config, CUDA_VISIBLE_DEVICES in the unit)",
                )
            )
    return out


def _llama_rules(
    name: str, args: Sequence[str], backend: BackendConfig, env: Mapping[str, str], facts: HostGpuFacts
) -> list[Finding]:
    out: list[Finding] = []
    split = (cmdline.parse(args, "llama-server").value(_LLAMA_SPLIT) or "").lower()
    have = _gpu_count(backend, env, facts)
    if split == "none" and facts.error is None and have > 1:
        out.append(
            Finding(
                WARNING,
                SPLIT_MODE_NONE,
                name,
                f"--split-mode none on {have} GPUs: llama-server uses only the main GPU and the others stay idle",
                "use --split-mode layer (the default) to spread the layers over every GPU, or give the "
                "backend only one GPU",
            )
        )
    return out


def _ecc_rules(
    name: str,
    gpus: Sequence[GpuInfo],
    previous_corrected: Mapping[str, int] | None,
    accepted_uncorrected: Mapping[str, int] | None,
) -> list[Finding]:
    out: list[Finding] = []
    for g in gpus:
        accepted = (accepted_uncorrected or {}).get(g.uuid, 0)
        if g.ecc_uncorrected is not None and g.ecc_uncorrected > accepted:
            out.append(
                Finding(
                    ERROR,
                    ECC_UNCORRECTABLE,
                    name,
                    f"GPU {g.index} ({g.name}, {g.uuid}) reports {g.ecc_uncorrected} uncorrectable ECC "
                    "error(s): its memory may be failing, and results can be silently wrong or the "
                    "backend may crash",
                    "inspect it with `nvidia-smi -q -d ECC` and a memory stress test; if the count no longer "
                    "grows, accept it explicitly; otherwise have the GPU replaced",
                )
            )
        prev = (previous_corrected or {}).get(g.uuid)
        if prev is not None and g.ecc_corrected is not None and g.ecc_corrected > prev:
            out.append(
                Finding(
                    WARNING,
                    ECC_CORRECTABLE_GROWING,
                    name,
                    f"GPU {g.index} ({g.name}) corrected ECC errors grew from {prev} to {g.ecc_corrected} "
                    "since the last launch",
                    "watch the trend with `nvidia-smi -q -d ECC`; a steadily growing count precedes "
                    "uncorrectable errors",
                )
            )
    return out


def _port_rules(
    name: str,
    backend: BackendConfig,
    args: Sequence[str],
    other_ports: Mapping[str, int] | None,
    other_units: Collection[str],
    listeners: Mapping[int, Holder] | None,
) -> list[Finding]:
    out: list[Finding] = []
    port = backend_port(backend, args)
    if port is None:
        return out
    for other, other_port in sorted((other_ports or {}).items()):
        if other != name and other_port == port:
            out.append(
                Finding(
                    ERROR,
                    PORT_DUPLICATE,
                    name,
                    f"port {port} is also the port of backend {other!r}: a health check could be answered "
                    "by the wrong server",
                    "give each backend its own --port (and health_url)",
                )
            )
    holder = (listeners or {}).get(port)
    if holder is not None and holder.unit != backend.unit and holder.unit not in other_units:
        out.append(
            Finding(
                ERROR,
                PORT_TAKEN,
                name,
                f"port {port} is already taken by {holder.describe()}, which is not a gpushift backend",
                "stop that process or move the backend to another port",
            )
        )
    if backend.kind in DEFAULT_PORTS and _url_is_local(backend.health_url):
        hport = _url_port(backend.health_url)
        if hport is not None and hport != port:
            out.append(
                Finding(
                    WARNING,
                    HEALTH_URL_PORT,
                    name,
                    f"health_url {backend.health_url} asks port {hport}, but the server listens on {port}",
                    "make health_url's port match --port",
                )
            )
    return out


def _unit_rules(
    name: str, backend: BackendConfig, args: Sequence[str], unit: UnitState, other_units: Collection[str]
) -> list[Finding]:
    out: list[Finding] = []

    def add(severity: str, code: str, message: str, hint: str) -> None:
        out.append(Finding(severity, code, name, message, hint))

    if unit.load_state not in ("loaded", ""):
        add(
            ERROR,
            UNIT_NOT_LOADED,
            f"unit {unit.name} is {unit.load_state}",
            "install the unit file and run `systemctl daemon-reload`",
        )
        return out
    if unit.kill_mode and unit.kill_mode != "control-group":
        add(
            WARNING,
            UNIT_KILL_MODE,
            f"KillMode={unit.kill_mode}: stopping the unit may leave the backend's children running, and "
            "vLLM workers that outlive the API server keep their VRAM",
            "set KillMode=control-group",
        )
    if not unit.send_sigkill:
        add(
            WARNING,
            UNIT_NO_SIGKILL,
            "SendSIGKILL=no: a backend that ignores SIGTERM (llama-server while loading, a wedged one) is "
            "never killed, and the switch waits for VRAM that never comes back",
            "set SendSIGKILL=yes",
        )
    if unit.timeout_stop_usec >= USEC_INFINITY:
        add(
            WARNING,
            UNIT_TIMEOUT_STOP_INFINITE,
            "TimeoutStopSec is infinite: a backend that ignores SIGTERM blocks the switch forever",
            "set a finite TimeoutStopSec= (longer than any --shutdown-timeout)",
        )
    elif backend.kind == "vllm" and unit.timeout_stop_usec > 0:
        drain = cmdline.parse(args, "vllm").value(_VLLM_SHUTDOWN)
        if drain and drain.isdigit() and unit.timeout_stop_usec <= int(drain) * 1_000_000:
            add(
                WARNING,
                UNIT_TIMEOUT_STOP_SHORT,
                f"TimeoutStopSec ({unit.timeout_stop_usec / 1e6:g} s) does not exceed --shutdown-timeout "
                f"{drain}: systemd kills vLLM before it has drained",
                f"set TimeoutStopSec= above {drain} s",
            )
    missing = [u for u in other_units if u not in unit.conflicts]
    if not unit.conflicts or missing:
        which = ", ".join(sorted(missing)) if missing else "the other backends' units"
        add(
            WARNING,
            UNIT_NO_CONFLICTS,
            f"the unit has no Conflicts= with {which}: `systemctl start` by hand could run two backends "
            "at once on the same GPUs",
            f"add Conflicts={' '.join(sorted(missing)) or '<other backend units>'} (and After= on one side)",
        )
    return out


def check_all(
    inputs: Sequence[BackendInput],
    facts: HostGpuFacts,
    *,
    path_exists: Callable[[str], bool] | None = None,
    previous_ecc_corrected: Mapping[str, int] | None = None,
    accepted_ecc_uncorrected: Mapping[str, int] | None = None,
    listeners: Mapping[int, Holder] | None = None,
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

    Returns:
        The findings of every backend, backend by backend in the order given.
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
            )
        )
    return out


def has_errors(findings: Sequence[Finding]) -> bool:
    """Whether any finding refuses the launch."""
    return any(f.is_error for f in findings)
