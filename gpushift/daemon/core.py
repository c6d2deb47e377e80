"""The daemon's composition root — builds every collaborator, owns the bus name, runs the loop.

Threads (docs/design.md has the full picture):
- the GLib main loop (main thread): D-Bus handlers, signal emission, Unix signals, the watchdog's
  turn stamp, the clockwork's once-a-second timer;
- the watchdog thread (``WATCHDOG=1`` while the loop shows progress: ``daemon/watchdog.py``);
- the switch worker (one at a time, started by the Switcher);
- the sampler's thread (status reads its snapshot);
- the scheduler's thread (APScheduler), which only *asks* for switches as a person does;
- with ``[metrics]``: the ``/metrics`` listener's thread and the textfile's; with ``[mirror]``: the mirror's.
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

from gpushift import __version__
from gpushift.bus import properties
from gpushift.bus.names import BUS_NAME
from gpushift.config import schema as config_mod
from gpushift.daemon import exporter, fleetwire, statusline, wiring
from gpushift.daemon.clockwork import Clockwork
from gpushift.daemon.models import ModelNames
from gpushift.daemon.pagedata import PageData
from gpushift.daemon.relay import SignalRelay
from gpushift.daemon.settings import ConfigOnDisk, load_schedule_of, parse_until, reloadable, watch_settings
from gpushift.daemon.watch import BackendWatcher
from gpushift.errors import ConfigError, GpushiftError, InvalidArgument, UnknownBackend
from gpushift.keeper.decide import Ask
from gpushift.keeper.lookahead import LookAhead
from gpushift.notify.notices import Notices
from gpushift.prewarm.consumer import Prewarming
from gpushift.safetext import redact
from gpushift.sampler.sample import Sample
from gpushift.switch import Switcher
from gpushift.values import OFF, Caller, EventKind, Trigger

#: What a switch asked for ``--when-idle`` answers instead of a ticket: the keeper makes it later.
WHEN_IDLE = "when-idle"


class Daemon:
    """Builds every collaborator, owns the bus name and runs the loop until SIGTERM."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_mod.config_path(config_path)
        self.config_on_disk = ConfigOnDisk(self.config_path)
        self.config = self.config_on_disk.load()
        self.schedule = load_schedule_of(self.config)
        self.stagger = fleetwire.stagger_of(self.config)
        from gpushift.daemon import logs

        self.log = logs.setup(self.config.daemon.log_level)
        self.started_at = datetime.now(timezone.utc)
        self.reload_error: str | None = None
        self.reloaded_at: datetime | None = None
        self._loop: Any = None
        self._service: Any = None
        self._publication: Any = None
        self.watchdog: Any = None
        self.relay = SignalRelay(self)  # the switch's events -> the bus's signals
        self.models = ModelNames(self.log)  # the backends' model names (D-Bus Models, NextServed)
        self.mirror: Any = None  # [mirror]: the ledger's copy in the fleet's database (docs/fleet.md)
        self.pages = PageData()  # the status page's redacted summary (GetSummary)
        from gpushift.host.sdnotify import Notifier

        self.notify = Notifier()

    # ------------------------------------------------------------ composition

    def build(self) -> None:
        self.components = wiring.build(self.config, log=self.log)
        ports = self.components.ports
        from gpushift.doctor.facts import HostDoctor

        ports.doctor = HostDoctor(ports.units, ports.gpu, ports.ledger)
        # A transition the table does not allow is logged (switch_transition_invalid), never fatal here.
        self.switcher = Switcher(
            self.config,
            ports,
            listener=self.relay.on_event,
            log=self.log,
            version=__version__,
            strict_transitions=False,
        )
        if ports.gpu.simulated:
            self.log.warning("gpu_simulated", detail="GPU provider is SIMULATED: no real VRAM is measured")
        from gpushift.keeper import Keeper
        from gpushift.keeper.store import JsonOverrideStore

        self.watcher = BackendWatcher(ports, self.components.bus, self.log)

        self.override_store = JsonOverrideStore(
            os.path.join(self.config.daemon.state_dir, "override.json"),
            log=self.log,
            backends=set(self.config.backends),
            # while the state directory cannot be written (disk full): a restart must not bring an
            # older override back
            fallback=os.path.join(self.config.daemon.runtime_dir, "override.json"),
        )
        self.keeper = Keeper(
            self.switcher,
            self.schedule,
            self.override_store,
            now=ports.clock.now,
            monotonic=ports.clock.monotonic,
            log=self.log,
            max_attempts=self.config.daemon.max_attempts,
            retry_after_s=self.config.daemon.retry_after_s,
            watch=self.watcher,
            settings=watch_settings(self.config),
            on_failure=self.config.daemon.on_failure,
            ledger=ports.ledger,  # who served before whom, for the fallback (keeper/fallback.py)
        )
        # Consumers (pre-warm, hooks, notices) register here: docs/design.md "A look-ahead consumer".
        self.lookahead = LookAhead(self.keeper.coming_switch, ports.clock.now, self.log)
        self.prewarming = Prewarming(
            lambda: self.config, ports.units, self.log, switching_to=self._switching_to
        )
        self.lookahead.add(self.prewarming.consumer())
        self.switcher.preflight.row_facts.append(self.prewarming.row_facts)
        self.switcher.add_listener(self._after_switch)
        self.switcher.preflight.row_facts.append(lambda _t: {"stagger": self.stagger} if self.stagger else {})
        from gpushift.notify.webhook import WebhookSender

        self.webhook = WebhookSender(lambda: self.config.notify, self.config.daemon.state_dir, self.log)
        self.notices = Notices(
            lambda: self.config, self.webhook, ports.hooks, ports.ledger, ports.clock.now, self.log
        )
        for consumer in self.notices.consumers():  # the before_boundary hook and the webhook's notice
            self.lookahead.add(consumer)
        self.clockwork = Clockwork(
            self.keeper,
            lambda: self.config.daemon.reconcile_interval_s,
            self._reconcile,
            self.log,
            lookahead=self.lookahead,
        )

    def _after_switch(self, ev: Any) -> None:
        """The switch's worker, once its row is closed: a unit started anew may run another command
        line (a ``daemon-reload`` since), so its model names are read again."""
        if ev.kind is EventKind.FINISHED:
            self.models.refresh(self.config, self.components.ports.units)

    def _switching_to(self) -> str | None:
        cur = self.switcher.current()
        return cur.target if cur is not None else None

    def converge(self) -> None:
        """At start, before the first decision: recover from a switch the previous daemon did not
        finish (docs/reliability.md), and close every other unfinished ledger row."""
        from gpushift.switch import recovery

        ov = self.keeper.override
        fire = self.schedule.in_effect(datetime.now(timezone.utc)) if self.schedule is not None else None
        plan = recovery.prepare(
            self.switcher, ov.backend if ov else None, fire.target if fire else None, self.log
        )
        for row_id in self.components.ports.ledger.mark_interrupted(datetime.now(timezone.utc)):
            self.log.warning(
                "switch_interrupted",
                ledger_id=row_id,
                detail="found unfinished at start: the daemon died mid-switch",
            )
        if plan is None:
            return
        if plan.give_up:
            self.keeper.halt(
                f"recovery gave up after {recovery.MAX_RECOVERIES} interrupted attempts: every backend is "
                "stopped; `gpushift switch BACKEND` or `gpushift resume` to bring one back"
            )
        else:  # the recovery switch is the keeper's decision, like every switch
            self.keeper.recover(plan.target, recovery.announce(plan, self.log), plan.attempt)

    # ------------------------------------------------------------ Backend protocol (D-Bus calls)

    def status(self) -> dict[str, Any]:
        """On the loop thread: from the sampler's latest sample and memory only, no I/O.  Credentials
        (a holder's ``--api-key``, a URL's password, a row's ``HF_TOKEN``) are masked."""
        sample = self.latest_sample()
        cur = self.switcher.current()
        now = self.components.ports.clock.monotonic()
        daemon = {
            "state": ("recovering" if cur.trigger is Trigger.RECOVERY else "switching") if cur else "idle",
            "running": True,
            "pid": os.getpid(),
            "version": __version__,
            "started_at": self.started_at.isoformat(),
            "config": self.config_path,
            "bus": self.config.daemon.bus,
            "switch": cur.progress(now) if cur else None,
            "reload_error": self.reload_error,
            "reloaded_at": self.reloaded_at.isoformat() if self.reloaded_at else None,
            "override_ignored": self.override_store.ignored,  # override.json found unusable at start
            "override_not_saved": self.override_store.error,  # the state directory cannot be written
            "override_moved_to": self.override_store.moved_to,  # the unusable file, set aside
            "run_ignored": getattr(self.components.ports.runs, "ignored", None),  # run.json set aside
        }
        c = self.components
        out = wiring.compose_status(self.config, sample, now, daemon, c.ledger_view())
        out.update(self.keeper.status())
        out["notices"] = self.notices.status(self.lookahead.status())
        out["mirror"] = self.mirror.status() if self.mirror is not None else None
        out["stagger"] = self.stagger  # [daemon] stagger_s: the offset of every boundary shown
        masked: dict[str, Any] = redact.redact_tree(out)
        return masked

    def status_json(self) -> str:
        return json.dumps(self.status(), default=str)

    def summary_json(self) -> str:
        """The status page's redacted summary (``gpushift/statuspage/summary.py``), from memory."""
        return self.pages.summary_json(self)

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str:
        self.config_on_disk.check()  # a broken file on disk refuses the switch (the CLI does not check)
        reason = str(options.get("reason") or "")
        hold = bool(options.get("hold"))
        until = None
        if options.get("until"):
            tz = self.schedule.tz if self.schedule is not None else None
            until = parse_until(str(options["until"]), tz)
            if until <= datetime.now(timezone.utc):
                raise InvalidArgument(f"--until {options['until']!r} is in the past")
        when_idle = bool(options.get("when_idle"))
        if when_idle and backend != OFF and backend not in self.config.backends:
            raise UnknownBackend(
                f"unknown backend {backend!r} (configured: {', '.join([*self.config.backends, OFF])})"
            )
        ask = Ask(backend, reason, caller, Trigger.MANUAL, skip_drain=bool(options.get("now")),
                  relaunch=bool(options.get("restart")), hold=hold, until=until, when_idle=when_idle)  # fmt: skip
        # The keeper decides and asks the switcher (a refusal — SwitchInProgress, UnknownBackend —
        # comes back from here at once, and nothing changed); it keeps the override.
        ticket, ov = self.keeper.ask(ask)
        # the mode as status and the D-Bus Mode say it (without a schedule an override is 'manual')
        mode, ends = (self.keeper.mode(), ov.until.isoformat() if ov.until else None) if ov else (None, None)
        if ticket is None:
            # --when-idle: the person's choice is kept at once; the keeper switches once the serving
            # backend has been idle (docs/config.md ``defer_while_busy_s``).
            self.log.info("switch_requested_when_idle", to=backend, by=caller.user, uid=caller.uid,
                          reason=reason, mode=mode, until=ends)  # fmt: skip
            self.clockwork.tick(Trigger.MANUAL)
            self.clockwork.arm()
            return WHEN_IDLE
        self.log.info("switch_requested", ticket=ticket, to=backend, by=caller.user, uid=caller.uid,
                      reason=reason, mode=mode, until=ends)  # fmt: skip
        self.clockwork.arm()
        return ticket

    def cancel(self, caller: Caller) -> str:
        ticket = self.switcher.cancel(caller)
        self.log.info("switch_cancel_requested", ticket=ticket, by=caller.user)
        return ticket

    def resume(self, caller: Caller) -> str:
        summary = self.keeper.resume(caller)
        self.clockwork.arm()
        return summary

    def reload(self, caller: Caller) -> str:
        return self._reload(f"requested by {caller.user}")

    def property_values(self) -> dict[str, Any]:
        """The D-Bus properties, from memory (gpushift/bus/properties.py)."""
        return properties.values(properties.sources(self))

    # ------------------------------------------------------------ the sampler, the status line

    @property
    def service(self) -> Any:
        """The published D-Bus object (None before the bus name is owned)."""
        return self._service

    def _start_sampler(self) -> None:
        """The sampler's first sample is taken before the bus name is: status has a picture at once."""
        from gpushift.sampler.sampler import Sampler

        self.sampler = Sampler(self.config, self.components.ports, log=self.log)
        self.sampler.sample_once()
        self.sampler.start()
        self.watcher.sampler = self.sampler

    def latest_sample(self) -> Sample:
        """The sampler's latest sample; right after a switch, the one taken after it (the relay's)."""
        return self.relay.latest_sample()

    def update_status_line(self) -> None:
        """systemd's status line (``systemctl status gpushift``): ``gpushift/daemon/statusline.py``."""
        self.notify.status(statusline.text(self))

    # ------------------------------------------------------------ reload, watchdog, signals

    def _reload(self, why: str) -> str:
        self.notify.reloading()
        try:
            new = self.config_on_disk.load()
            new_schedule = load_schedule_of(new)
            applied = reloadable(self.config, new)
        except ConfigError as e:
            self.reload_error = str(e)
            self.log.error("reload_rejected", error=str(e), detail="the old config stays in force")
            self.notify.ready()
            raise
        from gpushift.daemon import logs

        logs.set_level(new.daemon.log_level)
        self.config = new
        self.components.config = new
        self.switcher.reconfigure(new)
        self.sampler.reconfigure(new)
        self.schedule = new_schedule
        from gpushift.host.identity import stagger

        self.stagger = stagger(new)
        self.keeper.set_schedule(new_schedule)
        self.keeper.configure(
            new.daemon.max_attempts, new.daemon.retry_after_s, watch_settings(new), new.daemon.on_failure
        )
        if self._service is not None:
            self._service.allowed_group = new.daemon.allowed_group
        self.watcher.keep_units_loaded(new)
        self.models.refresh(new, self.components.ports.units)
        if new.frontdoor is not None and self.components.ports.frontdoor is not None:
            self.components.ports.frontdoor.timeout_s = new.frontdoor.bus_timeout_s
        self.reload_error = None
        self.reloaded_at = datetime.now(timezone.utc)
        self.log.info("reloaded", why=why, config=self.config_path, applied=applied)
        self.notify.ready()
        self.clockwork.tick(Trigger.RECONCILE)
        self.update_status_line()
        where = f" and {new_schedule.path}" if new_schedule else ""
        keys = f"; applied: {', '.join(applied)}" if applied else "; no key changed"
        return f"reloaded {self.config_path}{where}{keys}"

    def run(self) -> int:
        from gi.repository import GLib

        from gpushift.bus import service as dbus_service
        from gpushift.host.sdnotify import watchdog_interval_s

        self.build()
        self.models.refresh(self.config, self.components.ports.units)
        self._start_sampler()
        bus = self.components.bus
        self._service = dbus_service.SwitcherService(
            bus, self, allowed_group=self.config.daemon.allowed_group
        )
        try:
            self._publication = dbus_service.publish(bus, self._service)
        except RuntimeError as e:
            self.log.error(
                "bus_name_taken",
                name=BUS_NAME,
                error=str(e),
                detail="another gpushift daemon runs on this bus",
            )
            self.sampler.stop()
            return 1
        self.mirror = fleetwire.start(self)  # [mirror]: its own thread and connection
        self.metrics = exporter.start(self)  # /metrics and the textfile, on threads of their own
        self.webhook.start()  # only the daemon that owns the bus name delivers the queue
        self._loop = GLib.MainLoop()
        GLib.timeout_add(1000, self._service.announce)  # property changes no event announced
        self.watcher.start_jobwatch()
        self.watcher.keep_units_loaded(self.config)
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGTERM, self._quit)
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGINT, self._quit)
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGHUP, self._sighup)
        self.watchdog = self._watchdog(watchdog_interval_s())
        if self.watchdog is not None:  # WATCHDOG=1 from a thread, while the loop shows progress
            GLib.timeout_add(self.watchdog.turn_ms, self.watchdog.loop_turn)
        running = self.switcher.running_backends()
        self.log.info(
            "daemon_ready",
            pid=os.getpid(),
            bus=self.config.daemon.bus,
            name=BUS_NAME,
            running=running,
            version=__version__,
            schedule=self.schedule.path if self.schedule else None,
        )
        self.clockwork.start()
        self.notify.ready()
        if self.watchdog is not None:
            self.watchdog.start()
        try:
            self.converge()  # a switch the previous daemon died in: converge before anything decides
        except Exception as e:  # the start's edge: log it, keep serving requests and the schedule
            self.log.exception("recovery_failed", error=repr(e))
        self.clockwork.tick(Trigger.RECONCILE)  # boot or crash restart: bring up what the schedule wants
        self.update_status_line()
        self._loop.run()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self.mirror is not None:
            self.mirror.stop()
        self.sampler.stop()
        self.clockwork.stop()
        self.prewarming.stop()  # end the pre-warm readers this daemon started
        self.webhook.stop()  # what is still queued is delivered by the next daemon
        self.notify.stopping()
        self.log.info("daemon_stopping", detail="backends are left as they are")
        return 0

    def _watchdog(self, interval_s: float | None) -> Any:
        """The watchdog thread (``gpushift/daemon/watchdog.py``), or None when systemd set none."""
        if not interval_s:
            return None
        from gpushift.daemon.watchdog import Watchdog, worker_silence
        from gpushift.host.dbus import waiting_until

        loop_thread = threading.get_ident()  # run() runs the loop on this thread
        return Watchdog(
            self.notify.watchdog,
            interval_s,
            progress=lambda: self._service.last_call if self._service is not None else 0.0,
            problem=lambda: worker_silence(self.switcher, self.config),
            waiting=lambda: waiting_until(loop_thread),
            log=self.log,
        )

    def _reconcile(self) -> None:
        """Every reconcile_interval_s and after a clock jump (the clockwork's timer, loop thread)."""
        self._flush_ledger()
        if self.mirror is not None:
            self.mirror.poke(state=True)  # the host's state row at every reconcile
        try:
            self.override_store.flush()  # an override the state directory could not take (disk full)
        except Exception as e:
            self.log.error("override_flush_failed", error=repr(e))
        self.clockwork.tick(Trigger.RECONCILE)
        self.clockwork.arm()
        self.update_status_line()

    def _flush_ledger(self) -> None:
        """A degraded ledger (disk full, locked) retries its pending spool here; every time, the
        ledger also checks that its database is still the file it opened (docs/ledger.md)."""
        ledger = self.components.ports.ledger
        try:
            flush = getattr(ledger, "flush_pending", None)
            if flush is not None:
                n = flush()
                if n:
                    self.log.info("ledger_flushed", rows=n)
        except Exception as e:
            self.log.error("ledger_flush_failed", error=repr(e))

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
        # The journal gets this line (stderr); systemd sees the non-zero exit.
        print(f"gpushift daemon: refusing to start: {e}", file=sys.stderr, flush=True)
        return e.code
    try:
        return d.run()
    except GpushiftError as e:
        d.log.error("daemon_failed", error=str(e))
        return e.code
    finally:
        threading.Event().set()
