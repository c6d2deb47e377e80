"""Systemd through its D-Bus API (pydbus): the :class:`gpushift.ports.UnitControl` port.

Every read is asked of systemd at that moment (no cache): the switcher gates its decisions on it.
(The sampler's :meth:`SystemdUnits.states` carries over only what cannot have changed unseen.)

Waiting for a job: :mod:`gpushift.host.jobwait` (the ``JobRemoved`` signal, with polling as a
safety net).  Transient units (the hooks): :mod:`gpushift.host.transient`.

The bus comes from :func:`gpushift.host.dbus.connect`.  gi is imported lazily (gpushift must
import without it, and ``gpushift --help`` must start fast).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpushift.errors import GpushiftError, SystemdError
from gpushift.host.dbus import waiting
from gpushift.host.dbus_errors import split_remote
from gpushift.host.jobwait import SIGNAL_GRACE_S, JobWaiter
from gpushift.host.systemd_names import (
    JOB_IFACE,
    PROPS_IFACE,
    SERVICE_IFACE,
    SYSTEMD_BUS_NAME,
    SYSTEMD_PATH,
    UNIT_IFACE,
)
from gpushift.values import JobResult, UnitState

#: How long a single D-Bus call may take (pydbus's proxies wait forever by default).
DEFAULT_CALL_TIMEOUT_S = 25.0


def is_glib_error(e: BaseException) -> bool:
    from gi.repository import GLib

    return isinstance(e, GLib.Error)


#: The properties :meth:`SystemdUnits.state` reads (of the Unit and the Service interface).
#: A socket unit's interface (its ``Listen`` property: ``gpushift check`` against ``[frontdoor] listen``).
SOCKET_IFACE = "org.freedesktop.systemd1.Socket"
_UNIT_KEYS = frozenset({"LoadState", "ActiveState", "SubState", "FragmentPath", "DropInPaths", "Conflicts"})
_SERVICE_KEYS = frozenset({
    "ExecStart", "Result", "MainPID", "Environment", "WorkingDirectory", "User", "KillMode", "SendSIGKILL",
    "TimeoutStopUSec", "ExecMainStartTimestamp", "ExecMainCode", "ExecMainStatus", "NRestarts",
    "ControlGroup", "EnvironmentFiles",
})  # fmt: skip
_EXIT_KEYS = frozenset({"InactiveExitTimestampMonotonic"})


class SystemdUnits:
    """:class:`gpushift.ports.UnitControl` over the systemd manager on ``bus``.

    Thread-safe: any thread may call any method, concurrently (each job wait has its own context).
    """

    def __init__(
        self, bus: Any, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, wait: str = "signal"
    ) -> None:
        """Args:
        bus: a pydbus bus (see :func:`gpushift.host.dbus.connect`).
        call_timeout_s: the most one D-Bus call may take.
        wait: ``"signal"`` (JobRemoved, with polling as a safety net) or ``"poll"`` (poll the job
            object only: for a caller that cannot receive signals).
        """
        if wait not in ("signal", "poll"):
            raise ValueError(f"wait must be 'signal' or 'poll', not {wait!r}")
        self._bus = bus
        self._con = bus.con
        self._call_timeout_s = call_timeout_s
        self._wait = wait
        self._lock = threading.Lock()
        self._manager: Any = None
        self._subscribed = False
        # unit name -> its object path (LoadUnit's answer, stable while systemd runs; asked again
        # when a read through it fails) and the GetAll argument per interface: a readiness wait
        # reads its unit every poll, and the proxy call and argument building were most of a read.
        self._paths: dict[str, str] = {}
        self._getall_args: dict[str, Any] = {}
        self._poll: Any = None  # the sampler's reader (unitpoll.UnitPoll), made at its first use
        # The jobs gpushift itself queued (recent ones): the job watch tells a person's from ours.
        self.own_jobs: collections.deque[str] = collections.deque(maxlen=256)

    # ------------------------------------------------------------------ plumbing

    def _mgr(self) -> Any:
        with self._lock:
            if self._manager is None:
                try:
                    with waiting(self._call_timeout_s):
                        self._manager = self._bus.get(
                            SYSTEMD_BUS_NAME, SYSTEMD_PATH, timeout=self._call_timeout_s
                        )
                except Exception as e:
                    if is_glib_error(e):
                        raise self._error("connect to systemd", None, e) from e
                    raise
            return self._manager

    def _error(self, what: str, unit: str | None, e: BaseException) -> SystemdError:
        name, msg = split_remote(e)
        subject = f"{what} {unit}" if unit else what
        if "Timeout was reached" in msg:
            msg = f"systemd did not answer within {self._call_timeout_s:g} s"
        return SystemdError(f"systemd: {subject}: {msg}" + (f" ({name})" if name else ""))

    def _call(self, what: str, unit: str | None, fn: Any, *args: Any, timeout_s: float | None = None) -> Any:
        """Call a manager method with a timeout, translating D-Bus failures into SystemdError."""
        timeout = timeout_s if timeout_s is not None else self._call_timeout_s
        try:
            with waiting(timeout):
                return fn(*args, timeout=timeout)
        except Exception as e:
            if is_glib_error(e):
                raise self._error(what, unit, e) from e
            raise

    def _get_all(self, path: str, iface: str, unit: str, keys: frozenset[str]) -> dict[str, Any]:
        """The properties ``keys`` of ``iface`` on ``path``, in one GetAll.

        Only those are unpacked (looked up in C): unpacking all of a service's ~250 properties in
        Python made each read cost about 10 ms, and the readiness wait reads its unit every poll.
        """
        from gi.repository import GLib

        args = self._getall_args.get(iface)
        if args is None:
            args = self._getall_args[iface] = (GLib.Variant("(s)", (iface,)), GLib.VariantType.new("(a{sv})"))
        try:
            with waiting(self._call_timeout_s):
                reply = self._con.call_sync(
                    SYSTEMD_BUS_NAME,
                    path,
                    PROPS_IFACE,
                    "GetAll",
                    args[0],
                    args[1],
                    0,
                    int(self._call_timeout_s * 1000),
                    None,
                )
        except GLib.Error as e:
            raise self._error("read the properties of", unit, e) from e
        props = reply.get_child_value(0)
        out: dict[str, Any] = {}
        for key in keys:
            value = props.lookup_value(key, None)
            if value is not None:
                out[key] = value.unpack()
        return out

    def _job_exists(self, job: str, unit: str) -> bool:
        from gi.repository import GLib

        try:
            with waiting(self._call_timeout_s):
                self._con.call_sync(
                    SYSTEMD_BUS_NAME,
                    job,
                    PROPS_IFACE,
                    "Get",
                    GLib.Variant("(ss)", (JOB_IFACE, "State")),
                    GLib.VariantType.new("(v)"),
                    0,
                    int(self._call_timeout_s * 1000),
                    None,
                )
        except GLib.Error as e:
            name, _ = split_remote(e)
            if name in (
                "org.freedesktop.DBus.Error.UnknownObject",
                "org.freedesktop.DBus.Error.UnknownMethod",
            ):
                return False
            raise self._error("follow the job of", unit, e) from e
        return True

    def _ensure_subscribed(self) -> None:
        # systemd sends JobRemoved only to connections that subscribed (one subscription per
        # connection; a second Subscribe() answers AlreadySubscribed, which is fine).
        if self._subscribed:
            return
        mgr = self._mgr()
        try:
            mgr.Subscribe(timeout=self._call_timeout_s)
        except Exception as e:
            if not is_glib_error(e):
                raise
            if split_remote(e)[0] != "org.freedesktop.systemd1.AlreadySubscribed":
                raise self._error("subscribe to", "job signals", e) from e
        self._subscribed = True

    # ------------------------------------------------------------------ the port

    def state(self, unit: str) -> UnitState:
        """What systemd says about ``unit`` right now (LoadUnit: reads the file if not loaded yet).

        A unit without a file comes back with ``load_state == "not-found"`` (no exception): the
        caller decides what a missing unit means.

        Raises:
            SystemdError: systemd cannot be asked, or the name is not a valid unit name.
        """
        path = self._paths.get(unit)
        try:
            if path is None:
                path = self._unit_path(unit)
            u = s = self._unit_props(path, unit)
        except SystemdError:
            if unit not in self._paths:
                raise
            self._paths.pop(unit, None)  # a path remembered from before: ask LoadUnit once more
            path = self._unit_path(unit)
            u = s = self._unit_props(path, unit)
        exec_start: tuple[str, ...] = ()
        commands = s.get("ExecStart") or []
        if commands:
            # a(sasbttttuii): (path, argv, ignore-failure, timestamps..., pid, code, status).  argv is
            # the command as written: ${VAR} is NOT expanded here (/proc/MainPID/cmdline has that).
            exec_start = tuple(str(a) for a in commands[0][1])
        return UnitState(
            name=unit,
            load_state=str(u.get("LoadState", "")),
            active_state=str(u.get("ActiveState", "")),
            sub_state=str(u.get("SubState", "")),
            result=str(s.get("Result", "success")),
            main_pid=int(s.get("MainPID", 0)),
            exec_start=exec_start,
            fragment_path=str(u.get("FragmentPath", "")),
            drop_in_paths=tuple(str(p) for p in u.get("DropInPaths", ())),
            environment=tuple(str(e) for e in s.get("Environment", ())),
            # a(sb): each EnvironmentFile= (its path, and whether a leading "-" lets it be missing)
            environment_files=tuple((str(f[0]), bool(f[1])) for f in s.get("EnvironmentFiles", ())),
            # A leading "!" is systemd's "missing is fine" flag, not part of the path.
            working_directory=str(s.get("WorkingDirectory", "")).lstrip("!"),
            user=str(s.get("User", "")),
            kill_mode=str(s.get("KillMode", "")),
            send_sigkill=bool(s.get("SendSIGKILL", True)),
            timeout_stop_usec=int(s.get("TimeoutStopUSec", 0)),
            conflicts=tuple(str(c) for c in u.get("Conflicts", ())),
            main_start_us=int(s.get("ExecMainStartTimestamp", 0)),
            exec_main_code=int(s.get("ExecMainCode", 0)),
            exec_main_status=int(s.get("ExecMainStatus", 0)),
            n_restarts=int(s.get("NRestarts", 0)),
            control_group=str(s.get("ControlGroup", "")),
        )

    def states(self, units: Sequence[str]) -> dict[str, UnitState | GpushiftError]:
        """Every unit's state for the sampler, in few small calls (:mod:`gpushift.host.unitpoll`)."""
        if self._poll is None:
            from gpushift.host.unitpoll import UnitPoll

            self._poll = UnitPoll(self)
        return dict(self._poll.states(units))

    def keep_loaded(self, unit: str) -> None:
        """Hold a client reference on ``unit`` (``Unit.Ref()``): systemd then keeps it loaded when it
        goes inactive, so how its main process ended (``ExecMainCode``/``ExecMainStatus``) can still
        be read — an unreferenced unit that exits 0 is unloaded at once and forgets it (measured).
        The reference ends with this bus connection."""
        path = self._call("load", unit, self._mgr().LoadUnit, unit)
        try:
            with waiting(2 * self._call_timeout_s):  # introspection, then the call
                self._bus.get(SYSTEMD_BUS_NAME, path)[UNIT_IFACE].Ref(timeout=self._call_timeout_s)
        except Exception as e:
            if not is_glib_error(e):
                raise
            raise self._error("reference", unit, e) from e

    def start(self, unit: str, timeout_s: float) -> JobResult:
        """StartUnit(replace) and wait for the job to end.

        For ``Type=simple`` a ``done`` start job means only that systemd forked the process: watch
        :meth:`state` (and the health URL) afterwards.

        Raises:
            SystemdError: the job could not be queued (e.g. the unit does not exist), or it did not
                end within ``timeout_s``.
        """
        return self._run_job("StartUnit", "start", unit, timeout_s)

    def stop(self, unit: str, timeout_s: float) -> JobResult:
        """StopUnit(replace) and wait for the job to end (systemd SIGKILLs after TimeoutStopSec).

        Raises:
            SystemdError: the job could not be queued (e.g. the unit is not loaded), or it did not
                end within ``timeout_s``.
        """
        return self._run_job("StopUnit", "stop", unit, timeout_s)

    def reset_failed(self, unit: str) -> None:
        """ResetFailedUnit: forget a failed state (and the start rate limit, ``Result=start-limit``).

        A unit systemd has not loaded has nothing to reset: that is not an error.
        """
        mgr = self._mgr()
        try:
            mgr.ResetFailedUnit(unit, timeout=self._call_timeout_s)
        except Exception as e:
            if not is_glib_error(e):
                raise
            if split_remote(e)[0] != "org.freedesktop.systemd1.NoSuchUnit":
                raise self._error("reset-failed", unit, e) from e

    def processes(self, unit: str) -> list[int]:
        """PIDs in the unit's cgroup (GetUnitProcesses); empty when it has none.

        A unit systemd has not loaded (never started, or unloaded once inactive) has no processes.

        Raises:
            SystemdError: systemd cannot be asked.
        """
        mgr = self._mgr()
        try:
            rows = mgr.GetUnitProcesses(unit, timeout=self._call_timeout_s)
        except Exception as e:
            if not is_glib_error(e):
                raise
            if split_remote(e)[0] == "org.freedesktop.systemd1.NoSuchUnit":
                return []
            raise self._error("list the processes of", unit, e) from e
        return sorted({int(pid) for _cgroup, pid, _cmdline in rows})

    # ------------------------------------------------------------------ jobs

    def _run_job(self, method: str, verb: str, unit: str, timeout_s: float) -> JobResult:
        deadline = time.monotonic() + timeout_s
        mgr = self._mgr()
        before = self._inactive_exit(unit) if verb == "start" else 0
        waiter: JobWaiter | None = None
        if self._wait == "signal":
            self._ensure_subscribed()
            waiter = JobWaiter(self._con)  # BEFORE the call: the signal may beat its reply
        try:
            call_timeout = min(self._call_timeout_s, max(1.0, deadline - time.monotonic()))
            job = str(self._call(verb, unit, getattr(mgr, method), unit, "replace", timeout_s=call_timeout))
            self.own_jobs.append(job)
            gone_since: float | None = None
            while True:
                if waiter is not None:
                    result = waiter.wait(job, min(1.0, max(0.0, deadline - time.monotonic())))
                    if result is not None:
                        return JobResult(unit=unit, job=job, result=result)
                else:
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                now = time.monotonic()
                if gone_since is None and not self._job_exists(job, unit):
                    gone_since = now
                # The job object disappears as the signal is sent; give the signal a moment to
                # arrive before falling back to what the unit's state says.
                if gone_since is not None and (waiter is None or now - gone_since >= SIGNAL_GRACE_S):
                    return JobResult(unit=unit, job=job, result=self._infer(verb, unit, before))
                if now >= deadline:
                    raise SystemdError(
                        f"systemd: {verb} {unit}: job {job} did not finish within {timeout_s:g} s "
                        f"(unit {self._describe(unit)})"
                    )
        finally:
            if waiter is not None:
                waiter.close()

    def _unit_props(self, path: str, unit: str) -> dict[str, Any]:
        """The Unit and (for a service) Service properties :meth:`state` uses, in ONE GetAll: an
        empty interface name asks systemd for every interface's.  A systemd that answered for one
        interface only is asked per interface."""
        if not unit.endswith(".service"):
            return self._get_all(path, UNIT_IFACE, unit, _UNIT_KEYS)
        props = self._get_all(path, "", unit, _UNIT_KEYS | _SERVICE_KEYS)
        if "ActiveState" not in props or "MainPID" not in props:
            props = {
                **self._get_all(path, UNIT_IFACE, unit, _UNIT_KEYS),
                **self._get_all(path, SERVICE_IFACE, unit, _SERVICE_KEYS),
            }
        return props

    def socket_listen(self, unit: str) -> tuple[str, list[tuple[str, str]]]:
        """A socket unit's ``LoadState`` and its ``Listen`` property (``a(ss)``: each socket's type
        and address as systemd reads its ``ListenStream=`` etc., e.g. ``("Stream", "[::]:8000")``);
        no addresses unless it is loaded.

        Raises:
            SystemdError: systemd cannot be asked.
        """
        path = self._unit_path(unit)
        load = str(self._get_all(path, UNIT_IFACE, unit, frozenset({"LoadState"})).get("LoadState", ""))
        if load != "loaded":
            return load, []
        listen = self._get_all(path, SOCKET_IFACE, unit, frozenset({"Listen"})).get("Listen") or []
        return load, [(str(kind), str(address)) for kind, address in listen]

    def _unit_path(self, unit: str) -> str:
        """LoadUnit (loads the unit file if systemd has not yet): the unit's object path, remembered."""
        path = str(self._call("load", unit, self._mgr().LoadUnit, unit))
        self._paths[unit] = path
        return path

    def _inactive_exit(self, unit: str) -> int:
        path = self._call("load", unit, self._mgr().LoadUnit, unit)
        return int(self._get_all(path, UNIT_IFACE, unit, _EXIT_KEYS).get("InactiveExitTimestampMonotonic", 0))

    def _infer(self, verb: str, unit: str, before: int) -> str:
        """The job's result from the unit's state, when its JobRemoved was not seen.

        start: ``done`` when the unit is up, or when it left ``inactive`` after our call (it was
        forked, then failed: what JobRemoved also says for ``Type=simple``); ``failed`` otherwise.
        stop: ``done`` when the unit is inactive or failed; ``failed`` otherwise.
        """
        st = self.state(unit)
        if verb == "stop":
            return "done" if st.active_state in ("inactive", "failed") else "failed"
        if st.active_state in ("active", "activating", "reloading"):
            return "done"
        return "done" if self._inactive_exit(unit) > before else "failed"

    def _describe(self, unit: str) -> str:
        try:
            st = self.state(unit)
        except SystemdError as e:
            return f"state unknown: {e}"
        return f"{st.active_state}/{st.sub_state}"
