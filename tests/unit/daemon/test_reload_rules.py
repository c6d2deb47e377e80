"""Which config changes a reload may apply, and which need a restart (gpushift/daemon.py)."""

from __future__ import annotations

import pytest

from gpushift.config.schema import parse
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


def test_every_config_key_is_applied_on_reload_or_needs_a_restart() -> None:
    """A key in neither list would be read at start and silently ignored by a reload."""
    from gpushift.daemon.settings import ON_RELOAD, ON_RESTART, flat

    assert not ON_RELOAD & ON_RESTART
    for key in flat(cfg()):
        table = key.split(".")[0]
        places = [s for s in (ON_RELOAD, ON_RESTART) if key in s or f"{table}.*" in s]
        assert len(places) == 1, f"{key} is in {len(places)} of the lists ON_RELOAD, ON_RESTART (settings.py)"


def test_reload_names_each_key_that_needs_a_restart_and_lists_what_it_applies() -> None:
    with pytest.raises(ConfigError) as exc:
        reloadable(cfg(), cfg(release=30, bus="system", extra="[metrics]\ntextfile_interval_s = 30\n"))
    msg = str(exc.value)
    for key in ("daemon.bus", "gpu.release_timeout_s", "metrics.textfile_interval_s"):
        assert key in msg, msg
    old = cfg()
    new = parse(
        BASE.format(provider="nvml", release=120, start=900).replace(
            'state_dir = "/var/lib/gs"', 'state_dir = "/var/lib/gs"\nlog_level = "debug"\nmax_attempts = 5'
        ),
        "/etc/gpushift/gpushift.toml",
    )
    assert reloadable(old, new) == ["backends.day", "daemon.log_level", "daemon.max_attempts"]
    assert reloadable(old, cfg()) == []


def test_log_level_is_applied_live() -> None:
    """A reload to log_level = "debug" must bring debug lines at once (before: none until a restart)."""
    import io
    import json

    from gpushift.daemon import logs

    out = io.StringIO()
    log = logs.setup("info", stream=out)
    try:
        log.debug("before")
        logs.set_level("debug")
        log.debug("after")
        logs.set_level("error")
        log.warning("dropped")
        events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
        assert events == ["after"]
    finally:
        import structlog

        structlog.reset_defaults()


def test_config_on_disk_refuses_once_the_file_no_longer_validates(tmp_path) -> None:
    from gpushift.daemon.settings import ConfigOnDisk

    path = tmp_path / "gpushift.toml"
    good = BASE.format(provider="nvml", release=120, start=300)
    path.write_text(good)
    disk = ConfigOnDisk(str(path))
    assert disk.load().backends["day"].unit == "day.service"
    disk.check()  # unchanged: nothing to say
    path.write_text(good.replace("[gpu]", "[gpu]\nresidual_mb = 3"))
    with pytest.raises(ConfigError, match="gpu.residual_mb: unknown key") as e:
        disk.check()
    assert str(path) in str(e.value)
    path.write_text(good + "# edited\n")  # valid, not reloaded: no refusal
    disk.check()
    path.unlink()
    with pytest.raises(ConfigError, match=str(path)):
        disk.check()
