"""Where the metrics go — ``/metrics`` over HTTP and node_exporter's textfile, off the GLib loop.

:class:`MetricsService` is started and stopped by the daemon.  It owns:

- the HTTP listener (``[metrics] listen``): a bounded listener of its own
  (:class:`~gpushift.metrics.listener.Listener`: one thread, ``metrics-http``, at most
  :data:`~gpushift.metrics.listener.MAX_CONNECTIONS` connections, deadlines for a request's head
  and body and for the response, never a thread per connection) that serves prometheus-client's
  WSGI application over a registry of the state gauges, the switch metrics and the process's own
  figures (``process_*``: memory, CPU, open files);
- one background thread, ``metrics``, that reads the GPUs' UUIDs once (the GPU provider may be
  slow; a scrape never waits for it), binds the listener again every :data:`RETRY_S` while its
  address cannot be bound (switching goes on meanwhile), and writes the textfile
  (``[metrics] textfile``) whenever what it says changed — checked every sampling period and at
  the end of every switch — and at least every ``textfile_interval_s``.  The file is replaced
  atomically: written to a temporary file in the same directory, then renamed over it, so
  node_exporter never reads half of it.  The thread ends when none of this is left to do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, make_wsgi_app

from gpushift.config.schema import MetricsConfig
from gpushift.host.files import write_atomic
from gpushift.host.nulllog import NULL_LOG
from gpushift.metrics.collector import Sources, StateCollector, SwitchMetrics
from gpushift.metrics.listener import Listener
from gpushift.ports import GpuProbe

#: Seconds between attempts to bind the listener, and to read the GPUs' UUIDs, after a failure.
RETRY_S = 30.0


class MetricsService:
    """Serves ``/metrics`` and writes the textfile as configured; does nothing when both are off.

    Args:
        settings: the ``[metrics]`` table.
        sources: where the figures come from (see :class:`~gpushift.metrics.collector.Sources`).
        gpu: the GPU provider, asked once for the GPUs' UUIDs (their label).
        current: the switcher's run in flight (a switch's trigger is read from it).
        log: a structlog-like logger.
        retry_s: seconds between attempts to bind, and to read the UUIDs, after a failure.
    """

    def __init__(
        self,
        settings: MetricsConfig,
        sources: Sources,
        gpu: GpuProbe,
        current: Callable[[], Any],
        log: Any = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self._retry_s = retry_s
        self.settings = settings
        self._src = sources
        self._gpu = gpu
        self._log = log if log is not None else NULL_LOG
        self._uuids: Mapping[int, str] = {}
        self.switches = SwitchMetrics(sources.config, current)
        self.registry = self._registry(volatile=True)
        self.textfile_registry = self._registry(volatile=False)
        ProcessCollector(registry=self.registry)
        self._server: Listener | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._errors: dict[str, str] = {}
        self._written: bytes | None = None
        self._written_at = 0.0

    def _registry(self, volatile: bool) -> CollectorRegistry:
        r = CollectorRegistry()
        r.register(StateCollector(self._src, lambda: self._uuids, volatile=volatile))
        for c in self.switches.collectors():
            r.register(c)
        return r

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> tuple[str, int] | None:
        """Where ``/metrics`` is served now (the bound port), or None."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def on_event(self, ev: Any) -> None:
        """A :class:`~gpushift.switch.Switcher` listener: count the switch, rewrite the textfile."""
        self.switches.on_event(ev)
        if ev.result is not None:
            self._wake.set()

    def start(self) -> None:
        """Bind the listener (an address that cannot be bound is tried again in the background)
        and start the background thread; returns at once."""
        if self.settings.address is not None:
            self._bind()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listener and end the background thread.  The textfile stays: its age
        (node_exporter's ``node_textfile_mtime_seconds``) says the daemon stopped writing it."""
        self._stop.set()
        self._wake.set()
        server, self._server = self._server, None
        if server is not None:
            server.close(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def render(self) -> bytes:
        """The exposition ``/metrics`` serves now."""
        return bytes(generate_latest(self.registry))

    # ------------------------------------------------------------------ the background thread

    def _run(self) -> None:
        next_bind = next_uuids = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if not self._uuids and now >= next_uuids:
                    next_uuids = now + self._retry_s
                    self._read_uuids()
                if self.settings.address is not None and self._server is None and now >= next_bind:
                    next_bind = now + self._retry_s
                    self._bind()
                if self.settings.textfile:
                    self._write_textfile()
            except Exception as e:  # the thread's edge: a bug is logged, the loop goes on
                self._note("metrics", f"metrics thread: {e!r}")
            bind_pending = self.settings.address is not None and self._server is None
            if not (self.settings.textfile or bind_pending or not self._uuids):
                return  # nothing left to do
            self._wake.wait(self._src.config().daemon.sample_interval_s)
            self._wake.clear()

    def _bind(self) -> None:
        address = self.settings.address
        assert address is not None
        host, port = address
        try:
            server = Listener(host, port, make_wsgi_app(self.registry), lambda e: self._note("http", e))
        except OSError as e:
            self._note("listen", f"cannot listen on {self.settings.listen}: {e.strerror or e}")
            return
        server.start()
        self._server = server
        self._errors.pop("listen", None)
        self._log.info("metrics_listening", listen=self.settings.listen, path="/metrics")

    def _read_uuids(self) -> None:
        facts = self._gpu.facts()
        if facts.error is not None or not facts.gpus:
            self._note("uuids", f"GPU UUIDs not read: {facts.error or 'no GPU listed'}")
            return
        self._uuids = {g.index: g.uuid for g in facts.gpus}
        self._errors.pop("uuids", None)

    def _write_textfile(self) -> None:
        text = bytes(generate_latest(self.textfile_registry))
        now = time.monotonic()
        if text == self._written and now - self._written_at < self.settings.textfile_interval_s:
            return
        path = self.settings.textfile
        try:
            write_atomically(path, text)
        except OSError as e:
            self._note("textfile", f"cannot write {path}: {e.strerror or e}")
            return
        self._errors.pop("textfile", None)
        self._written, self._written_at = text, now

    def _note(self, key: str, error: str) -> None:
        """Log a failure once, not at every attempt."""
        if self._errors.get(key) != error:
            self._errors[key] = error
            event = {"listen": "metrics_listen_failed", "textfile": "metrics_textfile_failed"}
            self._log.error(event.get(key, "metrics_failed"), error=error)


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a temporary file in the same directory (not ``*.prom``, so
    node_exporter skips it), readable by all (node_exporter runs as its own user), then renamed."""
    write_atomic(path, data, durable=False, mode=0o644, make_dir=False)
