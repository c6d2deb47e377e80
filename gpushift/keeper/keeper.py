"""The keeper — obeys the schedule, yields to people, never fights them.

The keeper decides; the switcher acts.  Every decision is a call of :meth:`Keeper.tick` with the
time now: at daemon start, every ``reconcile_interval_s``, at each schedule boundary, after a
wall-clock jump, after a reload, after ``resume``.  A tick takes a :class:`~.decide.Snapshot`
through the narrow :class:`SwitchControl` interface, hands it to the pure :func:`~.decide.decide`,
and executes the actions it returns.  The mode survives restarts through an :class:`OverrideStore`.

Every switch is asked for here, and only here: the schedule's, the backend watcher's (a relaunch),
a person's (:meth:`Keeper.ask`, the daemon's ``SwitchTo``) and recovery's at daemon start
(:meth:`Keeper.recover`) are all decisions of :func:`~.decide.decide` that the executor
(:meth:`Keeper._start`) carries out with the switcher's ``request``.  How they ended comes back from
the switcher's finished runs (``take_finished``) into the next decision: the keeper keeps no ticket
of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from gpushift.errors import GpushiftError, SwitchInProgress
from gpushift.host.nulllog import NULL_LOG
from gpushift.keeper.coming import Coming, coming_switch
from gpushift.keeper.control import BackendWatch, SwitchControl
from gpushift.keeper.decide import (
    Adopt,
    Ask,
    Attempts,
    Decision,
    Deferral,
    Ended,
    Log,
    RecordExternal,
    RecordIncident,
    RecordRelaunch,
    Relaunch,
    SetOverride,
    Snapshot,
    Switch,
    WatchSettings,
    decide,
)
from gpushift.keeper.fallback import ledger_before, served_before
from gpushift.keeper.override import Override, OverrideStore
from gpushift.keeper.served import Served, next_served
from gpushift.keeper.watch import Observation, Seen, observe, observe_instances
from gpushift.ports import Ledger
from gpushift.schedule import Schedule
from gpushift.switch import Event, SwitchRun
from gpushift.values import OFF, Caller, EventKind, Mode, OverrideSource, Trigger

#: While a switch waits for an idle moment, the keeper looks again this often.
DEFER_CHECK_S = 1.0


class Keeper:
    """Args:
    switcher: the one writer; the keeper only asks it for switches.
    schedule: the parsed schedule, or None (then gpushift only switches when asked).
    store: where the override survives restarts.
    now: the wall clock (aware UTC); ``monotonic`` for retry spacing.
    max_attempts: failed scheduled switches per boundary before waiting for the next one.
    retry_after_s: spacing between those attempts.
    watch: the job watch and health history (None: a failed unit is a crash, an inactive one a
        person's stop, and nobody notices a wedged backend).
    on_failure: ``[daemon] on_failure``; ``"rollback"``: a crashed backend whose relaunches all
        failed gives way to the backend that served before it (:mod:`.fallback`).
    ledger: read once here, its newest rows, for who served before whom (None: nothing known yet).
    """

    def __init__(
        self,
        switcher: SwitchControl,
        schedule: Schedule | None,
        store: OverrideStore,
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
        log: Any = None,
        max_attempts: int = 3,
        retry_after_s: float = 30.0,
        watch: BackendWatch | None = None,
        settings: Mapping[str, WatchSettings] | None = None,
        on_failure: str = "rollback",
        ledger: Ledger | None = None,
    ) -> None:
        self.switcher = switcher
        self.schedule = schedule
        self.store = store
        self.now = now
        self.monotonic = monotonic
        self.log = log if log is not None else NULL_LOG
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.watch = watch
        self.settings: dict[str, WatchSettings] = dict(settings or {})
        self.on_failure = on_failure
        # (backend, the backend that served before it): the ledger's, then the last switch seen ok
        self.before = ledger_before(ledger, self.log) if ledger is not None else None
        self.seen: Seen | None = None
        self.seen_instances: dict[str, Seen] = {}  # a backend of several: each instance, by unit
        self.relaunch: Relaunch | None = None
        self.deferral: Deferral | None = None
        self.override: Override | None = store.load()
        self.attempts: Attempts | None = None
        self.blocked: str | None = None
        self.last_action: str = ""
        self._lock = threading.RLock()
        # NextServed's last answer: what it was computed from, the answer, its UNIX-seconds form
        self._served: tuple[tuple[Any, ...], Served, dict[str, int]] | None = None
        switcher.add_listener(self._on_switch_event)

    def _on_switch_event(self, event: Event) -> None:
        if event.kind is EventKind.FINISHED:
            self.seen = None  # our own switch changed the unit: look afresh

    # ------------------------------------------------------------ settings and people

    def set_schedule(self, schedule: Schedule | None) -> None:
        with self._lock:
            self.schedule = schedule
            self.attempts = None
            self.blocked = None

    def configure(
        self,
        max_attempts: int,
        retry_after_s: float,
        settings: Mapping[str, WatchSettings] | None = None,
        on_failure: str | None = None,
    ) -> None:
        """New settings (on reload); they apply from the next tick."""
        with self._lock:
            self.max_attempts = max_attempts
            self.retry_after_s = retry_after_s
            if on_failure is not None:
                self.on_failure = on_failure
            if settings is not None:
                self.settings = dict(settings)

    def ask(self, a: Ask) -> tuple[str | None, Override | None]:
        """A switch somebody asks for now (a person's, or recovery's): decided and carried out at
        once.  Returns its ticket (None: ``--when-idle``, the keeper switches later) and the
        override in force after it.

        Raises:
            UnknownBackend, SwitchInProgress: the switcher's refusal, as it gave it (nothing of the
                keeper changed).
        """
        with self._lock:
            busy, established = self.switcher.snapshot()
            # Nothing is read of systemd here: the switch's own preflight asks what runs.
            d = decide(replace(self._base(a.trigger, busy, established), asked=a))
            ticket: str | None = None
            for act in d.actions:
                if isinstance(act, Switch):
                    ticket = self._start(act, asked=True)
                else:
                    self._execute(act, d.summary)
            self._apply(d)
            return ticket, self.override

    def recover(self, target: str, reason: str, attempt: int) -> str:
        """Recovery's switch at daemon start (:mod:`gpushift.switch.recovery`): to ``target`` through
        the full gate, a running target verified; returns its ticket."""
        ticket, _ov = self.ask(
            Ask(target, reason, Caller.daemon(), Trigger.RECOVERY, recovery_attempt=attempt)
        )
        assert ticket is not None
        return ticket

    def halt(self, why: str) -> Override:
        """Hold every backend off until a person acts (recovery gave up): persisted, shown in status."""
        with self._lock:
            ov = Override(Mode.HOLD, OFF, None, "gpushift", self.now(), why, OverrideSource.MANUAL)
            self._set_override(ov)
            self.blocked = why
            return ov

    def resume(self, caller: Caller) -> str:
        """Back to the schedule at once (switching if needed)."""
        with self._lock:
            if self.schedule is None:
                raise GpushiftError("no schedule is configured ([daemon] schedule): nothing to resume")
            self._set_override(None)
            self.attempts = None
            self.blocked = None
            self.relaunch = None
            self._info("schedule_resumed", by=caller.user)
            action = self.tick(Trigger.RECONCILE)
            return f"obeying the schedule again: {action}"

    # ------------------------------------------------------------ the tick

    def tick(self, trigger: Trigger = Trigger.RECONCILE) -> str:
        """Decide once and act; return a one-line description of what was done."""
        with self._lock:
            decision = decide(self._snapshot(trigger))
            self._apply(decision)
            action = decision.summary
            for a in decision.actions:
                action = self._execute(a, action)
            self.last_action = action
            return action

    def _apply(self, d: Decision) -> None:
        """The keeper's bookkeeping as the decision leaves it."""
        self.attempts = d.attempts
        self.blocked = d.blocked
        self.relaunch = d.relaunch
        self.deferral = d.deferral

    def _base(self, trigger: Trigger, busy: bool, established: str | None) -> Snapshot:
        """A snapshot of the keeper's own state (what runs is the caller's to add)."""
        return Snapshot(
            now=self.now(),
            mono=self.monotonic(),
            trigger=trigger,
            schedule=self.schedule,
            override=self.override,
            busy=busy,
            established=established,
            running=(),
            relaunch=self.relaunch,
            settings=self.settings,
            deferral=self.deferral,
            attempts=self.attempts,
            blocked=self.blocked,
            max_attempts=self.max_attempts,
            retry_after_s=self.retry_after_s,
            before=self.before[1] if self.before is not None and self.before[0] == established else None,
            on_failure=self.on_failure,
        )

    def _snapshot(self, trigger: Trigger) -> Snapshot:
        busy, established = self.switcher.snapshot()
        states = {} if busy else self.switcher.unit_states()
        busy_after, established_after = self.switcher.snapshot()
        # A switch that started while systemd was asked makes what it said stale.
        busy = busy or busy_after or established_after != established
        # The switches that ended since the last look, read with what runs after them (while one
        # runs they wait for the next decision).
        finished = [] if busy else self.switcher.take_finished()
        for r in finished:  # who served before whom: the fallback's target (keeper/fallback.py)
            ok = r.result is not None and r.result.ok
            self.before = (served_before(r.target, r.from_backend) if ok else None) or self.before
        ended = tuple(_ended(r) for r in finished)
        obs = Observation(seen=self.seen)
        st = states.get(established) if established is not None else None
        if st is not None and established is not None:
            w = self.settings.get(established, WatchSettings())
            if w.instances:  # a backend of several: each instance watched (watch.observe_instances)
                jobs = self.watch.foreign_job if self.watch is not None else None
                now, seen = self.switcher.instance_states(established), self.seen_instances
                hung = self.watch.instances_unhealthy_for(established) if self.watch is not None else {}
                inc, self.seen_instances = observe_instances(
                    established, now, seen, jobs, w.min_ready, w.unhealthy_after_s, hung
                )
                obs = Observation(incident=inc)
            else:
                foreign = self.watch.foreign_job(st.name) if self.watch is not None else None
                unhealthy = self.watch.unhealthy_for(established) if self.watch is not None else None
                obs = observe(established, st, self.seen, foreign, unhealthy, w.unhealthy_after_s)
        self.seen = obs.seen
        in_flight, idle_for = None, None
        actual = tuple(n for n, u in states.items() if u.running and not u.exited)
        if self.watch is not None and len(actual) == 1:
            in_flight, idle_for = self.watch.busy(actual[0])
        return replace(
            self._base(trigger, busy, established),
            running=actual,
            active=tuple(n for n, u in states.items() if u.running),
            incident=obs.incident,
            relaunched=obs.relaunched,
            in_flight=in_flight,
            idle_for_s=idle_for,
            ended=ended,
        )

    def _execute(self, a: object, summary: str) -> str:
        if isinstance(a, SetOverride):
            self._set_override(a.override)
        elif isinstance(a, Adopt):
            self.switcher.adopt(a.backend, force=a.force)
        elif isinstance(a, RecordExternal):
            self.switcher.note_external(a.was, a.now)
        elif isinstance(a, RecordRelaunch):
            self.switcher.note_relaunch(a.backend, a.detail)
        elif isinstance(a, RecordIncident):
            i = a.incident
            of: dict[str, Any] = {"unit": i.unit, "serving": i.converge} if i.unit else {}
            self.switcher.record_incident(i.outcome, i.backend, i.detail, i.exit, **of)
        elif isinstance(a, Log):
            (self._warn if a.level == "warning" else self._info)(a.event, **a.fields)
        elif isinstance(a, Switch):
            ticket = self._start(a, asked=False)
            if ticket is None:
                if "fallback" in a.details and self.relaunch is not None:  # asked again next time
                    self.relaunch = replace(self.relaunch, fell_back=False)
                    self.blocked = f"falling back to {a.target} waits for the switch that runs"
                return "a switch is running; deciding after it"
            return f"{summary} (ticket {ticket})"
        return summary

    def _start(self, a: Switch, asked: bool) -> str | None:
        """The executor's one call of the switcher's ``request`` (tests/unit/keeper/test_one_path.py
        checks that no other code calls it).  A switch the rules decided on that finds another
        running returns None (decided again after it); one asked for raises the refusal."""
        try:
            ticket = self.switcher.request(
                a.target,
                a.reason,
                a.caller,
                a.trigger,
                a.skip_drain,
                relaunch=a.relaunch,
                verify_running=a.verify_running,
                recovery_attempt=a.recovery_attempt,
                details=a.details,
                restart_instances=a.restart_instances,
            )
        except SwitchInProgress:
            if asked:
                raise
            return None
        if not asked:
            self._info(
                "schedule_switch", to=a.target, ticket=ticket, trigger=a.trigger.value, reason=a.reason
            )
        return ticket

    def _set_override(self, ov: Override | None) -> None:
        self.override = ov
        self.store.save(ov)

    # ------------------------------------------------------------ status

    def mode(self) -> Mode:
        """Without the lock (two reference reads): the D-Bus properties and the metrics ask from
        threads that must never wait on a tick."""
        schedule, override = self.schedule, self.override
        if schedule is None:
            return Mode.MANUAL
        return override.mode if override is not None else Mode.SCHEDULE

    def next_switch(self) -> tuple[str, datetime] | None:
        """(backend, when) of :meth:`coming_switch`, without the lock, like :meth:`mode`: for the
        D-Bus properties, read on the loop thread, which must never wait on a tick."""
        c = coming_switch(self.now(), self.schedule, self.override)
        return (c.target, c.at) if c is not None else None

    def next_served(self, backends: tuple[str, ...], serving: tuple[str, ...]) -> dict[str, int]:
        """Per backend, when the keeper will next serve it by itself (UTC UNIX seconds; 0: it serves
        now, ``serving`` being the active backend and the switch's target), ``keeper/served.py``.

        Without the lock, like :meth:`mode` (the D-Bus properties' loop thread).  Computed again only
        when the schedule, the override, a deferral or ``serving`` changed, or when the instant it
        holds until has come: a property read every second costs a comparison."""
        now = self.now()
        key = (self.schedule, self.override, self.deferral, backends, serving)
        memo = self._served
        if memo is not None and _same(memo[0], key) and (memo[1].until is None or now < memo[1].until):
            return memo[2]
        served = next_served(now, key[0], key[1], key[2], backends, serving)
        out = served.seconds()
        self._served = (key, served, out)
        return out

    def status(self) -> dict[str, Any]:
        with self._lock:
            now = self.now()
            ov = self.override
            if self.schedule is None:
                mode = "manual (no schedule)"
            else:
                mode = ov.describe() if ov is not None else Mode.SCHEDULE.value
            out: dict[str, Any] = {
                "mode": mode,
                "override": ov.to_dict() if ov else None,
                "blocked": self.blocked,  # why the keeper does not act (gave up, cancelled, on_crash)
                "deferred": (
                    {
                        "to": self.deferral.target,
                        "since": self.deferral.since.isoformat(),
                        "until": self.deferral.until().isoformat(),
                        "why": self.last_action,
                    }
                    if self.deferral
                    else None
                ),
                "relaunch": (
                    {
                        "backend": self.relaunch.backend,
                        "since": self.relaunch.since.isoformat(),
                        "why": self.relaunch.why,
                        "fell_back_to": self.relaunch.before if self.relaunch.fell_back else None,
                    }
                    if self.relaunch
                    else None
                ),
            }
            if self.schedule is not None:
                fire = self.schedule.in_effect(now)
                nxt = self.schedule.next_change(now)
                out["schedule"] = {
                    "path": self.schedule.path,
                    "tz": str(self.schedule.tz),
                    "wants": fire.target if fire else None,
                    "since": fire.at.isoformat() if fire else None,
                    "exception": fire.in_force.as_dict(self.schedule.tz) if fire and fire.in_force else None,
                    "next": (
                        {
                            "target": nxt.target,
                            "at": nxt.at.isoformat(),
                            "at_local": nxt.at.astimezone(self.schedule.tz).isoformat(),
                            "line": nxt.entry.line,
                        }
                        if nxt
                        else None
                    ),
                    "blocked": self.blocked,
                    "last_action": self.last_action,
                }
            return out

    def coming_switch(self) -> Coming | None:
        """The next switch to another backend the keeper will make by itself (``keeper/coming.py``):
        none during a hold, counted from an override's end."""
        with self._lock:
            return coming_switch(self.now(), self.schedule, self.override)

    def next_wakeup(self) -> datetime | None:
        """When the daemon's timer should fire next: the next boundary, or the override's end."""
        with self._lock:
            now = self.now()
            times = []
            if self.schedule is not None:
                b = self.schedule.next_boundary(now)
                if b is not None:
                    times.append(b.at)
            if self.override is not None and self.override.until is not None:
                times.append(self.override.until)
            if self.deferral is not None:
                times.append(now + timedelta(seconds=DEFER_CHECK_S))  # look again for the idle moment
            return min(times) if times else None

    def _info(self, event: str, **kw: Any) -> None:
        self.log.info(event, **kw)

    def _warn(self, event: str, **kw: Any) -> None:
        self.log.warning(event, **kw)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same inputs of NextServed: the very schedule object (a reload makes a new one), equal rest."""
    return a[0] is b[0] and a[1:] == b[1:]


def _ended(run: SwitchRun) -> Ended:
    """A finished run as the decision sees it (its result, and when it ended: retry spacing counts
    from then, not from the tick that noticed it)."""
    res = run.result
    assert res is not None and run.ended_mono is not None
    return Ended(run.target, run.trigger, res.ok, res.message, run.ended_mono, res.cancelled_by)
