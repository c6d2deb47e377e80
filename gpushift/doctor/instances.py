"""The rules for a backend of several instances (issue 23), pure: no two instances of one backend
on one GPU (each llama-server would take its share of VRAM that the other counts on) or on one
port (a health check would be answered by the wrong instance), and every instance's unit loaded
(a template instance ``gpushift-llama@1.service`` is loaded only when the template is installed),
and each instance's server listening on its health URL's port (the template takes ``${PORT}``
from the instance's environment file, so the variables given for it count).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushift.backends import cmdline
from gpushift.backends.rules import (
    ERROR,
    HEALTH_URL_PORT,
    INSTANCE_GPU_SHARED,
    INSTANCE_PORT_DUPLICATE,
    UNIT_NOT_LOADED,
    WARNING,
    Finding,
)
from gpushift.config.instances import port_of, view
from gpushift.config.types import BackendConfig, InstanceConfig
from gpushift.doctor.common import backend_port, url_is_local
from gpushift.doctor.kinds import KINDS
from gpushift.values import UnitState


def instance_findings(
    b: BackendConfig,
    units: Mapping[str, UnitState | None] | None,
    envs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Finding]:
    """The findings about ``b``'s instances (none for a backend of one unit).

    Args:
        b: the backend.
        units: each instance's unit as systemd reports it, by unit name (None or a missing entry:
            not known, nothing said about it).
        envs: the variables each instance's command sees (``Environment=`` and its
            ``EnvironmentFile=``s), by unit name (a missing entry: its ``Environment=`` alone).
    """
    out: list[Finding] = []
    gpus: dict[int, str] = {}
    ports: dict[tuple[str, int], str] = {}
    for i in b.instances:
        if i.gpus is None and len(b.instances) > 1:
            out.append(
                Finding(
                    ERROR,
                    INSTANCE_GPU_SHARED,
                    b.name,
                    f"instance {i.unit} names no gpus, so it would use every GPU, those of the other "
                    "instances too",
                    "give each instance its own gpus = [N]",
                )
            )
        for g in i.gpus or ():
            if g in gpus:
                out.append(
                    Finding(
                        ERROR,
                        INSTANCE_GPU_SHARED,
                        b.name,
                        f"GPU {g} is given to two instances, {gpus[g]} and {i.unit}: each would count on "
                        "VRAM the other holds",
                        "give each instance GPUs of its own",
                    )
                )
            gpus.setdefault(g, i.unit)
        port = port_of(i.health_url)
        host = i.health_url.partition("://")[2].split("/", 1)[0].rsplit(":", 1)[0]
        if port is not None:
            if (host, port) in ports:
                out.append(
                    Finding(
                        ERROR,
                        INSTANCE_PORT_DUPLICATE,
                        b.name,
                        f"instances {ports[(host, port)]} and {i.unit} have the same health URL port {port}: "
                        "one would answer for the other",
                        "give each instance its own port (PORT= in its environment file) and health_url",
                    )
                )
            ports.setdefault((host, port), i.unit)
        st = (units or {}).get(i.unit)
        if st is not None:
            env = (envs or {}).get(i.unit)
            out.extend(_port(b, i, st, cmdline.environment(st.environment) if env is None else env))
        if st is not None and st.load_state != "loaded":
            out.append(
                Finding(
                    ERROR,
                    UNIT_NOT_LOADED,
                    b.name,
                    f"unit {i.unit} (an instance of {b.name}) is {st.load_state}",
                    "install the (template) unit file and run `systemctl daemon-reload`",
                )
            )
    return out


def _port(b: BackendConfig, i: InstanceConfig, st: UnitState, env: Mapping[str, str]) -> list[Finding]:
    """The instance's server (its unit's command, variables expanded) listening on another port
    than its health URL's (a variable that nothing defines leaves it unknown: no finding)."""
    if b.kind not in KINDS or not url_is_local(i.health_url) or not st.exec_start:
        return []
    if cmdline.undefined_variables(st.exec_start, env):
        return []
    port, asked = backend_port(view(b, i), cmdline.expand(st.exec_start, env)), port_of(i.health_url)
    if port is None or asked is None or port == asked:
        return []
    return [
        Finding(
            WARNING,
            HEALTH_URL_PORT,
            b.name,
            f"instance {i.unit}: health_url {i.health_url} asks port {asked}, but the server listens on {port}",
            "make the instance's health_url port match its --port (PORT= in its environment file)",
        )
    ]
