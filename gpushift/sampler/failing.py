"""How long a backend's health has failed without a break while its unit is active — for the
backend (:func:`unhealthy_since`) and, for a backend of several instances, for each instance
(:func:`instance_unhealthy`: a hung instance, issue 23).  Pure: figures in, a monotonic time out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushift.sampler.sample import BackendSample, Figure

__all__ = ["instance_unhealthy", "unhealthy_since"]


def unhealthy_since(
    prev: BackendSample | None,
    state: Figure[Any] | None,
    health: Figure[Any] | None,
    now: float,
    period_s: float,
) -> float | None:
    """Since when a backend's health has failed continuously while its unit is ``active``.

    Cleared by an OK answer, by the unit not being active, and by a new main process (a restarted
    server loads its model again).  A health endpoint that has not answered for two periods counts
    as failing from the moment that was noticed.  While the unit's state is unknown the previous
    value stands.
    """
    if state is None or state.value is None or state.stale(now, period_s):
        return prev.unhealthy_since if prev is not None else None
    unit = state.value
    if unit.active_state != "active":
        return None
    same_process = (
        prev is not None
        and prev.state is not None
        and prev.state.value is not None
        and prev.state.value.main_pid == unit.main_pid
    )
    before = prev.unhealthy_since if prev is not None and same_process else None
    if health is None:
        return before
    if health.stale(now, period_s):
        return before if before is not None else now
    if health.error is None and health.value is not None and health.value.ok:
        return None
    return before if before is not None else health.at


def instance_unhealthy(
    prev: BackendSample | None,
    b: Any,
    figures: Mapping[str, Figure[Any]],
    health: Sequence[tuple[str, Figure[Any]]],
    now: float,
    period_s: float,
) -> tuple[tuple[str, float], ...]:
    """Per instance of ``b`` (its config) whose health has failed without a break while its unit
    is active: (unit, since when), by the rule of :func:`unhealthy_since` applied to the instance's
    own unit figure (``figures["instance:UNIT"]``) and health figure, against ``prev``'s."""
    if not b.instances:
        return ()
    was_state = dict(prev.instances) if prev is not None else {}
    was_since = dict(prev.instance_unhealthy) if prev is not None else {}
    healths = dict(health)
    out = []
    for i in b.instances:
        u = i.unit
        before = BackendSample(u, u, "", None, state=was_state.get(u), unhealthy_since=was_since.get(u))
        since = unhealthy_since(before, figures.get(f"instance:{u}"), healths.get(u), now, period_s)
        if since is not None:
            out.append((u, since))
    return tuple(out)
