"""The ``[frontdoor]`` table and the backends' ``models`` / ``aliases`` (docs/config.md)."""

from __future__ import annotations

import pytest

from gpushift.config.frontdoor import port_of
from gpushift.config.schema import parse
from gpushift.config.types import DEFAULT_LISTEN
from gpushift.errors import ConfigError

BACKENDS = """
[backends.day]
kind = "vllm"
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:8001/health"

[backends.night]
kind = "llama-server"
unit = "gpushift-night.service"
health_url = "http://127.0.0.1:8081/health"
"""


def test_frontdoor_absent_means_none_and_an_empty_table_means_the_defaults() -> None:
    assert parse(BACKENDS).frontdoor is None
    fd = parse("[frontdoor]\n" + BACKENDS).frontdoor
    assert fd is not None
    assert fd.listen == DEFAULT_LISTEN == ("[::]:8000", "[::]:8080")
    assert fd.addresses == (("::", 8000), ("::", 8080))
    assert (fd.hold_timeout_s, fd.max_held, fd.max_body_bytes) == (300.0, 1000, 16 * 1024 * 1024)


def test_frontdoor_keys_take_their_values() -> None:
    fd = parse(
        '[frontdoor]\nlisten = ["127.0.0.1:9000", "[::1]:9000"]\nhold_timeout_s = 5\nmax_held = 0\n'
        'metrics_listen = "127.0.0.1:9841"\n' + BACKENDS
    ).frontdoor
    assert fd is not None
    assert fd.addresses == (("127.0.0.1", 9000), ("::1", 9000))
    assert (fd.hold_timeout_s, fd.max_held, fd.metrics_listen) == (5.0, 0, "127.0.0.1:9841")


@pytest.mark.parametrize(
    ("table", "key", "says"),
    [
        ('listen = "[::]:8000"', "frontdoor.listen", "expected a list"),
        ("listen = []", "frontdoor.listen", "expected a list of 1 - 16"),
        ('listen = ["::8000"]', "frontdoor.listen", "IPv6"),
        ('listen = ["127.0.0.1:9000", "127.0.0.1:9000"]', "frontdoor.listen", "listed twice"),
        ('listen = ["[::]:8001"]', "frontdoor.listen", "port 8001 of backend 'day'"),
        ('listen = ["127.0.0.1:8081"]', "frontdoor.listen", "port 8081 of backend 'night'"),
        ("hold_timeout_s = 0", "frontdoor.hold_timeout_s", ">= 1"),
        ("max_body_bytes = 10", "frontdoor.max_body_bytes", ">= 1024"),
        ("max_held = -1", "frontdoor.max_held", ">= 0"),
        ('metrics_listen = "nowhere"', "frontdoor.metrics_listen", "HOST:PORT"),
        ("colour = 1", "frontdoor.colour", "unknown key"),
    ],
)
def test_frontdoor_bad_values_are_refused_naming_the_key(table: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(f"[frontdoor]\n{table}\n" + BACKENDS)
    assert key in str(e.value) and says in str(e.value)


def test_frontdoor_default_listen_refuses_backends_still_on_8000() -> None:
    # An existing host that adds [frontdoor] without moving its backends is told what to do.
    old = BACKENDS.replace("8001", "8000")
    with pytest.raises(ConfigError) as e:
        parse("[frontdoor]\n" + old)
    assert "port 8000 of backend 'day'" in str(e.value) and "docs/frontdoor.md" in str(e.value)
    assert parse(old).frontdoor is None  # without the table nothing changes


INSTANCES = """
[backends.pair]
kind = "llama-server"
instances = [
  { unit = "gpushift-llama@0.service", health_url = "http://127.0.0.1:8081/health", gpus = [0] },
  { unit = "gpushift-llama@1.service", health_url = "http://127.0.0.1:8082/health", gpus = [1] },
]
"""


def test_frontdoor_listen_on_any_instances_port_is_refused() -> None:
    # The first instance's port was checked through the backend's health_url; the second's too.
    with pytest.raises(ConfigError) as e:
        parse('[frontdoor]\nlisten = ["127.0.0.1:8082"]\n' + INSTANCES)
    assert "port 8082 of backend 'pair'" in str(e.value) and "gpushift-llama@1.service" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse('[frontdoor]\nlisten = ["[::]:8081"]\n' + INSTANCES)
    assert "port 8081 of backend 'pair'" in str(e.value)
    assert parse('[frontdoor]\nlisten = ["127.0.0.1:8000"]\n' + INSTANCES).frontdoor is not None


def test_backend_models_and_aliases() -> None:
    cfg = parse(
        BACKENDS.replace(
            'kind = "vllm"', 'kind = "vllm"\nmodels = ["qwen", "qwen-big"]\naliases = ["default"]'
        )
    )
    day, night = cfg.backend("day"), cfg.backend("night")
    assert (day.models, day.aliases) == (("qwen", "qwen-big"), ("default",))
    assert (night.models, night.aliases) == (None, ())  # None: read from the unit's command line


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('models = "qwen"', "expected a list of model names"),
        ('models = ["qwen", "qwen"]', "listed twice"),
        ('models = [""]', "expected a list of model names"),
        ('models = ["a\\nb"]', "model name"),
        ('aliases = ["llama-model"]', "an alias must not hide a model"),
    ],
)
def test_backend_bad_models_are_refused(line: str, says: str) -> None:
    text = BACKENDS.replace('kind = "vllm"', f'kind = "vllm"\n{line}').replace(
        'kind = "llama-server"', 'kind = "llama-server"\nmodels = ["llama-model"]'
    )
    with pytest.raises(ConfigError) as e:
        parse("[frontdoor]\n" + text)
    assert "backends.day" in str(e.value) and says in str(e.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8001/health", ("127.0.0.1", 8001)),
        ("http://[::1]:8081/health", ("::1", 8081)),
        ("http://localhost/health", ("localhost", 80)),
        ("https://u:p@host/x", ("host", 443)),
    ],
)
def test_port_of_reads_host_and_port(url: str, expected: tuple[str, int]) -> None:
    assert port_of(url) == expected
