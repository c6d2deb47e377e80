"""The daemon's Prometheus metrics — which of its parts each figure is read from.

:func:`start` builds a :class:`~gpushift.metrics.server.MetricsService` over the daemon's
sampler, keeper, switcher and ledger view, makes it a listener of the switcher and starts it; it
returns None when ``[metrics]`` configures neither a listener nor a textfile.  docs/metrics.md
says what is exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpushift import __version__
from gpushift.metrics.collector import next_switch

if TYPE_CHECKING:
    from gpushift.metrics.server import MetricsService


class _Daemon(Protocol):
    """The parts of :class:`gpushift.daemon.core.Daemon` the metrics read (core imports this module)."""

    config: Any
    sampler: Any
    keeper: Any
    switcher: Any
    components: Any
    log: Any
    mirror: Any


def start(d: _Daemon) -> MetricsService | None:
    m = d.config.metrics
    if not m.listen and not m.textfile:
        return None
    from gpushift.metrics.collector import Sources
    from gpushift.metrics.server import MetricsService

    sources = Sources(
        config=lambda: d.config,
        sample=d.sampler.snapshot,
        monotonic=d.components.ports.clock.monotonic,
        mode=d.keeper.mode,
        next_switch=lambda: next_switch(d.keeper.status(), d.keeper.mode()),
        ledger=d.components.ledger_view,
        switching=lambda: d.switcher.snapshot()[0],
        version=__version__,
        mirror=lambda: d.mirror.status() if d.mirror is not None else None,
    )
    service = MetricsService(m, sources, d.components.ports.gpu, d.switcher.current, d.log)
    d.switcher.add_listener(service.on_event)
    service.start()
    return service
