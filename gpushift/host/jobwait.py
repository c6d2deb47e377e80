"""Waiting for a systemd job — :class:`JobWaiter`, the ``JobRemoved`` signals of one caller.

``StartUnit``/``StopUnit`` return a job path; the job's end is the ``JobRemoved(id, job, unit,
result)`` signal, which systemd only sends to clients that called ``Manager.Subscribe()`` and which
may arrive before the method call has returned.  So, per call:

1. a private ``GLib.MainContext`` is made thread-default just long enough to subscribe to
   ``JobRemoved``: GDBus delivers a subscription's signals to the context that was thread-default
   when it was made, so these callbacks run ONLY when the calling thread iterates that context;
2. ``Subscribe()`` (once per connection) and the subscription both exist before ``StartUnit``;
3. after the call returns, the calling thread iterates its private context until the signal for
   its job path has been seen (results are kept by job path, so an early signal is never lost).

This works the same whether the caller is a plain test (no main loop anywhere), a switch worker
thread while the daemon's GLib main loop runs in another thread (that loop never sees these
callbacks, and this thread never needs it), or the loop thread itself.  As a safety net, and for
connections created with ``wait="poll"``, the job object is polled: when it is gone and no signal
came, the result is inferred from the unit's state (``SystemdUnits._infer`` in
:mod:`gpushift.host.systemd`).

:class:`~gpushift.host.systemd.SystemdUnits` waits so for its start and stop jobs, and
:mod:`gpushift.host.transient` for a transient unit's start job.  gi is imported lazily.
"""

from __future__ import annotations

import time
from typing import Any

from gpushift.host.systemd_names import MANAGER_IFACE, SYSTEMD_BUS_NAME, SYSTEMD_PATH

#: After the job object is gone, how long to keep waiting for its JobRemoved before inferring.
SIGNAL_GRACE_S = 1.0


class JobWaiter:
    """JobRemoved signals delivered to a private main context that only the calling thread iterates."""

    def __init__(self, con: Any) -> None:
        from gi.repository import Gio, GLib

        self._con = con
        self._ctx = GLib.MainContext.new()
        self.results: dict[str, tuple[str, str]] = {}  # job path -> (unit, result)
        self._ctx.push_thread_default()
        try:
            self._sub = con.signal_subscribe(
                SYSTEMD_BUS_NAME,
                MANAGER_IFACE,
                "JobRemoved",
                SYSTEMD_PATH,
                None,
                Gio.DBusSignalFlags.NONE,
                self._on_job_removed,
            )
        finally:
            self._ctx.pop_thread_default()
        # A ticking source bounds each blocking iteration, so a wait can notice its deadline.
        self._tick = GLib.timeout_source_new(50)
        self._tick.set_callback(lambda *_: True)
        self._tick.attach(self._ctx)

    def _on_job_removed(
        self, _con: Any, _sender: str, _path: str, _iface: str, _member: str, params: Any
    ) -> None:
        _job_id, job, unit, result = params.unpack()
        self.results[str(job)] = (str(unit), str(result))

    def wait(self, job: str, seconds: float) -> str | None:
        """Iterate the private context up to ``seconds``; the job's result, or None if not seen yet."""
        deadline = time.monotonic() + max(0.0, seconds)
        while job not in self.results:
            self._ctx.iteration(True)  # returns at the latest on the next 50 ms tick
            if time.monotonic() >= deadline:
                break
        found = self.results.get(job)
        return found[1] if found else None

    def close(self) -> None:
        self._con.signal_unsubscribe(self._sub)
        self._tick.destroy()
        while self._ctx.pending():  # drop callbacks queued before the unsubscribe
            self._ctx.iteration(False)
