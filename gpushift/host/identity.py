"""Who this machine is: its host name (``[mirror] host_name``, default the kernel's) and machine-id.

The machine-id is systemd's (machine-id(5): ``/etc/machine-id``, 32 hex digits, made once per
installation).  Two hosts that report one machine-id were cloned from one image without it being
made anew; the fleet reports them (docs/fleet.md).
"""

from __future__ import annotations

import re
import socket
from typing import Any

from gpushift.config.textfile import read_bounded
from gpushift.config.types import Config

MACHINE_ID_PATH = "/etc/machine-id"
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")


def host_name(configured: str | None) -> str:
    """``configured`` when set, else the machine's host name (its first label kept whole)."""
    if configured:
        return configured
    name = socket.gethostname().strip()
    return name or "localhost"


def machine_id(path: str = MACHINE_ID_PATH) -> str | None:
    """The machine-id, or None when it is missing or not one."""
    try:
        text = read_bounded(path, 4096).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        return None
    except Exception:  # noqa: BLE001 - a FIFO or device at the path (textfile.Skipped): no id
        return None
    return text if _MACHINE_ID.fullmatch(text) else None


def stagger(config: Config) -> dict[str, Any] | None:
    """This host's stagger (``[daemon] stagger_s``, from its host name): ``host_name``, ``stagger_s``,
    ``offset_s``; None without one.  What the daemon shifts its schedule by, and ``schedule`` shows."""
    from gpushift.schedule.stagger import describe

    return describe(host_name(config.mirror.host_name), config.daemon.stagger_s)
