"""L3: the keeper — obeys the schedule, yields to people, never fights them.

The keeper decides; the switcher acts.  Every decision is a call of :meth:`Keeper.tick` with the
time now: at daemon start, every ``reconcile_interval_s``, at each schedule boundary, after a
wall-clock jump, after a reload, after ``resume``.  A tick:

1. ends an override whose time is up;
2. compares what runs (asked of systemd now) with what gpushift last established: a difference
   that no switch of ours explains is a person's ``systemctl`` — an *external* override until the
   next boundary, recorded in the ledger, never undone before then;
3. in ``schedule`` mode, switches to the backend in effect (the entry that fired most recently at or
   before now) unless a switch is running or this boundary already failed ``max_attempts`` times.

The mode survives restarts through an :class:`OverrideStore`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from .errors import GpushiftError, SwitchInProgress
from .model import OFF, Caller, Trigger
from .schedule import Schedule
from .switcher import Switcher


@dataclass(frozen=True)
class Override:
    """A person's (or systemctl's) choice that the schedule waits for.

    ``mode`` is ``override`` (until ``until``) or ``hold`` (until ``gpushift resume``).
    """

    mode: str
    backend: str
    until: datetime | None
    set_by: str
    set_at: datetime
    reason: str = ""
    source: str = "manual"  # manual | external

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["until"] = self.until.isoformat() if self.until else None
        d["set_at"] = self.set_at.isoformat()
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Override:
        return Override(
            mode=str(d["mode"]),
            backend=str(d["backend"]),
            until=datetime.fromisoformat(d["until"]) if d.get("until") else None,
            set_by=str(d.get("set_by", "")),
            set_at=datetime.fromisoformat(d["set_at"]),
            reason=str(d.get("reason", "")),
            source=str(d.get("source", "manual")),
        )


class OverrideStore(Protocol):
    def load(self) -> Override | None: ...

    def save(self, override: Override | None) -> None: ...


@dataclass
class _Attempts:
    fire_at: datetime
    target: str
    failures: int = 0
    last_failure_mono: float = 0.0
    last_message: str = ""


class Keeper:
    """Args:
    switcher: the one writer; the keeper only asks it for switches.
    schedule: the parsed schedule, or None (then gpushift only switches when asked).
    store: where the override survives restarts.
    now: the wall clock (aware UTC); ``monotonic`` for retry spacing.
    max_attempts: failed scheduled switches per boundary before waiting for the next one.
    retry_after_s: spacing between those attempts.
    """

    def __init__(
        self,
        switcher: Switcher,
        schedule: Schedule | None,
        store: OverrideStore,
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
        log: Any = None,
        max_attempts: int = 3,
        retry_after_s: float = 30.0,
    ) -> None:
        self.switcher = switcher
        self.schedule = schedule
        self.store = store
        self.now = now
        self.monotonic = monotonic
        self.log = log
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.override: Override | None = store.load()
        self.attempts: _Attempts | None = None
        self.blocked: str | None = None
        self.last_action: str = ""
        self._pending_ticket: str | None = None
        self._last_finished: tuple[str, float] = ("", 0.0)
        self._lock = threading.RLock()
        # Retry spacing counts from when a switch ended, not from the tick that noticed it.
        switcher.listeners.append(self._on_switch_event)

    def _on_switch_event(self, event: Any) -> None:
        if event.kind == "finished":
            self._last_finished = (event.ticket, self.monotonic())

    # ------------------------------------------------------------ people

    def set_schedule(self, schedule: Schedule | None) -> None:
        with self._lock:
            self.schedule = schedule
            self.attempts = None
            self.blocked = None

    def manual(
        self, backend: str, caller: Caller, hold: bool, until: datetime | None, reason: str
    ) -> Override:
        """Record a person's switch: keep ``backend`` until the next boundary, ``until``, or resume."""
        with self._lock:
            now = self.now()
            if hold:
                ov = Override("hold", backend, None, caller.user, now, reason)
            else:
                end = until
                if end is None and self.schedule is not None:
                    b = self.schedule.next_boundary(now)
                    end = b.at if b else None
                ov = Override("override" if end else "hold", backend, end, caller.user, now, reason)
            self._set_override(ov)
            self.blocked = None  # a person acted: an old "gave up" no longer describes the state
            return ov

    def manual_failed(self, backend: str) -> None:
        """A person's switch to ``backend`` did not happen: the override keeps what really runs
        (it still lasts as long as the person asked), so status never names a backend that is
        not there."""
        with self._lock:
            ov = self.override
            if ov is None or ov.backend != backend or ov.source != "manual":
                return
            running = self.switcher.running_backends()
            actual = running[0] if len(running) == 1 else OFF
            self._set_override(
                Override(
                    ov.mode,
                    actual,
                    ov.until,
                    ov.set_by,
                    ov.set_at,
                    f"{ov.reason} (switch to {backend} failed)".strip(),
                    ov.source,
                )
            )

    def resume(self, caller: Caller) -> str:
        """Back to the schedule at once (switching if needed)."""
        with self._lock:
            if self.schedule is None:
                raise GpushiftError("no schedule is configured ([daemon] schedule): nothing to resume")
            self._set_override(None)
            self.attempts = None
            self.blocked = None
            self._info("schedule_resumed", by=caller.user)
            action = self.tick(Trigger.RECONCILE)
            return f"obeying the schedule again: {action}"

    # ------------------------------------------------------------ the tick

    def tick(self, trigger: Trigger = Trigger.RECONCILE) -> str:
        """Decide once; return a one-line description of what was done (for logs and resume)."""
        with self._lock:
            action = self._tick(trigger)
            self.last_action = action
            return action

    def _tick(self, trigger: Trigger) -> str:
        now = self.now()
        busy, established = self.switcher.snapshot()
        if busy:
            return "a switch is running; deciding after it"
        self._collect_pending()
        # 1. an override whose time is up
        ov = self.override
        if ov is not None and ov.mode == "override" and ov.until is not None and now >= ov.until:
            self._info("override_ended", backend=ov.backend, until=ov.until.isoformat())
            self._set_override(None)
        # 2. what runs, asked now; a difference no switch of ours explains is a person's systemctl
        running = self.switcher.running_backends()
        actual = running[0] if len(running) == 1 else (OFF if not running else None)
        busy_now, established_now = self.switcher.snapshot()
        if busy_now or established_now != established:
            return "a switch started meanwhile; deciding after it"
        if actual is None:
            return f"several backends run ({', '.join(running)}); waiting for a person"
        if established is None:
            self.switcher.adopt(actual)
        elif actual != established and actual == OFF and self._crashed(established):
            # Not a person: the backend died by itself (unit "failed").  Adopt "off" and let the
            # schedule bring it back, with the same bounded retries as any scheduled switch.
            self._warn(
                "backend_crashed",
                backend=established,
                detail="its unit failed on its own; the schedule decides what runs next",
            )
            self.switcher.adopt(OFF, force=True)
        elif actual != established:
            self._external(established, actual, now)
        # 3. the schedule
        if self.schedule is None:
            return f"{actual} serves (no schedule)"
        if self.override is not None:
            o = self.override
            until = f" until {o.until.isoformat()}" if o.until else ""
            return f"{o.mode}{until}: keeping {actual}"
        fire = self.schedule.in_effect(now)
        if fire is None:
            return f"{actual} serves (no schedule entry has fired yet)"
        wants = fire.target
        if wants == actual:
            self.blocked = None
            return f"{actual} serves as the schedule wants"
        a = self.attempts
        if a is None or a.fire_at != fire.at or a.target != wants:
            a = self.attempts = _Attempts(fire.at, wants)
            self.blocked = None
        if a.failures >= self.max_attempts:
            nxt = self.schedule.next_boundary(now)
            when = nxt.at.isoformat() if nxt else "never"
            self.blocked = (
                f"gave up switching to {wants} after {a.failures} failed attempts "
                f"(last: {a.last_message}); waiting for the next boundary ({when}) or a person"
            )
            return self.blocked
        if a.failures and self.monotonic() - a.last_failure_mono < self.retry_after_s:
            return f"retrying {wants} in {self.retry_after_s - (self.monotonic() - a.last_failure_mono):.0f}s"
        reason = f"schedule line {fire.entry.line} ({fire.entry.fields}) fired at {fire.at.isoformat()}"
        try:
            ticket = self.switcher.request(wants, reason, Caller.daemon(), trigger)
        except SwitchInProgress:
            return "a switch is running; deciding after it"
        self._pending_ticket = ticket
        self._info("schedule_switch", to=wants, ticket=ticket, trigger=trigger.value, reason=reason)
        return f"switching {actual} -> {wants} (ticket {ticket})"

    def _collect_pending(self) -> None:
        t = self._pending_ticket
        if t is None:
            return
        res = self.switcher.result(t)
        if res is None:
            return
        self._pending_ticket = None
        if not res.get("ok") and self.attempts is not None:
            self.attempts.failures += 1
            ticket, ended = self._last_finished
            self.attempts.last_failure_mono = ended if ticket == t else self.monotonic()
            self.attempts.last_message = str(res.get("message", ""))[:300]

    def _crashed(self, backend: str) -> bool:
        b = self.switcher.config.backends.get(backend)
        return b is not None and self.switcher.units.state(b.unit).failed

    def _external(self, established: str, actual: str, now: datetime) -> None:
        nxt = self.schedule.next_boundary(now) if self.schedule else None
        ov = self.override
        if ov is not None and ov.mode == "hold":
            # A hold stays a hold, now of what really runs.
            self._set_override(Override("hold", actual, None, ov.set_by, ov.set_at, ov.reason, ov.source))
        else:
            self._set_override(
                Override(
                    "override" if nxt else "hold",
                    actual,
                    nxt.at if nxt else None,
                    "systemctl",
                    now,
                    f"{established} -> {actual} changed outside gpushift",
                    "external",
                )
            )
        self._warn(
            "external_change",
            was=established,
            now=actual,
            detail="not undone before the next schedule boundary",
        )
        self.switcher.note_external(established, actual)

    def _set_override(self, ov: Override | None) -> None:
        self.override = ov
        self.store.save(ov)

    # ------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        with self._lock:
            now = self.now()
            ov = self.override
            if self.schedule is None:
                mode = "manual (no schedule)"
            elif ov is None:
                mode = "schedule"
            elif ov.mode == "hold":
                mode = f"hold {ov.backend} (until gpushift resume)"
            else:
                mode = f"override {ov.backend} until {ov.until.isoformat() if ov.until else '?'}"
            out: dict[str, Any] = {"mode": mode, "override": ov.to_dict() if ov else None}
            if self.schedule is not None:
                fire = self.schedule.in_effect(now)
                nxt = self.schedule.next_change(now)
                out["schedule"] = {
                    "path": self.schedule.path,
                    "tz": str(self.schedule.tz),
                    "wants": fire.target if fire else None,
                    "since": fire.at.isoformat() if fire else None,
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
            return min(times) if times else None

    def _info(self, event: str, **kw: Any) -> None:
        if self.log is not None:
            self.log.info(event, **kw)

    def _warn(self, event: str, **kw: Any) -> None:
        if self.log is not None:
            self.log.warning(event, **kw)
