"""``gpushift check``'s rules for the front door (``[frontdoor]``, docs/frontdoor.md).

Pure: the config, the model names the daemon would announce, what each running backend lists at
``/v1/models`` and what systemd says of ``gpushift-frontdoor.socket`` come in as values; findings
come out (codes in :mod:`gpushift.doctor.findings`):

* ``frontdoor-port-clash`` (error): a ``listen`` address that is also ``[metrics] listen`` or the
  front door's own ``metrics_listen`` (a backend's port is refused by the config reader already);
* ``frontdoor-backend-exposed`` (warning): a backend (or an instance of one) whose health URL is not
  on a loopback address — clients can reach it around the front door (no holding, no answer saying
  when it comes back);
* ``frontdoor-models-unknown`` (warning): a backend with no model names (a ``generic`` one without
  ``models = [...]``): requests that name a model never reach it;
* ``frontdoor-model-mismatch`` / ``frontdoor-models-unreadable`` (warning): a running backend does
  not list a name gpushift routes by, or its ``/v1/models`` cannot be read;
* ``frontdoor-socket-listen`` (warning): the socket unit's ``ListenStream=`` addresses differ from
  ``[frontdoor] listen`` (under systemd the front door serves the socket unit's sockets).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpushift.backends import models
from gpushift.config import instances
from gpushift.config.frontdoor import port_of
from gpushift.config.schema import Config, split_listen
from gpushift.doctor.findings import (
    ERROR,
    FRONTDOOR_BACKEND_EXPOSED,
    FRONTDOOR_MODEL_MISMATCH,
    FRONTDOOR_MODELS_UNKNOWN,
    FRONTDOOR_MODELS_UNREADABLE,
    FRONTDOOR_PORT_CLASH,
    FRONTDOOR_SOCKET_LISTEN,
    WARNING,
    Finding,
)

#: The socket unit that owns the front door's listening sockets under systemd (units/).
SOCKET_UNIT = "gpushift-frontdoor.socket"
#: The name front-door-wide findings carry as their ``backend``.
FRONTDOOR = "frontdoor"
_WILDCARD = ("::", "0.0.0.0")


@dataclass(frozen=True)
class SocketFacts:
    """What systemd says of the socket unit: its ``LoadState``, its ``Listen`` addresses (of the
    stream sockets), or why it could not be asked."""

    load_state: str = ""
    listen: tuple[str, ...] = ()
    error: str | None = None


def _address(text: str) -> tuple[str, int] | str:
    """(host, port) of an address as the config or systemd writes it; the text when it is neither."""
    try:
        return split_listen(text)
    except ValueError:
        return text


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _clashes(a: tuple[str, int] | str, b: tuple[str, int] | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a[1] == b[1] and (a[0] == b[0] or a[0] in _WILDCARD or b[0] in _WILDCARD)


def port_findings(cfg: Config) -> list[Finding]:
    """The listen addresses against the other listeners and the backends' addresses."""
    fd = cfg.frontdoor
    assert fd is not None
    out: list[Finding] = []
    others = [("[metrics] listen", cfg.metrics.listen), ("[frontdoor] metrics_listen", fd.metrics_listen)]
    for text in fd.listen:
        for what, other in others:
            if other and _clashes(_address(text), _address(other)):
                out.append(
                    Finding(
                        ERROR,
                        FRONTDOOR_PORT_CLASH,
                        FRONTDOOR,
                        f"[frontdoor] listen {text!r} takes the port of {what} {other!r}",
                        f"give {what} another port",
                    )
                )
    for b in cfg.backends.values():
        for i in instances.members(b):
            hp = port_of(i.health_url)
            if hp is None or _loopback(hp[0]):
                continue
            whose = f"{b.name}'s instance {i.unit}" if b.instances else b.name
            out.append(
                Finding(
                    WARNING,
                    FRONTDOOR_BACKEND_EXPOSED,
                    b.name,
                    f"{whose}'s health_url is on {hp[0]}:{hp[1]}, not a loopback address: clients can reach "
                    "it around the front door (no holding through a switch, no answer saying when its model "
                    "comes back)",
                    f"bind the backend to 127.0.0.1 (e.g. 127.0.0.1:{hp[1]}) and its health_url with it",
                )
            )
    return out


def model_findings(
    cfg: Config,
    names: Mapping[str, Sequence[str]],
    listed: Mapping[str, tuple[Sequence[str] | None, str | None]],
) -> list[Finding]:
    """Each backend's model names (``names``) against what its server lists at ``/v1/models``
    (``listed``: the running backends' answers, or (None, why not))."""
    out: list[Finding] = []
    for name in cfg.backends:
        known = list(names.get(name, ()))
        if not known:
            out.append(
                Finding(
                    WARNING,
                    FRONTDOOR_MODELS_UNKNOWN,
                    name,
                    f"{name} has no model names: the front door cannot route a request that names a model "
                    "to it (only its aliases and requests naming none reach it)",
                    f'set models = ["..."] in [backends.{name}] (what its /v1/models lists)',
                )
            )
            continue
        if name not in listed:
            continue  # not running: nothing to compare with
        served, why = listed[name]
        if served is None:
            out.append(
                Finding(
                    WARNING,
                    FRONTDOOR_MODELS_UNREADABLE,
                    name,
                    f"{name} is running but its /v1/models cannot be read ({why}): its model names "
                    f"({', '.join(known)}) cannot be checked",
                )
            )
            continue
        bad = models.compare(known, list(served))
        if bad is not None:
            out.append(
                Finding(
                    WARNING,
                    FRONTDOOR_MODEL_MISMATCH,
                    name,
                    f"{name} does not list {', '.join(bad['missing'])} at /v1/models (it lists "
                    f"{', '.join(bad['listed']) or 'nothing'}): requests for that name get the backend's 404",
                    f"make [backends.{name}] models = [...] the names its server lists, or the server's "
                    "--served-model-name / --alias the configured ones",
                )
            )
    return out


def socket_findings(cfg: Config, socket: SocketFacts | None) -> list[Finding]:
    """The socket unit's ``Listen`` against ``[frontdoor] listen`` (a unit that is not loaded: none)."""
    fd = cfg.frontdoor
    assert fd is not None
    if socket is None or socket.error is not None or socket.load_state != "loaded":
        return []
    theirs = {_address(a) for a in socket.listen}
    ours = {_address(a) for a in fd.listen}
    if theirs == ours:
        return []
    return [
        Finding(
            WARNING,
            FRONTDOOR_SOCKET_LISTEN,
            FRONTDOOR,
            f"{SOCKET_UNIT} listens on {' '.join(socket.listen) or 'nothing'} but [frontdoor] listen is "
            f"{' '.join(fd.listen)}: under systemd the front door serves the socket unit's sockets, started "
            "by hand it binds [frontdoor] listen",
            f"make the ListenStream= lines of {SOCKET_UNIT} and [frontdoor] listen the same addresses",
        )
    ]


def findings(
    cfg: Config,
    names: Mapping[str, Sequence[str]],
    listed: Mapping[str, tuple[Sequence[str] | None, str | None]],
    socket: SocketFacts | None,
) -> list[Finding]:
    """Every front door finding (none without a ``[frontdoor]`` table)."""
    if cfg.frontdoor is None:
        return []
    return [*port_findings(cfg), *model_findings(cfg, names, listed), *socket_findings(cfg, socket)]
