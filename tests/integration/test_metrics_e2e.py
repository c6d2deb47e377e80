"""The daemon's metrics as a real Prometheus sees them: the shipped gpushift.service under a private
systemd user manager serves /metrics, a private Prometheus (Debian's, ended by PID) scrapes it every
second across a switch, and its range query API shows the old backend active before and the new one
after, with the switch counted.  promtool accepts the exposition, and node_exporter's textfile is
rewritten as the state changes."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port
from prometheus_server import Prometheus, tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def prometheus() -> Iterator[list[Prometheus]]:
    """Holds the Prometheus a test starts, and stops it by PID afterwards, also on failure."""
    started: list[Prometheus] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


def scrape(env: GpushiftEnv) -> str:
    with urllib.request.urlopen(env.metrics_url(), timeout=5) as r:
        return str(r.read().decode())


def ones(series: dict[frozenset[tuple[str, str]], list[tuple[float, float]]], backend: str) -> list[float]:
    """The times at which gpushift_active_backend{backend=...} was 1."""
    for labels, points in series.items():
        if dict(labels).get("backend") == backend:
            return [t for t, v in points if v == 1]
    return []


def test_prometheus_sees_the_active_backend_change_and_the_switch_counted(
    sandbox: Any, prometheus: list[Prometheus]
) -> None:
    base = Path(sandbox.base_dir)
    textfile = base / "node-exporter" / "gpushift.prom"
    textfile.parent.mkdir(parents=True)
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [1], version="2.0.0")
    env = GpushiftEnv(sandbox, base / "gs", [a, b], sample_interval_s=0.5, metrics_textfile=str(textfile))
    target = env.metrics_listen
    prom = Prometheus(base / "prometheus", [target])  # boots while the daemon starts
    prometheus.append(prom)
    env.up()
    env.cli("switch", "a", "--reason", "setup", check=True)
    prom.wait_ready()

    def active(backend: str) -> bool:
        got = prom.query(f'gpushift_active_backend{{backend="{backend}"}}')
        return list(got.values()) == [1.0]

    t0 = time.time()
    env.wait_for(lambda: active("a"), 20, "Prometheus to scrape a as the active backend")
    assert prom.query('up{job="gpushift"}') == {frozenset({("instance", target), ("job", "gpushift")}): 1.0}
    time.sleep(1.5)  # more scrapes before the switch
    written = textfile.stat().st_mtime_ns
    before_file = textfile.read_text()
    assert 'gpushift_active_backend{backend="a"} 1.0' in before_file

    t_switch = time.time()
    env.cli("switch", "b", "--reason", "metrics e2e", check=True)
    t_done = time.time()
    env.wait_for(lambda: active("b"), 20, "Prometheus to scrape b as the active backend")
    time.sleep(1.5)  # more scrapes after it
    t1 = time.time()

    series = prom.query_range("gpushift_active_backend", t0, t1, 0.5)
    a_on, b_on = ones(series, "a"), ones(series, "b")
    assert a_on and b_on, series
    assert min(a_on) < t_switch and max(a_on) < min(b_on), (a_on, b_on)  # a before, b after, never both
    assert min(b_on) > t_switch and max(b_on) >= t1 - 1, (t_switch, b_on)

    counted = prom.query_range(
        'gpushift_switches_total{from="a",to="b",trigger="manual",outcome="ok"}', t0, t1, 0.5
    )
    (points,) = counted.values()
    assert all(t > t_switch for t, _ in points), (t_switch, points)  # no such switch before it
    assert points[-1][1] == 1.0
    assert prom.query("gpushift_switch_duration_seconds_count") != {}
    phases = prom.query("gpushift_switch_phase_duration_seconds_count")
    assert {dict(k)["phase"] for k in phases} >= {"stop", "release", "start", "ready"}

    # Every query of the shipped dashboard answers from this Prometheus with data, but the next
    # switch (this daemon has no schedule).
    dashboard = json.loads((REPO / "contrib" / "grafana" / "gpushift-dashboard.json").read_text())
    empty = []
    for panel in dashboard["panels"]:
        for t in panel["targets"]:
            expr = t["expr"].replace("$instance", ".*").replace("$__range", "5m")
            if not prom.query(expr):
                empty.append(expr)
    assert empty == ['gpushift_next_switch_timestamp_seconds{instance=~".*"} * 1000'], empty

    # The textfile followed the state: rewritten after the switch (its interval is 60 s), saying b.
    env.wait_for(
        lambda: 'gpushift_active_backend{backend="b"} 1.0' in textfile.read_text(), 5, "the textfile"
    )
    assert textfile.stat().st_mtime_ns > written
    assert (
        'gpushift_switches_total{from="a",outcome="ok",to="b",trigger="manual"} 1.0' in textfile.read_text()
    )
    assert t_done - t_switch < 30


def test_promtool_accepts_the_daemons_exposition(sandbox: Any) -> None:
    a = Backend("a", free_port(), [0, 1])
    b = Backend("b", free_port(), [1])
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a, b], sample_interval_s=0.5).up()
    env.cli("switch", "a", check=True)
    env.cli("switch", "b", check=True)  # counters and histograms with samples
    text = scrape(env)
    for name in (
        "gpushift_switches_total",
        "gpushift_vram_gate_wait_seconds_bucket",
        "gpushift_gpu_simulated 1.0",
    ):
        assert name in text, name
    # curl | promtool check metrics: the daemon's /metrics as Prometheus's own linter reads it.
    curl = subprocess.Popen(["curl", "-sf", env.metrics_url()], stdout=subprocess.PIPE)
    try:
        check = subprocess.run(
            [tool("promtool"), "check", "metrics"],
            stdin=curl.stdout,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        if curl.stdout is not None:
            curl.stdout.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            curl.wait(10)
    assert curl.returncode == 0, "curl could not fetch /metrics"
    assert check.returncode == 0, check.stdout + check.stderr


def test_textfile_in_a_directory_protect_system_keeps_read_only_needs_read_write_paths(sandbox: Any) -> None:
    # The shipped unit's ProtectSystem=strict: the daemon cannot write node_exporter's directory
    # (here one under /var/tmp) until a drop-in gives it that directory, as docs/metrics.md says.
    directory = Path(tempfile.mkdtemp(prefix="gpushift-node-exporter.", dir="/var/tmp"))
    try:
        textfile = directory / "gpushift.prom"
        a = Backend("a", free_port(), [0, 1])
        env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a], metrics_textfile=str(textfile)).up()
        env.wait_for(
            lambda: "metrics_textfile_failed" in env.daemon_log(), 10, "the failed write to be logged"
        )
        assert "Read-only file system" in env.daemon_log() and not textfile.exists()
        sandbox.install_dropin(
            "gpushift.service", "60-textfile.conf", f"[Service]\nReadWritePaths={directory}\n"
        )
        sandbox.daemon_reload()
        sandbox.systemctl("restart", "gpushift.service", timeout_s=90)
        env.wait_for(textfile.exists, 10, "the textfile once the drop-in gives the daemon its directory")
        assert "gpushift_build_info" in textfile.read_text()
        assert oct(textfile.stat().st_mode & 0o777) == "0o644"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
