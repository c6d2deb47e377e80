"""What people see of the front door: its Prometheus metrics and its access log.

Metrics live in the front door's own registry (never the process-wide default one), served at
``[frontdoor] metrics_listen`` when set (``server.py``):

* ``gpushift_frontdoor_requests_total{backend, model, status}`` — requests answered, by the backend
  that answered ("" for the front door itself), the model named (a configured name or alias;
  ``other`` for any other name, "" for none: a client cannot grow the label set) and the status;
* ``gpushift_frontdoor_held_requests`` — held now;
* ``gpushift_frontdoor_held_seconds`` — how long each held request was held (a histogram);
* ``gpushift_frontdoor_in_flight_requests{backend}`` — forwarded and not finished, per backend;
* ``gpushift_frontdoor_upstream_errors_total{backend, reason}`` — a backend that did not answer.

One access line per request through structlog, event ``frontdoor_request`` with ``method``,
``path`` (without its query string, which may carry a key), ``status``, ``backend``, ``model``,
``held_ms`` and ``duration_ms``: never a body or a header value.
"""

from __future__ import annotations

from collections.abc import Collection

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = structlog.get_logger("gpushift.frontdoor")

#: The held-time histogram's buckets (seconds): a switch takes from seconds (llama-server) to
#: minutes (vLLM with CUDA graph capture), and a hold lasts at most hold_timeout_s (≤ 3600).
HELD_BUCKETS = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)

#: The model label of a name that is not configured.
OTHER = "other"

#: An access line's path is cut at this many characters.
PATH_MAX = 256

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Observer:
    """The front door's metrics and access log."""

    def __init__(self, backends: Collection[str], names: Collection[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.names = frozenset(names)
        self.requests = Counter(
            "gpushift_frontdoor_requests",
            "Requests answered, by backend ('' = the front door), model and status",
            ("backend", "model", "status"),
            registry=self.registry,
        )
        self.held = Gauge("gpushift_frontdoor_held_requests", "Requests held now", registry=self.registry)
        self.held_seconds = Histogram(
            "gpushift_frontdoor_held_seconds",
            "How long each held request was held",
            buckets=HELD_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gpushift_frontdoor_in_flight_requests",
            "Requests forwarded and not finished, per backend",
            ("backend",),
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "gpushift_frontdoor_upstream_errors",
            "Forwarded requests a backend did not answer",
            ("backend", "reason"),
            registry=self.registry,
        )
        self._in_flight = {b: self.in_flight.labels(b) for b in backends}
        for g in self._in_flight.values():
            g.set(0)

    def set_in_flight(self, backend: str, n: int) -> None:
        g = self._in_flight.get(backend)
        if g is None:
            g = self._in_flight[backend] = self.in_flight.labels(backend)
        g.set(n)

    def label(self, model: str | None) -> str:
        if model is None:
            return ""
        return model if model in self.names else OTHER

    def done(
        self,
        method: str,
        path: str,
        status: int,
        backend: str,
        model: str | None,
        held_s: float,
        duration_s: float,
    ) -> None:
        """One request answered: its counter and its access line."""
        self.requests.labels(backend, self.label(model), str(status)).inc()
        log.info(
            "frontdoor_request",
            method=method,
            path=path[:PATH_MAX],
            status=status,
            backend=backend,
            model=self.label(model),
            held_ms=round(held_s * 1000, 1),
            duration_ms=round(duration_s * 1000, 1),
        )

    def page(self) -> bytes:
        """The /metrics page (Prometheus's text format)."""
        return generate_latest(self.registry)
