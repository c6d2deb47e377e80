"""The keeper — obeys the schedule, yields to people, never fights them.

The keeper decides; the switcher acts.  Every decision is a call of :meth:`Keeper.tick` with the
time now: at daemon start, every ``reconcile_interval_s``, at each schedule boundary, after a
wall-clock jump, after a reload, after ``resume``.  A tick takes a :class:`~.decide.Snapshot`
through the narrow :class:`SwitchControl` interface, hands it to the pure :func:`~.decide.decide`,
and executes the actions it returns.  The mode survives restarts through an :class:`OverrideStore`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from gpushift.errors import GpushiftError, SwitchInProgress
from gpushift.keeper.coming import Coming, coming_switch
from gpushift.keeper.decide import (
    Adopt,
    Attempts,
    Deferral,
    Log,
    RecordExternal,
    RecordIncident,
    RecordRelaunch,
    Relaunch,
    SetOverride,
    Snapshot,
    Switch,
    WatchSettings,
    after_result,
    decide,
)
from gpushift.keeper.override import Override, OverrideStore, after_failed_manual, manual_override
from gpushift.keeper.watch import Observation, Seen, observe
from gpushift.schedule import Schedule
from gpushift.switch import Event, SwitchResult
from gpushift.values import OFF, Caller, EventKind, Mode, Outcome, OverrideSource, Trigger, UnitState


class SwitchControl(Protocol):
    """What the keeper needs of the switcher (the Switcher implements it)."""

    def snapshot(self) -> tuple[bool, str | None]: ...

    def unit_states(self) -> dict[str, UnitState]: ...

    def request(
        self,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger = ...,
        skip_drain: bool = ...,
        *,
        relaunch: bool = ...,
        verify_running: bool = ...,
        details: Mapping[str, str] | None = ...,
    ) -> str: ...

    def result(self, ticket: str) -> SwitchResult | None: ...

    def adopt(self, backend: str, force: bool = False) -> None: ...

    def note_external(self, from_backend: str, to_backend: str) -> None: ...

    def note_relaunch(self, backend: str, detail: str) -> None: ...

    def record_incident(self, outcome: Outcome, backend: str, detail: str, exit: str) -> None: ...

    def add_listener(self, listener: Callable[[Event], None]) -> None: ...


#: While a switch waits for an idle moment, the keeper looks again this often.
DEFER_CHECK_S = 1.0


class BackendWatch(Protocol):
    """What the daemon sees of the backends between switches (its job watch and its sampler)."""

    def foreign_job(self, unit: str) -> bool | None:
        """A job gpushift did not start ran on ``unit`` since the last call (None: cannot tell)."""
        ...

    def unhealthy_for(self, backend: str) -> float | None:
        """Seconds the backend's health has failed without a break while its unit is active."""
        ...

    def busy(self, backend: str) -> tuple[int | None, float | None]:
        """(requests in flight now — None: cannot be told, seconds without any — None: some are)."""
        ...


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
    ) -> None:
        self.switcher = switcher
        self.schedule = schedule
        self.store = store
        self.now = now
        self.monotonic = monotonic
        self.log = log
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.watch = watch
        self.settings: dict[str, WatchSettings] = dict(settings or {})
        self.seen: Seen | None = None
        self.relaunch: Relaunch | None = None
        self.deferral: Deferral | None = None
        self.override: Override | None = store.load()
        self.attempts: Attempts | None = None
        self.blocked: str | None = None
        self.last_action: str = ""
        self._pending_ticket: str | None = None
        self._last_finished: tuple[str, float] = ("", 0.0)
        self._lock = threading.RLock()
        # Retry spacing counts from when a switch ended, not from the tick that noticed it.
        switcher.add_listener(self._on_switch_event)

    def _on_switch_event(self, event: Event) -> None:
        if event.kind is EventKind.FINISHED:
            self._last_finished = (event.ticket, self.monotonic())
            self.seen = None  # our own switch changed the unit: look afresh

    # ------------------------------------------------------------ settings and people

    def set_schedule(self, schedule: Schedule | None) -> None:
        with self._lock:
            self.schedule = schedule
            self.attempts = None
            self.blocked = None

    def configure(
        self, max_attempts: int, retry_after_s: float, settings: Mapping[str, WatchSettings] | None = None
    ) -> None:
        """New settings (on reload); they apply from the next tick."""
        with self._lock:
            self.max_attempts = max_attempts
            self.retry_after_s = retry_after_s
            if settings is not None:
                self.settings = dict(settings)

    def manual(
        self,
        backend: str,
        caller: Caller,
        hold: bool,
        until: datetime | None,
        reason: str,
        when_idle: bool = False,
    ) -> Override:
        """Record a person's switch: keep ``backend`` until the next boundary, ``until``, or resume.

        ``when_idle``: the switch itself is the keeper's, once the serving backend is idle."""
        with self._lock:
            ov = manual_override(
                self.now(), self.schedule, backend, caller.user, hold, until, reason, when_idle
            )
            self._set_override(ov)
            self.blocked = None  # a person acted: an old "gave up" no longer describes the state
            self.relaunch = None
            return ov

    def manual_failed(self, backend: str) -> None:
        """A person's switch to ``backend`` did not happen: the override follows what runs."""
        with self._lock:
            running = [name for name, st in self.switcher.unit_states().items() if st.running]
            actual = running[0] if len(running) == 1 else OFF
            ov = after_failed_manual(self.override, backend, actual)
            if ov is not None:
                self._set_override(ov)

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
            self._collect_pending()
            decision = decide(self._snapshot(trigger))
            self.attempts = decision.attempts
            self.blocked = decision.blocked
            self.relaunch = decision.relaunch
            self.deferral = decision.deferral
            action = decision.summary
            for a in decision.actions:
                action = self._execute(a, action)
            self.last_action = action
            return action

    def _snapshot(self, trigger: Trigger) -> Snapshot:
        busy, established = self.switcher.snapshot()
        states = {} if busy else self.switcher.unit_states()
        busy_after, established_after = self.switcher.snapshot()
        obs = Observation(seen=self.seen)
        st = states.get(established) if established is not None else None
        if st is not None and established is not None:
            w = self.settings.get(established, WatchSettings())
            foreign = self.watch.foreign_job(st.name) if self.watch is not None else None
            unhealthy = self.watch.unhealthy_for(established) if self.watch is not None else None
            obs = observe(established, st, self.seen, foreign, unhealthy, w.unhealthy_after_s)
        self.seen = obs.seen
        in_flight, idle_for = None, None
        actual = [n for n, u in states.items() if u.running and not u.exited]
        if self.watch is not None and len(actual) == 1:
            in_flight, idle_for = self.watch.busy(actual[0])
        return Snapshot(
            now=self.now(),
            mono=self.monotonic(),
            trigger=trigger,
            schedule=self.schedule,
            override=self.override,
            # A switch that started while systemd was asked makes what it said stale.
            busy=busy or busy_after or established_after != established,
            established=established,
            running=tuple(name for name, u in states.items() if u.running and not u.exited),
            incident=obs.incident,
            relaunched=obs.relaunched,
            relaunch=self.relaunch,
            settings=self.settings,
            in_flight=in_flight,
            idle_for_s=idle_for,
            deferral=self.deferral,
            attempts=self.attempts,
            blocked=self.blocked,
            max_attempts=self.max_attempts,
            retry_after_s=self.retry_after_s,
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
            self.switcher.record_incident(i.outcome, i.backend, i.detail, i.exit)
        elif isinstance(a, Log):
            (self._warn if a.level == "warning" else self._info)(a.event, **a.fields)
        elif isinstance(a, Switch):
            try:
                ticket = self.switcher.request(
                    a.target,
                    a.reason,
                    Caller.daemon(),
                    a.trigger,
                    relaunch=a.relaunch,
                    verify_running=a.relaunch,
                    details=a.details,
                )
            except SwitchInProgress:
                return "a switch is running; deciding after it"
            self._pending_ticket = ticket
            self._info(
                "schedule_switch", to=a.target, ticket=ticket, trigger=a.trigger.value, reason=a.reason
            )
            return f"{summary} (ticket {ticket})"
        return summary

    def _collect_pending(self) -> None:
        t = self._pending_ticket
        res = self.switcher.result(t) if t is not None else None
        if res is None:
            return
        self._pending_ticket = None
        ticket, ended = self._last_finished
        ended_mono = ended if ticket == t else self.monotonic()
        self.attempts = after_result(self.attempts, res.ok, res.message, ended_mono, res.cancelled_by)
        if res.ok and self.relaunch is not None and res.to_backend == self.relaunch.backend:
            self.relaunch = None  # brought back

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
        if self.log is not None:
            self.log.info(event, **kw)

    def _warn(self, event: str, **kw: Any) -> None:
        if self.log is not None:
            self.log.warning(event, **kw)
