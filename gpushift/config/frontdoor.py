"""The ``[frontdoor]`` table and the backends' model names → frozen, validated types.

The front door (``gpushift frontdoor``, docs/frontdoor.md) is the one address clients use: it
forwards to whichever backend serves and holds requests through a switch.  A config with a
``[frontdoor]`` table has one, and the daemon then tells it about every drain and every switch's end;
a config without one never calls it.

* ``listen``: the addresses the front door binds when it is started without sockets (by hand, in
  tests); under systemd it serves the sockets of ``gpushift-frontdoor.socket`` instead, and
  ``gpushift check`` says when the two differ.
* a backend's ``models``: the model names it serves (default: read from its unit's command line by
  its kind; see :func:`gpushift.backends.kinds`), and ``aliases``: names that reach it whenever it
  serves (the front door rewrites ``model`` in the request body).

Read with the config's own :class:`~gpushift.config.keys.KeyReader` (the same error format and
number checks as every other key); docs/config.md lists every key with its range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushift.config import instances, validate
from gpushift.config.keys import KeyReader
from gpushift.config.types import DEFAULT_LISTEN, MIB, FrontDoorConfig, split_listen

#: A model name: one plain line, as vLLM's ``--served-model-name`` and llama-server's ``--alias`` take.
MODEL_NAME_MAX = 256


def read_frontdoor(r: KeyReader, data: Mapping[str, Any]) -> FrontDoorConfig | None:
    """The ``[frontdoor]`` table, or None when the config has none (no front door)."""
    if "frontdoor" not in data:
        return None
    f = r.table(data, "frontdoor")
    r.no_unknown(f, "frontdoor", set(FrontDoorConfig.__dataclass_fields__))
    metrics_listen = f.get("metrics_listen", "")
    if not isinstance(metrics_listen, str):
        raise r.err(
            "frontdoor.metrics_listen", f'expected "HOST:PORT" (or "" for none), got {metrics_listen!r}'
        )
    if metrics_listen:
        _address(r, "frontdoor.metrics_listen", metrics_listen)
    return FrontDoorConfig(
        listen=_listen(r, f),
        hold_timeout_s=float(r.number(f, "frontdoor", "hold_timeout_s", 300.0, minimum=1, maximum=3600)),
        max_held=int(r.number(f, "frontdoor", "max_held", 1000, integer=True, maximum=100000)),
        max_body_bytes=int(
            r.number(
                f, "frontdoor", "max_body_bytes", 16 * MIB, minimum=1024, integer=True, maximum=1024 * MIB
            )
        ),
        max_connections=int(
            r.number(f, "frontdoor", "max_connections", 4096, minimum=16, integer=True, maximum=65536)
        ),
        header_timeout_s=float(r.number(f, "frontdoor", "header_timeout_s", 10.0, minimum=0.1, maximum=300)),
        body_timeout_s=float(r.number(f, "frontdoor", "body_timeout_s", 60.0, minimum=0.1, maximum=3600)),
        idle_timeout_s=float(r.number(f, "frontdoor", "idle_timeout_s", 75.0, minimum=1, maximum=3600)),
        upstream_connect_timeout_s=float(
            r.number(f, "frontdoor", "upstream_connect_timeout_s", 5.0, minimum=0.1, maximum=300)
        ),
        metrics_listen=metrics_listen,
        bus_timeout_s=float(r.number(f, "frontdoor", "bus_timeout_s", 5.0, minimum=0.1, maximum=60)),
    )


def _address(r: KeyReader, key: str, text: str) -> tuple[str, int]:
    try:
        return split_listen(text)
    except ValueError as e:
        raise r.err(key, str(e)) from None


def _listen(r: KeyReader, f: Mapping[str, Any]) -> tuple[str, ...]:
    v = f.get("listen", list(DEFAULT_LISTEN))
    if not isinstance(v, list) or not 1 <= len(v) <= 16 or not all(isinstance(x, str) for x in v):
        raise r.err(
            "frontdoor.listen",
            f'expected a list of 1 - 16 "HOST:PORT" strings (e.g. ["[::]:8000"]), got {validate.shown(v)}',
        )
    seen: set[tuple[str, int]] = set()
    for x in v:
        a = _address(r, "frontdoor.listen", x)
        if a in seen:
            raise r.err("frontdoor.listen", f"{x!r} is listed twice")
        seen.add(a)
    return tuple(v)


def model_names(r: KeyReader, d: Mapping[str, Any], where: str, key: str) -> tuple[str, ...] | None:
    """A backend's ``models`` or ``aliases``: a list of distinct model names; None when absent."""
    if key not in d:
        return None
    v = d[key]
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise r.err(
            f"{where}.{key}", f'expected a list of model names (e.g. ["qwen2.5-7b"]), got {validate.shown(v)}'
        )
    for x in v:
        problem = validate.line_problem(x, MODEL_NAME_MAX)
        if problem is not None:
            raise r.err(f"{where}.{key}", f"model name {validate.shown(x)}: {problem}")
    if len(set(v)) != len(v):
        raise r.err(f"{where}.{key}", f"a name is listed twice in {validate.shown(v)}")
    return tuple(v)


def port_of(url: str) -> tuple[str, int] | None:
    """(host, port) of an ``http(s)://HOST[:PORT]/...`` URL (the scheme's port when none is written)."""
    scheme, _, rest = url.partition("://")
    hostport = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = hostport.partition(":")
    if port and not port.isdigit():
        return None
    return host, int(port) if port else (443 if scheme == "https" else 80)


def check_against_backends(r: KeyReader, fd: FrontDoorConfig, backends: Mapping[str, Any]) -> None:
    """A listen address that takes a backend's port (the same port on the same or a wildcard
    address) is refused: the front door and the backend would fight for it.  A backend of several
    instances has one port per instance, each checked."""
    for text, (host, port) in zip(fd.listen, fd.addresses, strict=True):
        for b in backends.values():
            for i in instances.members(b):
                hp = port_of(i.health_url)
                if hp is None or hp[1] != port or not (host in ("::", "0.0.0.0") or hp[0] == host):
                    continue
                where = f"instance {i.unit!r}'s health_url" if b.instances else "its health_url"
                raise r.err(
                    "frontdoor.listen",
                    f"{text!r} takes port {port} of backend {b.name!r} ({hp[0]}:{port} in {where}): move "
                    "the backend to another port, e.g. 127.0.0.1:8001 (docs/frontdoor.md, "
                    "'Moving an existing host')",
                )
    for b in backends.values():
        for a in b.aliases:
            for other in backends.values():
                if a in (other.models or ()):
                    raise r.err(
                        f"backends.{b.name}.aliases",
                        f"{a!r} is a model name of backend {other.name!r}: an alias must not hide a model",
                    )
