"""The switch's events → the bus's signals, the sample after a switch, systemd's status line.

The switcher calls :meth:`SignalRelay.on_event` on its worker thread for every event (each of the
transition table's transitions is one: :mod:`gpushift.switch.phases`); the relay hands the D-Bus
``Progress`` and ``Finished`` signals to the GLib loop thread.  As a switch finishes, the keeper
looks first (its decision reads the switch's end from the switcher's finished runs), then
``Finished`` goes out; a sample of what the switch left is taken beside it, and status waits for it
(:meth:`SignalRelay.latest_sample`).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Protocol

from gpushift.safetext import redact
from gpushift.sampler.sample import Sample
from gpushift.switch import Event
from gpushift.values import EventKind, Trigger


class _Daemon(Protocol):
    """The parts of :class:`gpushift.daemon.core.Daemon` the relay uses (core imports this module)."""

    sampler: Any
    clockwork: Any
    notices: Any
    notify: Any
    log: Any

    @property
    def service(self) -> Any: ...

    def update_status_line(self) -> None: ...


class SignalRelay:
    def __init__(self, daemon: _Daemon) -> None:
        self.d = daemon
        self._sampled = threading.Event()  # clear from a switch's end until the sample after it
        self._sampled.set()

    def on_event(self, ev: Event) -> None:
        """Called on the worker thread: hand the signal to the GLib loop thread."""
        from gi.repository import GLib

        d = self.d

        def emit() -> bool:
            svc = d.service
            if svc is None:
                return False
            if ev.result is None:
                svc.Progress(ev.ticket, ev.phase.value, redact.redact_text(ev.detail))
                svc.announce()  # the properties this event changed, right after its signal
            else:
                # The keeper's first look after the switch (it asks systemd what runs, not the
                # sample, and takes the switch's end into account) comes before Finished: what a
                # person does once `gpushift switch` exited (a `systemctl restart`) is seen as a
                # change after the switch, never as its end.
                d.clockwork.tick(Trigger.RECONCILE)
                result = redact.redact_tree(ev.result.to_dict())
                svc.Finished(ev.ticket, ev.ok, json.dumps(result, default=str))
            return False

        def after_sample() -> bool:
            """Once the sample of what the switch left is published: the properties it changed
            and the status line, from it."""
            svc = d.service
            if svc is None:
                return False
            d.update_status_line()
            svc.announce()
            return False

        # PRIORITY_HIGH: GDBus queues every incoming call as a source of DEFAULT priority, and GLib
        # runs a lower one (idle_add's default) only once none of those is ready — never during a
        # flood of calls.  A high one runs at the start of the loop's next iteration.
        if ev.result is None:
            GLib.idle_add(emit, priority=GLib.PRIORITY_HIGH)
            if ev.kind is EventKind.PROGRESS:
                d.notify.status(redact.redact_text(f"switching: {ev.phase} {ev.detail}")[:200])
            return
        # The row is complete: Finished goes out now (the CLI exits on it).  The sample of what the
        # switch left is taken beside it, on a thread of its own (this listener returns at once: the
        # keeper's own listener must see the end before the keeper's tick does); until the sample is
        # published, status and the properties wait for it (latest_sample), so a status asked once
        # `gpushift switch` exited shows the new backend serving; the loop goes on meanwhile.
        try:
            d.notices.finished(ev.result)  # the webhook's document, queued on disk
        except Exception as e:  # a listener must not fail the switch's end
            d.log.error("webhook_enqueue_failed", error=repr(e))
        self._sampled.clear()

        def sample() -> None:
            self._sample_after_switch()
            GLib.idle_add(after_sample, priority=GLib.PRIORITY_HIGH)

        threading.Thread(target=sample, name="sample-after-switch", daemon=True).start()
        GLib.idle_add(emit, priority=GLib.PRIORITY_HIGH)

    def _sample_after_switch(self) -> None:
        """As Finished goes out (a thread of its own): a sample taken after the switch ended, so a
        status asked right after the switch shows what it left."""
        try:
            self.d.sampler.sample_once()
        except Exception as e:  # a listener must not fail the switch's end
            self.d.log.error("sample_after_switch_failed", error=repr(e))
        finally:
            self._sampled.set()

    def latest_sample(self) -> Sample:
        """The sampler's latest sample; right after a switch, the one taken after it (waited for, at
        most one sampling period: a cycle publishes within it)."""
        sampler = self.d.sampler
        self._sampled.wait(sampler.period_s)
        snap: Sample = sampler.snapshot()
        return snap
