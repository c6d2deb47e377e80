"""Which jobs ran on the backend units that gpushift did not start — a person's ``systemctl``.

systemd announces every job it queues with the manager's ``JobNew(id, job, unit)`` signal (sent to
clients that called ``Manager.Subscribe()``).  The watch keeps, per unit, the jobs it saw; a job
whose path is not among those gpushift queued itself (``SystemdUnits.own_jobs``) is somebody
else's: ``systemctl stop``/``restart``, or ``Conflicts=`` pulled by a person's ``systemctl start``.
That tells a person's stop apart from a backend that exited by itself, which queues no job.

Signals are delivered on the thread that runs the GLib main loop (the daemon's main thread); the
keeper asks :meth:`JobWatch.foreign_job` on whatever thread it runs — the watch is thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any

from gpushift.host.nulllog import NULL_LOG

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"

#: Jobs remembered per unit between two questions (older ones are dropped).
_KEEP = 64


class JobWatch:
    """Args:
    bus: the daemon's pydbus connection (the one systemd is asked on).
    own_jobs: the job paths gpushift queued itself (read at question time: a JobNew may arrive
        before the call that queued the job has returned its path).
    """

    def __init__(self, bus: Any, own_jobs: Callable[[], Collection[str]], log: Any = NULL_LOG) -> None:
        self._bus = bus
        self._own_jobs = own_jobs
        self._log = log
        self._lock = threading.Lock()
        self._jobs: dict[str, list[str]] = {}
        self._subscription: Any = None

    def start(self) -> None:
        """Subscribe (call on the thread that runs the GLib main loop)."""
        self._subscription = self._bus.subscribe(
            sender=SYSTEMD, iface=MANAGER_IFACE, signal="JobNew", signal_fired=self._on_signal
        )
        try:
            self._bus.get(SYSTEMD, "/org/freedesktop/systemd1").Subscribe()
        except Exception as e:  # already subscribed on this connection: fine
            self._log.debug("jobwatch_subscribe", detail=str(e))

    def stop(self) -> None:
        if self._subscription is not None:
            self._subscription.unsubscribe()
            self._subscription = None

    def _on_signal(self, sender: str, obj: str, iface: str, signal: str, params: Any) -> None:
        _job_id, job, unit = params
        self.record(str(unit), str(job))

    def record(self, unit: str, job: str) -> None:
        with self._lock:
            jobs = self._jobs.setdefault(unit, [])
            jobs.append(job)
            del jobs[:-_KEEP]

    def foreign_job(self, unit: str) -> bool | None:
        """A job gpushift did not queue ran on ``unit`` since the last question (and forget them)."""
        with self._lock:
            jobs = self._jobs.pop(unit, [])
        own = set(self._own_jobs())
        return any(j not in own for j in jobs)
