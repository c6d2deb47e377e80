"""A backend of several instances (issue 23): the ``instances`` and ``min_ready`` keys, and the
few questions the rest of gpushift asks of such a backend.

``instances = [{ unit = "gpushift-llama@0.service", health_url = "http://127.0.0.1:8081/health",
gpus = [0] }, ...]`` makes one backend of several units, switched, gated and recorded as one.  With
``instances`` the backend-level ``unit``, ``health_url`` and ``gpus`` are refused (they would
contradict the instances'); the reader fills them itself, so code that knows one unit per backend
keeps a meaning:

* ``BackendConfig.unit`` and ``health_url``: the FIRST instance's (its origin also gives the kind's
  default ``version_url`` and ``metrics_url``);
* ``BackendConfig.gpus``: every GPU of every instance, sorted (the VRAM gate and the preflight
  watch them all); None (all GPUs) when an instance names none.

What is switched, stopped and watched is :func:`members`: the instances, or the one unit of a
backend without them (as an :class:`InstanceConfig` of its own), so a caller needs no second path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from gpushift.config import validate
from gpushift.config.keys import KeyReader
from gpushift.config.types import BackendConfig, InstanceConfig

#: Most instances one backend may have.
INSTANCES_MAX = 64

#: The backend-level keys that ``instances`` replaces.
REPLACED = ("unit", "health_url", "gpus")


def members(b: BackendConfig) -> tuple[InstanceConfig, ...]:
    """What runs ``b``: its instances, or its one unit as the only instance."""
    return b.instances or (InstanceConfig(b.unit, b.health_url, b.gpus),)


def needed(b: BackendConfig) -> int:
    """How many instances must pass health and warm-up for ``b`` to serve (``min_ready``; all)."""
    return b.min_ready if b.min_ready is not None else len(members(b))


def units_of(b: BackendConfig) -> tuple[str, ...]:
    """Every unit of ``b``."""
    return tuple(i.unit for i in members(b))


def view(b: BackendConfig, i: InstanceConfig) -> BackendConfig:
    """``b`` as if it were the one unit ``i`` (its own unit, health URL and GPUs; the kind's default
    ``version_url``/``metrics_url`` moved to ``i``'s origin): the steps written for one unit run
    an instance unchanged.  ``b`` without instances is returned as it is."""
    if not b.instances:
        return b
    old, new = _origin(b.health_url), _origin(i.health_url)

    def moved(url: str | None) -> str | None:
        return new + url[len(old) :] if url is not None and url.startswith(old) else url

    return replace(
        b,
        unit=i.unit,
        health_url=i.health_url,
        gpus=i.gpus,
        version_url=moved(b.version_url),
        metrics_url=moved(b.metrics_url),
        instances=(),
        min_ready=None,
    )


def view_of_unit(b: BackendConfig, unit: str | None) -> BackendConfig:
    """The one-unit view of ``b``'s instance whose unit is ``unit`` (``b`` itself when none is)."""
    return next((view(b, i) for i in b.instances if i.unit == unit), b)


def pick(b: BackendConfig, states: Mapping[str, Any]) -> str:
    """The unit that stands for ``b`` given its units' states (by unit): the first instance that
    runs, else the first one (``states``' values: states with ``running``, or errors)."""
    for u in units_of(b):
        if getattr(states.get(u), "running", False):
            return u
    return b.unit


def port_of(url: str) -> int | None:
    """The port a URL names (its scheme's default when it names none); None if unreadable."""
    try:
        parts = urlsplit(url)
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def read_instances(r: KeyReader, d: Mapping[str, Any], where: str) -> tuple[InstanceConfig, ...]:
    """``instances`` (absent: ``()``); with it, the keys it replaces are refused by name."""
    key = f"{where}.instances"
    if "instances" not in d:
        if "min_ready" in d:
            raise r.err(f"{where}.min_ready", "only a backend with instances has min_ready")
        return ()
    for k in REPLACED:
        if k in d:
            raise r.err(
                f"{where}.{k}",
                f"a backend with instances has no {k} of its own (each instance names its {k}): "
                f"remove {k} or instances",
            )
    v = d["instances"]
    if not isinstance(v, list) or not v or not all(isinstance(x, dict) for x in v):
        raise r.err(
            key,
            'expected a non-empty list of tables { unit = "...", health_url = "...", gpus = [...] }, '
            f"got {validate.shown(v)}",
        )
    if len(v) > INSTANCES_MAX:
        raise r.err(key, f"at most {INSTANCES_MAX} instances, got {len(v)}")
    out: list[InstanceConfig] = []
    for n, x in enumerate(v):
        at = f"{key}[{n}]"
        r.no_unknown(x, at, {"unit", "health_url", "gpus"})
        unit = r.string(x, at, "unit", None)
        if unit is None:
            raise r.err(f"{at}.unit", "missing (expected a systemd unit name such as 'gpushift-x@0.service')")
        problem = validate.unit_problem(unit)
        if problem is not None:
            raise r.err(f"{at}.unit", f"{validate.shown(unit)}: {problem}")
        if any(i.unit == unit for i in out):
            raise r.err(f"{at}.unit", f"{unit!r} is already the unit of another instance")
        health_url = r.url(x, at, "health_url", required=True) or ""
        out.append(InstanceConfig(unit=unit, health_url=health_url, gpus=r.gpu_list(x, at)))
    return tuple(out)


def read_min_ready(r: KeyReader, d: Mapping[str, Any], where: str, count: int) -> int | None:
    """``min_ready``: 1 to the number of instances; absent: None (all)."""
    if "min_ready" not in d:
        return None
    return int(r.number(d, where, "min_ready", count, minimum=1, integer=True, maximum=count))


def joined_gpus(instances: tuple[InstanceConfig, ...]) -> tuple[int, ...] | None:
    """Every GPU of the instances, sorted; None when one of them names none (all GPUs)."""
    if any(i.gpus is None for i in instances):
        return None
    return tuple(sorted({g for i in instances for g in i.gpus or ()}))
