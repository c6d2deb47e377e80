"""The Prometheus metrics as a scrape sees them: the gauges follow the sampler's latest sample (who
serves, each backend's unit and health, GPU memory and foreign holders) between switches too, an
unknown figure is left out rather than shown with its old value, switches are counted with bounded
labels and timed in histograms reaching half an hour.  Against the stateful fakes (tests/unit/
fakes.py): "day" (GPUs 0+1) serving, "night" (GPU 1) stopped."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushift.ledger.view import LedgerView
from gpushift.metrics.collector import (
    BUCKETS_S,
    MIB,
    Sources,
    StateCollector,
    SwitchMetrics,
    backend_label,
    next_switch,
)
from gpushift.sampler.sampler import Sampler
from gpushift.values import OFF, Caller, Mode, Outcome, SwitchRecord, Trigger
from tests.support.instances import with_instances

Labels = frozenset[tuple[str, str]]


class Scrape:
    """A registry like the daemon's over a World, and what one scrape of it says."""

    def __init__(self, w: Any, period_s: float = 2.0) -> None:
        self.w = w
        self.sampler = Sampler(w.config, w.ports, period_s=period_s)
        self.mode = Mode.SCHEDULE
        self.next: tuple[str, float] | None = None
        self.view = LedgerView()
        self.switches = SwitchMetrics(lambda: w.config, w.switcher.current)
        w.switcher.add_listener(self.switches.on_event)
        sources = Sources(
            config=lambda: w.config,
            sample=self.sampler.snapshot,
            monotonic=w.clock.monotonic,
            mode=lambda: self.mode,
            next_switch=lambda: self.next,
            ledger=lambda: self.view,
            switching=lambda: w.switcher.snapshot()[0],
            version="9.9.9",
            mirror=lambda: self.mirror,
        )
        # [mirror] set: the mirror's status (gpushift/fleet/mirror.py); None: no mirror, no gauges
        self.mirror: dict[str, Any] | None = {
            "state": "lagging",
            "lag_rows": 3,
            "lag_s": 12.5,
            "problems": 1,
            "error": None,
        }
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(sources, lambda: {0: "GPU-fake-0", 1: "GPU-fake-1"}))
        for c in self.switches.collectors():
            self.registry.register(c)

    def __call__(self) -> dict[str, dict[Labels, float]]:
        """{sample name: {labels: value}}."""
        out: dict[str, dict[Labels, float]] = {}
        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
        return out


def by(label: str, series: dict[Labels, float]) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in series.items()}


def gpu(i: int) -> Labels:
    return frozenset({("gpu", str(i)), ("uuid", f"GPU-fake-{i}")})


# --------------------------------------------------------------------------- who serves


def test_metrics_show_the_serving_backend_its_health_and_unit(world: Any) -> None:
    scrape = Scrape(world)
    scrape.sampler.sample_once()
    m = scrape()
    assert by("backend", m["gpushift_active_backend"]) == {"day": 1, "night": 0, OFF: 0}
    assert by("backend", m["gpushift_backend_up"]) == {"day": 1, "night": 0}
    assert by("backend", m["gpushift_backend_unit_active"]) == {"day": 1, "night": 0}
    assert m["gpushift_build_info"] == {frozenset({("version", "9.9.9")}): 1}
    assert m["gpushift_switch_in_progress"] == {frozenset(): 0}


def test_metrics_gauges_move_with_the_sample_between_switches(world: Any) -> None:
    # Nothing switched: the health went bad and the unit was stopped behind gpushift's back.
    w = world
    scrape = Scrape(w)
    scrape.sampler.sample_once()
    w.probe.set_health(w.url("day"), ok_after=None, before=503, unit=w.unit("day"))
    scrape.sampler.sample_once()
    m = scrape()
    assert by("backend", m["gpushift_active_backend"]) == {"day": 0, "night": 0, OFF: 0}  # unknown: none
    assert by("backend", m["gpushift_backend_up"]) == {"day": 0, "night": 0}
    assert by("backend", m["gpushift_backend_unit_active"]) == {"day": 1, "night": 0}
    w.units.set_stopped(w.unit("day"))
    scrape.sampler.sample_once()
    m = scrape()
    assert by("backend", m["gpushift_active_backend"]) == {"day": 0, "night": 0, OFF: 1}
    assert by("backend", m["gpushift_backend_unit_active"]) == {"day": 0, "night": 0}


def test_metrics_leave_out_what_is_stale_instead_of_its_old_value(world: Any) -> None:
    w = world
    scrape = Scrape(w, period_s=2.0)
    scrape.sampler.sample_once()
    w.clock.advance(4.5)  # older than two sampling periods
    m = scrape()
    assert by("backend", m["gpushift_active_backend"]) == {"day": 0, "night": 0, OFF: 0}
    assert by("backend", m["gpushift_backend_up"]) == {"day": 0, "night": 0}
    for name in (
        "gpushift_backend_unit_active",
        "gpushift_gpu_memory_used_bytes",
        "gpushift_vram_held_by_foreign_process",
    ):
        assert name not in m, name
    assert m["gpushift_sample_age_seconds"] == {frozenset(): 4.5}


def test_metrics_before_the_first_sample_say_nothing_is_known(world: Any) -> None:
    m = Scrape(world)()
    assert by("backend", m["gpushift_active_backend"]) == {"day": 0, "night": 0, OFF: 0}
    assert "gpushift_gpu_memory_used_bytes" not in m and "gpushift_sample_age_seconds" not in m


def test_metrics_mode_is_one_of_the_four_modes(world: Any) -> None:
    scrape = Scrape(world)
    for mode in Mode:
        scrape.mode = mode
        assert by("mode", scrape()["gpushift_mode"]) == {x.value: float(x is mode) for x in Mode}


# --------------------------------------------------------------------------- GPUs


def test_metrics_gpu_memory_in_bytes_labelled_by_index_and_uuid(world: Any) -> None:
    scrape = Scrape(world)
    scrape.sampler.sample_once()
    m = scrape()
    assert m["gpushift_gpu_memory_used_bytes"] == {gpu(0): 14500 * MIB, gpu(1): 14500 * MIB}
    assert m["gpushift_gpu_memory_total_bytes"] == {gpu(0): 16384 * MIB, gpu(1): 16384 * MIB}
    assert m["gpushift_vram_held_by_foreign_process"] == {gpu(0): 0, gpu(1): 0}
    assert m["gpushift_vram_foreign_used_bytes"] == {gpu(0): 0, gpu(1): 0}
    assert m["gpushift_gpu_simulated"] == {frozenset(): 0}


def test_metrics_vram_held_by_a_process_outside_every_backend_unit(world: Any) -> None:
    w = world
    w.gpu.add_foreign(0, pid=4242, mib=9318, user="bob")  # another user's job
    w.gpu.add_foreign(1, pid=4343, mib=0, command="nvidia-smi")  # has the device open, holds nothing
    scrape = Scrape(w)
    scrape.sampler.sample_once()
    m = scrape()
    assert m["gpushift_vram_held_by_foreign_process"] == {gpu(0): 1, gpu(1): 0}
    assert m["gpushift_vram_foreign_used_bytes"] == {gpu(0): 9318 * MIB, gpu(1): 0}
    w.gpu.remove_foreign(4242)
    scrape.sampler.sample_once()
    assert scrape()["gpushift_vram_held_by_foreign_process"] == {gpu(0): 0, gpu(1): 0}


def test_metrics_foreign_vram_unknown_while_a_holder_list_is_incomplete(world: Any) -> None:
    w = world
    w.gpu.incomplete[1] = (999,)  # a process whose open files could not be read
    scrape = Scrape(w)
    scrape.sampler.sample_once()
    assert scrape()["gpushift_vram_held_by_foreign_process"] == {gpu(0): 0}


def test_metrics_gpu_that_cannot_be_read_is_left_out(world: Any) -> None:
    w = world
    w.gpu.errors[1] = "NVML: GPU is lost"
    scrape = Scrape(w)
    scrape.sampler.sample_once()
    m = scrape()
    assert set(m["gpushift_gpu_memory_used_bytes"]) == {gpu(0)}
    assert set(m["gpushift_gpu_memory_total_bytes"]) == {gpu(0)}


# --------------------------------------------------------------------------- switches


def test_metrics_count_and_time_a_switch(world: Any) -> None:
    w = world
    scrape = Scrape(w)
    assert "gpushift_switches_total" not in scrape()
    res = w.switch("night")
    assert res.outcome is Outcome.OK
    scrape.sampler.sample_once()
    m = scrape()
    labels = frozenset({("from", "day"), ("to", "night"), ("trigger", "manual"), ("outcome", "ok")})
    assert m["gpushift_switches_total"] == {labels: 1}
    assert by("backend", m["gpushift_active_backend"]) == {"day": 0, "night": 1, OFF: 0}
    assert m["gpushift_switch_duration_seconds_count"] == {frozenset(): 1}
    assert m["gpushift_vram_gate_wait_seconds_count"] == {frozenset(): 1}
    assert m["gpushift_vram_gate_wait_seconds_sum"] == {frozenset(): res.durations_s["release"]}
    phases = by("phase", m["gpushift_switch_phase_duration_seconds_count"])
    assert phases == dict.fromkeys(["preflight", "drain", "stop", "release", "start", "ready", "version"], 1)
    buckets = {dict(k)["le"] for k in m["gpushift_switch_duration_seconds_bucket"]}
    assert "1800.0" in buckets and "+Inf" in buckets and max(BUCKETS_S) == 1800
    assert not any(n.endswith("_created") for n in m)
    w.switch(OFF)
    m = scrape()
    off = frozenset({("from", "night"), ("to", OFF), ("trigger", "manual"), ("outcome", "ok")})
    assert m["gpushift_switches_total"] == {labels: 1, off: 1}
    assert m["gpushift_switch_duration_seconds_count"] == {frozenset(): 2}


def test_metrics_label_a_failed_switch_with_its_outcome_and_trigger(make_world: Any) -> None:
    w = make_world(on_failure="rollback")
    w.boot("day")
    scrape = Scrape(w)
    w.probe.set_health(w.url("night"), ok_after=None, before=503, unit=w.unit("night"))
    ticket = w.switcher.request("night", "test", Caller(None, "gpushift"), Trigger.SCHEDULE)
    assert w.wait(ticket).outcome is Outcome.ROLLED_BACK
    labels = frozenset(
        {("from", "day"), ("to", "night"), ("trigger", "schedule"), ("outcome", "rolled_back")}
    )
    assert scrape()["gpushift_switches_total"] == {labels: 1}


def test_metrics_do_not_count_a_request_for_what_already_serves(world: Any) -> None:
    scrape = Scrape(world)
    assert world.switch("day").already
    m = scrape()
    assert "gpushift_switches_total" not in m
    assert m["gpushift_switch_duration_seconds_count"] == {frozenset(): 0}


def test_metrics_backend_labels_are_bounded(world: Any) -> None:
    c = world.config
    assert [backend_label(x, c) for x in ("day", "night", OFF, None, "removed", "ticket 1a2b")] == [
        "day",
        "night",
        OFF,
        OFF,
        "other",
        "other",
    ]


# --------------------------------------------------------------------------- schedule and ledger


def record(row_id: int, outcome: str, finished: datetime | None) -> SwitchRecord:
    return SwitchRecord(
        trigger="schedule",
        requested_by="gpushift",
        reason="",
        from_backend="day",
        to_backend="night",
        started_at=datetime(2026, 3, 1, tzinfo=timezone.utc),
        id=row_id,
        outcome=outcome,
        finished_at=finished,
    )


def test_metrics_ledger_rows_health_and_the_last_switch(world: Any) -> None:
    scrape = Scrape(world)
    m = scrape()
    assert m["gpushift_ledger_rows"] == {frozenset(): 0}
    assert "gpushift_last_switch_timestamp_seconds" not in m
    switched = datetime(2026, 3, 1, 8, 0, 5, tzinfo=timezone.utc)
    scrape.view = LedgerView(
        rows=(
            record(7, Outcome.CRASHED.value, datetime(2026, 3, 1, 9, tzinfo=timezone.utc)),
            record(6, Outcome.REFUSED.value, datetime(2026, 3, 1, 8, 30, tzinfo=timezone.utc)),
            record(5, Outcome.OK.value, switched),
        ),
        health={"state": "degraded", "pending": 2},
    )
    m = scrape()
    assert m["gpushift_ledger_rows"] == {frozenset(): 7}
    assert m["gpushift_last_switch_timestamp_seconds"] == {frozenset(): switched.timestamp()}
    assert m["gpushift_ledger_degraded"] == {frozenset(): 1}
    assert m["gpushift_ledger_pending_records"] == {frozenset(): 2}
    scrape.view = replace(scrape.view, health={"state": "ok", "pending": 0})
    assert scrape()["gpushift_ledger_degraded"] == {frozenset(): 0}


def test_metrics_next_switch_timestamp_labelled_with_its_target(world: Any) -> None:
    scrape = Scrape(world)
    assert "gpushift_next_switch_timestamp_seconds" not in scrape()
    scrape.next = ("night", 1_790_000_000.0)
    assert scrape()["gpushift_next_switch_timestamp_seconds"] == {
        frozenset({("backend", "night")}): 1_790_000_000.0
    }


def test_next_switch_is_the_schedules_next_change_except_in_hold_and_manual_mode() -> None:
    at = "2026-03-02T06:00:00+00:00"
    st = {"mode": "schedule", "schedule": {"next": {"target": "day", "at": at}}}
    expected = ("day", datetime(2026, 3, 2, 6, tzinfo=timezone.utc).timestamp())
    assert next_switch(st, Mode.SCHEDULE) == expected
    assert next_switch(st, Mode.OVERRIDE) == expected  # the override ends at that boundary
    assert next_switch(st, Mode.HOLD) is None
    assert next_switch({"mode": "manual (no schedule)"}, Mode.MANUAL) is None
    assert next_switch({"mode": "schedule", "schedule": {"next": None}}, Mode.SCHEDULE) is None


# --------------------------------------------------------------------------- what the files name


def every_exported_name(w: Any) -> set[str]:
    """Every sample name a scrape can show (each figure known, a switch done, a schedule ahead;
    "night" a backend of two instances, whose units have series of their own)."""
    with_instances(w)
    scrape = Scrape(w)
    assert w.switch("night").ok
    w.gpu.add_foreign(
        0, pid=4242, mib=9318
    )  # after the switch: its preflight would refuse (GPU 0 is night's)
    scrape.sampler.sample_once()
    scrape.next = ("day", 1_790_000_000.0)
    scrape.view = LedgerView(
        (record(1, Outcome.OK.value, datetime(2026, 3, 1, tzinfo=timezone.utc)),), {"state": "ok"}
    )
    return set(scrape())


def test_dashboard_and_alert_rules_name_only_metrics_the_daemon_exports(world: Any, repo_root: Any) -> None:
    exported = every_exported_name(world)
    dashboard = json.loads((repo_root / "contrib" / "grafana" / "gpushift-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["definition"])
    in_dashboard = {n for e in exprs for n in re.findall(r"\bgpushift_[a-z_]+\b", e)}
    assert in_dashboard and in_dashboard <= exported, in_dashboard - exported
    rules = (repo_root / "contrib" / "prometheus" / "gpushift-alerts.yml").read_text()
    in_rules = set(re.findall(r"\bgpushift_[a-z_]+\b", rules))
    assert in_rules and in_rules <= exported, in_rules - exported
    # Between them they show every state gauge an operator watches.
    for name in (
        "gpushift_active_backend",
        "gpushift_mode",
        "gpushift_backend_up",
        "gpushift_switches_total",
    ):
        assert name in in_dashboard, name


def test_docs_metrics_md_describes_every_exported_metric(world: Any, repo_root: Any) -> None:
    text = (repo_root / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(gpushift_[a-z_]+)`", text, flags=re.MULTILINE))
    names = every_exported_name(world)
    histograms = {n[: -len("_bucket")] for n in names if n.endswith("_bucket")}
    families = {
        n for n in names if not any(n in (h + "_bucket", h + "_count", h + "_sum") for h in histograms)
    }
    families |= histograms
    assert documented == families, documented ^ families


def test_the_mirror_s_lag_is_exported_only_with_a_mirror(world: Any) -> None:
    sc = Scrape(world)
    text = generate_latest(sc.registry).decode()
    assert "gpushift_mirror_lag_rows 3.0" in text and "gpushift_mirror_lag_seconds 12.5" in text
    assert "gpushift_mirror_up 1.0" in text and "gpushift_mirror_problems 1.0" in text
    sc.mirror = {"state": "unavailable", "lag_rows": 9, "lag_s": 40.0, "problems": 0, "error": "down"}
    assert "gpushift_mirror_up 0.0" in generate_latest(sc.registry).decode()
    sc.mirror = None
    assert "gpushift_mirror" not in generate_latest(sc.registry).decode()
