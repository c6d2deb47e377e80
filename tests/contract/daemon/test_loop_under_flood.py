"""The daemon's loop-side machinery against a real GLib main loop flooded the way GDBus floods it: one
source of DEFAULT priority per incoming call, many of them dispatched in one iteration.

* The watchdog (gpushift/daemon/watchdog.py) keeps sending WATCHDOG=1 while such an iteration lasts
  seconds (each call stamps ``last_call``, as the bus service does), and stops once a handler wedges
  the loop.
* The switch's signals (gpushift/daemon/relay.py) go out while the flood lasts: an idle source of
  idle_add's default priority would wait for the flood's end (a switch client waited 13.5 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushift.daemon.relay import SignalRelay
from gpushift.daemon.watchdog import Watchdog
from gpushift.switch import Event
from gpushift.values import EventKind, Phase


class Loop:
    """The default GLib main context run by a loop on a thread, as the daemon runs it (GLib.idle_add
    and GLib.timeout_add attach there); quit after the test."""

    def __init__(self) -> None:
        from gi.repository import GLib

        self.GLib = GLib
        self.ctx = GLib.MainContext.default()
        self.loop = GLib.MainLoop()
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.sources: list[Any] = []  # destroyed after the test: the default context outlives it

    def add(self, fn: Any, priority: int | None = None, delay_ms: int = 0) -> None:
        GLib = self.GLib
        source = GLib.timeout_source_new(delay_ms) if delay_ms else GLib.idle_source_new()
        source.set_priority(GLib.PRIORITY_DEFAULT if priority is None else priority)
        source.set_callback(lambda *_: fn())
        source.attach(self.ctx)
        self.sources.append(source)


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    lp.thread.start()
    try:
        yield lp
    finally:
        lp.loop.quit()
        lp.thread.join(10)
        for source in lp.sources:
            if not source.is_destroyed():
                source.destroy()


def flood(lp: Loop, calls: int, each_s: float, stamp: list[float] | None = None) -> None:
    """``calls`` sources of DEFAULT priority attached at once (GDBus attaches one per call), each
    taking ``each_s`` and, like a handled call, stamping ``stamp``."""

    def call() -> bool:
        time.sleep(each_s)
        if stamp is not None:
            stamp[0] = time.monotonic()
        return False

    for _ in range(calls):
        lp.add(call)


def test_the_watchdog_pings_through_a_long_iteration_of_calls_and_stops_when_the_loop_wedges(loop):
    pings: list[float] = []
    last_call = [0.0]
    wd = Watchdog(lambda: pings.append(time.monotonic()), 0.4, progress=lambda: last_call[0])
    loop.add(wd.loop_turn, delay_ms=wd.turn_ms)  # the loop's own stamp, as the daemon sets it
    wd.start()
    try:
        # One iteration of 3 s of calls (3,000 × 1 ms): the loop's timer cannot run meanwhile.
        start = time.monotonic()
        flood(loop, 3000, 0.001, last_call)
        deadline = time.monotonic() + 60
        while last_call[0] < start + 2.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        during = [t for t in pings if start + 1.0 < t < last_call[0]]
        assert len(during) >= 3, (len(pings), last_call[0] - start)

        # A wedged handler: nothing stamps, so nothing is sent (after one interval and a margin).
        wedge = [0.0, 0.0]

        def wedged() -> bool:
            wedge[0] = time.monotonic()
            time.sleep(4.0)
            wedge[1] = time.monotonic()
            return False

        loop.add(wedged)
        deadline = time.monotonic() + 60
        while not wedge[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wedge[1], "the wedged handler never ran"
        silent = [t for t in pings if wedge[0] + 1.5 < t < wedge[1]]
        assert silent == [], [round(t - wedge[0], 2) for t in pings if t > wedge[0]]
    finally:
        wd.stop()


class FakeService:
    def __init__(self) -> None:
        self.progress: list[float] = []

    def Progress(self, ticket: str, phase: str, detail: str) -> None:
        self.progress.append(time.monotonic())

    def announce(self) -> bool:
        return True


class FakeDaemon:
    def __init__(self) -> None:
        self.service = FakeService()
        self.notify = type("N", (), {"status": staticmethod(lambda line: True)})()
        self.sampler = self.clockwork = self.notices = self.log = None

    def update_status_line(self) -> None:
        pass


def test_the_switchs_signals_go_out_while_calls_keep_the_loop_busy(loop):
    d = FakeDaemon()
    relay = SignalRelay(d)  # type: ignore[arg-type]
    stop = threading.Event()

    def keep_calls_coming() -> None:  # calls keep arriving, as from a flooding client
        while not stop.is_set():
            flood(loop, 20, 0.0005)
            time.sleep(0.005)

    feeder = threading.Thread(target=keep_calls_coming, daemon=True)
    feeder.start()
    try:
        time.sleep(0.5)
        asked = time.monotonic()
        ev = Event("t1", EventKind.PROGRESS, Phase.STOP, "stopping a", 0.1)
        relay.on_event(ev)  # from this thread, as from the switch worker
        deadline = time.monotonic() + 30
        while not d.service.progress and time.monotonic() < deadline:
            time.sleep(0.05)
        flooding = not stop.is_set()
        assert d.service.progress and flooding, "Progress did not go out while the calls kept coming"
        print(f"Progress went out {d.service.progress[0] - asked:.3f} s after it was handed over")
    finally:
        stop.set()
        feeder.join(10)
