"""A switch and the front door: close the old backend as the drain begins, release the held
requests as the switch ends (docs/design.md "The front door's part in a switch").

With a ``[frontdoor]`` table (``Ports.frontdoor`` set):

* the drain's start calls ``Close(old)`` for each backend it stops (also with ``--now``): nothing
  new is forwarded there, and the answer is the requests still in flight;
* the drain waits until the larger of the front door's ``InFlight(old)`` and the backend's own
  metrics count is 0, or ``drain_timeout_s`` (:func:`larger`: a count that cannot be told does
  not count; both unknown is unknown);
* every switch that wrote a row calls ``Release(serving now)`` before the row closes (served,
  rolled back, failed, cancelled, refused, to ``off``): the held requests go to what serves after
  it, and the row records the answer as ``extra.frontdoor``.

The front door's adapter never raises (an absent or slow front door answers None within
``bus_timeout_s``): a switch neither fails nor waits longer for it.  Without the table nothing
here calls anything.
"""

from __future__ import annotations

from typing import Any

from gpushift.config.instances import units_of, view
from gpushift.config.schema import BackendConfig, Config
from gpushift.errors import GpushiftError
from gpushift.ports import FrontDoorPort, Ports
from gpushift.switch.run import SwitchRun
from gpushift.values import OFF, Outcome, SwitchRecord

#: The key of the ledger row's ``extra`` that holds the front door's answer (docs/ledger.md).
KEY = "frontdoor"


def larger(a: int | None, b: int | None) -> int | None:
    """The larger of two request counts where either may be unknown (None): the known one when
    only one is known, None when neither is."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def close(ports: Ports, run: SwitchRun, b: BackendConfig) -> int | None:
    """``Close(b)`` as the drain of ``b`` begins; the front door's count in flight there (None: no
    front door, or it did not answer).  Noted on the run's plan for the row."""
    fd = ports.frontdoor
    if fd is None:
        return None
    n = fd.close(b.name)
    if run.plan is not None:
        run.plan.closed[b.name] = n
    return n


class DrainCount:
    """The drain's count of ``b``: the larger of its own metrics and the front door's, starting
    from the front door's answer to Close (``at_close``).  A front door that did not answer (Close,
    or an InFlight since) is not asked again during this drain: each call could cost its
    ``bus_timeout_s``, and the backend's own count still stands."""

    def __init__(
        self, ports: Ports, b: BackendConfig, at_close: int | None, cgroup: str | None = None
    ) -> None:
        self.ports, self.b, self.cgroup = ports, b, cgroup  # cgroup: only the unit's own answers count
        # A backend of several instances (issue 23): each running instance's own count, with its
        # own cgroup, summed (the known ones; unknown only when none is known).
        self.members = [
            (view(b, i), st.control_group) for i in b.instances if (st := ports.units.state(i.unit)).running
        ]
        self.asking = ports.frontdoor is not None and at_close is not None
        self.first = larger(self._own(), at_close)

    def _own(self) -> int | None:
        if not self.b.instances:
            return self.ports.probe.in_flight(self.b, self.cgroup)
        known = [n for n in (self.ports.probe.in_flight(v, cg) for v, cg in self.members) if n is not None]
        return sum(known) if known else None

    def now(self) -> int | None:
        own = self._own()
        fd = self.ports.frontdoor
        theirs = fd.in_flight(self.b.name) if self.asking and fd is not None else None
        if theirs is None:
            self.asking = False
        return larger(own, theirs)


def serving_now(ports: Ports, run: SwitchRun, rec: SwitchRecord, config: Config | None) -> str:
    """What serves as the row closes: the target of a switch that served, the rollback's
    destination, what ran before for one that touched nothing, else what systemd runs now
    (``off`` when nothing, or when it cannot be asked)."""
    if rec.outcome == Outcome.OK.value:
        return run.target
    rollback = rec.extra.get("rollback")
    if rec.outcome == Outcome.ROLLED_BACK.value and isinstance(rollback, dict) and rollback.get("to"):
        return str(rollback["to"])
    if not run.touched:
        return run.previous[0] if run.previous else OFF
    if config is None:
        return OFF
    for name, b in config.backends.items():
        try:
            if any(ports.units.state(u).running for u in units_of(b)):
                return name
        except GpushiftError:
            continue
    return OFF


def release(ports: Ports, run: SwitchRun, rec: SwitchRecord, config: Config | None) -> None:
    """``Release(serving now)`` as the row closes; its answer into ``rec.extra["frontdoor"]``."""
    fd = ports.frontdoor
    if fd is None:
        return
    closed = run.plan.closed if run.plan is not None else {}
    rec.extra[KEY] = release_to(fd, serving_now(ports, run, rec, config), closed)


def release_to(fd: FrontDoorPort, serving: str, closed: dict[str, int | None]) -> dict[str, Any]:
    """``Release(serving)`` and the row's ``extra.frontdoor``: ``held``, ``longest_s`` (or
    ``error``), ``in_flight_at_close`` (the front door's counts when the drain closed ``closed``,
    summed; None when none was known), ``serving``, and ``closed`` when something was."""
    known = [n for n in closed.values() if n is not None]
    got = fd.release(serving)
    entry: dict[str, Any] = {"serving": serving, "in_flight_at_close": sum(known) if known else None}
    if closed:
        entry["closed"] = list(closed)
    if got is None:
        entry["error"] = fd.last_error("release") or "the front door did not answer"
    else:
        entry["held"], entry["longest_s"] = got[0], round(got[1], 3)
    return entry
