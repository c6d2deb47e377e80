"""The host's processes and clock — /proc for the argv as run, the wall and monotonic clocks."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from gpushift.values import UnitState


class ProcHost:
    """The :class:`gpushift.ports.Host` of a Linux machine.

    Keeps the model-file fingerprint cache for the life of the daemon, so an unchanged model
    (same path, size, mtime) is not read again at every switch.
    """

    def __init__(self) -> None:
        self._fp_cache: dict[Any, Any] = {}

    def cmdline(self, pid: int) -> list[str]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            return []
        return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []

    def launch_info(self, unit: UnitState, argv: Sequence[str]) -> dict[str, Any]:
        from gpushift.host.launchinfo import collect_launch_info

        return collect_launch_info(unit, argv, cache=self._fp_cache)

    def unit_log(self, unit: str, lines: int) -> dict[str, Any]:
        from gpushift.host.unitlog import unit_log

        return unit_log(unit, lines)


class SystemClock:
    """The :class:`gpushift.ports.Clock` of the real world.

    ``sleep`` waits on an Event rather than calling time.sleep: time.sleep's
    clock_nanosleep(TIMER_ABSTIME) fails with EINVAL under libfaketime (measured), which the
    integration tests preload to jump the daemon's wall clock.  An Event wait is the same
    monotonic wait without that call.
    """

    def __init__(self) -> None:
        self._never = threading.Event()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        self._never.wait(max(0.0, seconds))
