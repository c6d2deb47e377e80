"""L5: the daemon — the composition root.

Threads (docs/design.md has the full picture):
- the GLib main loop (main thread): D-Bus handlers, signal emission, Unix signals, watchdog;
- the switch worker (one at a time, started by the Switcher);
- the scheduler's thread (APScheduler), which only *asks* for switches through the same door as a
  person does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import Any

from . import __version__, wiring
from . import config as config_mod
from .errors import ConfigError, GpushiftError
from .model import Caller, Trigger
from .switcher import Event, Switcher


class Daemon:
    """Builds every collaborator, owns the bus name and runs the loop until SIGTERM."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_mod.config_path(config_path)
        self.config = config_mod.load(self.config_path)
        from . import logs

        self.log = logs.setup(self.config.daemon.log_level)
        self.started_at = datetime.now(timezone.utc)
        self.reload_error: str | None = None
        self.reloaded_at: datetime | None = None
        self._loop: Any = None
        self._service: Any = None
        self._publication: Any = None
        from .adapters.notify import Notifier

        self.notify = Notifier()

    # ------------------------------------------------------------ composition

    def build(self) -> None:
        self.components = wiring.build(self.config, log=self.log)
        c = self.components
        interrupted = c.ledger.mark_interrupted(datetime.now(timezone.utc))
        for row_id in interrupted:
            self.log.warning("switch_interrupted", ledger_id=row_id,
                             detail="found unfinished at start: the daemon died mid-switch")
        self.switcher = Switcher(
            self.config, c.units, c.gpu, c.probe, c.ledger, c.host, c.clock,
            listener=self._on_event, log=self.log, version=__version__,
        )
        if c.gpu.simulated:
            self.log.warning("gpu_simulated", detail="GPU provider is SIMULATED: no real VRAM is measured")

    # ------------------------------------------------------------ Backend protocol (D-Bus calls)

    def status(self) -> dict[str, Any]:
        cur = self.switcher.current()
        daemon = {
            "state": "switching" if cur else "idle",
            "running": True,
            "pid": os.getpid(),
            "version": __version__,
            "started_at": self.started_at.isoformat(),
            "config": self.config_path,
            "bus": self.config.daemon.bus,
            "switch": cur.to_dict(self.components.clock.monotonic()) if cur else None,
            "reload_error": self.reload_error,
            "reloaded_at": self.reloaded_at.isoformat() if self.reloaded_at else None,
        }
        return wiring.status_report(self.components, daemon)

    def status_json(self) -> str:
        return json.dumps(self.status(), default=str)

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str:
        reason = str(options.get("reason") or "")
        ticket = self.switcher.request(
            backend, reason, caller, Trigger.MANUAL, skip_drain=bool(options.get("now"))
        )
        self.log.info("switch_requested", ticket=ticket, to=backend, by=caller.user, uid=caller.uid,
                      reason=reason)
        return ticket

    def cancel(self, caller: Caller) -> str:
        ticket = self.switcher.cancel(caller)
        self.log.info("switch_cancel_requested", ticket=ticket, by=caller.user)
        return ticket

    def resume(self, caller: Caller) -> str:
        raise GpushiftError("no schedule is configured in this daemon")

    def reload(self, caller: Caller) -> str:
        return self._reload(f"requested by {caller.user}")

    # ------------------------------------------------------------ events → signals

    def _on_event(self, ev: Event) -> None:
        """Called on the worker thread: hand the signal to the GLib loop thread."""
        from gi.repository import GLib

        def emit() -> bool:
            svc = self._service
            if svc is None:
                return False
            if ev.kind == "progress":
                svc.Progress(ev.ticket, ev.phase, ev.detail)
            else:
                svc.Finished(ev.ticket, ev.ok, json.dumps(ev.result, default=str))
                self._update_status_line()
            return False

        GLib.idle_add(emit)
        if ev.kind == "progress":
            self.notify.status(f"switching: {ev.phase} {ev.detail}"[:200])

    def _update_status_line(self) -> None:
        try:
            running = self.switcher.running_backends()
        except GpushiftError:
            running = []
        serving = ", ".join(running) if running else "nothing (GPUs free)"
        self.notify.status(f"serving {serving}")

    # ------------------------------------------------------------ reload, watchdog, signals

    def _reload(self, why: str) -> str:
        self.notify.reloading()
        try:
            new = config_mod.load(self.config_path)
        except ConfigError as e:
            self.reload_error = str(e)
            self.log.error("reload_rejected", error=str(e), detail="the old config stays in force")
            self.notify.ready()
            raise
        self.config = new
        self.components.config = new
        self.switcher.reconfigure(new)
        self.reload_error = None
        self.reloaded_at = datetime.now(timezone.utc)
        self.log.info("reloaded", why=why, config=self.config_path)
        self.notify.ready()
        self._update_status_line()
        return f"reloaded {self.config_path}"

    def _watchdog(self) -> bool:
        """Runs on the loop thread (so the loop is alive); also proves the switch worker is."""
        cur = self.switcher.current()
        if cur is not None:
            t = self.switcher._thread
            age = self.components.clock.monotonic() - self.switcher.heartbeat
            limit = self.config.daemon.stop_timeout_s + 60
            if t is None or not t.is_alive() or age > limit:
                self.log.error("watchdog_withheld", detail=f"switch worker silent for {age:.0f}s")
                return True
        self.notify.watchdog()
        return True

    def run(self) -> int:
        from gi.repository import GLib

        from .adapters import dbus_service
        from .adapters.notify import watchdog_interval_s

        self.build()
        bus = self.components.bus
        self._service = dbus_service.SwitcherService(bus, self)
        try:
            self._publication = dbus_service.publish(bus, self._service)
        except RuntimeError as e:
            self.log.error("bus_name_taken", name=dbus_service.BUS_NAME, error=str(e),
                           detail="another gpushift daemon runs on this bus")
            return 1
        self._loop = GLib.MainLoop()
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGTERM, self._quit)
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGINT, self._quit)
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGHUP, self._sighup)
        interval = watchdog_interval_s()
        if interval:
            GLib.timeout_add(max(100, int(interval * 1000)), self._watchdog)
        running = self.switcher.running_backends()
        self.log.info("daemon_ready", pid=os.getpid(), bus=self.config.daemon.bus,
                      name=dbus_service.BUS_NAME, running=running, version=__version__)
        self.notify.ready()
        self._update_status_line()
        self._loop.run()
        self.notify.stopping()
        self.log.info("daemon_stopping", detail="backends are left as they are")
        return 0

    def _quit(self) -> bool:
        if self._loop is not None:
            self._loop.quit()
        return False

    def _sighup(self) -> bool:
        with contextlib.suppress(ConfigError):
            self._reload("SIGHUP")
        return True


def main(config_path: str | None) -> int:
    try:
        d = Daemon(config_path)
    except ConfigError as e:
        print(f"gpushift daemon: {e}", file=sys.stderr, flush=True)
        return e.code
    try:
        return d.run()
    except GpushiftError as e:
        d.log.error("daemon_failed", error=str(e))
        return e.code
    finally:
        threading.Event().set()
