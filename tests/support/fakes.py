"""Stateful fakes of the ports, and a ``World`` that wires them to a real :class:`Switcher`.

The fakes keep state the way the real systems do (a unit that was started is active until it is
stopped or crashes; a GPU's memory comes back some reads after its process went), so a test states
a situation and then asserts what the switcher did.  Every call that changes or observes the world
goes into one shared :class:`EventLog`, stamped with the fake monotonic time, so ordering rules
("the intent row exists before the first stop") are asserted on one timeline.

Only the stdlib and gpushift are imported here: the unit tests also run on bare 3.10/3.12 venvs.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from gpushift.config.schema import Config, parse
from gpushift.errors import GpushiftError
from gpushift.keeper.override import Override
from gpushift.ports import Ports, states_one_by_one
from gpushift.switch import Event, Switcher, SwitchResult
from gpushift.values import (
    Caller,
    GpuInfo,
    GpuReading,
    Health,
    Holder,
    HookOutcome,
    HookSpec,
    HostGpuFacts,
    JobResult,
    Outcome,
    SwitchRecord,
    Trigger,
    UnitState,
    VersionInfo,
    WarmupRequest,
    WarmupResult,
)

# --------------------------------------------------------------------------- shared timeline


@dataclass(frozen=True)
class Entry:
    """One thing that happened: ``kind`` such as ``units.stop``, its arguments, the fake time."""

    t: float
    kind: str
    args: tuple[Any, ...]


class EventLog:
    """The one ordered log every fake writes to (thread-safe: the switch runs on a worker)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.entries: list[Entry] = []
        self._lock = threading.Lock()

    def add(self, kind: str, *args: Any) -> None:
        with self._lock:
            self.entries.append(Entry(self.clock.monotonic(), kind, args))

    def kinds(self) -> list[str]:
        return [e.kind for e in self.entries]

    def of(self, kind: str) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]

    def first(self, kind: str, *args: Any) -> int:
        """Index of the first entry of ``kind`` whose leading args equal ``args``; -1 if none."""
        for i, e in enumerate(self.entries):
            if e.kind == kind and e.args[: len(args)] == args:
                return i
        return -1

    def last(self, kind: str, *args: Any) -> int:
        for i in range(len(self.entries) - 1, -1, -1):
            e = self.entries[i]
            if e.kind == kind and e.args[: len(args)] == args:
                return i
        return -1


# --------------------------------------------------------------------------- clock


class FakeClock:
    """Monotonic time that moves only when somebody sleeps; ``now()`` is aware UTC."""

    def __init__(self, start: datetime | None = None, mono: float = 5000.0) -> None:
        self._wall0 = start or datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
        self._mono0 = mono
        self._mono = mono
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> datetime:
        with self._lock:
            return self._wall0 + timedelta(seconds=self._mono - self._mono0)

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")  # as time.sleep does
        with self._lock:
            self._mono += seconds
            self.sleeps.append(seconds)

    def advance(self, seconds: float) -> None:
        """Let time pass outside the switcher (a test's own step)."""
        self.sleep(seconds)

    @property
    def elapsed(self) -> float:
        with self._lock:
            return self._mono - self._mono0


# --------------------------------------------------------------------------- systemd


@dataclass
class FakeUnit:
    """One systemd unit and how it misbehaves when asked."""

    name: str
    load_state: str = "loaded"
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    main_pid: int = 0
    exec_start: tuple[str, ...] = ()  # as written (${VAR} unexpanded)
    argv_running: tuple[str, ...] = ()  # what /proc/MainPID/cmdline says once started
    fragment_path: str = ""
    children: int = 0  # extra processes in the cgroup besides the main one
    pids: list[int] = field(default_factory=list)
    started_mono: float | None = None
    main_start_us: int = 0  # ExecMainStartTimestamp of the last start (kept after the process ends)
    # --- behaviours
    crash_after_s: float | None = None  # after a start, the process exits this long after (0: at once)
    crash_result: str = "exit-code"
    start_job_result: str = "done"  # anything else: the job fails and the unit is failed
    start_failure_result: str = "exit-code"  # Service.Result after a failed start job
    stop_job_result: str = "done"
    stop_leaves_running: bool = False  # a stop that leaves the unit active (a wedged stop)
    stop_duration_s: float = 0.0  # how long StopUnit takes until JobRemoved (fake time)
    start_duration_s: float = 0.0
    start_raises: Exception | None = None  # StartUnit itself fails (the adapter raises SystemdError)
    stop_raises: Exception | None = None
    hold_stop: threading.Event | None = None  # when set: stop() blocks until the event is set
    stop_entered: threading.Event = field(default_factory=threading.Event)

    @property
    def running(self) -> bool:
        return self.active_state in ("active", "activating", "reloading")


Subscriber = Callable[[str, "FakeUnit"], None]


class FakeUnits:
    """systemd for the backend units: ``state()`` reflects every start/stop/crash at once."""

    def __init__(self, clock: FakeClock, log: EventLog) -> None:
        self.clock = clock
        self.log = log
        self.units: dict[str, FakeUnit] = {}
        self.calls: list[tuple[str, str]] = []  # ("start"|"stop"|"reset_failed", unit), in order
        self.state_reads: list[str] = []
        self._subscribers: list[Subscriber] = []
        self._pids = itertools.count(4000)
        self._jobs = itertools.count(1)
        self._lock = threading.RLock()

    # --- set-up (what a test arranges; not logged as calls)

    def add(self, name: str, **behaviour: Any) -> FakeUnit:
        u = FakeUnit(name=name, **behaviour)
        self.units[name] = u
        return u

    def behave(self, name: str, **behaviour: Any) -> FakeUnit:
        u = self.units[name]
        for k, v in behaviour.items():
            if not hasattr(u, k):
                raise AttributeError(f"FakeUnit has no behaviour {k!r}")
            setattr(u, k, v)
        return u

    def subscribe(self, fn: Subscriber) -> None:
        """``fn(event, unit)`` with event ``started``, ``stopped`` or ``crashed``."""
        self._subscribers.append(fn)

    def set_running(self, name: str) -> int:
        """Make a unit active as if somebody had started it earlier (e.g. ``systemctl start``)."""
        with self._lock:
            u = self.units[name]
            self._activate(u)
            return u.main_pid

    def set_stopped(self, name: str) -> None:
        """Make a unit inactive behind the switcher's back (``systemctl stop``); memory goes at once."""
        with self._lock:
            u = self.units[name]
            u.active_state, u.sub_state, u.main_pid, u.pids = "inactive", "dead", 0, []
            self._notify("crashed", u)

    def set_failed(self, name: str, result: str) -> None:
        with self._lock:
            u = self.units[name]
            u.active_state, u.sub_state, u.result, u.main_pid, u.pids = "failed", "failed", result, 0, []

    def is_running(self, name: str) -> bool:
        with self._lock:
            u = self.units.get(name)
            if u is None:
                return False
            self._refresh(u)
            return u.running

    # --- internals

    def _notify(self, event: str, u: FakeUnit) -> None:
        for fn in list(self._subscribers):
            fn(event, u)

    def _activate(self, u: FakeUnit) -> None:
        u.active_state, u.sub_state, u.result = "active", "running", "success"
        u.main_pid = next(self._pids)
        u.pids = [u.main_pid] + [next(self._pids) for _ in range(u.children)]
        u.started_mono = self.clock.monotonic()
        u.main_start_us = int(self.clock.now().timestamp() * 1_000_000)
        self._notify("started", u)

    def _refresh(self, u: FakeUnit) -> None:
        # A Type=simple process that dies after its start job finished: systemd notices at once.
        if (
            u.running
            and u.crash_after_s is not None
            and u.started_mono is not None
            and self.clock.monotonic() - u.started_mono >= u.crash_after_s
        ):
            u.active_state, u.sub_state, u.result = "failed", "failed", u.crash_result
            u.main_pid, u.pids = 0, []
            self._notify("crashed", u)
            self.log.add("units.crashed", u.name, u.crash_result)

    def _job(self, unit: str, result: str) -> JobResult:
        return JobResult(unit=unit, job=f"/org/freedesktop/systemd1/job/{next(self._jobs)}", result=result)

    # --- the UnitControl port

    def states(self, units: Sequence[str]) -> dict[str, UnitState | GpushiftError]:
        return states_one_by_one(self.state, units)

    def state(self, unit: str) -> UnitState:
        with self._lock:
            self.state_reads.append(unit)
            u = self.units.get(unit)
            if u is None:
                return UnitState(name=unit, load_state="not-found", active_state="inactive", sub_state="dead")
            self._refresh(u)
            return UnitState(
                name=u.name,
                load_state=u.load_state,
                active_state=u.active_state,
                sub_state=u.sub_state,
                result=u.result,
                main_pid=u.main_pid,
                exec_start=u.exec_start,
                fragment_path=u.fragment_path,
                main_start_us=u.main_start_us,
                control_group=f"/system.slice/{u.name}" if u.pids else "",
            )

    def start(self, unit: str, timeout_s: float) -> JobResult:
        with self._lock:
            self.calls.append(("start", unit))
            self.log.add("units.start", unit)
            u = self.units.get(unit)
            if u is None or u.load_state != "loaded":
                return self._job(unit, "failed")
            if u.start_raises is not None:
                raise u.start_raises
            if u.start_duration_s:
                self.clock.sleep(u.start_duration_s)
            if u.running:
                return self._job(unit, "done")
            if u.active_state == "failed" and u.result == "start-limit":
                # systemd refuses until ResetFailedUnit
                return self._job(unit, "failed")
            if u.start_job_result != "done":
                u.active_state, u.sub_state, u.result = "failed", "failed", u.start_failure_result
                u.main_pid, u.pids = 0, []
                return self._job(unit, u.start_job_result)
            self._activate(u)
            return self._job(unit, "done")

    def stop(self, unit: str, timeout_s: float) -> JobResult:
        u = self.units.get(unit)
        with self._lock:
            self.calls.append(("stop", unit))
            self.log.add("units.stop", unit)
        if u is None:
            return self._job(unit, "done")
        if u.stop_raises is not None:
            raise u.stop_raises
        u.stop_entered.set()
        # Held outside the lock: another thread may ask for state() meanwhile, as with real systemd.
        if u.hold_stop is not None and not u.hold_stop.wait(30):
            raise AssertionError(f"test never released the held stop of {unit}")
        with self._lock:
            if u.stop_duration_s:
                self.clock.sleep(u.stop_duration_s)
            self.log.add("units.stopped", unit)
            if u.stop_leaves_running:
                return self._job(unit, u.stop_job_result)
            was_running = u.running
            if u.active_state != "failed":  # a failed unit stays failed until reset-failed
                u.active_state, u.sub_state = "inactive", "dead"
            u.main_pid, u.pids = 0, []
            if was_running:
                self._notify("stopped", u)
            return self._job(unit, u.stop_job_result)

    def reset_failed(self, unit: str) -> None:
        with self._lock:
            self.calls.append(("reset_failed", unit))
            self.log.add("units.reset_failed", unit)
            u = self.units.get(unit)
            if u is not None and u.active_state == "failed":
                u.active_state, u.sub_state, u.result = "inactive", "dead", "success"

    def processes(self, unit: str) -> list[int]:
        with self._lock:
            u = self.units.get(unit)
            if u is None:
                return []
            self._refresh(u)
            return list(u.pids)


# --------------------------------------------------------------------------- GPUs


@dataclass
class _Alloc:
    """What a backend unit's processes hold while it runs."""

    unit: str
    gpus: tuple[int, ...]
    mib: float
    report_per_process: bool = True  # False: the provider cannot attribute memory per process
    pid: int = 0
    held: bool = False
    release_after_read: int | None = None  # last read that still shows it (after a stop)


@dataclass
class _Foreign:
    gpu: int
    holder: Holder
    mib: float


class FakeGpu:
    """GPUs with memory and holders.

    A backend's memory appears when its unit starts and is released ``drain_reads`` reads after its
    unit stops ("VRAM drains N reads after a stop"); a crash releases it at once.  Foreign holders
    (another user's job, an orphan) never go unless removed.  ``error``/``errors`` make readings
    UNKNOWN; ``incomplete`` makes a GPU's holder list incomplete (also UNKNOWN).
    """

    simulated: bool

    def __init__(
        self,
        log: EventLog,
        count: int = 2,
        total_mib: float = 16384.0,
        simulated: bool = False,
        drain_reads: int = 0,
    ) -> None:
        self.log = log
        self.count = count
        self.total_mib = total_mib
        self.simulated = simulated
        self.drain_reads = drain_reads
        self.reads = 0
        self.read_calls: list[tuple[int, ...] | None] = []
        self.holder_reads = 0  # reads that named holders (the /proc scan of a real provider)
        self.error: str | None = None  # every GPU unreadable (NVML gone)
        self.errors: dict[int, str] = {}  # per GPU
        self.incomplete: dict[int, tuple[int, ...]] = {}  # GPU -> pids whose fds could not be read
        self.baseline_mib: dict[int, float] = {}
        self.allocs: dict[str, _Alloc] = {}
        self.foreign: list[_Foreign] = []
        self.orphans_on_stop: dict[str, list[_Foreign]] = {}
        self.uuids: dict[int, str] = {}  # a replaced card: another UUID at the same index
        self._lock = threading.RLock()

    # --- set-up

    def allocate(self, unit: str, gpus: Sequence[int], mib: float, report_per_process: bool = True) -> None:
        """While ``unit`` runs, its main process holds ``mib`` on each of ``gpus``."""
        self.allocs[unit] = _Alloc(unit, tuple(gpus), mib, report_per_process)

    def add_foreign(
        self,
        gpu: int,
        pid: int,
        mib: float,
        command: str = "python",
        user: str = "bob",
        cmdline: Sequence[str] = (),
        unit: str | None = None,
    ) -> Holder:
        """A process outside every backend unit with GPU ``gpu`` open, holding ``mib`` (0: none)."""
        h = Holder(pid=pid, user=user, command=command, cmdline=tuple(cmdline), unit=unit, used_mib=mib)
        with self._lock:
            self.foreign.append(_Foreign(gpu, h, mib))
        return h

    def remove_foreign(self, pid: int) -> None:
        with self._lock:
            self.foreign = [f for f in self.foreign if f.holder.pid != pid]

    def orphan_on_stop(
        self, unit: str, gpu: int, pid: int, mib: float, command: str = "python", user: str = "svc"
    ) -> None:
        """When ``unit`` is stopped, a child it left outside its cgroup keeps ``mib`` on ``gpu``."""
        h = Holder(pid=pid, user=user, command=command, used_mib=mib)
        self.orphans_on_stop.setdefault(unit, []).append(_Foreign(gpu, h, mib))

    def unit_event(self, event: str, u: FakeUnit) -> None:
        """FakeUnits subscriber: keeps the backend allocations in step with the units."""
        with self._lock:
            a = self.allocs.get(u.name)
            if event == "started":
                if a is not None:
                    a.held, a.pid, a.release_after_read = True, u.main_pid, None
            elif event == "stopped":
                if a is not None and a.held:
                    a.release_after_read = self.reads + self.drain_reads
                self.foreign.extend(self.orphans_on_stop.pop(u.name, []))
            elif event == "crashed" and a is not None:
                a.held, a.release_after_read = False, None

    # --- the GpuProbe port

    def facts(self) -> HostGpuFacts:
        return HostGpuFacts(
            simulated=self.simulated,
            driver_version="580.0.0",
            cuda_version="13.0",
            gpus=tuple(
                GpuInfo(i, "Fake V100", self.uuids.get(i, f"GPU-fake-{i}"), self.total_mib, (7, 0))
                for i in range(self.count)
            ),
        )

    def read(self, indices: Sequence[int] | None = None, holders: bool = True) -> list[GpuReading]:
        with self._lock:
            self.reads += 1
            self.read_calls.append(None if indices is None else tuple(indices))
            for a in self.allocs.values():
                if a.held and a.release_after_read is not None and self.reads > a.release_after_read:
                    a.held, a.release_after_read = False, None
            wanted = range(self.count) if indices is None else indices
            out = [self._reading(i) for i in wanted]
            if holders:
                self.holder_reads += 1
            elif not self.simulated:  # memory only, as NVML answers it: nobody named
                out = [replace(r, holders=()) for r in out]
            self.log.add("gpu.read", tuple(r.index for r in out), tuple(r.used_mib for r in out))
            return out

    def _reading(self, i: int) -> GpuReading:
        name = "Fake V100"
        err = self.error or self.errors.get(i)
        if err is None and not 0 <= i < self.count:
            err = f"NVML: no GPU {i} on this host (NVML sees {self.count})"
        if err is not None:
            return GpuReading(index=i, name=name, total_mib=self.total_mib, used_mib=None, error=err)
        holders: list[Holder] = []
        used = self.baseline_mib.get(i, 0.0)
        for a in self.allocs.values():
            if a.held and i in a.gpus:
                used += a.mib
                holders.append(
                    Holder(
                        pid=a.pid,
                        user="gpushift",
                        command="server",
                        unit=a.unit,
                        used_mib=a.mib if a.report_per_process else None,
                    )
                )
        for f in self.foreign:
            if f.gpu == i:
                used += f.mib
                holders.append(f.holder)
        unreadable = self.incomplete.get(i)
        return GpuReading(
            index=i,
            name=name,
            total_mib=self.total_mib,
            used_mib=used,
            holders=tuple(holders),
            holders_complete=unreadable is None,
            unreadable_pids=unreadable or (),
        )


# --------------------------------------------------------------------------- HTTP probes


@dataclass
class _HealthScript:
    ok_after: int | None  # polls (since the unit's current start) answered before the first 200
    before: str | int  # "refuse" or an HTTP status such as 503
    unit: str | None
    polls: int = 0
    pid: int = 0
    hung_pid: int = 0  # while its unit's main process is this one, it answers nothing (hang)


@dataclass
class Impostor:
    """A process of another user, outside every unit, that holds a backend's port and answers 200."""

    port: int
    version: str
    pid: int
    cgroup: str = "/user.slice/user-65534.slice/session-9.scope"

    def foreign(self, expected: str) -> dict[str, Any]:
        """What the real probe's verdict (served.RefusedForeign.to_dict) says about it."""
        return {
            "address": f"127.0.0.1:{self.port}",
            "expected_cgroup": expected,
            "peers": [
                {"pid": self.pid, "user": "nobody", "command": "python3 fake.py", "cgroup": self.cgroup}
            ],
            "uid": 65534,
            "socket_cgroup": "",
            "message": self.message(expected),
        }

    def message(self, expected: str) -> str:
        return (
            f"not the backend: 127.0.0.1:{self.port} is answered by PID {self.pid} (user nobody, "
            f"command 'python3 fake.py', cgroup {self.cgroup}), outside the backend's unit ({expected})"
        )

    def health(self, expected: str | None) -> Health:
        if expected is None:  # unchecked: its 200 looks like the backend's
            return Health(ok=True, status=200, detail="ok")
        return Health(False, None, self.message(expected), foreign=self.foreign(expected))

    def version_info(self, expected: str | None) -> VersionInfo:
        if expected is None:
            return VersionInfo(self.version, "url", f'{{"version": "{self.version}"}}')
        return VersionInfo(None, "url", self.message(expected), foreign=self.foreign(expected))


class FakePeers:
    """A :class:`gpushift.backends.served.PeerCheck` with scripted verdicts by server port: every
    port is the backend's own (Answered) unless :meth:`foreign` or :meth:`unknown` said otherwise."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, int], tuple[str, int], str]] = []  # (client, server, cgroup)
        self._foreign: dict[int, Any] = {}
        self._unknown: dict[int, str] = {}

    def foreign(self, port: int, pid: int = 31337, user: str = "nobody", cgroup: str = "/elsewhere") -> None:
        from gpushift.backends.served import Peer

        self._foreign[port] = Peer(pid, user, "python3 fake.py", cgroup)

    def unknown(self, port: int, why: str = "the kernel lists no socket for this connection") -> None:
        self._unknown[port] = why

    def check(self, conn: Any, expect_cgroup: str, deadline: float) -> Any:
        from gpushift.backends.served import Answered, RefusedForeign, RefusedUnknown

        self.calls.append((conn.client, conn.server, expect_cgroup))
        port = conn.server[1]
        if port in self._foreign:
            return RefusedForeign(conn.address, expect_cgroup, (self._foreign[port],), 65534)
        if port in self._unknown:
            return RefusedUnknown(conn.address, self._unknown[port])
        return Answered(conn.address)


class FakeProbe:
    """Health, version and in-flight answers per backend.

    Health is bound to a unit: while the unit does not run, the URL refuses connections; the poll
    count restarts at each start of the unit (a new process loads the model again).
    """

    def __init__(self, log: EventLog, units: FakeUnits | None = None) -> None:
        self.log = log
        self.units = units
        self._health: dict[str, _HealthScript] = {}
        self._in_flight: dict[str, list[int | None]] = {}
        self._in_flight_step: dict[str, int] = {}
        self._versions: dict[Any, VersionInfo] = {}
        self.health_polls: list[str] = []
        self.in_flight_polls: list[str] = []
        self.version_calls: list[tuple[str | None, tuple[str, ...] | None]] = []
        self.version_error: Exception | None = None  # version() raises this (a bug in a probe)
        self.warmups: list[WarmupRequest] = []
        self.warmup_results: dict[str, WarmupResult] = {}  # by URL; absent: answered at once
        self.model_lists: dict[str, list[str]] = {}  # /v1/models by URL; absent: HTTP 404
        self.models_calls: list[tuple[str, dict[str, str]]] = []
        # A process outside every unit answering on a port (set_impostor), and the cgroup every
        # checked call was asked with (None: unchecked), in order.
        self.impostors: dict[int, Impostor] = {}
        self.checked: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()

    def set_health(
        self, url: str, ok_after: int | None = 0, before: str | int = "refuse", unit: str | None = None
    ) -> None:
        """``ok_after=None``: never healthy; ``before``: "refuse" or a status (503) while loading."""
        old = self._health.get(url)
        if unit is None and old is not None:
            unit = old.unit  # re-scripting a URL keeps its binding to the unit
        self._health[url] = _HealthScript(ok_after, before, unit)

    def hang(self, url: str) -> None:
        """The process now behind ``url`` (bound to a unit) stops answering: every poll times out
        until its unit's main process is another one (a restart)."""
        s = self._health[url]
        assert s.unit is not None and self.units is not None, "hang() needs a URL bound to a unit"
        s.hung_pid = self.units.units[s.unit].main_pid

    def set_in_flight(self, backend: str, start: int | None, step: int = 1) -> None:
        """Requests in flight on ``backend``: ``start``, then ``step`` fewer at each poll (None: unknown)."""
        self._in_flight[backend] = [start]
        self._in_flight_step[backend] = step

    def set_version(self, key: str | Sequence[str], info: VersionInfo) -> None:
        """The answer for a version URL or a version command."""
        self._versions[key if isinstance(key, str) else tuple(key)] = info

    def set_impostor(self, port: int, version: str = "6.6.6-impostor", pid: int = 31337) -> Impostor:
        """From now on a process outside every unit holds ``port``: it answers 200 and its version to
        an unchecked request, and a checked one is refused naming it (what the real probe does)."""
        imp = Impostor(port, version, pid)
        self.impostors[port] = imp
        return imp

    def _impostor(self, url: str, expect_cgroup: str | None) -> Impostor | None:
        self.checked.append((url, expect_cgroup))
        return self.impostors.get(urlsplit(url).port or 80)

    def health(self, url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        with self._lock:
            self.health_polls.append(url)
            imp = self._impostor(url, expect_cgroup)
            if imp is not None:
                h = imp.health(expect_cgroup)
                self.log.add("probe.health", url, h.status)
                return h
            s = self._health.get(url)
            unit_down = (
                s is not None
                and s.unit is not None
                and self.units is not None
                and not self.units.is_running(s.unit)
            )
            if s is None or unit_down:
                h = Health(ok=False, status=None, detail="connection refused")
            else:
                if s.unit is not None and self.units is not None:
                    pid = self.units.units[s.unit].main_pid
                    if pid != s.pid:
                        s.pid, s.polls = pid, 0
                n = s.polls
                s.polls += 1
                if s.hung_pid and s.pid == s.hung_pid:
                    h = Health(ok=False, status=None, detail="timed out")
                elif s.ok_after is not None and n >= s.ok_after:
                    h = Health(ok=True, status=200, detail="ok")
                elif s.before == "refuse":
                    h = Health(ok=False, status=None, detail="connection refused")
                else:
                    h = Health(ok=False, status=int(s.before), detail="Loading model")
            self.log.add("probe.health", url, h.status)
            return h

    def version(
        self,
        version_url: str | None,
        version_command: Sequence[str] | None,
        timeout_s: float = 5.0,
        expect_cgroup: str | None = None,
    ) -> VersionInfo:
        cmd = tuple(version_command) if version_command else None
        self.version_calls.append((version_url, cmd))
        self.log.add("probe.version", version_url, cmd)
        if self.version_error is not None:
            raise self.version_error
        imp = self._impostor(version_url, expect_cgroup) if version_url else None
        if imp is not None:
            return imp.version_info(expect_cgroup)
        if version_url and version_url in self._versions:
            return self._versions[version_url]
        if cmd and cmd in self._versions:
            return self._versions[cmd]
        return VersionInfo(version=None, source="none")

    def warmup(self, request: WarmupRequest, expect_cgroup: str | None = None) -> WarmupResult:
        self.warmups.append(request)
        self.log.add("probe.warmup", request.url)
        imp = self._impostor(request.url, expect_cgroup)
        if imp is not None and expect_cgroup is not None:
            return WarmupResult(False, None, imp.message(expect_cgroup), foreign=imp.foreign(expect_cgroup))
        return self.warmup_results.get(request.url, WarmupResult(True, 200, "1 chunk(s)", 0.01, 0.02, 1))

    def models(
        self, url: str, headers: Any, timeout_s: float = 5.0, expect_cgroup: str | None = None
    ) -> tuple[list[str] | None, str | None]:
        self.models_calls.append((url, dict(headers)))
        self.log.add("probe.models", url)
        names = self.model_lists.get(url)
        return (list(names), None) if names is not None else (None, "HTTP 404")

    def in_flight(self, backend: Any, expect_cgroup: str | None = None) -> int | None:
        name = backend.name
        with self._lock:
            self.in_flight_polls.append(name)
            seq = self._in_flight.get(name)
            if seq is None:
                n: int | None = 0
            else:
                n = seq[0]
                if n is not None:
                    seq[0] = max(0, n - self._in_flight_step[name])
            self.log.add("probe.in_flight", name, n)
            return n


# --------------------------------------------------------------------------- ledger and host


class FakeLedger:
    """Keeps copies of each row as begun and as finished; logs begin/finish on the shared timeline."""

    def __init__(self, log: EventLog, clock: FakeClock) -> None:
        self.log = log
        self.clock = clock
        self.intents: dict[int, SwitchRecord] = {}  # id -> the row as the intent was written
        self.rows: dict[int, SwitchRecord] = {}  # id -> the row as it stands now
        self.finishes: list[SwitchRecord] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def begin(self, record: SwitchRecord) -> int:
        with self._lock:
            row_id = next(self._ids)
            r = copy.deepcopy(record)
            r.id = row_id
            self.intents[row_id] = r
            self.rows[row_id] = copy.deepcopy(r)
            self.log.add("ledger.begin", row_id, record.to_backend, record.outcome)
            return row_id

    def finish(self, record: SwitchRecord) -> None:
        with self._lock:
            if record.id not in self.rows:
                raise AssertionError(f"finish() of row {record.id!r} that was never begun")
            r = copy.deepcopy(record)
            self.rows[record.id] = r
            self.finishes.append(r)
            self.log.add("ledger.finish", record.id, record.outcome)

    def mark_interrupted(self, now: datetime) -> list[int]:
        with self._lock:
            out = []
            for row_id, r in self.rows.items():
                if r.outcome == Outcome.PENDING.value:
                    r.outcome, r.finished_at = Outcome.INTERRUPTED.value, now
                    out.append(row_id)
            return out

    def last(self) -> SwitchRecord | None:
        return self.rows[max(self.rows)] if self.rows else None

    def get(self, row_id: int) -> SwitchRecord | None:
        return self.rows.get(row_id)

    def list(self, limit: int = 20, **filters: Any) -> list[SwitchRecord]:
        rows = [self.rows[i] for i in sorted(self.rows, reverse=True)]
        for key, value in filters.items():
            rows = [r for r in rows if getattr(r, key, None) == value]
        return rows[:limit]

    def health(self) -> dict[str, Any]:
        return {"state": "ok", "pending": 0, "error": None}


class FakeRunStore:
    """The run store in memory; every save and clear goes on the shared timeline."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.data: dict[str, Any] | None = None
        self.saves: list[dict[str, Any]] = []

    def save(self, run: dict[str, Any]) -> None:
        self.data = copy.deepcopy(run)
        self.saves.append(self.data)
        self.log.add("runs.save", run["ticket"], run["phase"])

    def load(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.data)

    def clear(self) -> None:
        self.data = None
        self.log.add("runs.clear")


class MemoryOverrideStore:
    """The keeper's OverrideStore port in memory, keeping exactly what JsonOverrideStore would write."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.saves: list[Override | None] = []

    def load(self) -> Override | None:
        if not self.text:
            return None
        data = json.loads(self.text)
        return Override.from_dict(data) if data else None

    def save(self, override: Override | None) -> None:
        # Through JSON: a restart sees only what survives serialisation (aware datetimes included).
        self.text = json.dumps(override.to_dict() if override else {})
        self.saves.append(override)


class FakeHost:
    """``/proc/PID/cmdline`` per pid, and the launch description of a unit."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.cmdlines: dict[int, list[str]] = {}
        self.launch_calls: list[tuple[UnitState, list[str]]] = []
        self.launch_error: Exception | None = None
        self.unit_logs: dict[str, list[str]] = {}  # what the journal has of each unit

    def unit_event(self, event: str, u: FakeUnit) -> None:
        """FakeUnits subscriber: a started unit's main process runs ``argv_running``."""
        if event == "started" and u.argv_running:
            self.cmdlines[u.main_pid] = list(u.argv_running)

    def cmdline(self, pid: int) -> list[str]:
        self.log.add("host.cmdline", pid)
        return list(self.cmdlines.get(pid, []))

    def launch_info(self, unit: UnitState, argv: Sequence[str]) -> dict[str, Any]:
        self.launch_calls.append((unit, list(argv)))
        if self.launch_error is not None:
            raise self.launch_error
        return {"unit": unit.name, "fragment_path": unit.fragment_path, "argv": list(argv)}

    def unit_log(self, unit: str, lines: int) -> dict[str, Any]:
        self.log.add("host.unit_log", unit)
        return {"source": "journal", "lines": self.unit_logs.get(unit, [])[-lines:]}


class FakeFrontDoor:
    """The FrontDoorPort (``org.gpushift.FrontDoor1``): which backends are closed, the requests in
    flight per backend (``set_in_flight``: a start and a step fewer per ``InFlight``, like
    :class:`FakeProbe`), the requests held (``hold``) and what ``Release`` answered.

    ``absent``: nobody owns the name (every call answers None at once); ``hang``: it owns the
    name and never answers (every call takes ``timeout_s`` of the fake clock, then None).  Every
    call goes on the shared timeline as ``frontdoor.<call>``.
    """

    def __init__(self, log: EventLog, clock: FakeClock, timeout_s: float = 5.0) -> None:
        self.log = log
        self.clock = clock
        self.timeout_s = timeout_s
        self.absent = False
        self.hang = False
        self.closed: set[str] = set()
        self.released: list[str] = []
        self.held = 0
        self.longest_s = 0.0
        self.listen = ["[::]:8000", "[::]:8080"]
        self.instances: Any = None  # Status()'s "instances" (a backend of several), when set
        self._in_flight: dict[str, list[int]] = {}
        self._step: dict[str, int] = {}
        self._errors: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def set_in_flight(self, backend: str, start: int, step: int = 1) -> None:
        with self._lock:
            self._in_flight[backend] = [start]
            self._step[backend] = step

    def hold(self, n: int, longest_s: float) -> None:
        """``n`` requests are held now, the oldest for ``longest_s``."""
        self.held, self.longest_s = n, longest_s

    def _answers(self, call: str, *args: Any) -> bool:
        self.log.add(f"frontdoor.{call}", *args)
        method = {"close": "Close", "in_flight": "InFlight", "release": "Release", "status": "Status"}[call]
        if self.hang:
            self.clock.sleep(self.timeout_s)
            self._errors[call] = f"{method}: Timeout was reached"
            return False
        if self.absent:
            self._errors[call] = (
                f'{method}: org.freedesktop.DBus.Error.NameHasNoOwner: Name "org.gpushift.FrontDoor1" does not exist'
            )
            return False
        self._errors[call] = None
        return True

    def _count(self, backend: str, poll: bool) -> int:
        with self._lock:
            seq = self._in_flight.get(backend)
            if seq is None:
                return 0
            n = seq[0]
            if poll:
                seq[0] = max(0, n - self._step[backend])
            return n

    def close(self, backend: str) -> int | None:
        if not self._answers("close", backend):
            return None
        self.closed.add(backend)
        return self._count(backend, poll=True)  # its answer is the first poll of the drain

    def in_flight(self, backend: str) -> int | None:
        if not self._answers("in_flight", backend):
            return None
        return self._count(backend, poll=True)

    def release(self, serving: str) -> tuple[int, float] | None:
        if not self._answers("release", serving):
            return None
        self.released.append(serving)
        self.closed.discard(serving)
        got = (self.held, self.longest_s)
        self.held, self.longest_s = 0, 0.0
        return got

    def status(self) -> dict[str, Any] | None:
        if not self._answers("status"):
            return None
        with self._lock:
            counts = {b: seq[0] for b, seq in self._in_flight.items()}
        doc = {"listen": list(self.listen), "held": self.held, "in_flight": counts,
               "closed": sorted(self.closed), "daemon": "connected", "requests": 0}  # fmt: skip
        if self.instances is not None:
            doc["instances"] = self.instances
        return doc

    def last_error(self, call: str) -> str | None:
        return self._errors.get(call)


class FakeHookRunner:
    """The HookRunner port: each run recorded (its spec); per program an exit status and output,
    or ``hang``: it runs until cancelled or its timeout passes (fake time, the heartbeat beating)."""

    def __init__(self, log: EventLog, clock: FakeClock) -> None:
        self.log = log
        self.clock = clock
        self.specs: list[HookSpec] = []
        self.exit: dict[str, int] = {}
        self.output: dict[str, str] = {}
        self.hang: set[str] = set()
        self.beats = 0

    def run(self, spec: HookSpec, cancelled: Callable[[], bool], beat: Callable[[], None]) -> HookOutcome:
        program = spec.argv[0]
        self.specs.append(spec)
        self.log.add("hook.run", spec.env.get("GPUSHIFT_EVENT", ""), program)
        out = self.output.get(program, "")
        if program in self.hang:
            t0 = self.clock.monotonic()
            while not cancelled():
                beat()
                self.beats += 1
                self.clock.sleep(0.5)
                if self.clock.monotonic() - t0 >= spec.timeout_s:
                    return HookOutcome(spec.name, "timeout", None, out, self.clock.monotonic() - t0)
            return HookOutcome(spec.name, "cancelled", None, out, self.clock.monotonic() - t0)
        status = self.exit.get(program, 0)
        return HookOutcome(spec.name, "success" if status == 0 else "exit-code", status, out, 0.25)

    def events(self) -> list[str]:
        return [s.env["GPUSHIFT_EVENT"] for s in self.specs]


# --------------------------------------------------------------------------- the world

CONFIG_TEMPLATE = """\
[daemon]
bus = "session"
state_dir = "/nonexistent/gpushift-unit-tests"
on_failure = "{on_failure}"
poll_interval_s = {poll_interval_s}
stop_timeout_s = 60

[gpu]
residual_mib = {residual_mib}
release_timeout_s = {release_timeout_s}

[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
version_url = "http://127.0.0.1:18000/version"
start_timeout_s = {day_start_timeout_s}
drain_timeout_s = {day_drain_timeout_s}
{day_gpus_line}

[backends.night]
unit = "gpushift-night.service"
health_url = "http://127.0.0.1:18080/health"
version_command = ["night-server", "--version"]
start_timeout_s = {night_start_timeout_s}
drain_timeout_s = 5
gpus = [1]
"""

DEFAULTS: dict[str, Any] = {
    "on_failure": "rollback",
    "poll_interval_s": 0.5,
    "residual_mib": 256,
    "release_timeout_s": 20,
    "day_start_timeout_s": 60,
    "day_drain_timeout_s": 10,
    "night_start_timeout_s": 30,
    "day_gpus_line": "gpus = [0, 1]",  # "" : day uses every GPU the host has
}

#: The backends of the world's config: name -> (unit, port, GPUs, MiB per GPU it holds).
BACKENDS: dict[str, tuple[str, str, tuple[int, ...], float]] = {
    "day": ("gpushift-day.service", "18000", (0, 1), 14500.0),
    "night": ("gpushift-night.service", "18080", (1,), 6800.0),
}


class World:
    """A config with two backends ("day" on GPUs 0+1, "night" on GPU 1), the fakes, a Switcher.

    Keyword arguments override :data:`DEFAULTS` of the config template; ``drain_reads`` is how many
    GPU reads a stopped backend's memory stays visible.
    """

    def __init__(self, drain_reads: int = 0, simulated: bool = False, **overrides: Any) -> None:
        unknown = set(overrides) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown World settings: {sorted(unknown)}")
        self.settings = {**DEFAULTS, **overrides}
        self.toml = CONFIG_TEMPLATE.format(**self.settings)
        self.config: Config = parse(self.toml, "/etc/gpushift/unit-test.toml")
        self.clock = FakeClock()
        self.log = EventLog(self.clock)
        self.units = FakeUnits(self.clock, self.log)
        self.gpu = FakeGpu(self.log, simulated=simulated, drain_reads=drain_reads)
        self.probe = FakeProbe(self.log, self.units)
        self.ledger = FakeLedger(self.log, self.clock)
        self.host = FakeHost(self.log)
        self.units.subscribe(self.gpu.unit_event)
        self.units.subscribe(self.host.unit_event)
        for name, (unit, port, gpus, mib) in BACKENDS.items():
            self.units.add(
                unit,
                exec_start=(f"/opt/{name}/bin/server", "--port", "${PORT}", "--model", f"/models/{name}"),
                argv_running=(f"/opt/{name}/bin/server", "--port", port, "--model", f"/models/{name}"),
                fragment_path=f"/etc/systemd/system/{unit}",
            )
            self.gpu.allocate(unit, gpus, mib)
            self.probe.set_health(self.config.backends[name].health_url, ok_after=0, unit=unit)
        self.events: list[Event] = []
        self._events_lock = threading.Lock()
        self.runs = FakeRunStore(self.log)
        self.ports = Ports(
            self.units, self.gpu, self.probe, self.ledger, self.host, self.clock, runs=self.runs
        )
        self.switcher = Switcher(self.config, self.ports, listener=self._listen, version="0.0.0-test")

    # --- helpers

    def _listen(self, e: Event) -> None:
        with self._events_lock:
            self.events.append(e)

    def unit(self, backend: str) -> str:
        return self.config.backends[backend].unit

    def url(self, backend: str) -> str:
        return self.config.backends[backend].health_url

    def boot(self, backend: str | None) -> None:
        """Start state: ``backend`` already serves (started before this daemon), VRAM held."""
        if backend is not None:
            self.units.set_running(self.unit(backend))
        self.log.entries.clear()

    def running(self) -> list[str]:
        return [b for b in self.config.backends if self.units.is_running(self.unit(b))]

    def unit_calls(self) -> list[tuple[str, str]]:
        """The start/stop calls as (verb, backend name), in order."""
        by_unit = {b.unit: b.name for b in self.config.backends.values()}
        return [(verb, by_unit.get(u, u)) for verb, u in self.units.calls if verb in ("start", "stop")]

    def events_of(self, ticket: str) -> list[Event]:
        with self._events_lock:
            return [e for e in self.events if e.ticket == ticket]

    def request(
        self, target: str, reason: str = "unit test", user: str = "alice", skip_drain: bool = False
    ) -> str:
        return self.switcher.request(
            target, reason, Caller(uid=1000, user=user, pid=77), Trigger.MANUAL, skip_drain=skip_drain
        )

    def wait(self, ticket: str, timeout_s: float = 20.0) -> SwitchResult:
        """Wait for the worker and return the result of the one ``finished`` event of ``ticket``."""
        if not self.switcher.wait(timeout_s):
            raise AssertionError(f"switch {ticket} still running after {timeout_s}s (real time)")
        finished = [e for e in self.events_of(ticket) if e.kind == "finished"]
        if len(finished) != 1:
            raise AssertionError(f"expected one finished event for {ticket}, got {len(finished)}")
        result = finished[0].result
        assert result is not None, f"the finished event of {ticket} carries no result"
        return result

    def switch(self, target: str, **kw: Any) -> SwitchResult:
        """Run one switch synchronously (request + wait) and return its Finished result."""
        return self.wait(self.request(target, **kw))

    def record(self, result: SwitchResult) -> SwitchRecord:
        """The ledger row of a finished switch."""
        row_id = result.ledger_id
        if row_id is None or row_id not in self.ledger.rows:
            raise AssertionError(f"no ledger row for {result!r}")
        return self.ledger.rows[row_id]

    def phases(self, ticket: str) -> list[str]:
        """The phases of the progress events, consecutive repeats folded."""
        out: list[str] = []
        for e in self.events_of(ticket):
            if e.kind == "progress" and (not out or out[-1] != e.phase):
                out.append(e.phase)
        return out
