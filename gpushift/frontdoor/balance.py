"""Which instance of a backend of several gets a request (issue 23 item 4): :class:`Picker`.

Pure: no clock, no I/O.  A backend with ``instances`` is one upstream per instance (the origin of
that instance's ``health_url``); the front door keeps one :class:`Picker` per such backend
(``frontdoor/instances.py``) and asks it for every request it forwards there:

* among the instances that are up, the one with the fewest requests in flight;
* a tie goes round robin: the scan starts after the instance picked last;
* ``exclude`` names the instances already tried for this request (their connect was refused), so
  a retry goes to another one;
* when every instance left is marked down, the least busy of them all is tried anyway (a mark can
  be stale, and trying costs only a refused connect); when none is left, there is none (the
  request gets the front door's 502).

An instance is marked down (:meth:`Picker.mark`) on a refused connect, a request that broke there
or a failed health probe, and up again when its health answers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


class Picker:
    """The instances of one backend: their requests in flight, whether each is up, and whose turn."""

    def __init__(self, names: Sequence[str]) -> None:
        if not names:
            raise ValueError("a picker needs at least one instance")
        self.names = tuple(names)
        self.in_flight = [0] * len(self.names)
        self.up = [True] * len(self.names)
        self._next = 0  # where the next scan starts: after the one picked last

    def __len__(self) -> int:
        return len(self.names)

    def pick(self, exclude: Collection[int] = ()) -> int | None:
        """The instance for the next request (None: every one is in ``exclude``)."""
        n = len(self.names)
        order = [(self._next + k) % n for k in range(n)]
        left = [i for i in order if i not in exclude]
        if not left:
            return None
        live = [i for i in left if self.up[i]] or left
        fewest = min(self.in_flight[i] for i in live)
        chosen = next(i for i in live if self.in_flight[i] == fewest)
        self._next = (chosen + 1) % n
        return chosen

    def begin(self, i: int) -> None:
        """A request was given to instance ``i``."""
        self.in_flight[i] += 1

    def end(self, i: int) -> None:
        """A request of instance ``i`` ended (answered, failed or its client gone)."""
        if self.in_flight[i] > 0:
            self.in_flight[i] -= 1

    def mark(self, i: int, up: bool) -> bool:
        """Mark instance ``i`` up or down; whether that changed anything."""
        changed = self.up[i] != up
        self.up[i] = up
        return changed

    def all_up(self) -> list[int]:
        """Mark every instance up (the backend starts serving again); those that were down."""
        were = [i for i, u in enumerate(self.up) if not u]
        self.up = [True] * len(self.names)
        return were

    def total_in_flight(self) -> int:
        return sum(self.in_flight)
