"""The doctor's rules for every backend, whatever its kind: the unit's environment, the GPU
facts, model paths, ECC, the pinned version, ports, and the unit's stop settings.

ECC errors garble output; vLLM stays pinned on old cards because newer releases regressed there
(the field reports of a 2xV100 host).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from urllib.parse import urlsplit

from gpushift.backends import cmdline
from gpushift.config.schema import BackendConfig
from gpushift.doctor.findings import (
    ECC_CORRECTABLE_GROWING,
    ECC_UNCORRECTABLE,
    ENV_UNDEFINED,
    ERROR,
    GPU_FACTS_UNAVAILABLE,
    HEALTH_URL_PORT,
    MODEL_PATH_MISSING,
    PORT_DUPLICATE,
    PORT_TAKEN,
    UNIT_KILL_MODE,
    UNIT_NO_CONFLICTS,
    UNIT_NO_SIGKILL,
    UNIT_NOT_LOADED,
    UNIT_TIMEOUT_STOP_INFINITE,
    VERSION_NOT_PINNED,
    WARNING,
    Finding,
)
from gpushift.doctor.kinds import KINDS, no_stop_rules
from gpushift.values import GpuInfo, Holder, HostGpuFacts, UnitState

#: systemd's USEC_INFINITY: ``TimeoutStopSec=infinity`` (and ``=0``) read back over D-Bus.
USEC_INFINITY = 2**64 - 1

_PORT = ("--port",)


def environment_rules(
    name: str, argv: Sequence[str], env: Mapping[str, str], unread: Sequence[str] = ()
) -> list[Finding]:
    """Variables the command uses that neither the unit's ``Environment=`` nor its
    ``EnvironmentFile=``s set (``env`` holds both; ``unread``: the files that could not be read)."""
    missing = cmdline.undefined_variables(argv, env)
    if not missing:
        return []
    why = f" (not read: {'; '.join(unread)})" if unread else ""
    return [
        Finding(
            WARNING,
            ENV_UNDEFINED,
            name,
            f"the command uses {', '.join('$' + v for v in missing)}, which neither the unit's Environment= "
            f"nor its EnvironmentFile= sets{why}: systemd makes an unset variable empty",
            "set it with Environment= in the unit or a drop-in, or in its EnvironmentFile="
            + (" (and make that file readable)" if unread else ""),
        )
    ]


def gpu_facts_rules(name: str, facts: HostGpuFacts) -> list[Finding]:
    """GPU facts that could not be read leave the GPU rules unmade: say so."""
    if facts.error is None:
        return []
    return [
        Finding(
            WARNING,
            GPU_FACTS_UNAVAILABLE,
            name,
            f"the GPU facts could not be read ({facts.error}): the FP8, BF16, tensor-parallel and ECC "
            "checks were not made",
            "check the NVIDIA driver with nvidia-smi",
        )
    ]


def in_container(argv: Sequence[str]) -> bool:
    """Whether the command runs a container (``docker run -v /models:/models image --model /models/x``):
    then its paths are the container's, not the host's."""
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in ("docker", "podman", "nerdctl")


def model_path_rules(
    name: str, paths: Sequence[str], unit: UnitState | None, path_exists: Callable[[str], bool]
) -> list[Finding]:
    """Each path that does not exist (relative ones resolved against ``WorkingDirectory=``)."""
    out: list[Finding] = []
    wd = unit.working_directory if unit else ""
    for path in paths:
        full = path if path.startswith("/") or not wd else f"{wd.rstrip('/')}/{path}"
        if not path_exists(full):
            out.append(
                Finding(
                    ERROR,
                    MODEL_PATH_MISSING,
                    name,
                    f"{path!r} on the command line does not exist"
                    + (f" (resolved against WorkingDirectory={wd})" if full != path else ""),
                    "fix the path in the unit's ExecStart= (or the Environment= variable that holds it)",
                )
            )
    return out


def ecc_rules(
    name: str,
    gpus: Sequence[GpuInfo],
    previous_corrected: Mapping[str, int] | None,
    accepted_uncorrected: Mapping[str, int] | None,
) -> list[Finding]:
    """Uncorrectable ECC errors beyond the accepted ones; corrected ones grown since the last launch."""
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


def version_rules(name: str, backend: BackendConfig, version: str | None) -> list[Finding]:
    """A version other than the config's ``pinned_version``."""
    pinned = backend.pinned_version
    if pinned is None or version is None or version_matches(pinned, version):
        return []
    return [
        Finding(
            WARNING,
            VERSION_NOT_PINNED,
            name,
            f"version {version} runs where the config pins {pinned}",
            f"reinstall {pinned}, or update pinned_version once {version} is validated "
            "on this GPU (newer releases have regressed on old GPUs)",
        )
    ]


def backend_port(backend: BackendConfig, argv: Sequence[str]) -> int | None:
    """The TCP port a backend will listen on.

    For a kind in the table (``vllm``, ``llama-server``): ``--port`` on the command line, else the
    kind's default (8000, 8080).  For ``generic`` (and when ``--port`` is not a number): the port of
    the health URL.
    """
    kind = KINDS.get(backend.kind)
    if kind is not None:
        given = cmdline.parse(argv, backend.kind).value(_PORT)
        if given is None:
            return kind.default_port
        if given.isdigit():
            return int(given)
    return _url_port(backend.health_url)


def _url_port(url: str) -> int | None:
    try:
        parts = urlsplit(url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def url_is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


def port_rules(
    name: str,
    backend: BackendConfig,
    args: Sequence[str],
    other_ports: Mapping[str, int] | None,
    other_units: Collection[str],
    listeners: Mapping[int, Holder] | None,
) -> list[Finding]:
    """The port shared with another backend, taken by a stranger, or not the health URL's."""
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
    # Asked of the one port only: ``listeners or {}`` would take its truth value, i.e. its length,
    # which for the host's table means mapping every socket to its process (a scan of every
    # process's open files, tens of ms before each switch).
    holder = listeners.get(port) if listeners is not None else None
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
    if backend.kind in KINDS and url_is_local(backend.health_url) and not backend.instances:
        # (a backend of several instances: each instance's port, doctor/instances.py)
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


def unit_rules(
    name: str, backend: BackendConfig, args: Sequence[str], unit: UnitState, other_units: Collection[str]
) -> list[Finding]:
    """The unit must be loaded, and stopping it must kill the whole backend, in bounded time."""
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
    elif unit.timeout_stop_usec > 0:
        kind = KINDS.get(backend.kind)
        stop = kind.stop if kind is not None else no_stop_rules
        out.extend(stop(name, args, unit.timeout_stop_usec))
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
