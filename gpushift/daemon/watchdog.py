"""systemd's watchdog (``WatchdogSec=`` in the unit), fed from a thread of its own.

``WATCHDOG=1`` was a GLib timeout on the main loop, so it went out only between the loop's
iterations.  GLib dispatches in one iteration every call that is queued (45,000 pipelined
``GetStatus`` calls on one connection, or 128 on each of 200): a loop busy answering them, correctly,
missed its pings and systemd restarted the daemon (issue 20, point 4).

Now :class:`Watchdog` sends it from a thread, every half of :attr:`interval_s` (the notify interval,
half of ``WatchdogSec=``), as long as

* the loop shows progress: :meth:`Watchdog.loop_turn` runs on the loop every
  :data:`TURN_S` (a GLib timeout), and the bus service stamps ``last_call`` for every call it has
  handled (:class:`gpushift.bus.service.SwitcherService`), so a loop answering a flood counts as
  alive; the newest of those stamps must be at most :attr:`stale_after_s` old (one interval) —
  or the loop is blocked in one synchronous D-Bus call of the systemd adapter
  (:func:`gpushift.host.dbus.waiting`) whose own timeout, plus :data:`BUS_MARGIN_S`, has not
  passed: a bus slowed down by a flood answers late, and a restart would not make it sooner; and
* the switch worker, while a switch runs, is alive and reported within the longest job it may wait
  on, plus a minute (:func:`worker_silence`; as before).

A loop that is wedged (a handler that never returns) stamps nothing: the pings stop one interval
after its last stamp and systemd restarts the daemon ``WatchdogSec=`` after the last ping, at most
1.5 × ``WatchdogSec=`` after the loop's last sign of life (the GLib timeout did it within one
``WatchdogSec=``; a handler may now hold the loop for up to one interval without a missed ping).  Withholding is logged
(``watchdog_withheld``) when it starts, then at most once a minute while it lasts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

#: How often the loop stamps its turn (seconds; shorter when the interval is short).
TURN_S = 1.0
#: While the pings are withheld, the reason is logged again at most this often (seconds).
LOG_EVERY_S = 60.0
#: How long past a D-Bus call's own timeout a loop blocked in it still counts as alive (seconds).
BUS_MARGIN_S = 5.0


def worker_silence(switcher: Any, config: Any) -> str | None:
    """Why the switch worker looks dead, or None (no switch, or it is alive and reporting).

    A worker blocked in a systemd job does not beat: the longest job it may wait on is allowed,
    plus a minute.
    """
    health = switcher.worker_health()
    if health is None:
        return None
    alive, age = health
    longest = max(
        [config.daemon.stop_timeout_s, config.gpu.release_timeout_s]
        + [max(b.start_timeout_s, b.drain_timeout_s) for b in config.backends.values()]
    )
    if not alive or age > longest + 60:
        return f"switch worker silent for {age:.0f}s"
    return None


class Watchdog:
    """Sends ``WATCHDOG=1`` from a thread while the loop shows progress and nothing else is wrong.

    ``progress()`` gives the monotonic time of the newest sign of life besides the loop's own turn
    (the bus service's ``last_call``); ``problem()`` a reason to withhold the ping, or None;
    ``waiting()`` the deadline of the D-Bus call the loop is blocked in, or None.
    """

    def __init__(
        self,
        notify: Callable[[], object],
        interval_s: float,
        *,
        progress: Callable[[], float] = lambda: 0.0,
        problem: Callable[[], str | None] = lambda: None,
        waiting: Callable[[], float | None] = lambda: None,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._notify = notify
        self.interval_s = interval_s
        self.stale_after_s = interval_s
        self._progress = progress
        self._problem = problem
        self._waiting = waiting
        self._log = log
        self._clock = clock
        self.turn = clock()  # the loop's last turn (stamped by loop_turn)
        self.sent = 0
        self._withheld_since: float | None = None
        self._logged_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def turn_ms(self) -> int:
        """The loop's stamping period for GLib: at most :data:`TURN_S`, a quarter of the interval."""
        return max(50, int(min(TURN_S, self.interval_s / 4) * 1000))

    def loop_turn(self) -> bool:
        """On the loop (a GLib timeout's callback, hence True): the loop has turned."""
        self.turn = self._clock()
        return True

    def check(self) -> str | None:
        """Why no ping should go out now, or None."""
        try:
            newest = max(self.turn, float(self._progress()))
        except Exception as e:  # a source that fails says nothing about the loop
            newest = self.turn
            if self._log is not None:
                self._log.error("watchdog_progress_failed", error=repr(e))
        now = self._clock()
        age = now - newest
        if age > self.stale_after_s:
            deadline = self._waiting()
            if deadline is None or now > deadline + BUS_MARGIN_S:
                return f"main loop silent for {age:.1f}s"
        try:
            return self._problem()
        except Exception as e:
            return f"watchdog check failed: {e!r}"

    def tick(self) -> bool:
        """One check; the ping when all is well.  True when it was sent."""
        why = self.check()
        now = self._clock()
        if why is None:
            if self._withheld_since is not None and self._log is not None:
                self._log.info("watchdog_resumed", after_s=round(now - self._withheld_since, 1))
            self._withheld_since = self._logged_at = None
            self._notify()
            self.sent += 1
            return True
        if self._withheld_since is None:
            self._withheld_since = now
        if self._log is not None and (self._logged_at is None or now - self._logged_at >= LOG_EVERY_S):
            self._logged_at = now
            self._log.error("watchdog_withheld", detail=why)
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            self.tick()

    def start(self) -> None:
        self.turn = self._clock()
        self.tick()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
