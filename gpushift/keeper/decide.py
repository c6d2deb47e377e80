"""L3: the keeper's decision — a pure function from a snapshot of the world to actions.

:func:`decide` sees everything as plain values in a :class:`Snapshot` (the time, the schedule, the
override, what runs and whether its unit failed by itself, what gpushift last established, the
attempts at the current boundary) and returns a :class:`Decision`: the actions to execute, in order,
and the keeper's new bookkeeping.  No thread, no bus, no clock: the decision table is a unit test.

The rules, in order:

1. an override whose time is up ends;
2. what runs is compared with what gpushift last established; a difference no switch of ours
   explains is a person's ``systemctl`` — an *external* override until the next boundary, recorded
   in the ledger, never undone before then — except a backend whose unit *failed* by itself, which
   is adopted as "off" so that the schedule brings it back;
3. in ``schedule`` mode, the backend in effect (the entry that fired most recently at or before
   now) is switched to, unless this boundary already failed ``max_attempts`` times, the last
   failure is more recent than ``retry_after_s``, or a person cancelled the switch (then it waits
   for the next boundary or ``gpushift resume``).

A clock jump is nothing special: it is a snapshot with a different ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..model import OFF, Trigger
from ..schedule import Schedule
from .override import Override, external_override


@dataclass(frozen=True)
class Attempts:
    """The scheduled switches tried for one boundary (``fire_at``, ``target``)."""

    fire_at: datetime
    target: str
    failures: int = 0
    last_failure_mono: float = 0.0
    last_message: str = ""
    cancelled_by: str | None = None  # a person cancelled it: no retry before the next boundary


def after_result(
    attempts: Attempts | None, ok: bool, message: str, ended_mono: float, cancelled_by: str | None = None
) -> Attempts | None:
    """The attempts once a scheduled switch of the keeper's has ended."""
    if ok or attempts is None:
        return attempts
    return replace(
        attempts,
        failures=attempts.failures + 1,
        last_failure_mono=ended_mono,
        last_message=message[:300],
        cancelled_by=cancelled_by,
    )


@dataclass(frozen=True)
class Snapshot:
    """Everything one decision looks at."""

    now: datetime
    mono: float
    trigger: Trigger
    schedule: Schedule | None
    override: Override | None
    busy: bool  # a switch is running (or started while the snapshot was taken)
    established: str | None  # what gpushift last established; None: not known yet
    running: tuple[str, ...]  # backends whose unit runs, in config order
    failed: frozenset[str] = frozenset()  # backends whose unit failed by itself
    attempts: Attempts | None = None
    blocked: str | None = None
    max_attempts: int = 3
    retry_after_s: float = 30.0


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class SetOverride:
    """Write (or clear, with None) the override and persist it."""

    override: Override | None


@dataclass(frozen=True)
class Adopt:
    """Take ``backend`` as what gpushift established (``force``: replace a known value)."""

    backend: str
    force: bool = False


@dataclass(frozen=True)
class RecordExternal:
    """A change made outside gpushift: a ledger row, and adopt it."""

    was: str
    now: str


@dataclass(frozen=True)
class Switch:
    """Ask the switcher for a switch (the way a person does)."""

    target: str
    reason: str
    trigger: Trigger
    actual: str


@dataclass(frozen=True)
class Log:
    level: str  # info | warning
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = SetOverride | Adopt | RecordExternal | Switch | Log


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    summary: str  # one line for logs and `gpushift resume` (a Switch adds its ticket)
    attempts: Attempts | None
    blocked: str | None


def decide(s: Snapshot) -> Decision:
    """The keeper's decision table (see the module docstring)."""
    if s.busy:
        return Decision((), "a switch is running; deciding after it", s.attempts, s.blocked)
    actions: list[Action] = []
    ov = s.override
    # 1. an override whose time is up
    if ov is not None and ov.ended(s.now):
        assert ov.until is not None
        actions += [Log("info", "override_ended", {"backend": ov.backend, "until": ov.until.isoformat()})]
        actions += [SetOverride(None)]
        ov = None
    # 2. what runs, against what gpushift established
    running = s.running
    if len(running) > 1:
        return Decision(
            tuple(actions),
            f"several backends run ({', '.join(running)}); waiting for a person",
            s.attempts,
            s.blocked,
        )
    actual = running[0] if running else OFF
    if s.established is None:
        actions.append(Adopt(actual))
    elif actual != s.established and actual == OFF and s.established in s.failed:
        # Not a person: the backend died by itself (unit "failed").  Adopt "off" and let the
        # schedule bring it back, with the same bounded retries as any scheduled switch.
        detail = "its unit failed on its own; the schedule decides what runs next"
        actions += [Log("warning", "backend_crashed", {"backend": s.established, "detail": detail})]
        actions += [Adopt(OFF, force=True)]
    elif actual != s.established:
        ov = external_override(ov, s.schedule, s.established, actual, s.now)
        actions += [SetOverride(ov)]
        detail = "not undone before the next schedule boundary"
        actions += [
            Log("warning", "external_change", {"was": s.established, "now": actual, "detail": detail})
        ]
        actions += [RecordExternal(s.established, actual)]
    # 3. the schedule
    if s.schedule is None:
        return Decision(tuple(actions), f"{actual} serves (no schedule)", s.attempts, s.blocked)
    if ov is not None:
        until = f" until {ov.until.isoformat()}" if ov.until else ""
        return Decision(tuple(actions), f"{ov.mode}{until}: keeping {actual}", s.attempts, s.blocked)
    fire = s.schedule.in_effect(s.now)
    if fire is None:
        return Decision(
            tuple(actions), f"{actual} serves (no schedule entry has fired yet)", s.attempts, s.blocked
        )
    wants = fire.target
    if wants == actual:
        return Decision(tuple(actions), f"{actual} serves as the schedule wants", s.attempts, None)
    a, blocked = s.attempts, s.blocked
    if a is None or a.fire_at != fire.at or a.target != wants:
        a, blocked = Attempts(fire.at, wants), None
    if a.failures >= s.max_attempts or a.cancelled_by is not None:
        nxt = s.schedule.next_boundary(s.now)
        when = nxt.at.isoformat() if nxt else "never"
        if a.cancelled_by is not None:
            blocked = (
                f"the switch to {wants} was cancelled by {a.cancelled_by}; waiting for the next boundary "
                f"({when}) or `gpushift resume`"
            )
        else:
            blocked = (
                f"gave up switching to {wants} after {a.failures} failed attempts "
                f"(last: {a.last_message}); waiting for the next boundary ({when}) or a person"
            )
        return Decision(tuple(actions), blocked, a, blocked)
    since_failure = s.mono - a.last_failure_mono
    if a.failures and since_failure < s.retry_after_s:
        return Decision(
            tuple(actions), f"retrying {wants} in {s.retry_after_s - since_failure:.0f}s", a, blocked
        )
    reason = fire.describe()  # "schedule line N (fields) fired at T", naming a calendar exception
    actions.append(Switch(wants, reason, s.trigger, actual))
    return Decision(tuple(actions), f"switching {actual} -> {wants}", a, blocked)
