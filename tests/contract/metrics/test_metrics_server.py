"""The metrics service against real sockets and files: /metrics served on IPv4 and IPv6 loopback on a
thread of its own, an address that is taken is logged and bound once it is free (switching never
waits for it), and node_exporter's textfile is replaced atomically whenever what it says changes and
at least every ``textfile_interval_s``."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpushift.config.schema import Config, MetricsConfig, parse
from gpushift.ledger.view import LedgerView
from gpushift.metrics.collector import Sources
from gpushift.metrics.server import MetricsService, write_atomically
from gpushift.sampler.sample import Sample
from gpushift.values import GpuInfo, HostGpuFacts, Mode

CONFIG = """
[daemon]
sample_interval_s = 0.5
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
"""


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda event, **kw: self.events.append((event, kw))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for e, kw in self.events if e == event]


class Gpu:
    simulated = True

    def __init__(self) -> None:
        self.facts_calls = 0

    def facts(self) -> HostGpuFacts:
        self.facts_calls += 1
        return HostGpuFacts(True, None, None, (GpuInfo(0, "SIMULATED GPU", "GPU-sim-0", 16384.0),))


class World:
    """What the service reads: the state a test changes (the mode) and the service it started."""

    def __init__(self, metrics: MetricsConfig) -> None:
        self.config: Config = replace(parse(CONFIG, "/etc/gpushift/t.toml"), metrics=metrics)
        self.mode = Mode.SCHEDULE
        self.log = Log()
        self.gpu = Gpu()
        sample = Sample(0.5, 256.0, True)
        self.sources = Sources(
            config=lambda: self.config,
            sample=lambda: sample,
            monotonic=time.monotonic,
            mode=lambda: self.mode,
            next_switch=lambda: None,
            ledger=LedgerView,
            switching=lambda: False,
            version="1.2.3",
        )
        self.service = MetricsService(metrics, self.sources, self.gpu, lambda: None, self.log, retry_s=0.2)


@pytest.fixture
def world() -> Iterator[Callable[[MetricsConfig], World]]:
    made: list[World] = []

    def make(metrics: MetricsConfig) -> World:
        w = World(metrics)
        made.append(w)
        w.service.start()
        return w

    yield make
    for w in made:
        w.service.stop()


def free_port(family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def test_metrics_served_on_ipv4_loopback_on_a_thread_of_its_own(
    world: Callable[[MetricsConfig], World],
) -> None:
    port = free_port()
    w = world(MetricsConfig(listen=f"127.0.0.1:{port}"))
    assert w.service.address == ("127.0.0.1", port)
    assert w.log.named("metrics_listening") == [{"listen": f"127.0.0.1:{port}", "path": "/metrics"}]
    ctype, text = get(f"http://127.0.0.1:{port}/metrics")
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    assert 'gpushift_build_info{version="1.2.3"} 1.0' in text
    assert 'gpushift_mode{mode="schedule"} 1.0' in text
    assert "process_resident_memory_bytes" in text  # the process's own figures
    assert "metrics-http" in {t.name for t in threading.enumerate()}
    w.mode = Mode.HOLD  # read at every scrape
    assert 'gpushift_mode{mode="hold"} 1.0' in get(f"http://127.0.0.1:{port}/metrics")[1]
    wait_for(lambda: w.gpu.facts_calls == 1, 5, "the GPU UUIDs to be read")
    w.service.stop()
    with pytest.raises(OSError):
        get(f"http://127.0.0.1:{port}/metrics")


def test_metrics_served_on_ipv6_loopback(world: Callable[[MetricsConfig], World]) -> None:
    port = free_port(socket.AF_INET6, "::1")
    w = world(MetricsConfig(listen=f"[::1]:{port}"))
    assert w.service.address == ("::1", port)
    assert "gpushift_active_backend" in get(f"http://[::1]:{port}/metrics")[1]


def test_metrics_address_taken_is_logged_and_bound_once_free(world: Callable[[MetricsConfig], World]) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        w = world(MetricsConfig(listen=f"127.0.0.1:{port}"))
        assert w.service.address is None  # start() returned: the daemon goes on without it
        (failed,) = w.log.named("metrics_listen_failed")
        assert f"cannot listen on 127.0.0.1:{port}" in failed["error"]
    finally:
        blocker.close()
    wait_for(lambda: w.service.address is not None, 5, "the listener to be bound once the port is free")
    assert "gpushift_build_info" in get(f"http://127.0.0.1:{port}/metrics")[1]
    assert len(w.log.named("metrics_listen_failed")) == 1  # logged once, not at every attempt


def test_metrics_textfile_rewritten_when_the_state_changes_and_at_least_every_interval(
    world: Callable[[MetricsConfig], World], tmp_path: Path
) -> None:
    path = tmp_path / "gpushift.prom"
    w = world(MetricsConfig(textfile=str(path), textfile_interval_s=2))
    wait_for(path.exists, 5, "the textfile")
    first = path.read_text()
    assert 'gpushift_mode{mode="schedule"} 1.0' in first
    assert "process_" not in first and "gpushift_sample_age_seconds" not in first  # no per-read figures
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # node_exporter runs as its own user
    mtime = path.stat().st_mtime_ns
    time.sleep(1.0)  # two sampling periods: nothing changed, nothing written
    assert path.stat().st_mtime_ns == mtime
    w.mode = Mode.OVERRIDE
    wait_for(lambda: 'gpushift_mode{mode="override"} 1.0' in path.read_text(), 3, "the new mode in the file")
    mtime = path.stat().st_mtime_ns
    wait_for(lambda: path.stat().st_mtime_ns > mtime, 4, "a rewrite after textfile_interval_s")
    assert [p.name for p in tmp_path.iterdir()] == ["gpushift.prom"]  # no temporary file left


def test_metrics_textfile_that_cannot_be_written_is_logged_once(
    world: Callable[[MetricsConfig], World], tmp_path: Path
) -> None:
    path = tmp_path / "missing-dir" / "gpushift.prom"
    w = world(MetricsConfig(textfile=str(path), textfile_interval_s=1))
    wait_for(lambda: w.log.named("metrics_textfile_failed"), 5, "the failure to be logged")
    time.sleep(1.2)
    (failed,) = w.log.named("metrics_textfile_failed")
    assert str(path) in failed["error"]
    path.parent.mkdir()
    wait_for(path.exists, 5, "the textfile once its directory exists")


def test_write_atomically_never_shows_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "x.prom"
    write_atomically(str(path), b"a 1\n")
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(path.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(100):
            write_atomically(str(path), b"a 1\n" * 2000)
            write_atomically(str(path), b"a 1\n")
    finally:
        stop.set()
        reader.join()
    assert seen <= {b"a 1\n", b"a 1\n" * 2000}
    assert os.listdir(tmp_path) == ["x.prom"]
