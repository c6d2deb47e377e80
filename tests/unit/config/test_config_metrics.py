"""The ``[metrics]`` table: where /metrics is served and where the node_exporter textfile goes; every
mistake is refused with the key named, and a reload cannot change it (the listener is bound at start)."""

from __future__ import annotations

import re

import pytest

from gpushift.config.schema import MetricsConfig, parse
from gpushift.daemon import reloadable
from gpushift.errors import ConfigError

PATH = "/etc/gpushift/gpushift.toml"
BACKEND = """
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
"""


def metrics(text: str) -> MetricsConfig:
    return parse(text + BACKEND, PATH).metrics


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse(text + BACKEND, PATH)
    assert exc.value.code == 2
    # the message's line number aside (tests/unit/config/test_config.py checks lines)
    return re.sub(r"^([^:]+):\d+(?::\d+)?: ", r"\1: ", str(exc.value))


def test_metrics_are_off_unless_configured() -> None:
    m = metrics("")
    assert (m.listen, m.textfile, m.textfile_interval_s, m.address) == ("", "", 60.0, None)
    assert metrics('[metrics]\nlisten = ""\n').address is None


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:9840", ("127.0.0.1", 9840)),
        ("[::1]:9840", ("::1", 9840)),
        ("[fe80::1]:1", ("fe80::1", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("metrics.example.org:9840", ("metrics.example.org", 9840)),
        ("0.0.0.0:9840", ("0.0.0.0", 9840)),
    ],
)
def test_metrics_listen_takes_ipv4_ipv6_in_brackets_and_host_names(listen: str, address: tuple) -> None:
    assert metrics(f'[metrics]\nlisten = "{listen}"\n').address == address


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("9840", "expected HOST:PORT"),
        (":9840", "expected HOST:PORT"),
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:0", "port 1-65535"),
        ("127.0.0.1:65536", "port 1-65535"),
        ("127.0.0.1:http", "port 1-65535"),
        ("127.0.0.1:98 40", "port 1-65535"),
        ("::1:9840", "IPv6 address in brackets"),
        ("[::1]", "port 1-65535"),
        ("[not-v6]:9840", "not an IPv6 address"),
        ("[127.0.0.1]:9840", "not an IPv6 address"),
        ("256.1.1.1:9840", "neither an IPv4 address nor a host name"),
        ("1.2.3:9840", "neither an IPv4 address nor a host name"),
        ("under_score:9840", "neither an IPv4 address nor a host name"),
        ("-lead.example:9840", "neither an IPv4 address nor a host name"),
    ],
)
def test_metrics_listen_mistakes_are_refused_naming_the_key(listen: str, says: str) -> None:
    msg = refused(f'[metrics]\nlisten = "{listen}"\n')
    assert msg.startswith(f"{PATH}: metrics.listen: "), msg
    assert says in msg


def test_metrics_listen_must_be_a_string() -> None:
    assert "metrics.listen: expected" in refused("[metrics]\nlisten = 9840\n")


def test_metrics_textfile_is_an_absolute_prom_path() -> None:
    path = "/var/lib/prometheus/node-exporter/gpushift.prom"
    assert metrics(f'[metrics]\ntextfile = "{path}"\n').textfile == path
    for bad in ('"gpushift.prom"', '"/var/lib/x/gpushift.txt"', "1"):
        msg = refused(f"[metrics]\ntextfile = {bad}\n")
        assert msg.startswith(f"{PATH}: metrics.textfile: expected an absolute path ending in .prom"), msg


def test_metrics_textfile_interval_range() -> None:
    assert metrics("[metrics]\ntextfile_interval_s = 1\n").textfile_interval_s == 1
    assert metrics("[metrics]\ntextfile_interval_s = 3600\n").textfile_interval_s == 3600
    assert "expected a value >= 1" in refused("[metrics]\ntextfile_interval_s = 0.5\n")
    assert "expected a value <= 3600" in refused("[metrics]\ntextfile_interval_s = 3601\n")


def test_metrics_unknown_key_is_named() -> None:
    msg = refused('[metrics]\nlisten_address = "127.0.0.1:9840"\n')
    assert msg.startswith(f"{PATH}: metrics.listen_address: unknown key"), msg
    assert "listen" in msg and "textfile" in msg


def test_metrics_table_is_not_changed_by_a_reload() -> None:
    old = parse(BACKEND, PATH)
    reloadable(old, parse(BACKEND, PATH))
    for extra in ('[metrics]\nlisten = "127.0.0.1:9840"\n', "[metrics]\ntextfile_interval_s = 30\n"):
        with pytest.raises(ConfigError, match=r"metrics.*systemctl restart gpushift"):
            reloadable(old, parse(extra + BACKEND, PATH))
