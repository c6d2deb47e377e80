"""The values of the D-Bus properties (org.gpushift.Switcher1's ActiveBackend, Mode, ...).

Computed from memory only, on the loop thread, so a read never waits on systemd, a backend, a GPU
or a keeper tick: who serves comes from the sampler's latest sample by the rule ``gpushift status``
uses (:func:`gpushift.sampler.sample.verdict`); the switch in flight from the switcher; the mode and the
next switch from the keeper's fields, read without its lock (:meth:`Keeper.mode`,
:meth:`Keeper.next_switch`).  The service (:mod:`gpushift.bus.service`) compares and
announces them.

``NextServed`` comes from ``Keeper.next_served``, which keeps its last answer until the schedule,
the override, a deferral or what serves changes, or the instant it holds until comes: an
announcement every second compares it, and it changes only when one of those did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpushift.sampler.sample import Sample, verdict
from gpushift.switch import SwitchRun
from gpushift.values import OFF, Mode


@dataclass(frozen=True)
class Sources:
    """Where each value is read from (the daemon's parts; fakes in the tests)."""

    backends: Callable[[], Iterable[str]]
    sample: Callable[[], Sample]
    monotonic: Callable[[], float]
    current: Callable[[], SwitchRun | None]
    mode: Callable[[], Mode]
    next_switch: Callable[[], tuple[str, datetime] | None]
    # The model names by backend (the daemon resolves them: config ``models``, else the command line).
    models: Callable[[], Mapping[str, Sequence[str]]] = field(default=lambda: {})
    # Per backend, when the keeper next serves it by itself (UNIX seconds, 0: now), given what
    # serves now (``Keeper.next_served``, computed again only when its inputs change).
    next_served: Callable[[tuple[str, ...]], Mapping[str, int]] = field(default=lambda serving: {})
    zone: Callable[[], str] = field(default=lambda: "")  # the schedule's zone name; "" = UTC


def values(src: Sources) -> dict[str, Any]:
    """Every property by name, in the D-Bus types of the interface XML."""
    v = verdict(src.sample(), src.monotonic())
    run = src.current()
    nxt = src.next_switch()
    target = run.target if run is not None else ""
    models = {b: list(names) for b, names in src.models().items()}
    serving = tuple(x for x in (v.active, target) if x and x != OFF)
    return {
        "ActiveBackend": v.active or "",
        "Mode": src.mode().value,
        "SwitchInProgress": run is not None,
        "Phase": run.phase.value if run is not None else "",
        "NextSwitch": (nxt[0], max(0, int(nxt[1].timestamp()))) if nxt else ("", 0),
        "Backends": list(src.backends()),
        "SwitchTarget": target,
        "NextServed": by_model(src.next_served(serving), models),
        "Models": models,
        "TimeZone": src.zone(),
        "Instances": instances(src.sample(), src.monotonic()),
    }


def instances(sample: Sample, now: float) -> dict[str, list[tuple[str, str, str]]]:
    """Per backend of several instances (issue 23): each instance's (unit, ActiveState as last
    sampled or ``unknown``, health ``ok``/``failing``/``unknown``, ``""`` while its unit does not
    run).  A backend of one unit is absent."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for b in sample.backends:
        if not b.instances:
            continue
        health = dict(b.instance_health)
        rows = []
        for unit, f in b.instances:
            st = f.known(now, sample.period_s) if f is not None else None
            h = health.get(unit)
            if h is None:
                word = ""
            elif h.stale(now, sample.period_s):
                word = "unknown"
            else:
                word = "ok" if h.value is not None and h.error is None and h.value.ok else "failing"
            rows.append((unit, st.active_state if st is not None else "unknown", word))
        out[b.name] = rows
    return out


def by_model(per_backend: Mapping[str, int], models: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Per model name, the earliest time one of the backends that serve it is served (0: now); a
    model whose backends are never served by the keeper itself is absent."""
    out: dict[str, int] = {}
    for backend, t in per_backend.items():
        for name in models.get(backend, ()):
            out[name] = min(out.get(name, t), t)
    return dict(sorted(out.items()))


def sources(d: Any) -> Sources:
    """The running daemon's parts (``d`` is the :class:`~gpushift.daemon.core.Daemon`)."""
    return Sources(
        backends=lambda: d.config.backends,
        sample=d.latest_sample,
        monotonic=d.components.ports.clock.monotonic,
        current=d.switcher.current,
        mode=d.keeper.mode,
        next_switch=d.keeper.next_switch,
        models=d.models.get,
        next_served=lambda serving: d.keeper.next_served(tuple(d.config.backends), serving),
        zone=lambda: zone_name(d.schedule),
    )


def zone_name(schedule: Any) -> str:
    """The schedule's zone (its ``TZ=`` line, else the host's zone it was read in); "" without one."""
    tz = getattr(schedule, "tz", None)
    return str(getattr(tz, "key", None) or "") if tz is not None else ""
