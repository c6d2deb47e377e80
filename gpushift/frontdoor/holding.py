"""The requests held through a switch.

A held request is a future the request's handler waits on: nothing has been sent to its client
(no status line, no header), so once it is forwarded its status is the backend's.  It leaves the
hold in one of four ways: the core resolves it (forwarded to what serves, or answered because that
does not serve its model), its ``hold_timeout_s`` runs out (a 503 with Retry-After), its client goes
away (the handler is cancelled), or the front door stops.  At most ``max_held`` are held at once.

The figures a switch's ledger row takes (``Release`` returns them): how many requests were held
since the switch began, and the longest hold among them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpushift.frontdoor.routing import Decision


@dataclass(frozen=True)
class Outcome:
    """How a held request leaves the hold: a routing decision (forward or answer), and, for an
    answer given at a release, the target of the switch that did not bring its model."""

    decision: Decision
    released_from: str | None = None  # a release answered it: the switch's target ("" unknown)


@dataclass(eq=False)
class Held:
    model: str | None
    target: str  # the switch's target when it was held ("" unknown yet)
    since: float  # monotonic
    future: asyncio.Future[Outcome] = field(repr=False)


class Holding:
    """The held requests and the figures of the switch in progress."""

    def __init__(
        self, max_held: int, timeout_s: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_held = max_held
        self.timeout_s = timeout_s
        self._mono = monotonic
        self._held: dict[int, Held] = {}
        self.switch_count = 0  # held since the switch began (Release returns it)
        self.switch_longest_s = 0.0  # the longest hold of those that left

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held.values()))

    def oldest_s(self) -> float:
        """How long the request held longest has waited so far (0 when none is held)."""
        now = self._mono()
        return max((now - h.since for h in self._held.values()), default=0.0)

    def add(self, model: str | None, target: str) -> Held | None:
        """Hold a request; None when ``max_held`` are held already."""
        if len(self._held) >= self.max_held:
            return None
        loop = asyncio.get_running_loop()
        h = Held(model, target, self._mono(), loop.create_future())
        self._held[id(h)] = h
        self.switch_count += 1
        return h

    def leave(self, h: Held) -> float:
        """``h`` leaves the hold; returns how long it was held."""
        self._held.pop(id(h), None)
        held_s = self._mono() - h.since
        self.switch_longest_s = max(self.switch_longest_s, held_s)
        return held_s

    def resolve(self, h: Held, outcome: Outcome) -> None:
        """Decide ``h`` (its handler wakes with ``outcome``); it leaves the hold now."""
        self.leave(h)
        if not h.future.done():
            h.future.set_result(outcome)

    async def wait(self, h: Held, dropped: Callable[[Outcome], None]) -> Outcome | None:
        """Wait for ``h``'s decision; None when ``timeout_s`` ran out first (it has left the hold).

        Cancelled (its client went away): it leaves the hold and the cancellation goes on; a decision
        that had come already is handed to ``dropped`` (a forward was counted in flight).
        """
        remaining = self.timeout_s - (self._mono() - h.since)
        try:
            if remaining > 0:
                await asyncio.wait({h.future}, timeout=remaining)
        except asyncio.CancelledError:
            self.leave(h)
            if h.future.done() and not h.future.cancelled():
                dropped(h.future.result())
            h.future.cancel()
            raise
        if h.future.done():
            return h.future.result()
        self.leave(h)
        h.future.cancel()
        return None

    def take_switch_figures(self) -> tuple[int, float]:
        """(held, longest_s) of the switch that ends now, counting those still held; reset."""
        figures = (self.switch_count, max(self.switch_longest_s, self.oldest_s()))
        self.switch_count = 0
        self.switch_longest_s = 0.0
        return figures
