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
* ``StandardOutputFileDescriptor=``/``StandardErrorFileDescriptor=`` the write end of a pipe the
  daemon passes with the call (:class:`OutputTail`): a thread of the daemon reads it while the hook
  runs, keeps its last :data:`KEPT_BYTES` and drops the rest, so a hook that prints 200 MB costs
  the host nothing but the reading: no file grows (before, the output went to a file under
  ``<runtime_dir>/hooks``, a tmpfs on a real host, which grew until the hook ended).  The ledger row
  gets its last :data:`OUTPUT_CHARS` characters, escaped and redacted, after a note of the whole
  size when some of it was dropped;
* ``GPUSHIFT_*`` in ``Environment=``.

Why a pipe, not a size limit on the file: ``LimitFSIZE=`` applies to every file the hook writes
(a hook that copies a model or writes a dump would fail with ``SIGXFSZ``/``EFBIG``), and kills a
chatty hook rather than capping its output; systemd has no size limit for ``StandardOutput=file:``.
The price: once the daemon is gone (it died mid-switch), a hook still running gets ``EPIPE`` (or
``SIGPIPE``) on its next write — the daemon that starts converges anyway (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable

from gpushift.errors import GpushiftError
from gpushift.host import transient
from gpushift.host.systemd import SystemdUnits
from gpushift.safetext import redact, terminal
from gpushift.values import HookOutcome, HookSpec

#: How much of a hook's output the ledger row keeps (its end: where the error is).
OUTPUT_CHARS = 4000
#: How much of it the daemon keeps while the hook runs (enough for OUTPUT_CHARS of any UTF-8).
KEPT_BYTES = OUTPUT_CHARS * 4
#: Once the hook's unit has ended, how long its output may take to reach its end: a process of the
#: hook that outlives it (systemd kills the rest of a oneshot's control group) still holds the pipe.
DRAIN_GRACE_S = 5.0
_CHUNK = 64 * 1024
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

    def properties(self, spec: HookSpec) -> list[tuple[str, str, object]]:
        """The transient unit's properties; its output goes to the first descriptor sent along."""
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
            ("StandardOutputFileDescriptor", "h", 0),
            ("StandardErrorFileDescriptor", "h", 0),
        ]

    def run(self, spec: HookSpec, cancelled: Callable[[], bool], beat: Callable[[], None]) -> HookOutcome:
        t0 = time.monotonic()
        try:
            self._forget_old_output(spec.name)
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
        except OSError as e:
            return HookOutcome(spec.name, "error", None, "", time.monotonic() - t0, str(e))
        tail = OutputTail(read_end)
        try:
            res = transient.run_transient(
                self.units,
                spec.name,
                self.properties(spec),
                spec.timeout_s + STOP_TIMEOUT_S + 5,
                cancelled,
                beat,
                fds=[write_end],
            )
        except (GpushiftError, OSError) as e:
            os.close(write_end)
            return HookOutcome(spec.name, "error", None, tail.text(), time.monotonic() - t0, str(e))
        os.close(write_end)
        if res.stopped_because == "cancelled":
            result = "cancelled"
        elif res.stopped_because == "timeout":
            result = "timeout"
        else:
            result = res.result or ("success" if res.job_result == "done" else "error")
        status = res.exit_status if res.exit_code in (1, 2, 3) else None
        return HookOutcome(spec.name, result, status, tail.text(), time.monotonic() - t0)

    def _forget_old_output(self, name: str) -> None:
        """The output file an older gpushift left for this hook under ``<runtime_dir>/hooks`` (no
        output goes there any more; the directory is kept, empty)."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, name.removesuffix(".service") + ".out"))


class OutputTail:
    """The read end of the pipe a hook writes to: a thread reads it until its end (every writer
    closed it) or until :meth:`text` stops it, keeping the last ``keep`` bytes and how many came.

    The thread only ever holds ``2 * keep`` bytes; reading 200 MB costs about a second of one core
    here (bench: a hook printing 200 MB in test_hook_flood_e2e.py)."""

    def __init__(self, fd: int, keep: int = KEPT_BYTES) -> None:
        self._fd = fd
        self._keep = keep
        self._tail = bytearray()
        #: Bytes the hook wrote (read so far).
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="gpushift-hook-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self._stop.is_set():
            if not poller.poll(200):
                continue
            try:
                chunk = os.read(self._fd, _CHUNK)
            except OSError:
                return
            if not chunk:
                return  # every writer closed it: the hook (and what it started) ended
            self.total += len(chunk)
            self._tail += chunk
            if len(self._tail) > 2 * self._keep:
                del self._tail[: -self._keep]

    def text(self, grace_s: float = DRAIN_GRACE_S) -> str:
        """Once the hook has ended: its output's last :data:`OUTPUT_CHARS` characters (escaped for a
        terminal, secrets masked), after a note of the whole size when some were dropped.  Waits up
        to ``grace_s`` for the pipe's end, then stops the reader and closes the pipe."""
        self._thread.join(grace_s)
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        kept = bytes(self._tail[-self._keep :])
        whole = kept.decode("utf-8", errors="replace")
        text = whole[-OUTPUT_CHARS:]
        if self.total > len(kept) or len(whole) > len(text):
            note = (
                f"[gpushift: {self.total} bytes of output in all; the last {len(text)} characters follow]\n"
            )
            text = note + text
        return redact.redact_text(terminal.escape(text, keep_newlines=True))
