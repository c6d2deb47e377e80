"""The front door's state: :class:`DoorState`, which :class:`gpushift.frontdoor.core.FrontDoor`
(the object the daemon link drives) extends with its sockets.

It learns what serves from :meth:`DoorState.update` (every change the daemon link sees in
``Switcher1``'s properties) and from the daemon's calls (``FrontDoor1``): :meth:`close` when a drain
begins, :meth:`in_flight` while it drains, :meth:`release` when the switch ends, :meth:`status`.
Every request's handler (``proxy.py``) asks it :meth:`admit` (forward, hold or answer) and tells it
:meth:`finished`; everything here runs on the event loop's thread, so a decision and the in-flight
count it adds are one step: once :meth:`close` returned, nothing new goes to that backend.

What it keeps beside the daemon's view: the backends closed and not released, the serving backend
a ``Release`` named until the daemon's own properties agree (``SwitchInProgress`` can stay true
for a moment after the release), the last backend known serving and whether its health answers
(for when the daemon is lost), the held requests (``holding.py``) and the in-flight counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from gpushift.backends import kinds
from gpushift.config.types import Config, FrontDoorConfig
from gpushift.errors import ConfigError
from gpushift.frontdoor import answers, routing, wire
from gpushift.frontdoor.answers import Answer
from gpushift.frontdoor.holding import Held, Holding, Outcome
from gpushift.frontdoor.instances import Pools, Probe
from gpushift.frontdoor.observe import Observer
from gpushift.frontdoor.routing import Decision, Names, Situation
from gpushift.frontdoor.view import OFF, DaemonView

log = structlog.get_logger("gpushift.frontdoor")

#: While the daemon is lost, the last serving backend's health is asked this often.
HEALTH_PERIOD_S = 2.0

#: A switch that ended (``SwitchInProgress`` false) with a backend still closed: when no Release
#: came this long after, the front door releases by itself to what the daemon says serves (a
#: daemon that died between Close and Release must not leave every request held).
RELEASE_GRACE_S = 15.0


@dataclass(frozen=True)
class Instance:
    """One instance of a backend of several: named by its unit, reached at its health URL's origin."""

    name: str
    origin: wire.Origin
    health_url: str


@dataclass(frozen=True)
class Backend:
    """One configured backend as the front door sees it."""

    name: str
    kind: str
    origin: wire.Origin  # with instances: the first instance's
    health_url: str
    native: frozenset[str]  # its kind's own routes
    start_timeout_s: float
    instances: tuple[Instance, ...] = ()  # (): one upstream, ``origin``


def backends_of(config: Config) -> dict[str, Backend]:
    """The configured backends; a ``health_url`` that is not on a loopback address is refused."""
    out: dict[str, Backend] = {}
    for b in config.backends.values():
        native = frozenset(kinds.kind_of(b.kind).native_routes)
        if b.instances:
            instances = tuple(
                Instance(
                    i.unit,
                    _origin(f"backends.{b.name}.instances[{n}].health_url", i.health_url),
                    i.health_url,
                )
                for n, i in enumerate(b.instances)
            )
            first = instances[0]
            out[b.name] = Backend(
                b.name, b.kind, first.origin, first.health_url, native, b.start_timeout_s, instances
            )
            continue
        origin = _origin(f"backends.{b.name}.health_url", b.health_url)
        out[b.name] = Backend(b.name, b.kind, origin, b.health_url, native, b.start_timeout_s)
    return out


def _origin(key: str, url: str) -> wire.Origin:
    try:
        return wire.loopback_origin(url)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


class DoorState:
    """What the front door knows and decides; every method runs on the event loop's thread."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.settings: FrontDoorConfig = config.frontdoor or FrontDoorConfig()
        self.clock = clock
        self.backends = backends_of(config)
        self._configured = {b.name: b.models for b in config.backends.values()}
        self._aliases = {b.name: b.aliases for b in config.backends.values()}
        self.names: Names = routing.names_of(self._configured, self._aliases, {})
        self._view = DaemonView()
        self._closed: set[str] = set()
        self._released: str | None = None  # the serving backend a Release named, until the view agrees
        self._released_at = 0.0
        self._last_serving = ""
        self._fallback_ok = True
        self._in_flight = dict.fromkeys(self.backends, 0)
        self._native = frozenset(r for b in self.backends.values() for r in b.native)
        self.holding = Holding(self.settings.max_held, self.settings.hold_timeout_s)
        self.observer = Observer(self.backends, self._every_name())
        self.pools = Pools(
            {b.name: [i.name for i in b.instances] for b in self.backends.values()}, self.observer.registry
        )
        self.requests = 0
        self._switch_began: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._grace: asyncio.TimerHandle | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.addresses: list[str] = []  # what is served (core.FrontDoor.serve)
        self.health_probe: Callable[[Backend], Awaitable[bool]] | None = None  # set once serving

    # ---- what the daemon link calls --------------------------------------------------------
    def update(self, view: DaemonView) -> None:
        """The daemon's properties changed (or the daemon came or went): sync, on the loop."""
        old = self._view
        if not view.connected and not view.models:
            view = replace(view, models=old.models, next_served=old.next_served, zone=old.zone, mode=old.mode)
        self._view = view
        if view.models != old.models:
            self.names = routing.names_of(self._configured, self._aliases, view.models)
            self.observer.names = frozenset(self._every_name())
        if view.connected and not view.switching:
            if view.active in self.backends:
                self._last_serving = view.active
                self.pools.serving(view.active)
            elif view.active == OFF:
                self._last_serving = ""
        self._follow_release(old, view)
        if not view.connected and old.connected:
            self._fallback_ok = True
            if self._health_task is None or self._health_task.done():
                self._health_task = self._spawn(self._watch_health())
        if self._closed and view.connected and not view.switching and (old.switching or not old.connected):
            self._arm_grace()
        self._resort()

    async def close(self, backend: str) -> int:
        """``FrontDoor1.Close``: nothing new goes to ``backend`` from now on; its count in flight."""
        if backend not in self.backends:
            log.warning("frontdoor_close_unknown", backend=backend)
            return 0
        self._closed.add(backend)
        self._released = None
        if self._switch_began is None:
            self._switch_began = time.monotonic()
        log.info("frontdoor_closed", backend=backend, in_flight=self._in_flight[backend])
        return self._in_flight[backend]

    def in_flight(self, backend: str) -> int:
        """``FrontDoor1.InFlight``: requests forwarded to ``backend`` and not finished."""
        return self._in_flight.get(backend, 0)

    async def release(self, serving: str) -> tuple[int, float]:
        """``FrontDoor1.Release``: the switch ended with ``serving`` serving ("" or "off": none).

        The held requests whose model ``serving`` serves are forwarded, the others answered with a
        503 that says why; every backend is open again.  Returns (held during the switch, longest
        hold in seconds).
        """
        target = self._view.target
        self._closed.clear()
        self._cancel_grace()
        self._released = serving
        self._released_at = time.monotonic()
        if serving in self.backends:
            self._last_serving = serving
            self.pools.serving(serving)
        held, longest = self.holding.take_switch_figures()
        for h in self.holding:
            d = routing.after_release(self.names, serving, h.model, self.backends)
            self._settle(h, d, None if d.action == routing.FORWARD else target)
        self._switch_began = None
        self.observer.held.set(len(self.holding))
        log.info("frontdoor_released", serving=serving, held=held, longest_s=round(longest, 3))
        return held, longest

    def status(self) -> dict[str, Any]:
        """``FrontDoor1.Status``: what ``gpushift status`` shows of the front door (``instances``
        only when a backend has several)."""
        out: dict[str, Any] = {
            "listen": self.listening(),
            "held": len(self.holding),
            "in_flight": dict(self._in_flight),
            "closed": sorted(self._closed),
            "daemon": "connected" if self._view.connected else "lost",
            "requests": self.requests,
            "serving": self._serving_now() or None,
            "longest_held_s": round(self.holding.oldest_s(), 3),
        }
        if self.pools.pickers:
            out["instances"] = self.pools.status()
        return out

    def end(self) -> None:
        """The front door stops: every held request is answered (a 503), its timers and tasks end."""
        self._cancel_grace()
        for h in self.holding:
            self._settle(h, routing.answer(routing.DAEMON_LOST), None)
        for t in list(self._tasks):
            t.cancel()

    def watch_instances(self, probe: Probe) -> None:
        """Start asking the health of the instances of the backends in use (``instances.py``);
        nothing when no backend has instances.  Ends with :meth:`end`."""
        if self.pools.pickers:
            self._spawn(self.pools.watch(probe, self._in_use))

    def listening(self) -> list[str]:
        """The addresses served now (``core.FrontDoor`` fills them in)."""
        return list(self.addresses)

    # ---- what a request's handler calls ---------------------------------------------------
    @property
    def view(self) -> DaemonView:
        return self._view

    def situation(self) -> Situation:
        v = self._view
        if self._released is not None:
            v = replace(v, switching=False, target="", active=self._released)
        fallback = self._last_serving if (not v.connected and self._fallback_ok) else ""
        return Situation(v, frozenset(self._closed), fallback, frozenset(self.backends))

    def admit(self, model: str | None) -> Decision:
        """Where a request naming ``model`` goes.  A ``forward`` is counted in flight at once: the
        caller must call :meth:`finished` with its backend when it ends, however it ends."""
        self.requests += 1
        d = routing.route(self.names, self.situation(), model)
        if d.action == routing.FORWARD:
            self._begin(d.backend)
        return d

    def finished(self, backend: str) -> None:
        """A forwarded request ended (answered, failed or its client gone)."""
        if self._in_flight.get(backend, 0) > 0:
            self._in_flight[backend] -= 1
            self.observer.set_in_flight(backend, self._in_flight[backend])

    async def hold(self, model: str | None, target: str) -> tuple[Outcome | Answer, float]:
        """Hold a request until the switch sorts it: its outcome (a ``forward`` counted in flight,
        as from :meth:`admit`) or the 503 of a full hold or a hold that lasted ``hold_timeout_s``;
        and how long it was held (seconds)."""
        h = self.holding.add(model, target)
        if h is None:
            return answers.too_many_held(self.settings.max_held, target, self.estimate_s(model, target)), 0.0
        if self._switch_began is None:
            self._switch_began = time.monotonic()
        self.observer.held.set(len(self.holding))
        try:
            outcome = await self.holding.wait(h, self._dropped)
        finally:
            held_s = time.monotonic() - h.since
            self.observer.held.set(len(self.holding))
            self.observer.held_seconds.observe(held_s)
        if outcome is None:
            return answers.hold_timeout(held_s, target, self.estimate_s(model, target)), held_s
        return outcome, held_s

    def answer(self, d: Decision, model: str | None, released_from: str | None = None) -> Answer:
        """The answer for a decision of action ``answer``."""
        now = self.clock()
        if released_from is not None:
            return answers.released_elsewhere(d, self.names, self._view, model, now, released_from)
        return answers.for_decision(d, self.names, self._view, model, now)

    def estimate_s(self, model: str | None, target: str) -> float:
        """How long until ``model`` is likely served: its NextServed when ahead, else what is left
        of the target's ``start_timeout_s`` since the switch began."""
        at = answers.next_at(self.names, self._view, model)
        now = self.clock()
        if at is not None and at > now:
            return at - now
        b = self.backends.get(target or self._view.target)
        began = self._switch_began if self._switch_began is not None else time.monotonic()
        left = (b.start_timeout_s if b is not None else 60.0) - (time.monotonic() - began)
        return left if left >= 1 else answers.SHORT_RETRY_S

    def native_routes(self) -> frozenset[str]:
        """Every configured kind's own routes (a path outside all of them and /v1/ is a 404)."""
        return self._native

    # ---- inside ---------------------------------------------------------------------------
    def _every_name(self) -> list[str]:
        return [*self.names.every_model(), *(a for al in self.names.aliases.values() for a in al)]

    def _serving_now(self) -> str:
        s = self.situation()
        return (
            s.fallback if not s.view.connected else (s.view.active if s.view.active in self.backends else "")
        )

    def _in_use(self) -> set[str]:
        """The backends whose instances' health is asked: serving now, or with requests in flight."""
        return {self._serving_now(), *(b for b, n in self._in_flight.items() if n)} - {""}

    def _begin(self, backend: str) -> None:
        self._in_flight[backend] = self._in_flight.get(backend, 0) + 1
        self.observer.set_in_flight(backend, self._in_flight[backend])

    def _dropped(self, outcome: Outcome) -> None:
        if outcome.decision.action == routing.FORWARD:
            self.finished(outcome.decision.backend)

    def _settle(self, h: Held, d: Decision, released_from: str | None) -> None:
        if d.action == routing.FORWARD:
            self._begin(d.backend)
        self.holding.resolve(h, Outcome(d, released_from))

    def _resort(self) -> None:
        """Held requests that the new situation no longer holds leave the hold now."""
        if not len(self.holding):
            return
        s = self.situation()
        for h in self.holding:
            d = routing.route(self.names, s, h.model)
            if d.action != routing.HOLD:
                self._settle(h, d, None)
        self.observer.held.set(len(self.holding))

    def _follow_release(self, old: DaemonView, view: DaemonView) -> None:
        """Forget the Release's word once the daemon's own view has caught up, or a new switch began."""
        if self._released is None:
            return
        caught_up = not view.switching and (
            view.active == self._released or (self._released in ("", OFF) and view.active in ("", OFF))
        )
        overdue = not view.switching and time.monotonic() - self._released_at > RELEASE_GRACE_S
        if caught_up or overdue or (view.switching and not old.switching) or not view.connected:
            self._released = None

    def _arm_grace(self) -> None:
        self._cancel_grace()
        try:
            self._grace = asyncio.get_running_loop().call_later(RELEASE_GRACE_S, self._grace_over)
        except RuntimeError:  # no loop (a unit test driving update() alone)
            self._grace = None

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _grace_over(self) -> None:
        self._grace = None
        if self._closed and self._view.connected and not self._view.switching:
            log.warning("frontdoor_release_missed", closed=sorted(self._closed), serving=self._view.active)
            self._spawn(self._release_quietly(self._view.active))

    async def _release_quietly(self, serving: str) -> None:
        await self.release(serving)

    def _spawn(self, coro: Any) -> asyncio.Task[None] | None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a unit test driving update() alone)
            coro.close()
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _watch_health(self) -> None:
        """While the daemon is lost: is the last serving backend's health still answering?"""
        while not self._view.connected:
            b = self.backends.get(self._last_serving)
            if b is None or self.health_probe is None:
                return
            ok = await self.health_probe(b)
            if ok != self._fallback_ok:
                log.warning("frontdoor_fallback_health", backend=b.name, healthy=ok)
            self._fallback_ok = ok
            await asyncio.sleep(HEALTH_PERIOD_S)
