"""``gpushift frontdoor``: the front door's process (what ``units/gpushift-frontdoor.service`` runs).

1. Read the config (``--config``, ``$GPUSHIFT_CONFIG``, else ``/etc/gpushift/gpushift.toml``); it
   must have a ``[frontdoor]`` table.  A bad config is refused with its error (exit 2).
2. Log like the daemon: into the journal's fields under systemd (``SYSLOG_IDENTIFIER=gpushift-frontdoor``,
   ``GPUSHIFT_EVENT=...``), one JSON object per line elsewhere (:mod:`gpushift.host.logs`).
3. Take the listening sockets systemd passed (``gpushift-frontdoor.socket``, :mod:`listenfds`), or,
   started without them (by hand, in tests), bind ``[frontdoor] listen``.
4. Follow the daemon over D-Bus (:mod:`daemonlink`) for the process's life; once it has read what
   serves (or found no daemon: at most ``[frontdoor] bus_timeout_s``), serve (the core), then tell
   systemd ``READY=1`` (``Type=notify``).
5. SIGTERM (or SIGINT): ``STOPPING=1``, stop accepting, let the requests in flight end (at most
   :data:`STOP_GRACE_S`; the unit's ``TimeoutStopSec=`` is longer), leave the bus, exit 0.  The
   listening sockets stay systemd's: a connection made meanwhile waits in their backlog for the next
   start.

Nothing of the daemon's process is imported here (no pydbus, no GLib): the front door is its own,
unprivileged process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

from gpushift.errors import ConfigError, GpushiftError
from gpushift.frontdoor.listenfds import ListenFdsError, ListenSocket, listen_fds

#: How long a stop waits for the requests in flight (the unit's TimeoutStopSec= is 30 s).
STOP_GRACE_S = 20.0
IDENTIFIER = "gpushift-frontdoor"
#: Exit status when the sockets cannot be had (bound or passed): systemd reports the failure.
EXIT_NO_SOCKETS = 1


def load(config_path: str | None) -> Any:
    """The config, with its ``[frontdoor]`` table.

    Raises:
        ConfigError: the file is bad, or has no ``[frontdoor]`` table.
    """
    from gpushift.config import schema

    config = schema.load(config_path)
    if config.frontdoor is None:
        raise ConfigError(
            f"{config.path}: no [frontdoor] table: this host has no front door configured "
            "(docs/frontdoor.md says how to add one; the daemon then tells it about every switch)"
        )
    return config


def main(config_path: str | None) -> int:
    """Run the front door until SIGTERM; its exit status."""
    try:
        config = load(config_path)
    except ConfigError as e:
        print(f"gpushift frontdoor: refusing to start: {e}", file=sys.stderr, flush=True)
        return e.code
    from gpushift.host import logs

    log = logs.setup(config.daemon.log_level, identifier=IDENTIFIER)
    try:
        sockets = listen_fds()
    except ListenFdsError as e:
        log.error("frontdoor_sockets_unusable", error=str(e))
        return EXIT_NO_SOCKETS
    try:
        return asyncio.run(run(config, sockets, log))
    except GpushiftError as e:
        log.error("frontdoor_failed", error=str(e))
        return e.code


async def run(config: Any, sockets: list[ListenSocket], log: Any, notifier: Any = None) -> int:
    """Serve until SIGTERM or SIGINT; the exit status."""
    from gpushift.frontdoor.core import FrontDoor
    from gpushift.frontdoor.daemonlink import DaemonLink
    from gpushift.host.sdnotify import Notifier

    notify = notifier if notifier is not None else Notifier()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    core = FrontDoor(config)
    link = DaemonLink(core, config.daemon.bus, log, call_timeout_s=config.frontdoor.bus_timeout_s)
    from gpushift.frontdoor.page import StatusPage, SummarySource

    core.status_page = StatusPage(SummarySource(link.get_summary, log=log), core)  # /gpushift/
    linked = asyncio.ensure_future(link.run())
    # What serves first (bounded): a request accepted before it is known would get "the daemon is
    # not answering"; meanwhile connections wait in the backlog.
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(link.first_read.wait(), config.frontdoor.bus_timeout_s)
    try:
        await core.serve([s.sock for s in sockets] or None)
    except OSError as e:
        where = ", ".join(config.frontdoor.listen)
        log.error("frontdoor_cannot_listen", listen=where, error=e.strerror or str(e))
        await link.stop()
        linked.cancel()
        return EXIT_NO_SOCKETS
    listening = [s.address for s in sockets] or list(config.frontdoor.listen)
    log.info(
        "frontdoor_serving",
        listen=listening,
        activated=bool(sockets),
        names=sorted({s.name for s in sockets}),
        bus=config.daemon.bus,
    )
    notify.ready(status=f"serving {', '.join(listening)}")
    await stop.wait()
    notify.stopping()
    log.info("frontdoor_stopping", grace_s=STOP_GRACE_S)
    try:
        await asyncio.wait_for(core.stop(), STOP_GRACE_S)
    except asyncio.TimeoutError:
        log.warning("frontdoor_stop_cut_short", grace_s=STOP_GRACE_S)
    await link.stop()
    linked.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await linked
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    log.info("frontdoor_stopped")
    return 0
