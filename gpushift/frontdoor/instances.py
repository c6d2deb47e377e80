"""The backends of several instances at the front door (issue 23 item 4): :class:`Pools`.

One :class:`gpushift.frontdoor.balance.Picker` per backend that has ``instances`` (a backend
without is one upstream, and nothing here touches it).  Besides the pick it keeps:

* **health**: :meth:`Pools.watch` asks the ``health_url`` of every instance of the backends in use
  (serving now, or with requests in flight) every :data:`PROBE_PERIOD_S`, each probe with a
  deadline (``proxy.Upstream.instance_healthy``); an instance is marked down when its probe fails,
  its connect is refused or a request broke there, and up again when its health answers 2xx.  A
  backend that starts serving again (a switch to it) starts with every instance up: the daemon has
  just seen them healthy, and a stale mark would keep one idle.
* **metrics**, in the front door's registry, only when some backend has instances:

  - ``gpushift_frontdoor_instance_up{backend, instance}`` — 1 up, 0 marked down;
  - ``gpushift_frontdoor_instance_in_flight_requests{backend, instance}``;
  - ``gpushift_frontdoor_instance_requests_total{backend, instance}`` — requests given to it;
  - ``gpushift_frontdoor_instance_retried_total{backend, instance}`` — its connect refused (nothing
    sent), the request tried again at once on another instance;
  - ``gpushift_frontdoor_instance_failed_total{backend, instance, reason}`` — a request already sent
    there that failed (its client got a 502, or a stream that broke off).

An instance's label is its unit's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpushift.frontdoor.balance import Picker

log = structlog.get_logger("gpushift.frontdoor")

#: The instances of the backends in use have their health asked this often (seconds).
PROBE_PERIOD_S = 1.0

#: The deadline of one health probe (seconds).
PROBE_TIMEOUT_S = 2.0

#: probe(backend, instance index) -> whether its health answered 2xx within the deadline.
Probe = Callable[[str, int], Awaitable[bool]]


class Pools:
    """Every backend of several instances: its picker, its instances' health and metrics."""

    def __init__(self, members: Mapping[str, Sequence[str]], registry: CollectorRegistry) -> None:
        self.pickers = {b: Picker(names) for b, names in members.items() if names}
        self._serving = ""
        if not self.pickers:
            return
        self._up = Gauge(
            "gpushift_frontdoor_instance_up",
            "Whether an instance of a backend gets requests (1) or is marked down (0)",
            ("backend", "instance"),
            registry=registry,
        )
        self._in_flight = Gauge(
            "gpushift_frontdoor_instance_in_flight_requests",
            "Requests forwarded to an instance and not finished",
            ("backend", "instance"),
            registry=registry,
        )
        self._requests = Counter(
            "gpushift_frontdoor_instance_requests",
            "Requests given to an instance",
            ("backend", "instance"),
            registry=registry,
        )
        self._retried = Counter(
            "gpushift_frontdoor_instance_retried",
            "Requests whose connect to an instance was refused, tried again on another",
            ("backend", "instance"),
            registry=registry,
        )
        self.failed = Counter(
            "gpushift_frontdoor_instance_failed",
            "Requests sent to an instance that failed there (a 502, or a stream broken off)",
            ("backend", "instance", "reason"),
            registry=registry,
        )
        for b, p in self.pickers.items():
            for name in p.names:
                self._up.labels(b, name).set(1)
                self._in_flight.labels(b, name).set(0)
                self._requests.labels(b, name)
                self._retried.labels(b, name)

    def __contains__(self, backend: object) -> bool:
        return backend in self.pickers

    def name(self, backend: str, i: int) -> str:
        return self.pickers[backend].names[i]

    def pick(self, backend: str, exclude: Collection[int] = ()) -> int | None:
        return self.pickers[backend].pick(exclude)

    def begin(self, backend: str, i: int) -> None:
        p = self.pickers[backend]
        p.begin(i)
        self._in_flight.labels(backend, p.names[i]).set(p.in_flight[i])
        self._requests.labels(backend, p.names[i]).inc()

    def end(self, backend: str, i: int) -> None:
        p = self.pickers[backend]
        p.end(i)
        self._in_flight.labels(backend, p.names[i]).set(p.in_flight[i])

    def refused(self, backend: str, i: int, reason: str) -> None:
        """Its connect failed before anything was sent: down, and the request goes elsewhere."""
        self._retried.labels(backend, self.name(backend, i)).inc()
        self._mark(backend, i, False, reason)

    def broke(self, backend: str, i: int, reason: str) -> None:
        """A request already sent there failed: counted, and the instance marked down."""
        self.failed.labels(backend, self.name(backend, i), reason).inc()
        self._mark(backend, i, False, reason)

    def serving(self, backend: str) -> None:
        """``backend`` is the one serving now: when it just became so, every instance starts up."""
        if backend == self._serving:
            return
        self._serving = backend
        p = self.pickers.get(backend)
        if p is not None:
            for i in p.all_up():
                self._up.labels(backend, p.names[i]).set(1)

    async def watch(self, probe: Probe, in_use: Callable[[], Collection[str]]) -> None:
        """Ask the health of every instance of the backends ``in_use()`` names, for ever."""
        while True:
            wanted = [b for b in in_use() if b in self.pickers]
            checks = [(b, i) for b in wanted for i in range(len(self.pickers[b]))]
            if checks:
                results = await asyncio.gather(*(probe(b, i) for b, i in checks), return_exceptions=True)
                for (b, i), ok in zip(checks, results, strict=True):
                    self._mark(b, i, ok is True, "health")
            await asyncio.sleep(PROBE_PERIOD_S)

    def status(self) -> dict[str, Any]:
        """Each instance: up or down and its requests in flight (``FrontDoor1.Status``)."""
        return {
            b: [{"instance": n, "up": p.up[i], "in_flight": p.in_flight[i]} for i, n in enumerate(p.names)]
            for b, p in self.pickers.items()
        }

    def _mark(self, backend: str, i: int, up: bool, why: str) -> None:
        p = self.pickers[backend]
        if p.mark(i, up):
            self._up.labels(backend, p.names[i]).set(1 if up else 0)
            if up:
                log.info("frontdoor_instance_up", backend=backend, instance=p.names[i])
            else:
                log.warning("frontdoor_instance_down", backend=backend, instance=p.names[i], reason=why)
