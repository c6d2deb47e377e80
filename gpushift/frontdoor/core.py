"""The object the front door's daemon link and command drive: :class:`FrontDoor`.

What it knows and decides is :class:`gpushift.frontdoor.state.DoorState` (``update``, ``close``,
``in_flight``, ``release``, ``status``); this adds the sockets (``serve``, ``stop``).  It runs in
tests without any bus: ``update(view)`` is how it learns what serves.

Usage (``main.py``)::

    fd = FrontDoor(config)
    await fd.serve(sockets)      # systemd's sockets, or None: bind [frontdoor] listen
    ...                          # the daemon link calls fd.update(view), fd.close(b), fd.release(s)
    await fd.stop()
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from gpushift.config.types import Config
from gpushift.frontdoor.server import Network
from gpushift.frontdoor.state import DoorState


class FrontDoor(DoorState):
    """The front door of one host (docs/frontdoor.md)."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        super().__init__(config, clock)
        self._network: Network | None = None
        self._stopped = asyncio.Event()
        #: The status page's routes under /gpushift/ (``frontdoor/page.py``); None: not served.
        self.status_page: Any = None

    async def serve(self, sockets: list[socket.socket] | None) -> None:
        """Serve ``sockets`` (systemd's, socket activation) or bind ``[frontdoor] listen``.

        Returns once every socket accepts (and the metrics listener, when set, is up); the serving
        goes on until :meth:`stop`.

        Raises:
            OSError: a ``listen`` address could not be bound (nothing is left open then).
        """
        network = Network(self)
        try:
            await network.start(sockets)
        except BaseException:
            await network.stop()
            raise
        self._network = network
        self.addresses = list(network.addresses)
        self.health_probe = network.upstream.healthy
        self.watch_instances(network.upstream.instance_probe(self.backends))

    async def stop(self) -> None:
        """Stop accepting, answer the held requests (503), let the requests in flight end for a
        few seconds, then close every connection."""
        self.end()
        if self._network is not None:
            network, self._network = self._network, None
            await network.stop()
        self.addresses = []
        self.health_probe = None
        self._stopped.set()

    async def wait_stopped(self) -> None:
        """Returns once :meth:`stop` has run."""
        await self._stopped.wait()
