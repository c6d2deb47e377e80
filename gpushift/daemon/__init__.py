"""The daemon (``gpushift daemon``, what units/gpushift.service runs).

``core`` (the composition root: build, D-Bus calls, reload, watchdog, the loop) · ``relay``
(the switcher's events to the bus's signals, the sample after a switch) · ``clockwork`` (when the keeper decides: the boundary job, clock jumps, reconcile) ·
``watch`` (what the keeper sees between switches: a person's systemctl, failing health) ·
``settings`` (what a config means for the running daemon: the schedule, reload rules).
"""

from gpushift.daemon.core import Daemon, main
from gpushift.daemon.settings import load_schedule_of, parse_until, reloadable

__all__ = ["Daemon", "load_schedule_of", "main", "parse_until", "reloadable"]
