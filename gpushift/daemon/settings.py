"""What a config means for the running daemon — the schedule it names, which changes a
reload may apply, the keeper's per-backend watch settings, and a person's ``--until``."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from gpushift.config import schema as config_mod
from gpushift.config.instances import needed, units_of
from gpushift.errors import ConfigError, InvalidArgument
from gpushift.keeper import WatchSettings
from gpushift.schedule import Schedule


def load_schedule_of(config: config_mod.Config) -> Schedule | None:
    """The schedule the config names, checked against its backends, its boundaries shifted by this
    host's stagger (``[daemon] stagger_s``, ``host/identity.py``).

    ``[daemon] schedule`` absent: the default path, when that file exists; ``""``: no schedule.
    A named file that is missing or invalid is an error (the daemon refuses to start on it).
    """
    from gpushift.host.identity import stagger
    from gpushift.schedule import DEFAULT_SCHEDULE_PATH, load_schedule

    path = config.daemon.schedule
    if path == "":
        return None
    if path is None:
        if not os.path.exists(DEFAULT_SCHEDULE_PATH):
            return None
        path = DEFAULT_SCHEDULE_PATH
    sched = load_schedule(path, backends=set(config.backends))
    st = stagger(config)
    return sched.staggered(st["offset_s"]) if st is not None else sched


#: What a reload applies: every key of these tables (a backend's table counts as one key,
#: ``backends.NAME``).  ``log_level`` through ``logs.set_level``, the switcher's, sampler's,
#: keeper's and clockwork's settings through their ``reconfigure``/``configure``, ``allowed_group``
#: on the D-Bus service, hooks and notify at the next event.
ON_RELOAD = frozenset(
    {
        *(f"daemon.{k}" for k in config_mod.DaemonConfig.__dataclass_fields__),
        "backends.*",
        "hooks.*",
        "notify.*",
        # the front door's own keys (it reads them itself); the daemon applies bus_timeout_s
        *(f"frontdoor.{k}" for k in config_mod.FrontDoorConfig.__dataclass_fields__),
    }
    - {"daemon.bus", "daemon.state_dir", "daemon.runtime_dir"}
)
#: What needs ``systemctl restart gpushift``: what was built at start (the bus connection, the
#: ledger and spool paths, the GPU provider, the metrics listener and textfile, the mirror's thread,
#: whether a front door is called at all: ``frontdoor.table``).
ON_RESTART = frozenset(
    {
        "daemon.bus",
        "daemon.state_dir",
        "daemon.runtime_dir",
        "gpu.*",
        "metrics.*",
        "mirror.*",
        "frontdoor.table",
    }
)


def flat(config: config_mod.Config) -> dict[str, Any]:
    """Every key of ``config`` by its dotted name (a backend's whole table under ``backends.NAME``)."""
    out: dict[str, Any] = {}
    for table in ("daemon", "gpu", "metrics", "hooks", "notify", "mirror"):
        section = getattr(config, table)
        for key in type(section).__dataclass_fields__:
            out[f"{table}.{key}"] = getattr(section, key)
    for name, b in config.backends.items():
        out[f"backends.{name}"] = b
    out["frontdoor.table"] = config.frontdoor is not None
    if config.frontdoor is not None:
        for key in type(config.frontdoor).__dataclass_fields__:
            out[f"frontdoor.{key}"] = getattr(config.frontdoor, key)
    return out


def needs_restart(key: str) -> bool:
    """Whether a change of ``key`` (a dotted name from :func:`flat`) needs a restart."""
    return key in ON_RESTART or f"{key.split('.')[0]}.*" in ON_RESTART


def reloadable(old: config_mod.Config, new: config_mod.Config) -> list[str]:
    """The keys a reload from ``old`` to ``new`` changes (all of them applied by a reload).

    Raises:
        ConfigError: naming every changed key that needs a restart (what was built at start: the
            bus, the paths, the GPU provider, the metrics outputs); the old config stays in force.
    """
    before, after = flat(old), flat(new)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    restart = [k for k in changed if needs_restart(k)]
    if old.gpu.provider == "simulated" and dict(old.backends) != dict(new.backends):
        restart.append("backends (the simulated GPUs attribute memory by backend)")
    if restart:
        raise ConfigError(
            f"{new.path}: {', '.join(restart)} changed: that needs `systemctl restart gpushift` "
            "(a reload keeps them); the old config stays in force"
        )
    return changed


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
        n: WatchSettings(
            b.on_crash,
            b.unhealthy_after_s,
            b.defer_while_busy_s,
            b.idle_s,
            instances=units_of(b) if b.instances else (),
            min_ready=needed(b),
        )
        for n, b in config.backends.items()
    }


class ConfigOnDisk:
    """The config file as the daemon last found it valid.

    ``gpushift switch`` does not validate the config itself (importing and running the validation
    would cost every switch its time): the daemon does, before it takes a switch.  The file is read
    (a few KiB) and validated again only when its text differs from the last valid one; a file that
    no longer validates refuses the switch with the :class:`~gpushift.errors.ConfigError` that names
    the file and the key, and nothing changes (``gpushift reload`` would reject it too).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._valid: str | None = None

    def load(self) -> config_mod.Config:
        """Load and validate the file (daemon start, reload) and remember it as valid."""
        text = config_mod.read(self.path)
        config = config_mod.parse(text, self.path)
        self._valid = text
        return config

    def check(self) -> None:
        """Raises:
        ConfigError: the file on disk is unreadable or does not validate (naming file and key).
        """
        text = config_mod.read(self.path)
        if text != self._valid:
            config_mod.parse(text, self.path)
            self._valid = text
