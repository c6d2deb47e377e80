"""Time zone names, and the host's own zone (the schedule's zone when its file has no ``TZ=``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpushift.errors import ConfigError

#: What an IANA zone name looks like (``Asia/Shanghai``, ``Etc/GMT+8``, ``UTC``).
ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")


def host_timezone(environ: Mapping[str, str] | None = None, root: str = "/") -> ZoneInfo:
    """The host's time zone: ``$TZ``, then ``/etc/localtime``, then ``/etc/timezone``, else UTC.

    ``/etc/localtime`` comes before ``/etc/timezone`` because it is what glibc (``date``, the
    journal's timestamps) and ``timedatectl`` use; ``/etc/timezone`` is a Debian copy that can be
    stale.  A source that does not name a zone the zone database knows is skipped.

    Args:
        environ: the environment to read ``TZ`` from (default: ``os.environ``).
        root: the file-system root (tests point it at a temporary directory).
    """
    env = os.environ if environ is None else environ
    tz_env = env.get("TZ", "").strip().lstrip(":")
    if tz_env:
        zone = _zone_from_path(tz_env) if tz_env.startswith("/") else _try_zone(tz_env)
        if zone is not None:
            return zone
    localtime = os.path.join(root, "etc/localtime")
    if os.path.islink(localtime):
        zone = _zone_from_path(os.path.realpath(localtime))
        if zone is not None:
            return zone
    try:
        first = Path(root, "etc/timezone").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        first = []
    if first:
        zone = _try_zone(first[0])
        if zone is not None:
            return zone
    if os.path.isfile(localtime):  # a copied zone file, not a link: usable, just without a name
        try:
            with open(localtime, "rb") as f:
                return ZoneInfo.from_file(f, key="localtime")
        except (OSError, ValueError):
            pass
    zone = _try_zone("UTC")
    if zone is None:
        raise ConfigError("no time zone database found (install the tzdata package)")
    return zone


def _try_zone(key: str) -> ZoneInfo | None:
    if not ZONE_KEY.fullmatch(key):
        return None
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _zone_from_path(path: str) -> ZoneInfo | None:
    # /usr/share/zoneinfo/Asia/Shanghai → Asia/Shanghai (also .../zoneinfo/posix/Asia/Shanghai)
    marker = "/zoneinfo/"
    i = path.rfind(marker)
    if i < 0:
        return None
    key = path[i + len(marker) :]
    for prefix in ("posix/", "right/"):
        key = key.removeprefix(prefix)
    return _try_zone(key)
