"""The sampler — one thread, off the GLib loop, that reads the host every sampling period.

Every ``[daemon] sample_interval_s`` it reads each backend unit's state (systemd), the health of
every running backend (HTTP, a timeout well inside the period), every GPU's memory, and the running
backend's in-flight requests, and publishes one immutable :class:`~gpushift.sampler.sample.Sample`.  Status,
metrics and the keeper read that sample instead of doing I/O themselves.

Each read runs on a short-lived thread of its own ("lane"; the unit states of every backend are one
read, :meth:`~gpushift.ports.UnitControl.states`), so a hung read holds up nothing but its
own figures: the cycle waits for its lanes only until a deadline inside the period, publishes what it
has, and does not start a lane again while the previous one still hangs (its figure then ages
until it is reported unknown).  An adapter that raises becomes that figure's ``error``; nothing
raises out of the sampler's thread.  Readers never block: :meth:`Sampler.snapshot` returns the
last published sample.

The VRAM gate of a switch does not use this: it keeps its own tight reads while it gates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpushift.config.instances import needed, pick, units_of, view_of_unit
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError
from gpushift.host.nulllog import NULL_LOG
from gpushift.ports import BackendProbe, Clock, FrontDoorPort, GpuProbe, Ports, UnitControl
from gpushift.sampler.failing import instance_unhealthy, unhealthy_since
from gpushift.sampler.sample import BackendSample, Figure, Sample, larger_in_flight
from gpushift.values import GpuReading, Health, UnitState

#: Parts of the period a cycle waits for its lanes: unit states first, then everything.
_UNITS_BY = 0.4
_ALL_BY = 0.9

#: The lane that reads every backend unit's state at once (:meth:`UnitControl.states`).
UNITS = "units"
#: The lane that reads the GPUs (memory every cycle; their holders as :func:`holders_due` says).
GPU = "gpu"
#: The lane that asks the front door's Status() (with a [frontdoor] table).
FRONTDOOR = "frontdoor"

#: The holder scan (the ``/proc`` fd walk, most of a GPU read on a host with many processes) runs
#: when a backend's main process changed, when a GPU's memory moved by more than this since the
#: holders were named ...
HOLDERS_MOVE_MIB = 64.0
#: ... and otherwise at least every this many sampling periods.
HOLDERS_EVERY_PERIODS = 15


@dataclass(frozen=True)
class _Named:
    """The GPU read that named the holders: its readings, when, and the backends' main PIDs then."""

    readings: tuple[GpuReading, ...]
    at: float
    pids: tuple[Any, ...] | None


def health_timeout_s(period_s: float) -> float:
    """The health request's timeout: short, and answered inside the cycle that asked."""
    return max(0.2, min(2.0, 0.4 * period_s))


class Sampler:
    """Reads units, health, GPU memory and in-flight requests; keeps the latest :class:`Sample`.

    Args:
        config: the validated config (its backends, ``sample_interval_s``, ``residual_mib``).
        ports: ``units``, ``gpu``, ``probe`` and ``clock`` are used (the clock stamps the figures).
        period_s: the sampling period; default ``config.daemon.sample_interval_s``.
        log: a structlog-like logger; a figure's error is logged when it changes.
    """

    def __init__(
        self, config: Config, ports: Ports, period_s: float | None = None, log: Any = NULL_LOG
    ) -> None:
        self._config = config
        self._units: UnitControl = ports.units
        self._gpu: GpuProbe = ports.gpu
        self._probe: BackendProbe = ports.probe
        self._clock: Clock = ports.clock
        self._frontdoor: FrontDoorPort | None = ports.frontdoor
        self._period_s = period_s
        self._log = log
        self._cond = threading.Condition()
        self._snap = Sample(self.period_s, config.gpu.residual_mib, bool(ports.gpu.simulated))
        self._cycle_lock = threading.Lock()  # one cycle at a time (the thread, or a refresh)
        self._figures: dict[str, Figure[Any]] = {}
        self._named: _Named | None = None  # the GPU read that last named the holders
        self._figures_lock = threading.Lock()
        self._lanes: dict[str, threading.Thread] = {}
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the public API

    @property
    def period_s(self) -> float:
        return self._period_s if self._period_s is not None else float(self._config.daemon.sample_interval_s)

    def reconfigure(self, config: Config) -> None:
        """A reloaded config: its backends and period apply from the next cycle."""
        self._config = config

    def snapshot(self) -> Sample:
        """The latest sample (never blocks; ``seq`` 0 before the first cycle)."""
        return self._snap

    def wait_next(self, timeout_s: float) -> Sample | None:
        """The first sample published after this call, or None after ``timeout_s``."""
        with self._cond:
            seq = self._snap.seq
            if not self._cond.wait_for(lambda: self._snap.seq > seq, timeout_s):
                return None
            return self._snap

    def sample_once(self) -> Sample:
        """Run one cycle in the calling thread now (a one-shot read, or a refresh after a switch)
        and return its sample.  Waits for a cycle of the sampler's thread that is under way."""
        with self._cycle_lock:
            return self._cycle()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread and join it; True when it has ended.  Lanes still hanging in an
        adapter are daemon threads: they end with their adapter's own timeout."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout_s)
        return not t.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with self._cycle_lock:
                    self._cycle()
            except Exception as e:  # the thread's edge: a bug is logged, the next cycle comes
                self._note("cycle", f"sampler cycle failed: {e!r}")
            self._wake.wait(max(0.0, self.period_s - (time.monotonic() - t0)))
            self._wake.clear()

    def _cycle(self) -> Sample:
        t0 = time.monotonic()
        period = self.period_s
        cfg = self._config
        units = {name: units_of(b) for name, b in cfg.backends.items()}  # every instance's (issue 23)
        units_read = threading.Event()  # set by this cycle's units lane when its figures are stored
        first = self._launch({UNITS: _bind(self._read_units, units, units_read)})
        units_by = t0 + _UNITS_BY * period
        # The GPU lane waits for the units on the Event, never by joining their lane: only this
        # thread joins (or asks is_alive of) a lane.  Two threads joining one thread race inside
        # CPython's Thread.join (python/cpython#116372: AssertionError, or "release unlocked lock").
        mine = units_read if UNITS in first else None
        first.update(self._launch({GPU: _bind(self._read_gpus, mine, units_by)}))
        _join([first[UNITS]] if UNITS in first else [], units_by)
        timeout = health_timeout_s(period)
        jobs: dict[str, Callable[[], Any]] = {}
        copies: dict[str, str] = {}  # a lane's key -> the second key its figure is stored under
        with self._figures_lock:
            figures = dict(self._figures)
        for name, b in cfg.backends.items():
            st = figures.get(f"unit:{name}")
            if st is not None and st.value is not None and st.value.running:
                # Checked against the unit's cgroup: another process on its port is not its health.
                v = view_of_unit(b, st.value.name)  # the instance that stands for it (issue 23)
                health = _bind(self._probe.health, v.health_url, timeout, st.value.control_group)
                if b.instances:  # asked once: the standing instance's health is the backend's too
                    jobs[f"ihealth:{v.unit}"] = health
                    copies[f"ihealth:{v.unit}"] = f"health:{name}"
                else:
                    jobs[f"health:{name}"] = health
                jobs[f"in_flight:{name}"] = _bind(self._probe.in_flight, v, st.value.control_group)
            for i in b.instances:  # each running instance's own health (issue 23)
                ist = figures.get(f"instance:{i.unit}")
                if ist is not None and ist.value is not None and ist.value.running:
                    jobs.setdefault(
                        f"ihealth:{i.unit}",
                        _bind(self._probe.health, i.health_url, timeout, ist.value.control_group),
                    )
        if self._frontdoor is not None:
            jobs[FRONTDOOR] = self._frontdoor_status
        second = self._launch(jobs, copies)
        _join([*first.values(), *second.values()], t0 + _ALL_BY * period)
        return self._publish(cfg, period)

    def _launch(
        self, jobs: Mapping[str, Callable[[], Any]], copies: Mapping[str, str] | None = None
    ) -> dict[str, threading.Thread]:
        """Start a lane per job, except where the previous lane of that key still runs.  A lane
        whose key ``copies`` names stores its figure under that second key too."""
        started: dict[str, threading.Thread] = {}
        for key, fn in jobs.items():
            old = self._lanes.get(key)
            if old is not None and old.is_alive():
                continue
            also = (copies or {}).get(key)
            t = threading.Thread(target=self._read, args=(key, fn, also), name=f"sampler-{key}", daemon=True)
            self._lanes[key] = t
            t.start()
            started[key] = t
        return started

    def _read(self, key: str, fn: Callable[[], Any], also: str | None = None) -> None:
        if key in (UNITS, GPU):
            fn()  # stores its figures itself
            return
        try:
            fig: Figure[Any] = Figure(fn(), self._clock.monotonic())
        except GpushiftError as e:
            fig = Figure(None, self._clock.monotonic(), str(e))
        except Exception as e:  # an adapter's bug: that figure's error, never the thread's end
            fig = Figure(None, self._clock.monotonic(), f"{type(e).__name__}: {e}")
        self._store(key, fig)
        if also is not None:
            self._store(also, fig)

    def _frontdoor_status(self) -> dict[str, Any]:
        """The front door's Status() (its own deadline: ``bus_timeout_s``); not answering is the
        figure's error."""
        fd = self._frontdoor
        assert fd is not None
        doc = fd.status()
        if doc is None:
            raise GpushiftError(fd.last_error("status") or "the front door did not answer")
        return doc

    def _read_units(self, units: Mapping[str, tuple[str, ...]], done: threading.Event | None = None) -> None:
        try:
            self._read_units_now(units)
        finally:
            if done is not None:
                done.set()

    def _read_units_now(self, units: Mapping[str, tuple[str, ...]]) -> None:
        """Every backend unit's state in one read (one lane: systemd answers for all of them or
        hangs for all of them); each backend's figure, and its error, is its own.  A backend of
        several instances stands for the first of them that runs (config/instances.py ``pick``)."""
        wanted: dict[str, None] = {}  # every unit once, in the backends' order
        for us in units.values():
            for u in us:
                wanted[u] = None
        error = None
        try:
            by_unit = self._units.states(list(wanted))
        except GpushiftError as e:
            by_unit, error = {}, str(e)
        except Exception as e:  # an adapter's bug: those figures' error, never the thread's end
            by_unit, error = {}, f"{type(e).__name__}: {e}"
        at = self._clock.monotonic()
        cfg = self._config
        for name, us in units.items():
            unit = pick(cfg.backends[name], by_unit) if name in cfg.backends else us[0]
            keys = [(f"unit:{name}", unit)]
            if len(us) > 1:  # each instance's own figure too
                for u in us:
                    keys.append((f"instance:{u}", u))
            for key, u in keys:
                got = by_unit.get(u)
                if isinstance(got, UnitState):
                    self._store(key, Figure(got, at))
                else:
                    why = str(got) if got is not None else error or f"systemd did not answer for {u}"
                    self._store(key, Figure(None, at, why))

    def _instance_health(self, b: Any) -> tuple[tuple[str, Figure[Health]], ...]:
        """Each running instance's health figure (one of an instance that does not run is dropped:
        it describes a process that is gone).  Called with the figures' lock held."""
        out = []
        for i in b.instances:
            st = self._figures.get(f"instance:{i.unit}")
            if st is not None and st.value is not None and not st.value.running:
                self._figures.pop(f"ihealth:{i.unit}", None)
            h = self._figures.get(f"ihealth:{i.unit}")
            if h is not None:
                out.append((i.unit, h))
        return tuple(out)

    def _read_gpus(self, units_read: threading.Event | None, units_by: float) -> None:
        """The GPUs' memory; their holders from this read when they may have changed, else carried
        over from the read that named them (with its time, ``Sample.holders_at``).

        They may have changed when :func:`holders_due` says so by the memory, and when a backend's
        main process is not the one it was then (a relaunch that left the memory as it was): this
        cycle's unit states are waited for (``units_read``, until ``units_by``) to tell; when they
        cannot be had, the holders are read again."""
        with self._figures_lock:
            named = self._named
        try:
            now = self._clock.monotonic()
            readings: tuple[GpuReading, ...] | None = None
            if not self._gpu.simulated and named is not None:
                # (The simulated provider's memory IS its holders: it scans on every read anyway.)
                memory = tuple(self._gpu.read(None, holders=False))
                if not holders_due(named.readings, memory, now - named.at, self.period_s):
                    pids = self._main_pids(units_read, units_by)
                    if pids is not None and pids == named.pids:
                        readings = carry_holders(named.readings, memory)
            if readings is None:
                readings = tuple(self._gpu.read(None))
                named = _Named(readings, now, self._main_pids(units_read, units_by))
            fig: Figure[Any] = Figure(readings, self._clock.monotonic())
        except GpushiftError as e:
            fig, named = Figure(None, self._clock.monotonic(), str(e)), None
        except Exception as e:  # an adapter's bug: that figure's error, never the thread's end
            fig, named = Figure(None, self._clock.monotonic(), f"{type(e).__name__}: {e}"), None
        self._store(GPU, fig, named=named)

    def _main_pids(self, units_read: threading.Event | None, by: float) -> tuple[Any, ...] | None:
        """Every backend unit's main PID as this cycle read it; None when that read is not done."""
        if units_read is None:
            return None  # the previous read still hangs: this cycle has none
        if not units_read.wait(max(0.0, by - time.monotonic())):
            return None
        with self._figures_lock:
            return tuple(
                sorted(
                    (key, f.value.main_pid if f.value is not None else -1)
                    for key, f in self._figures.items()
                    if key.startswith("unit:")
                )
            )

    def _store(self, key: str, fig: Figure[Any], named: _Named | None | bool = False) -> None:
        with self._figures_lock:
            self._figures[key] = fig
            if named is not False:  # the GPU figure and the read that named its holders, together
                self._named = named if isinstance(named, _Named) else None
        if fig.error is not None:
            self._note(key, fig.error)
        else:
            self._errors.pop(key, None)

    def _note(self, key: str, error: str) -> None:
        """Log a figure's error once, not at every cycle."""
        if self._errors.get(key) != error:
            self._errors[key] = error
            self._log.warning("sample_failed", figure=key, error=error)

    # ------------------------------------------------------------------ publishing

    def _publish(self, cfg: Config, period: float) -> Sample:
        now = self._clock.monotonic()
        prev = self._snap
        backends = []
        with self._figures_lock:
            door = self._figures.get(FRONTDOOR) if self._frontdoor is not None else None
            for name, b in cfg.backends.items():
                st = self._figures.get(f"unit:{name}")
                if st is not None and st.value is not None and not st.value.running:
                    # Not running: its old health and in-flight figures describe a process that is gone.
                    self._figures.pop(f"health:{name}", None)
                    self._figures.pop(f"in_flight:{name}", None)
                health = self._figures.get(f"health:{name}")
                in_flight = self._figures.get(f"in_flight:{name}")
                if st is not None and st.value is not None and st.value.running:
                    # the larger of its own count and the front door's (docs/frontdoor.md)
                    in_flight = larger_in_flight(in_flight, door, name, now, period)
                backends.append(
                    BackendSample(
                        name=name,
                        unit=st.value.name if st is not None and st.value is not None else b.unit,
                        kind=str(b.kind),
                        gpus=b.gpus,
                        state=st,
                        health=health,
                        in_flight=in_flight,
                        unhealthy_since=unhealthy_since(prev.backend(name), st, health, now, period),
                        idle_since=idle_since(prev.backend(name), in_flight, now, period),
                        instances=tuple(
                            (u, self._figures.get(f"instance:{u}")) for u in units_of(b) if b.instances
                        ),
                        instance_health=(ih := self._instance_health(b)),
                        needed=needed(b),
                        instance_unhealthy=instance_unhealthy(
                            prev.backend(name), b, self._figures, ih, now, period
                        ),
                    )
                )
            gpus = self._figures.get(GPU)
            named = self._named
            holders_at = named.at if named is not None and gpus is not None and gpus.error is None else None
        with self._cond:
            snap = Sample(
                period_s=period,
                residual_mib=cfg.gpu.residual_mib,
                simulated=bool(self._gpu.simulated),
                backends=tuple(backends),
                gpus=gpus,
                holders_at=holders_at,
                frontdoor=door,
                seq=self._snap.seq + 1,
                taken_at=now,
            )
            self._snap = snap
            self._cond.notify_all()
        return snap


def idle_since(
    prev: BackendSample | None, in_flight: Figure[Any] | None, now: float, period_s: float
) -> float | None:
    """Since when no request has been in flight, by the backend's own gauges (None: some are, or it
    cannot be told — a stale or failed reading, a backend without gauges)."""
    if (
        in_flight is None
        or in_flight.error is not None
        or in_flight.stale(now, period_s)
        or in_flight.value != 0
    ):
        return None
    before = prev.idle_since if prev is not None else None
    return before if before is not None else in_flight.at


def holders_due(
    named: tuple[GpuReading, ...], memory: tuple[GpuReading, ...], age_s: float, period_s: float
) -> bool:
    """Whether the GPUs' holders must be read again (the ``/proc`` scan), given the reading that
    last named them, a memory-only reading now, and how old the names are.

    Yes when they are :data:`HOLDERS_EVERY_PERIODS` periods old, when that reading could not see
    every process, and when any GPU's memory moved by more than :data:`HOLDERS_MOVE_MIB` (or became
    known or unknown, or GPUs came or went): memory that moves is memory somebody took or gave
    back, and the names must say who — in the same cycle."""
    if age_s >= HOLDERS_EVERY_PERIODS * period_s or len(named) != len(memory):
        return True
    for old, new in zip(named, memory, strict=True):
        if old.index != new.index or not old.holders_complete or (old.error is None) != (new.error is None):
            return True
        if (
            old.used_mib is None
            or new.used_mib is None
            or abs(new.used_mib - old.used_mib) > HOLDERS_MOVE_MIB
        ):
            return True
    return False


def carry_holders(named: tuple[GpuReading, ...], memory: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
    """The memory-only readings with the holders of the reading that last named them (same GPUs)."""
    return tuple(
        replace(
            new,
            holders=old.holders,
            holders_complete=old.holders_complete,
            unreadable_pids=old.unreadable_pids,
        )
        for old, new in zip(named, memory, strict=True)
    )


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _join(threads: list[threading.Thread], deadline: float) -> None:
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
