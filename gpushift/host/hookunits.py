"""Hooks as transient systemd units — the :class:`gpushift.ports.HookRunner` port.

A hook runs outside the daemon's hardened sandbox, where the backends run, so a hook that mounts a
disk does it where they see it: ``StartTransientUnit`` (:func:`gpushift.host.transient.run_transient`) with

* ``ExecStartEx=`` the argv exactly as configured, flagged ``no-env-expand`` (systemd would
  otherwise expand ``$VAR`` in it); no shell is involved, so nothing else is expanded either;
* ``User=`` ``[hooks] user`` (``nobody`` by default);
* ``Type=oneshot`` and ``TimeoutStartSec=`` the hook's ``timeout_s``: the start job of a oneshot
  ends when its process exits, and a oneshot that runs past ``TimeoutStartSec=`` is killed.
  ``RuntimeMaxSec=`` (what the issue names) has no effect on ``Type=oneshot`` (systemd.service(5),
  ``RuntimeMaxSec=``), hence ``TimeoutStartSec=`` (docs/design.md, deviations);
* ``StandardOutputFile=``/``StandardErrorFile=`` one file under ``<runtime_dir>/hooks`` (opened by
  systemd, which shares one descriptor for both when the paths are equal): the daemon reads its
  last :data:`OUTPUT_CHARS` characters back, escaped and redacted, and deletes it;
* ``GPUSHIFT_*`` in ``Environment=``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from gpushift.errors import GpushiftError
from gpushift.host import transient
from gpushift.host.systemd import SystemdUnits
from gpushift.safetext import redact, terminal
from gpushift.values import HookOutcome, HookSpec

#: How much of a hook's output the ledger row keeps (its end: where the error is).
OUTPUT_CHARS = 4000
#: A hook asked to stop (timeout, cancel) gets this long before SIGKILL.
STOP_TIMEOUT_S = 10


class SystemdHookRunner:
    """Args:
    units: the daemon's systemd adapter (its bus connection holds the units' references).
    runtime_dir: ``[daemon] runtime_dir``; the output files go to ``<runtime_dir>/hooks``.
    """

    def __init__(self, units: SystemdUnits, runtime_dir: str) -> None:
        self.units = units
        self.dir = os.path.join(runtime_dir, "hooks")

    def properties(self, spec: HookSpec, output: str) -> list[tuple[str, str, object]]:
        usec = int(spec.timeout_s * 1_000_000)
        return [
            ("Description", "s", f"gpushift hook {spec.argv[0]}"),
            ("Type", "s", "oneshot"),
            ("ExecStartEx", "a(sasas)", [(spec.argv[0], list(spec.argv), ["no-env-expand"])]),
            ("User", "s", spec.user),
            ("Environment", "as", [f"{k}={v}" for k, v in spec.env.items()]),
            ("TimeoutStartUSec", "t", usec),
            ("TimeoutStopUSec", "t", STOP_TIMEOUT_S * 1_000_000),
            ("StandardInput", "s", "null"),
            ("StandardOutputFile", "s", output),
            ("StandardErrorFile", "s", output),
        ]

    def run(self, spec: HookSpec, cancelled: Callable[[], bool], beat: Callable[[], None]) -> HookOutcome:
        t0 = time.monotonic()
        output = os.path.join(self.dir, spec.name.removesuffix(".service") + ".out")
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            if os.path.lexists(output):
                os.unlink(output)
            res = transient.run_transient(
                self.units,
                spec.name,
                self.properties(spec, output),
                spec.timeout_s + STOP_TIMEOUT_S + 5,
                cancelled,
                beat,
            )
        except (GpushiftError, OSError) as e:
            return HookOutcome(spec.name, "error", None, self._collect(output), time.monotonic() - t0, str(e))
        if res.stopped_because == "cancelled":
            result = "cancelled"
        elif res.stopped_because == "timeout":
            result = "timeout"
        else:
            result = res.result or ("success" if res.job_result == "done" else "error")
        status = res.exit_status if res.exit_code in (1, 2, 3) else None
        return HookOutcome(spec.name, result, status, self._collect(output), time.monotonic() - t0)

    @staticmethod
    def _collect(path: str) -> str:
        """The file's last characters (escaped for a terminal, secrets masked); the file is removed."""
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - OUTPUT_CHARS * 4))
                data = f.read()
        except OSError:
            return ""
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        text = data.decode("utf-8", errors="replace")[-OUTPUT_CHARS:]
        return redact.redact_text(terminal.escape(text, keep_newlines=True))
