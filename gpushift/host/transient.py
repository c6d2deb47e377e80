"""Transient systemd units — how a hook runs (:mod:`gpushift.host.hookunits`): ``StartTransientUnit``,
the wait for its start job (:mod:`gpushift.host.jobwait`), and how the unit ended.

It works through the daemon's :class:`~gpushift.host.systemd.SystemdUnits` (its connection, its
subscription to job signals, its timeouts and error mapping): the units' references belong to that
connection.  gi is imported lazily.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.errors import SystemdError
from gpushift.host.jobwait import SIGNAL_GRACE_S, JobWaiter
from gpushift.host.systemd import SystemdUnits, is_glib_error
from gpushift.host.systemd_names import (
    MANAGER_IFACE,
    SERVICE_IFACE,
    SYSTEMD_BUS_NAME,
    SYSTEMD_PATH,
    UNIT_IFACE,
)

#: What is read of the unit once it has ended.
_KEYS = frozenset({"Result", "ExecMainCode", "ExecMainStatus"})

#: How long a transient unit that was asked to stop may take (its TimeoutStopSec= is shorter).
STOP_S = 30.0


@dataclass(frozen=True)
class TransientResult:
    """How a transient unit ended: systemd's ``Result`` (``success``, ``exit-code``, ``signal``,
    ``timeout``, ...), its start job's result, ``ExecMainCode`` (1 exited, 2 killed, 3 dumped) and
    ``ExecMainStatus`` (the exit status or the signal), and whether gpushift stopped it and why."""

    unit: str
    result: str
    job_result: str
    exit_code: int
    exit_status: int
    stopped_because: str | None = None


def run_transient(
    units: SystemdUnits,
    name: str,
    properties: Sequence[tuple[str, str, Any]],
    timeout_s: float,
    cancelled: Callable[[], bool],
    beat: Callable[[], None],
    fds: Sequence[int] = (),
) -> TransientResult:
    """Start the transient unit ``name`` (``StartTransientUnit``, mode ``fail``) and wait for its
    start job to end: for ``Type=oneshot`` that is when its process has exited.

    ``properties``: (name, D-Bus signature, value), e.g. ``("User", "s", "nobody")``; a value of
    signature ``h`` is an index into ``fds``, the descriptors sent with the call (systemd keeps its
    own copies: e.g. ``StandardOutputFileDescriptor``; the caller still owns and closes ``fds``,
    and no copy of them is kept here once the call has returned).  The unit
    also gets ``AddRef=yes`` (systemd keeps it loaded, with its ``Result`` and exit status, until
    this connection releases it) and ``CollectMode=inactive-or-failed`` (then it is garbage
    collected, failed or not: no ``reset-failed`` is needed).  When ``cancelled()`` says yes, or
    ``timeout_s`` passes, the unit is stopped (its control group killed).  ``beat`` is called
    about twice a second.  The unit is released once its result has been read.

    Raises:
        SystemdError: systemd refused the unit, or it did not end after being stopped.
    """
    from gi.repository import GLib

    props = [(k, GLib.Variant(sig, v)) for k, sig, v in properties]
    props += [
        ("AddRef", GLib.Variant("b", True)),
        ("CollectMode", GLib.Variant("s", "inactive-or-failed")),
    ]
    units._ensure_subscribed()
    waiter = JobWaiter(units._con)
    stopped_because: str | None = None
    try:
        reply = _start(units, name, props, fds)
        job = str(reply.unpack()[0])
        units.own_jobs.append(job)
        deadline = time.monotonic() + timeout_s
        stop_deadline: float | None = None
        while True:
            beat()
            if waiter.wait(job, 0.5) is not None:
                break
            now = time.monotonic()
            if stopped_because is None and (cancelled() or now >= deadline):
                stopped_because = "cancelled" if cancelled() else "timeout"
                units._call("stop", name, units._mgr().StopUnit, name, "replace")
                stop_deadline = now + STOP_S
            if not units._job_exists(job, name):
                waiter.wait(job, SIGNAL_GRACE_S)
                break
            if stop_deadline is not None and now >= stop_deadline:
                raise SystemdError(f"systemd: {name} did not stop within {STOP_S:g} s")
        return _result(units, name, stopped_because, waiter.results.get(job, ("", ""))[1], beat)
    finally:
        waiter.close()


def _start(units: SystemdUnits, name: str, props: list[tuple[str, Any]], fds: Sequence[int]) -> Any:
    """``StartTransientUnit``'s reply (the job), ``fds`` sent with the call."""
    from gi.repository import Gio, GLib

    args = GLib.Variant("(ssa(sv)a(sa(sv)))", (name, "fail", props, []))
    timeout_ms = int(units._call_timeout_s * 1000)
    try:
        if not fds:
            return units._con.call_sync(
                SYSTEMD_BUS_NAME, SYSTEMD_PATH, MANAGER_IFACE, "StartTransientUnit", args,
                GLib.VariantType.new("(o)"), 0, timeout_ms, None,
            )  # fmt: skip
        fd_list = Gio.UnixFDList.new()
        for fd in fds:
            fd_list.append(fd)  # a copy of each
        try:
            reply, _ = units._con.call_with_unix_fd_list_sync(
                SYSTEMD_BUS_NAME, SYSTEMD_PATH, MANAGER_IFACE, "StartTransientUnit", args,
                GLib.VariantType.new("(o)"), 0, timeout_ms, fd_list, None,
            )  # fmt: skip
        finally:
            for copy in fd_list.steal_fds():  # else the write end of a pipe stays open here
                os.close(copy)
        return reply
    except GLib.Error as e:
        raise units._error("start the transient unit", name, e) from e


def _result(
    units: SystemdUnits, name: str, stopped_because: str | None, job_result: str, beat: Callable[[], None]
) -> TransientResult:
    """Wait until the unit is inactive or failed, read how it ended, release it."""
    mgr = units._mgr()
    path = units._call("look up", name, mgr.GetUnit, name)
    deadline = time.monotonic() + STOP_S
    while True:
        beat()
        unit = units._get_all(path, UNIT_IFACE, name, frozenset({"ActiveState"}))
        if str(unit.get("ActiveState")) in ("inactive", "failed") or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    svc = units._get_all(path, SERVICE_IFACE, name, _KEYS)
    try:
        units._bus.get(SYSTEMD_BUS_NAME, path)[UNIT_IFACE].Unref(timeout=units._call_timeout_s)
    except Exception as e:
        if not is_glib_error(e):
            raise
        # Released already (or collected): nothing is left behind either way.
    return TransientResult(
        unit=name,
        result=str(svc.get("Result", "")),
        job_result=job_result,
        exit_code=int(svc.get("ExecMainCode", 0)),
        exit_status=int(svc.get("ExecMainStatus", 0)),
        stopped_because=stopped_because,
    )
