"""L5: the daemon's Prometheus metrics — which of its parts each figure is read from.

:func:`start` builds a :class:`~gpushift.adapters.metrics_server.MetricsService` over the daemon's
sampler, keeper, switcher and ledger view, makes it a listener of the switcher and starts it; it
returns None when ``[metrics]`` configures neither a listener nor a textfile.  docs/metrics.md
says what is exported.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..model import Mode

if TYPE_CHECKING:
    from ..adapters.metrics_server import MetricsService
    from .core import Daemon


def start(d: Daemon) -> MetricsService | None:
    m = d.config.metrics
    if not m.listen and not m.textfile:
        return None
    from ..adapters.metrics import Sources
    from ..adapters.metrics_server import MetricsService

    sources = Sources(
        config=lambda: d.config,
        sample=d.sampler.snapshot,
        monotonic=d.components.ports.clock.monotonic,
        mode=d.keeper.mode,
        next_switch=lambda: next_switch(d.keeper.status(), d.keeper.mode()),
        ledger=d.components.ledger_view,
        switching=lambda: d.switcher.snapshot()[0],
        version=__version__,
    )
    service = MetricsService(m, sources, d.components.ports.gpu, d.switcher.current, d.log)
    d.switcher.add_listener(service.on_event)
    service.start()
    return service


def next_switch(keeper_status: dict[str, Any], mode: Mode) -> tuple[str, float] | None:
    """The schedule's next change as ``gpushift status`` shows it, as (backend, Unix time); None in
    hold and manual mode (the schedule does not act then) and when no change is ahead."""
    nxt = (keeper_status.get("schedule") or {}).get("next")
    if not nxt or mode in (Mode.HOLD, Mode.MANUAL):
        return None
    return str(nxt["target"]), datetime.fromisoformat(str(nxt["at"])).timestamp()
