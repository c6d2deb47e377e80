"""L5: what a config means for the running daemon — the schedule it names, which changes a
reload may apply, the keeper's per-backend watch settings, and a person's ``--until``."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from .. import config as config_mod
from ..errors import ConfigError, InvalidArgument
from ..keeper import WatchSettings
from ..schedule import Schedule


def load_schedule_of(config: config_mod.Config) -> Schedule | None:
    """The schedule the config names, checked against its backends.

    ``[daemon] schedule`` absent: the default path, when that file exists; ``""``: no schedule.
    A named file that is missing or invalid is an error (the daemon refuses to start on it).
    """
    from ..schedule import DEFAULT_SCHEDULE_PATH, load_schedule

    path = config.daemon.schedule
    if path == "":
        return None
    if path is None:
        if not os.path.exists(DEFAULT_SCHEDULE_PATH):
            return None
        path = DEFAULT_SCHEDULE_PATH
    return load_schedule(path, backends=set(config.backends))


def reloadable(old: config_mod.Config, new: config_mod.Config) -> None:
    """Refuse a reload that changes what was built at start (bus, GPU provider, paths)."""
    changed = [
        key
        for key, a, b in (
            ("daemon.bus", old.daemon.bus, new.daemon.bus),
            ("daemon.state_dir", old.daemon.state_dir, new.daemon.state_dir),
            ("daemon.runtime_dir", old.daemon.runtime_dir, new.daemon.runtime_dir),
            ("gpu", old.gpu, new.gpu),
            ("metrics", old.metrics, new.metrics),  # the listener and the textfile are set up at start
        )
        if a != b
    ]
    if old.gpu.provider == "simulated" and dict(old.backends) != dict(new.backends):
        changed.append("backends (the simulated GPUs attribute memory by backend)")
    if changed:
        raise ConfigError(
            f"{new.path}: {', '.join(changed)} changed: that needs `systemctl restart gpushift` "
            "(a reload keeps them); the old config stays in force"
        )


def parse_until(text: str, tz: Any) -> datetime:
    """``2026-12-01 08:00`` (local to the schedule's zone, or the host's) → aware datetime.

    Raises:
        InvalidArgument: not a time, or one a datetime cannot hold in UTC (year 9999 and later).
    """
    try:
        t = datetime.fromisoformat(text.strip().replace("T", " "))
        if t.tzinfo is None:
            t = t.replace(tzinfo=tz) if tz is not None else t.astimezone()
        return t.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise InvalidArgument(
            f"--until: cannot read {text!r} (expected e.g. '2026-12-01 08:00', before the year 9999)"
        ) from None


def watch_settings(config: config_mod.Config) -> dict[str, WatchSettings]:
    """Per backend, what the keeper does when it crashes or wedges."""
    return {
        n: WatchSettings(b.on_crash, b.unhealthy_after_s, b.defer_while_busy_s, b.idle_s)
        for n, b in config.backends.items()
    }
