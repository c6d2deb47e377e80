"""The keeper's decision — a pure function from a snapshot of the world to actions.

:func:`decide` sees everything as plain values in a :class:`Snapshot` (the time, the schedule, the
override, what runs and whether its unit failed by itself, what gpushift last established, the
attempts at the current boundary) and returns a :class:`Decision`: the actions to execute, in order,
and the keeper's new bookkeeping.  No thread, no bus, no clock: the decision table is a unit test.

The rules, in order:

1. an override whose time is up ends;
2. what happened to the serving backend (:mod:`.watch`): an exit by itself or a wedge is an
   *incident* — a ledger row, and the backend is to be relaunched (``on_crash = "restart"``); a
   relaunch behind gpushift's back gets a row; any other difference between what runs and what
   gpushift established is a person's ``systemctl`` — an *external* override until the next
   boundary, recorded in the ledger, never undone before then;
3. what is wanted — the override's backend, else the schedule's (the entry that fired most
   recently at or before now), else the backend being relaunched — is switched to, unless that
   target already failed ``max_attempts`` times here, the last failure is more recent than
   ``retry_after_s``, a person cancelled the switch (then it waits for the next boundary or
   ``gpushift resume``), or it is a crashed backend whose ``on_crash`` is ``stay``; a crashed
   backend whose relaunches all failed gives way, once, to the backend that served before it
   (``on_failure = "rollback"``, :mod:`.fallback`).

Before the rules, the switches that ended since the last decision (``Snapshot.ended``) are taken
into account: a failed switch of the keeper's own counts as an attempt, a backend that was brought
back ends its relaunch, and a person's switch that did not happen leaves the override on what runs.

A switch somebody asks for now (``Snapshot.asked``: a person's ``SwitchTo``, or recovery at daemon
start) is a decision too, made apart from the rules: the switch is asked for first (so that a
refusal — ``SwitchInProgress``, ``UnknownBackend`` — changes nothing), then a person's override is
kept; ``--when-idle`` only keeps the override (the rules switch once the backend is idle).

A clock jump is nothing special: it is a snapshot with a different ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from gpushift.keeper.fallback import fall_back
from gpushift.keeper.override import Override, after_failed_manual, external_override, manual_override
from gpushift.keeper.watch import Incident
from gpushift.schedule import Fire, Schedule
from gpushift.values import OFF, Caller, Outcome, Trigger


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
class WatchSettings:
    """Per backend: what to do when it crashes, how long a failing health URL is tolerated, and how
    long a scheduled boundary may wait for it to be idle (0: it does not wait)."""

    on_crash: str = "restart"
    unhealthy_after_s: float = 120.0
    defer_while_busy_s: float = 0.0
    idle_s: float = 5.0
    instances: tuple[str, ...] = ()  # a backend of several instances: their units (issue 23)
    min_ready: int = 1  # ... and how many of them must run for it to serve


#: ``gpushift switch --when-idle`` waits at most this long when the backend sets no limit.
WHEN_IDLE_LIMIT_S = 600.0


@dataclass(frozen=True)
class Deferral:
    """A switch to ``target`` waiting for the serving backend to be idle (a boundary, or a person's
    ``--when-idle``), since ``since`` and at most until :meth:`until`."""

    key: datetime  # the boundary's fire time (or the override's set_at): a new one is a new wait
    target: str
    since: datetime
    since_mono: float
    limit_s: float
    idle_s: float

    def until(self) -> datetime:
        return self.since + timedelta(seconds=self.limit_s)


@dataclass(frozen=True)
class Relaunch:
    """A backend that crashed or wedged, to be brought back (through the whole gate)."""

    backend: str
    since: datetime  # when it was noticed (the attempts' key, like a boundary's fire time)
    why: str
    restart: bool  # it still runs (wedged): stop it and start it again
    before: str | None = None  # the backend that served before it (the fallback's target)
    fell_back: bool = False  # its relaunches gave up and the fallback was asked for
    converge: bool = False  # it serves on its other instances: start those that are down (issue 23)
    hung: tuple[str, ...] = ()  # ... and restart these instances alone (running, health failing)


@dataclass(frozen=True)
class Ask:
    """A switch somebody asks for now: a person's (trigger ``manual``: ``gpushift switch``, the
    ``SwitchTo`` call) or recovery's at daemon start (trigger ``recovery``)."""

    target: str
    reason: str
    caller: Caller
    trigger: Trigger = Trigger.MANUAL
    skip_drain: bool = False  # --now
    relaunch: bool = False  # --restart: the target runs: stop it and start it again
    hold: bool = False
    until: datetime | None = None
    when_idle: bool = False  # the keeper switches once the serving backend is idle
    recovery_attempt: int = 0  # recovery: its number in a row


@dataclass(frozen=True)
class Ended:
    """A switch that ended since the last decision (from the switcher's finished runs)."""

    target: str
    trigger: Trigger
    ok: bool
    message: str
    ended_mono: float
    cancelled_by: str | None = None


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
    incident: Incident | None = None  # what happened to the established backend by itself
    relaunched: str | None = None  # the established backend was relaunched behind gpushift's back
    relaunch: Relaunch | None = None  # a crashed/wedged backend still to be brought back
    settings: Mapping[str, WatchSettings] = field(default_factory=dict)  # per backend
    in_flight: int | None = None  # the serving backend's requests in flight (None: cannot tell)
    idle_for_s: float | None = None  # how long it has had none (None: it has some, or unknown)
    deferral: Deferral | None = None  # a switch waiting for an idle moment
    attempts: Attempts | None = None
    blocked: str | None = None
    max_attempts: int = 3
    retry_after_s: float = 30.0
    ended: tuple[Ended, ...] = ()  # switches that ended since the last decision (read with ``running``)
    active: tuple[str, ...] | None = None  # units systemd reports running, auto-restart included
    asked: Ask | None = None  # a switch asked for now (then nothing else is decided)
    before: str | None = None  # the backend that served before the established one (None: unknown)
    on_failure: str = "rollback"


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
class RecordRelaunch:
    """The serving backend was relaunched outside gpushift: a ledger row with its launch."""

    backend: str
    detail: str


@dataclass(frozen=True)
class RecordIncident:
    """The serving backend crashed or wedged: a ledger row (outcome crashed | unhealthy)."""

    incident: Incident


@dataclass(frozen=True)
class Switch:
    """Ask the switcher for a switch (the executor is the one caller of its ``request``)."""

    target: str
    reason: str
    trigger: Trigger
    actual: str  # what runs as decided ("" for a switch asked for: not read)
    relaunch: bool = False  # the target runs: stop it and start it again
    details: dict[str, Any] = field(default_factory=dict)  # facts for the ledger row (named keys)
    caller: Caller = field(default_factory=Caller.daemon)
    skip_drain: bool = False
    verify_running: bool = False  # a running target is health-checked and its launch recorded
    recovery_attempt: int = 0
    restart_instances: tuple[str, ...] = ()  # with verify_running: these instances are restarted alone


@dataclass(frozen=True)
class Log:
    level: str  # info | warning
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = SetOverride | Adopt | RecordExternal | RecordRelaunch | RecordIncident | Switch | Log


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    summary: str  # one line for logs and `gpushift resume` (a Switch adds its ticket)
    attempts: Attempts | None
    blocked: str | None
    relaunch: Relaunch | None = None
    deferral: Deferral | None = None


def _defer(
    s: Snapshot, actual: str, wants: str, key: datetime, limit_s: float, details: dict[str, Any]
) -> tuple[Deferral | None, str | None]:
    """Wait for ``actual`` to be idle before switching to ``wants``? (the deferral, and the summary
    while it waits; a finished wait is described in ``details`` for the row)."""
    ws = s.settings.get(actual, WatchSettings())
    d = s.deferral if s.deferral is not None and (s.deferral.key, s.deferral.target) == (key, wants) else None
    if d is None:
        d = Deferral(key, wants, s.now, s.mono, limit_s, ws.idle_s)
    waited = s.mono - d.since_mono
    idle = s.idle_for_s is not None and s.idle_for_s >= d.idle_s
    if s.in_flight is None and s.idle_for_s is None and s.deferral is None:
        idle = True  # its gauges cannot tell: a busy moment cannot be told from an idle one
    # (once waiting, a reading that cannot be told for a moment does not end the wait: the limit does)
    if not idle and waited < d.limit_s:
        n = "some" if s.in_flight is None else str(s.in_flight)
        summary = (
            f"deferred until {d.until().isoformat()} at the latest: {actual} has {n} request(s) in flight "
            f"(switching to {wants} after {d.idle_s:g}s without one)"
        )
        return d, summary
    if waited > 0:
        ended = "idle" if idle else "limit"
        details["deferral"] = {"since": d.since.isoformat(), "waited_s": round(waited, 1), "ended": ended}
    return None, None


def _watch(
    s: Snapshot, actual: str, actions: list[Action], ov: Override | None
) -> tuple[Override | None, Relaunch | None]:
    """Rule 2: what happened to the established backend; returns the override and relaunch after it."""
    relaunch = s.relaunch
    est = s.established
    if est is None:
        actions.append(Adopt(actual))
        return ov, relaunch
    inc = s.incident
    if inc is not None:
        fields = {"backend": inc.backend, "outcome": inc.outcome.value, "detail": inc.detail}
        actions += [Log("warning", f"backend_{inc.outcome.value}", fields), RecordIncident(inc)]
        if not inc.serving_again:
            wedged = inc.restart if inc.unit else inc.outcome is Outcome.UNHEALTHY  # an instance's: it says
            relaunch = Relaunch(
                inc.backend, s.now, inc.detail, wedged, s.before, converge=inc.converge, hung=inc.hung
            )
            if not wedged and not inc.converge:
                actions.append(Adopt(OFF, force=True))  # it is gone: what serves now is nothing
        return ov, relaunch
    if s.relaunched is not None and actual == est:
        actions += [Log("warning", "external_relaunch", {"backend": est, "detail": s.relaunched})]
        actions.append(RecordRelaunch(est, s.relaunched))
    elif actual != est and not (relaunch is not None and est == OFF):
        ov = external_override(ov, s.schedule, est, actual, s.now)
        actions += [SetOverride(ov)]
        detail = "not undone before the next schedule boundary"
        actions += [Log("warning", "external_change", {"was": est, "now": actual, "detail": detail})]
        actions += [RecordExternal(est, actual)]
        relaunch = None  # a person decided what runs
    return ov, relaunch


def _ended(s: Snapshot) -> Snapshot:
    """The snapshot once the switches that ended since the last decision are taken into account."""
    attempts, relaunch, ov = s.attempts, s.relaunch, s.override
    active = s.active if s.active is not None else s.running
    actual = active[0] if len(active) == 1 else OFF
    for e in s.ended:
        if e.trigger is Trigger.MANUAL:  # a person's: the override follows what runs if it failed
            if not e.ok:
                ov = after_failed_manual(ov, e.target, actual) or ov
            continue
        attempts = after_result(attempts, e.ok, e.message, e.ended_mono, e.cancelled_by)
        if e.ok and relaunch is not None and e.target == relaunch.backend:
            relaunch = None  # brought back
    return replace(s, attempts=attempts, relaunch=relaunch, override=ov, ended=())


def _asked(s: Snapshot, a: Ask) -> Decision:
    """A switch asked for now: the switch first, then (a person's) the override it keeps."""
    if a.trigger is Trigger.RECOVERY:
        sw = Switch(
            a.target, a.reason, a.trigger, "", verify_running=True, recovery_attempt=a.recovery_attempt
        )
        return Decision((sw,), f"recovering to {a.target}", s.attempts, s.blocked, s.relaunch, s.deferral)
    ov = manual_override(s.now, s.schedule, a.target, a.caller.user, a.hold, a.until, a.reason, a.when_idle)
    keep = SetOverride(ov)
    # A person acted: an old "gave up" no longer describes the state, and nothing is relaunched.
    if a.when_idle:
        return Decision((keep,), f"{ov.mode} of {a.target} once idle", s.attempts, None, None, s.deferral)
    sw = Switch(
        a.target, a.reason, a.trigger, "", relaunch=a.relaunch, caller=a.caller, skip_drain=a.skip_drain
    )
    return Decision((sw, keep), f"switching to {a.target}", s.attempts, None, None, s.deferral)


def _wanted(
    fire: Fire | None, ov: Override | None, relaunch: Relaunch | None
) -> tuple[str, datetime, str] | None:
    """Rule 3's target: (backend, the attempts' key, why), or None when nothing is wanted."""
    if ov is not None:
        return ov.backend, ov.set_at, f"{ov.mode} of {ov.backend}"
    if fire is not None:
        return fire.target, fire.at, fire.describe()  # "schedule line N (fields) fired at T"
    if relaunch is not None:
        return relaunch.backend, relaunch.since, relaunch.why
    return None


def _fall_back(
    s: Snapshot, a: Attempts, relaunch: Relaunch, actual: str, when: str, blocked: str
) -> tuple[str, Decision | None]:
    """A relaunch that gave up: what ``status`` says, and the switch to the backend that served
    before the crashed one when it is to be tried now (:mod:`.fallback`)."""
    fb = fall_back(
        relaunch.backend, relaunch.before, relaunch.fell_back, a.failures, a.last_message, actual,
        s.on_failure, when,
    )  # fmt: skip
    if fb is None or fb.target is None:
        return (blocked if fb is None else fb.blocked), None
    details = {"fallback": {"from": relaunch.backend, "failed_relaunches": a.failures}}
    sw = Switch(fb.target, fb.reason, Trigger.ROLLBACK, actual, details=details)
    fell = replace(relaunch, fell_back=True)
    return fb.blocked, Decision((sw,), f"falling back to {fb.target}: {fb.reason}", a, fb.blocked, fell)


def _attempt(
    s: Snapshot, wants: str, key: datetime, relaunch: Relaunch | None, actual: str
) -> tuple[Attempts, str | None, Decision | None]:
    """The attempts at (``key``, ``wants``), and the decision when they say wait (gave up — or fall
    back, for a relaunch —, cancelled, or too soon after a failure)."""
    a: Attempts | None = s.attempts
    blocked: str | None = s.blocked
    if a is None or a.fire_at != key or a.target != wants:
        a, blocked = Attempts(key, wants), None
    if a.failures >= s.max_attempts or a.cancelled_by is not None:
        nxt = s.schedule.next_boundary(s.now) if s.schedule is not None else None
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
            if relaunch is not None and relaunch.backend == wants:
                blocked, fell = _fall_back(s, a, relaunch, actual, when, blocked)
                if fell is not None:
                    return a, blocked, fell
        return a, blocked, Decision((), blocked, a, blocked, relaunch)
    since_failure = s.mono - a.last_failure_mono
    if a.failures and since_failure < s.retry_after_s:
        summary = f"retrying {wants} in {s.retry_after_s - since_failure:.0f}s"
        return a, blocked, Decision((), summary, a, blocked, relaunch)
    return a, blocked, None


def decide(s: Snapshot) -> Decision:
    """The keeper's decision table (see the module docstring)."""
    if s.asked is not None:
        return _asked(s, s.asked)
    was = s.override
    s = _ended(s) if s.ended else s
    actions: list[Action] = [SetOverride(s.override)] if s.override is not was else []
    if s.busy:
        return Decision(
            tuple(actions), "a switch is running; deciding after it", s.attempts, s.blocked, s.relaunch
        )
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
        why = f"several backends run ({', '.join(running)}); waiting for a person"
        return Decision(tuple(actions), why, s.attempts, s.blocked, s.relaunch)
    actual = running[0] if running else OFF
    ov, relaunch = _watch(s, actual, actions, ov)
    # 3. what is wanted
    fire = s.schedule.in_effect(s.now) if s.schedule is not None else None
    if relaunch is not None and fire is not None and fire.at > relaunch.since:
        relaunch = None  # a boundary since: the schedule decides afresh
    wanted = _wanted(fire, ov, relaunch)
    if wanted is None:
        summary = (
            f"{actual} serves (no schedule)"
            if s.schedule is None
            else f"{actual} serves (no schedule entry has fired yet)"
        )
        return Decision(tuple(actions), summary, s.attempts, s.blocked, relaunch)
    wants, key, why = wanted
    bringing_back = relaunch is not None and relaunch.backend == wants
    restart = bringing_back and relaunch is not None and relaunch.restart and actual == wants
    converge = bringing_back and relaunch is not None and relaunch.converge and actual == wants
    if wants == actual and not restart and not converge:
        if ov is not None:
            until = f" until {ov.until.isoformat()}" if ov.until else ""
            summary = f"{ov.mode}{until}: keeping {actual}"
        else:
            summary = f"{actual} serves as the schedule wants"
        done = None if relaunch is not None and relaunch.backend == actual else relaunch
        return Decision(tuple(actions), summary, s.attempts, None, done)
    if bringing_back and s.settings.get(wants, WatchSettings()).on_crash == "stay":
        stay = (
            f'{wants} crashed or wedged ({relaunch.why if relaunch else ""}); on_crash = "stay": '
            "nothing relaunches it before the next boundary, `gpushift switch` or `gpushift resume`"
        )
        return Decision(tuple(actions), stay, s.attempts, stay, relaunch)
    if relaunch is not None and bringing_back:
        key = relaunch.since
    details: dict[str, Any] = {}
    if fire is not None and fire.exception and ov is None:
        details["calendar_exception"] = fire.exception
    if actual != OFF and not bringing_back:
        ws = s.settings.get(actual, WatchSettings())
        limit = ws.defer_while_busy_s if ov is None else 0.0
        if ov is not None and ov.when_idle:
            limit = ws.defer_while_busy_s or WHEN_IDLE_LIMIT_S
        if limit > 0:
            deferral, waiting = _defer(s, actual, wants, key, limit, details)
            if waiting is not None:
                return Decision(tuple(actions), waiting, s.attempts, s.blocked, relaunch, deferral)
    a, blocked, wait = _attempt(s, wants, key, relaunch, actual)
    if wait is not None:
        return replace(wait, actions=(*actions, *wait.actions))
    trigger = Trigger.RECOVERY if bringing_back else s.trigger
    reason = f"relaunch: {relaunch.why}" if bringing_back and relaunch is not None else why
    verify = restart or converge  # converge: start what is down of it (issue 23), the rest serves on
    again = relaunch.hung if converge and relaunch is not None else ()  # and restart its hung instances
    sw = Switch(wants, reason, trigger, actual, restart, details, verify_running=verify)
    actions.append(replace(sw, restart_instances=again))
    verb = "relaunching" if restart else "switching"
    return Decision(tuple(actions), f"{verb} {actual} -> {wants}", a, blocked, relaunch)
