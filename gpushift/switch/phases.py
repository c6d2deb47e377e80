"""The phases of one switch and which may follow which — the transition table.

A switch runs its phases in order (:class:`~gpushift.values.Phase`): preflight, the ledger's intent
row, the ``before_stop`` hook, drain, stop, the VRAM gate, start, readiness, the warm-up request,
the version probe, the ``after_ready`` hook, done.  A failure after something was touched turns to
the failure policy: ``rollback`` stops the target and brings the previous backend back through the
same gate (so rollback is followed by stop, release, start and ready again).  ``hooks`` after a
phase that is not a hook's is the ``on_failure`` hook, run as a failed row closes; ``done`` may
follow every phase (the end: served, refused, failed, rolled back, or a bug that ended it).

:data:`TRANSITIONS` is the table; :meth:`gpushift.switch.run.SwitchRun.advance` is the one way a
run changes phase and checks it.  A change the table does not allow is a bug: it raises
:class:`TransitionError` (a switcher built with ``strict_transitions=True``, as every test builds
it, lets it end the switch as an internal error); the daemon's switcher logs it loudly
(``switch_transition_invalid``) and goes on in the phase it was asked for — the switch in flight
is never abandoned half-way because of its own bookkeeping.  A report in the phase the run is
already in is not a transition (it only changes the detail line).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushift.values import Phase

P = Phase

#: The way out of every phase but ``done``: the end (served, refused, failed, or a bug).
ALWAYS: frozenset[Phase] = frozenset({P.DONE})

#: The phases a touched switch may fail in and turn to the failure policy from (rollback).
_TOUCHED = (P.STOP, P.RELEASE, P.START, P.READY, P.WARMUP, P.VERSION, P.HOOKS)

_NEXT: dict[Phase, frozenset[Phase]] = {
    # HOOKS after a phase: the on_failure hook as the row closes (refused, cancelled, failed, stay)
    P.PREFLIGHT: frozenset({P.INTENT, P.HOOKS}),
    # nothing to stop: straight to the gate, or (the target already runs alone: recovery) to ready
    P.INTENT: frozenset({P.HOOKS, P.DRAIN, P.RELEASE, P.READY}),
    P.DRAIN: frozenset({P.STOP, P.HOOKS}),  # every backend is drained, then every one is stopped
    P.STOP: frozenset({P.RELEASE, P.READY, P.ROLLBACK, P.HOOKS}),  # READY: the target ran beside
    P.RELEASE: frozenset({P.START, P.ROLLBACK, P.HOOKS}),
    P.START: frozenset({P.READY, P.ROLLBACK, P.HOOKS}),
    P.READY: frozenset({P.WARMUP, P.VERSION, P.ROLLBACK, P.HOOKS}),
    P.WARMUP: frozenset({P.VERSION, P.ROLLBACK}),
    P.VERSION: frozenset({P.HOOKS, P.ROLLBACK}),  # HOOKS: after_ready
    # before_stop is followed by what follows the intent row; after_ready (a cancel in it) by rollback
    P.HOOKS: frozenset({P.DRAIN, P.RELEASE, P.READY, P.ROLLBACK}),
    # the failed target is stopped, then the previous backend passes the gate and starts
    P.ROLLBACK: frozenset({P.STOP, P.RELEASE}),
    P.DONE: frozenset(),
}

#: Which phase may follow which (a phase to itself is no transition).
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    p: nxt | ALWAYS if p is not P.DONE else nxt for p, nxt in _NEXT.items()
}

assert set(TRANSITIONS) == set(Phase), "every phase has a row in the table"
assert all(P.ROLLBACK in TRANSITIONS[p] for p in _TOUCHED)
assert all(p not in nxt for p, nxt in TRANSITIONS.items()), "staying in a phase is no transition"


class TransitionError(RuntimeError):
    """A phase change the table does not allow: a bug in the switch's order."""

    def __init__(self, ticket: str, was: Phase, to: Phase) -> None:
        allowed = ", ".join(sorted(p.value for p in TRANSITIONS[was])) or "nothing (the run ended)"
        super().__init__(
            f"switch {ticket}: {was.value} -> {to.value} is not in the table (allowed: {allowed})"
        )
        self.ticket = ticket
        self.was = was
        self.to = to


def allowed(was: Phase, to: Phase) -> bool:
    """May a run in ``was`` go to ``to``? (staying in a phase is always allowed: no transition)."""
    return was is to or to in TRANSITIONS[was]


def edges() -> frozenset[tuple[Phase, Phase]]:
    """Every allowed transition as (from, to)."""
    return frozenset((a, b) for a, nxt in TRANSITIONS.items() for b in nxt)
