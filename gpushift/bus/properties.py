"""The values of the D-Bus properties (org.gpushift.Switcher1's ActiveBackend, Mode, ...).

Computed from memory only, on the loop thread, so a read never waits on systemd, a backend, a GPU
or a keeper tick: who serves comes from the sampler's latest sample by the rule ``gpushift status``
uses (:func:`gpushift.sampler.sample.verdict`); the switch in flight from the switcher; the mode and the
next switch from the keeper's fields, read without its lock (:meth:`Keeper.mode`,
:meth:`Keeper.next_switch`).  The service (:mod:`gpushift.bus.service`) compares and
announces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpushift.sampler.sample import Sample, verdict
from gpushift.switch import SwitchRun
from gpushift.values import Mode


@dataclass(frozen=True)
class Sources:
    """Where each value is read from (the daemon's parts; fakes in the tests)."""

    backends: Callable[[], Iterable[str]]
    sample: Callable[[], Sample]
    monotonic: Callable[[], float]
    current: Callable[[], SwitchRun | None]
    mode: Callable[[], Mode]
    next_switch: Callable[[], tuple[str, datetime] | None]


def values(src: Sources) -> dict[str, Any]:
    """Every property by name, in the D-Bus types of the interface XML."""
    v = verdict(src.sample(), src.monotonic())
    run = src.current()
    nxt = src.next_switch()
    return {
        "ActiveBackend": v.active or "",
        "Mode": src.mode().value,
        "SwitchInProgress": run is not None,
        "Phase": run.phase.value if run is not None else "",
        "NextSwitch": (nxt[0], max(0, int(nxt[1].timestamp()))) if nxt else ("", 0),
        "Backends": list(src.backends()),
    }


def sources(d: Any) -> Sources:
    """The running daemon's parts (``d`` is the :class:`~gpushift.daemon.core.Daemon`)."""
    return Sources(
        backends=lambda: d.config.backends,
        sample=d.latest_sample,
        monotonic=d.components.ports.clock.monotonic,
        current=d.switcher.current,
        mode=d.keeper.mode,
        next_switch=d.keeper.next_switch,
    )
