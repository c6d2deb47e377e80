"""Which config changes a reload may apply, and which need a restart (gpushift/daemon.py)."""

from __future__ import annotations

import pytest

from gpushift.config import parse
from gpushift.daemon import reloadable
from gpushift.errors import ConfigError

BASE = """
[daemon]
bus = "session"
state_dir = "/var/lib/gs"
[gpu]
provider = "{provider}"
release_timeout_s = {release}
[backends.day]
unit = "day.service"
health_url = "http://127.0.0.1:8000/health"
start_timeout_s = {start}
"""


def cfg(provider: str = "nvml", release: int = 120, start: int = 300, extra: str = "", bus: str = "session"):
    return parse(
        BASE.format(provider=provider, release=release, start=start).replace(
            'bus = "session"', f'bus = "{bus}"'
        )
        + extra,
        "/etc/gpushift/gpushift.toml",
    )


def test_reload_accepts_backend_timeouts_and_new_backends_on_nvml() -> None:
    extra = '[backends.night]\nunit = "night.service"\nhealth_url = "http://127.0.0.1:8080/health"\n'
    reloadable(cfg(), cfg(start=900, extra=extra))


@pytest.mark.parametrize(
    ("new", "named"),
    [
        (lambda: cfg(bus="system"), "daemon.bus"),
        (lambda: cfg(provider="simulated"), "gpu"),
        (lambda: cfg(release=30), "gpu"),
    ],
)
def test_reload_refuses_what_was_built_at_start(new, named: str) -> None:
    with pytest.raises(ConfigError, match=rf"{named}.*systemctl restart gpushift"):
        reloadable(cfg(), new())


def test_reload_refuses_backend_changes_under_the_simulated_provider() -> None:
    with pytest.raises(ConfigError, match="backends"):
        reloadable(cfg(provider="simulated"), cfg(provider="simulated", start=900))
