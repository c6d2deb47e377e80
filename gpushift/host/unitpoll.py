"""The backend units' states for the sampler, every period, in few and small D-Bus calls.

:meth:`SystemdUnits.state` answers everything a switch needs in one ``GetAll`` of every interface:
about 300 properties that systemd builds and GDBus parses, then a lookup per wanted key — about
1.5 ms of the daemon's CPU per unit, which, every ``sample_interval_s`` for every backend, was most
of the idle daemon's CPU.  The sampler needs less (:meth:`gpushift.ports.UnitControl.states`), and
asks:

1. ``Manager.ListUnitsByNames`` for every backend unit at once: load, active and sub state, the
   unit's object path and its queued job (systemd loads a unit that is not loaded, as ``LoadUnit``
   does);
2. ``MainPID`` of each unit that has a process (neither ``inactive`` nor ``failed``), with one
   ``Properties.Get``: a relaunch (``systemctl restart`` between two samples) changes it while the
   states read the same;
3. the rest of what a unit's state holds — ``Result``, ``ExecMainStartTimestamp``,
   ``ExecMainCode``/``ExecMainStatus``, ``NRestarts``, ``ControlGroup`` — with a ``GetAll`` of the Service interface
   only when one of the above changed since the previous call, or a job is queued on the unit.
   These do not change without one of them changing (a process that starts, ends or is replaced
   moves the states or the main PID), so the previous answer is carried over otherwise.

A unit missing from the answer (an invalid name, a systemd without ``ListUnitsByNames``), one not
``loaded`` (its Service interface may be absent), and every unit when the listing fails, is read
with :meth:`SystemdUnits.state` instead, so its error, if any, is its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpushift.errors import GpushiftError, SystemdError
from gpushift.host.systemd_names import (
    MANAGER_IFACE,
    PROPS_IFACE,
    SERVICE_IFACE,
    SYSTEMD_BUS_NAME,
    SYSTEMD_PATH,
)
from gpushift.values import UnitState

#: Active states without a main process (systemd resets MainPID to 0 there).
_NO_PROCESS = ("inactive", "failed")

#: The Service properties read when something moved (the configuration is not read here).
_DETAIL_KEYS = frozenset({
    "Result", "MainPID", "ExecMainStartTimestamp", "ExecMainCode", "ExecMainStatus", "NRestarts", "ControlGroup",
})  # fmt: skip


@dataclass(frozen=True)
class _Listed:
    """One row of ListUnitsByNames: what moves when the unit does."""

    load_state: str
    active_state: str
    sub_state: str
    path: str
    job_id: int


class SystemdUnits(Protocol):
    """What the poll uses of :class:`gpushift.host.systemd.SystemdUnits` (its connection, its
    timeout, its full read of one unit, its error mapping): the adapter hands itself in."""

    _con: Any
    _call_timeout_s: float

    def state(self, unit: str) -> UnitState: ...

    def _get_all(self, path: str, iface: str, unit: str, keys: frozenset[str]) -> dict[str, Any]: ...

    def _error(self, what: str, unit: str | None, e: BaseException) -> SystemdError: ...


class UnitPoll:
    """Reads the states of many units cheaply; remembers the last answer per unit (thread-safe)."""

    def __init__(self, units: SystemdUnits) -> None:
        self._units = units
        self._lock = threading.Lock()
        self._last: dict[str, tuple[_Listed, int, UnitState]] = {}  # unit -> (row, main pid, state)
        # The calls' arguments and reply types, built once (PyGObject builds a GVariant in Python).
        self._args: dict[Any, Any] = {}

    def states(self, names: Sequence[str]) -> dict[str, UnitState | GpushiftError]:
        """Every unit's state, or its error (see the module's docstring)."""
        try:
            listed = self._list(names)
        except SystemdError:
            listed = {}
        out: dict[str, UnitState | GpushiftError] = {}
        for name in names:
            try:
                row = listed.get(name)
                out[name] = self._one(name, row) if row is not None else self._full(name)
            except GpushiftError as e:
                out[name] = e
        return out

    def _full(self, name: str) -> UnitState:
        with self._lock:
            self._last.pop(name, None)
        return self._units.state(name)

    def _one(self, name: str, row: _Listed) -> UnitState:
        if row.load_state != "loaded" or not name.endswith(".service"):
            return self._full(name)
        main_pid = 0 if row.active_state in _NO_PROCESS else self._main_pid(row.path, name)
        with self._lock:
            last = self._last.get(name)
        if last is not None and last[0] == row and last[1] == main_pid and row.job_id == 0:
            return last[2]
        props = self._units._get_all(row.path, SERVICE_IFACE, name, _DETAIL_KEYS)
        if "MainPID" not in props:
            return self._full(name)  # no Service interface after all: ask the way a switch does
        st = UnitState(
            name=name,
            load_state=row.load_state,
            active_state=row.active_state,
            sub_state=row.sub_state,
            result=str(props.get("Result", "success")),
            main_pid=int(props["MainPID"]),
            main_start_us=int(props.get("ExecMainStartTimestamp", 0)),
            exec_main_code=int(props.get("ExecMainCode", 0)),
            exec_main_status=int(props.get("ExecMainStatus", 0)),
            n_restarts=int(props.get("NRestarts", 0)),
            control_group=str(props.get("ControlGroup", "")),
        )
        with self._lock:
            # Remember the main PID the details go with: a change after this call reads them again.
            self._last[name] = (row, st.main_pid if row.active_state not in _NO_PROCESS else 0, st)
        return st

    def _list(self, names: Sequence[str]) -> dict[str, _Listed]:
        from gi.repository import GLib

        reply = self._sync(
            SYSTEMD_BUS_NAME,
            SYSTEMD_PATH,
            MANAGER_IFACE,
            "ListUnitsByNames",
            self._arg(tuple(names), lambda: GLib.Variant("(as)", (list(names),))),
            "(a(ssssssouso))",
            "list",
        )
        out: dict[str, _Listed] = {}
        rows = reply.get_child_value(0)
        for i in range(rows.n_children()):
            row = rows.get_child_value(i)
            field = (
                row.get_child_value
            )  # (name, description, load, active, sub, following, path, job id, ...)
            out[field(0).get_string()] = _Listed(
                field(2).get_string(),
                field(3).get_string(),
                field(4).get_string(),
                field(6).get_string(),
                field(7).get_uint32(),
            )
        return out

    def _main_pid(self, path: str, unit: str) -> int:
        from gi.repository import GLib

        reply = self._sync(
            SYSTEMD_BUS_NAME,
            path,
            PROPS_IFACE,
            "Get",
            self._arg("MainPID", lambda: GLib.Variant("(ss)", (SERVICE_IFACE, "MainPID"))),
            "(v)",
            "read the main PID of",
            unit,
        )
        return int(reply.get_child_value(0).get_variant().get_uint32())

    def _arg(self, key: Any, make: Callable[[], Any]) -> Any:
        arg = self._args.get(key)
        if arg is None:
            arg = self._args[key] = make()
        return arg

    def _sync(
        self, dest: str, path: str, iface: str, method: str, args: Any, rtype: str, what: str, unit: str = ""
    ) -> Any:
        from gi.repository import GLib

        u = self._units
        try:
            return u._con.call_sync(
                dest,
                path,
                iface,
                method,
                args,
                self._arg(rtype, lambda: GLib.VariantType.new(rtype)),
                0,
                int(u._call_timeout_s * 1000),
                None,
            )
        except GLib.Error as e:
            raise u._error(what, unit or None, e) from e
