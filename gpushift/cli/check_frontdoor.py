"""``gpushift check``'s front door section: the facts its rules (:mod:`gpushift.doctor.frontdoor`)
read — each backend's model names (as the daemon resolves them), what each running backend lists
at ``/v1/models`` (with its API key, as the warm-up sends it), and the ``Listen`` of
``gpushift-frontdoor.socket`` from systemd — and the report's ``frontdoor`` part."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushift.backends import cmdline, models, warmup
from gpushift.config.schema import Config
from gpushift.doctor import frontdoor as rules
from gpushift.errors import GpushiftError
from gpushift.values import UnitState

#: The look at a running backend's ``/v1/models`` (check must not hang on a stuck backend).
MODELS_TIMEOUT_S = 3.0


def collect(cfg: Config, units: Any, states: Mapping[str, UnitState | None]) -> dict[str, Any] | None:
    """The ``frontdoor`` part of the report (None without a ``[frontdoor]`` table)."""
    if cfg.frontdoor is None:
        return None
    from gpushift.backends.probe import HttpBackendProbe

    probe = HttpBackendProbe()
    names: dict[str, tuple[str, ...]] = {}
    listed: dict[str, tuple[list[str] | None, str | None]] = {}
    for name, b in cfg.backends.items():
        st = states.get(name)
        names[name] = models.resolve(
            b.kind, b.models, st.exec_start if st else (), st.environment if st else ()
        )
        if st is not None and st.active_state == "active":
            env = cmdline.environment(st.environment)
            url, headers = warmup.models_query(b, cmdline.expand(st.exec_start, env), env)
            listed[name] = probe.models(url, headers, MODELS_TIMEOUT_S)
    socket = _socket(units)
    found = rules.findings(cfg, names, listed, socket)
    return {
        "listen": list(cfg.frontdoor.listen),
        "models": {k: list(v) for k, v in names.items()},
        "listed": {k: {"models": v[0], "error": v[1]} for k, v in listed.items()},
        "socket": (
            {
                "unit": rules.SOCKET_UNIT,
                "load_state": socket.load_state,
                "listen": list(socket.listen),
                "error": socket.error,
            }  # fmt: skip
            if socket is not None
            else None
        ),
        "findings": [f.to_dict() for f in found],
        "errors": sum(1 for f in found if f.is_error),
        "warnings": sum(1 for f in found if not f.is_error),
    }


def _socket(units: Any) -> rules.SocketFacts | None:
    """The socket unit's stream addresses as systemd has them (None: systemd not reachable)."""
    read = getattr(units, "socket_listen", None)
    if read is None:
        return None
    try:
        load, listen = read(rules.SOCKET_UNIT)
    except GpushiftError as e:
        return rules.SocketFacts(error=str(e))
    return rules.SocketFacts(load, tuple(address for kind, address in listen if kind == "Stream"))


def render(fd: dict[str, Any] | None) -> list[str]:
    """The report's front door lines (none without a ``[frontdoor]`` table)."""
    if not fd:
        return []
    lines = [f"\nfront door (listen {' '.join(fd['listen'])})"]
    sock = fd.get("socket")
    if sock is None:
        lines.append(f"  {rules.SOCKET_UNIT}: systemd not reachable")
    elif sock.get("error"):
        lines.append(f"  {rules.SOCKET_UNIT}: {sock['error']}")
    elif sock.get("load_state") != "loaded":
        lines.append(
            f"  {rules.SOCKET_UNIT}: {sock.get('load_state')} (the front door binds [frontdoor] listen)"
        )
    else:
        lines.append(f"  {rules.SOCKET_UNIT}: listens on {' '.join(sock.get('listen') or []) or 'nothing'}")
    for name, names in (fd.get("models") or {}).items():
        got = (fd.get("listed") or {}).get(name)
        served = ""
        if got is not None:
            served = (
                f"; /v1/models: {', '.join(got['models'])}"
                if got.get("models") is not None
                else (f"; /v1/models: {got.get('error')}")
            )
        lines.append(f"  {name}: models {', '.join(names) or '(none)'}{served}")
    for f in fd.get("findings") or []:
        tag = "ERROR  " if f["severity"] == "error" else "warning"
        lines.append(f"  {tag} [{f['code']}] {f['message']}")
        if f.get("hint"):
            lines.append(f"          hint: {f['hint']}")
    return lines
