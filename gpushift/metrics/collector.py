"""Gpushift's Prometheus metrics — what they are and where each figure comes from.

docs/metrics.md lists every metric with its type, labels and meaning.  Two kinds:

- the *state* (:class:`StateCollector`): gauges computed when they are collected (a scrape, or a
  textfile write) from the sampler's latest :class:`~gpushift.sampler.sample.Sample` (who serves, each
  backend's unit and health, GPU memory and its holders), the keeper's mode and next switch, and the
  ledger's view in memory.  Nothing here does I/O, so a scrape never waits on systemd, a backend or
  a GPU, and every gauge follows the state as the sampler sees it, between switches too;
- the *switches* (:class:`SwitchMetrics`): a counter and histograms fed by the switcher's events.

Names follow Prometheus's naming practices (https://prometheus.io/docs/practices/naming/): the
``gpushift_`` prefix, base units (bytes, seconds), ``_total`` for counters, ``_seconds`` for
durations, ``_timestamp_seconds`` for points in time (Unix time).  Every label value is bounded:
backend names from the config (:data:`OTHER` for one no longer configured), ``off``, GPU indices
and UUIDs, and the phase, outcome, trigger and mode enums of :mod:`gpushift.values` — never a
ticket, a person or a message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Histogram, disable_created_metrics
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushift.config.instances import units_of
from gpushift.config.schema import Config
from gpushift.ledger.view import LedgerView
from gpushift.sampler.sample import Sample, verdict
from gpushift.switch.policy import foreign_memory
from gpushift.values import OFF, EventKind, GpuReading, Mode, Outcome, Phase

MIB = 1024 * 1024

#: The label value of a backend that is neither configured nor ``off`` (e.g. removed by a reload).
OTHER = "other"
#: The trigger label of a switch whose start was not heard (never expected).
UNKNOWN = "unknown"

#: Histogram buckets, in seconds: a drain or a gate takes well under a second to minutes; a vLLM
#: load takes minutes, so the buckets reach half an hour.
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)

#: Ledger outcomes that changed what runs: the last of them is "the last switch".
_CHANGED = frozenset({Outcome.OK.value, Outcome.ROLLED_BACK.value, Outcome.FAILED.value})


@dataclass(frozen=True)
class Sources:
    """Where the figures come from: callables that return at once (no I/O), safe on any thread."""

    config: Callable[[], Config]
    sample: Callable[[], Sample]
    monotonic: Callable[[], float]
    mode: Callable[[], Mode]
    next_switch: Callable[[], tuple[str, float] | None]  # (backend or off, Unix time); None: none ahead
    ledger: Callable[[], LedgerView]
    switching: Callable[[], bool]
    version: str = ""
    mirror: Callable[[], Mapping[str, Any] | None] = lambda: None  # the fleet's mirror (docs/fleet.md)


def backend_label(name: str | None, config: Config) -> str:
    """A backend name as a label value: configured names and ``off`` (None: nothing ran) as they
    are, anything else :data:`OTHER`."""
    if name is None or name == OFF:
        return OFF
    return name if name in config.backends else OTHER


class StateCollector(Collector):
    """The gauges, computed from the sources each time they are collected.

    ``volatile``: also the figures that change at every collection (the sample's age); the
    textfile leaves them out, so that it is rewritten only when the state changes.
    ``uuids``: GPU index → UUID (read once from the GPU provider off this path; ``""`` until then).
    """

    def __init__(
        self, sources: Sources, uuids: Callable[[], Mapping[int, str]], volatile: bool = True
    ) -> None:
        self._src = sources
        self._uuids = uuids
        self._volatile = volatile

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not collect (the sources may not be ready yet)

    def collect(self) -> Iterable[Metric]:
        src = self._src
        config = src.config()
        sample = src.sample()
        now = src.monotonic()
        yield _gauge("gpushift_build_info", "gpushift's version (always 1)", {"version": src.version}, 1)
        yield from self._backends(config, sample, now)
        mode = src.mode()
        m = GaugeMetricFamily(
            "gpushift_mode", "Who decides what runs: 1 for the current mode", labels=["mode"]
        )
        for each in Mode:
            m.add_metric([each.value], 1.0 if each is mode else 0.0)
        yield m
        yield _gauge("gpushift_switch_in_progress", "1 while a switch runs", {}, 1 if src.switching() else 0)
        yield from self._gpus(config, sample, now)
        yield from self._schedule_and_ledger(config)
        yield from self._mirror()
        if self._volatile and sample.taken_at is not None:
            yield _gauge(
                "gpushift_sample_age_seconds",
                "Seconds since the sampler last published its readings",
                {},
                max(0.0, now - sample.taken_at),
            )

    def _mirror(self) -> Iterable[Metric]:
        m = self._src.mirror()
        if m is not None:  # only with [mirror] url
            yield from _mirror_gauges(m)

    def _backends(self, config: Config, sample: Sample, now: float) -> Iterable[Metric]:
        v = verdict(sample, now)
        active = GaugeMetricFamily(
            "gpushift_active_backend",
            "1 for the backend serving (unit active and health OK within two sampling periods), or for "
            "off when every unit is known stopped; all 0 while that is unknown",
            labels=["backend"],
        )
        up = GaugeMetricFamily(
            "gpushift_backend_up",
            "1 when the backend's health URL answered OK within the last two sampling periods",
            labels=["backend"],
        )
        unit = GaugeMetricFamily(
            "gpushift_backend_unit_active",
            "1 when systemd reports the backend's unit active (left out while unknown)",
            labels=["backend"],
        )
        instance = GaugeMetricFamily(
            "gpushift_backend_instance_unit_active",
            "A backend of several instances: 1 when systemd reports the instance's unit active (left out "
            "while unknown)",
            labels=["backend", "unit"],
        )
        instance_up = GaugeMetricFamily(
            "gpushift_backend_instance_up",
            "A backend of several instances: 1 when the instance's health URL answered OK within the last "
            "two sampling periods, 0 when not (left out while its unit does not run)",
            labels=["backend", "unit"],
        )
        period = sample.period_s
        for name in config.backends:
            active.add_metric([name], 1.0 if v.active == name else 0.0)
            b = sample.backend(name)
            h = b.health if b is not None else None
            ok = h is not None and (value := h.known(now, period)) is not None and value.ok
            up.add_metric([name], 1.0 if ok else 0.0)
            st = b.state.known(now, period) if b is not None and b.state is not None else None
            if st is not None:
                unit.add_metric([name], 1.0 if st.active_state == "active" else 0.0)
            for u, f in b.instances if b is not None else ():
                ist = f.known(now, period) if f is not None else None
                if ist is not None:
                    instance.add_metric([name, u], 1.0 if ist.active_state == "active" else 0.0)
            for u, h in b.instance_health if b is not None else ():
                hv = h.known(now, period)
                instance_up.add_metric([name, u], 1.0 if hv is not None and hv.ok else 0.0)
        active.add_metric([OFF], 1.0 if v.active == OFF else 0.0)
        yield from (active, up, unit, instance, instance_up)

    def _gpus(self, config: Config, sample: Sample, now: float) -> Iterable[Metric]:
        labels = ["gpu", "uuid"]
        used = GaugeMetricFamily("gpushift_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("gpushift_gpu_memory_total_bytes", "GPU memory in all", labels=labels)
        held = GaugeMetricFamily(
            "gpushift_vram_held_by_foreign_process",
            "1 when memory on the GPU is held that no backend unit accounts for (the preflight's rule: "
            "a switch onto this GPU would be refused), 0 when not; left out while the GPU is unknown",
            labels=labels,
        )
        foreign = GaugeMetricFamily(
            "gpushift_vram_foreign_used_bytes",
            "Memory the GPU provider attributes to processes outside every backend unit",
            labels=labels,
        )
        simulated = GaugeMetricFamily(
            "gpushift_gpu_simulated", "1 when the GPU figures come from SIMULATED GPUs, not NVML"
        )
        simulated.add_metric([], 1.0 if sample.simulated else 0.0)
        f = sample.gpus
        readings = f.known(now, sample.period_s) if f is not None else None
        uuids = self._uuids()
        own = {u for b in config.backends.values() for u in units_of(b)}  # every instance's (issue 23)
        for r in readings or ():
            if r.error is not None or r.used_mib is None:
                continue
            key = [str(r.index), uuids.get(r.index, "")]
            total.add_metric(key, r.total_mib * MIB)
            used.add_metric(key, r.used_mib * MIB)
            outsiders = [h for h in r.holders if h.unit not in own]
            foreign.add_metric(key, sum(h.used_mib or 0.0 for h in outsiders) * MIB)
            is_held = _held_by_foreign(r, own, sample.residual_mib)
            if is_held is not None:
                held.add_metric(key, 1.0 if is_held else 0.0)
        yield from (used, total, held, foreign, simulated)

    def _schedule_and_ledger(self, config: Config) -> Iterable[Metric]:
        nxt = GaugeMetricFamily(
            "gpushift_next_switch_timestamp_seconds",
            "When the schedule next changes what runs, labelled with what it switches to (left out in "
            "hold and manual mode, and with no change ahead)",
            labels=["backend"],
        )
        ahead = self._src.next_switch()
        if ahead is not None:
            nxt.add_metric([backend_label(ahead[0], config)], ahead[1])
        yield nxt
        view = self._src.ledger()
        changed = [r for r in view.rows if r.outcome in _CHANGED and r.finished_at is not None]
        last = GaugeMetricFamily(
            "gpushift_last_switch_timestamp_seconds",
            "When the last switch that changed what runs ended (ledger outcome ok, rolled_back or failed)",
        )
        if changed:
            finished = changed[0].finished_at
            assert finished is not None
            last.add_metric([], finished.timestamp())
        yield last
        ids = [r.id for r in view.rows if r.id is not None and r.id > 0]
        yield _gauge(
            "gpushift_ledger_rows",
            "Rows in the ledger's current chain (its newest row's id)",
            {},
            max(ids, default=0),
        )
        health = view.health
        yield _gauge(
            "gpushift_ledger_pending_records",
            "Records waiting in the spool because the ledger cannot be written",
            {},
            float(health.get("pending") or 0),
        )
        yield _gauge(
            "gpushift_ledger_degraded",
            "1 while the ledger is not ok (degraded: records wait in the spool; or unreadable)",
            {},
            0.0 if health.get("state") == "ok" else 1.0,
        )


def _mirror_gauges(m: Mapping[str, Any]) -> Iterable[Metric]:
    yield _gauge("gpushift_mirror_up", "1 while the fleet's database takes the mirror's writes", {},
                 1.0 if m.get("error") is None and m.get("state") != "starting" else 0.0)  # fmt: skip
    yield _gauge("gpushift_mirror_lag_rows", "Ledger rows (new or changed) not yet in the fleet's database",
                 {}, float(m.get("lag_rows") or 0))  # fmt: skip
    yield _gauge("gpushift_mirror_lag_seconds", "Seconds since the fleet's database was last caught up "
                 "with the ledger (0 while it is)", {}, float(m.get("lag_s") or 0))  # fmt: skip
    yield _gauge("gpushift_mirror_problems", "Mismatches between the ledger and its central copy the "
                 "mirror found and reported (since the daemon started)", {}, float(m.get("problems") or 0))  # fmt: skip


def _held_by_foreign(r: GpuReading, own_units: set[str], residual_mib: float) -> bool | None:
    """Whether the preflight would find memory on ``r`` that no backend unit accounts for; None when
    it cannot be told (some holder's open files were unreadable and nothing foreign was found)."""
    refused = not foreign_memory([r], own_units, (), residual_mib).ok
    if not refused and not r.holders_complete:
        return None
    return refused


def _gauge(name: str, doc: str, labels: Mapping[str, str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), float(value))
    return g


class SwitchMetrics:
    """The switch counter and histograms, fed by :meth:`on_event` (a :class:`Switcher` listener).

    ``current``: the switcher's run in flight; a switch's trigger is read from it at the switch's
    first progress event (the result does not carry it).  A request that found its target already
    serving is not counted: nothing was switched.
    """

    def __init__(self, config: Callable[[], Config], current: Callable[[], Any]) -> None:
        self._config = config
        self._current = current
        self._triggers: dict[str, str] = {}
        self._lock = threading.Lock()
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series beside each
        self.switches = Counter(
            "gpushift_switches_total",
            "Switches this daemon ran, by what ran before, the target, what asked and how it ended",
            ["from", "to", "trigger", "outcome"],
            registry=None,
        )
        self.duration = Histogram(
            "gpushift_switch_duration_seconds",
            "How long a switch took, from its request to its end",
            registry=None,
            buckets=BUCKETS_S,
        )
        self.phase_duration = Histogram(
            "gpushift_switch_phase_duration_seconds",
            "How long each phase of a switch took (the rollback's own phases are not included)",
            ["phase"],
            registry=None,
            buckets=BUCKETS_S,
        )
        self.gate_wait = Histogram(
            "gpushift_vram_gate_wait_seconds",
            "How long the VRAM gate waited after the stop until every watched GPU read released",
            registry=None,
            buckets=BUCKETS_S,
        )

    def collectors(self) -> tuple[Collector, ...]:
        return (self.switches, self.duration, self.phase_duration, self.gate_wait)

    def on_event(self, ev: Any) -> None:
        """On the switch worker thread: remember the trigger at the start, count at the end."""
        if ev.kind is EventKind.PROGRESS:
            with self._lock:
                if ev.ticket not in self._triggers:
                    run = self._current()
                    if run is not None and run.ticket == ev.ticket:
                        self._triggers[ev.ticket] = run.trigger.value
                        while len(self._triggers) > 16:  # a switch whose end was never heard
                            del self._triggers[next(iter(self._triggers))]
            return
        with self._lock:
            trigger = self._triggers.pop(ev.ticket, UNKNOWN)
        res = ev.result
        if res is None or res.already:
            return
        config = self._config()
        self.switches.labels(
            backend_label(res.from_backend, config),
            backend_label(res.to_backend, config),
            trigger,
            res.outcome.value,
        ).inc()
        self.duration.observe(ev.elapsed_s)
        phases = {p.value for p in Phase}
        for phase, seconds in res.durations_s.items():
            if phase in phases:
                self.phase_duration.labels(phase).observe(seconds)
        if Phase.RELEASE.value in res.durations_s:
            self.gate_wait.observe(res.durations_s[Phase.RELEASE.value])


def next_switch(keeper_status: dict[str, Any], mode: Mode) -> tuple[str, float] | None:
    """The schedule's next change as ``gpushift status`` shows it, as (backend, Unix time); None in
    hold and manual mode (the schedule does not act then) and when no change is ahead."""
    nxt = (keeper_status.get("schedule") or {}).get("next")
    if not nxt or mode in (Mode.HOLD, Mode.MANUAL):
        return None
    return str(nxt["target"]), datetime.fromisoformat(str(nxt["at"])).timestamp()
