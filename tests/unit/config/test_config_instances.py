"""The ``instances`` and ``min_ready`` keys of a backend (issue 23): read, refused by name."""

from __future__ import annotations

import pytest

from gpushift.config.instances import members, needed, units_of, view
from gpushift.config.schema import parse
from gpushift.config.types import InstanceConfig
from gpushift.errors import ConfigError

TWO = """
[backends.night]
kind = "llama-server"
instances = [
  { unit = "gpushift-llama@0.service", health_url = "http://127.0.0.1:8081/health", gpus = [0] },
  { unit = "gpushift-llama@1.service", health_url = "http://127.0.0.1:8082/health", gpus = [1] },
]
"""
DAY = '[backends.day]\nunit = "day.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'


def test_instances_are_read_with_the_first_one_s_unit_and_url_and_every_gpu() -> None:
    b = parse(TWO + DAY, "/t.toml").backends["night"]
    assert b.instances == (
        InstanceConfig("gpushift-llama@0.service", "http://127.0.0.1:8081/health", (0,)),
        InstanceConfig("gpushift-llama@1.service", "http://127.0.0.1:8082/health", (1,)),
    )
    assert (b.unit, b.health_url, b.gpus, b.min_ready) == (
        "gpushift-llama@0.service",
        "http://127.0.0.1:8081/health",
        (0, 1),
        None,
    )
    assert needed(b) == 2
    assert units_of(b) == ("gpushift-llama@0.service", "gpushift-llama@1.service")
    second = view(b, b.instances[1])
    assert (second.unit, second.health_url, second.gpus, second.instances) == (
        "gpushift-llama@1.service",
        "http://127.0.0.1:8082/health",
        (1,),
        (),
    )
    assert second.version_url == "http://127.0.0.1:8082/props"  # the kind's default, at its own origin


def test_the_single_unit_form_is_its_own_one_instance() -> None:
    b = parse(DAY, "/t.toml").backends["day"]
    assert b.instances == () and b.min_ready is None
    assert members(b) == (InstanceConfig("day.service", "http://127.0.0.1:8000/health", None),)
    assert needed(b) == 1 and view(b, members(b)[0]) is b


def test_min_ready_is_read_and_an_instance_without_gpus_means_all() -> None:
    text = TWO.replace(", gpus = [1]", "") + "min_ready = 1\n"
    b = parse(text, "/t.toml").backends["night"]
    assert b.min_ready == 1 and needed(b) == 1
    assert b.gpus is None  # one instance on every GPU: the gate watches all


@pytest.mark.parametrize("key", ["unit", "health_url", "gpus"])
def test_a_backend_level_key_beside_instances_is_refused_by_name(key: str) -> None:
    value = {"unit": '"x.service"', "health_url": '"http://127.0.0.1:1/h"', "gpus": "[0]"}[key]
    with pytest.raises(ConfigError, match=rf"backends\.night\.{key}: a backend with instances has no {key}"):
        parse(TWO + f"{key} = {value}\n", "/t.toml")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (TWO + "min_ready = 3\n", r"backends\.night\.min_ready: expected a value <= 2"),
        (TWO + "min_ready = 0\n", r"backends\.night\.min_ready: expected a value >= 1"),
        (DAY + "min_ready = 1\n", r"backends\.day\.min_ready: only a backend with instances"),
        ("[backends.n]\ninstances = []\n", r"backends\.n\.instances: expected a non-empty list"),
        ('[backends.n]\ninstances = ["a.service"]\n', r"backends\.n\.instances: expected a non-empty list"),
        (
            '[backends.n]\ninstances = [{ unit = "a.service" }]\n',
            r"backends\.n\.instances\[0\]\.health_url: missing",
        ),
        (
            '[backends.n]\ninstances = [{ health_url = "http://h:1/" }]\n',
            r"backends\.n\.instances\[0\]\.unit: missing",
        ),
        (
            '[backends.n]\ninstances = [{ unit = "a@.service", health_url = "http://h:1/" }]\n',
            r"instances\[0\]\.unit: 'a@.service': a template",
        ),
        (
            '[backends.n]\ninstances = [{ unit = "a.service", health_url = "http://h:1/", port = 1 }]\n',
            r"instances\[0\]\.port: unknown key",
        ),
        (
            '[backends.n]\ninstances = [{ unit = "a.service", health_url = "http://h:1/", gpus = [0, 0] }]\n',
            r"instances\[0\]\.gpus: a GPU is listed twice",
        ),
        (
            '[backends.n]\ninstances = [{ unit = "a.service", health_url = "http://h:1/" },'
            ' { unit = "a.service", health_url = "http://h:2/" }]\n',
            r"instances\[1\]\.unit: 'a.service' is already the unit of another instance",
        ),
        (
            TWO + '[backends.other]\nunit = "gpushift-llama@1.service"\nhealth_url = "http://h:3/"\n',
            r"backends\.other\.unit: 'gpushift-llama@1.service' is already the unit of backend 'night'",
        ),
    ],
)
def test_bad_instances_are_refused_naming_the_key(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse(text, "/t.toml")


def test_an_instance_unit_names_its_backend() -> None:
    cfg = parse(TWO + DAY, "/t.toml")
    assert cfg.backend_for_unit("gpushift-llama@1.service") == "night"
    assert cfg.backend_for_unit("day.service") == "day"
    assert cfg.backend_for_unit("other.service") is None
