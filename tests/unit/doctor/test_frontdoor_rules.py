"""`gpushift check`'s front door rules (gpushift/doctor/frontdoor.py): ports, the model names
against /v1/models, the socket unit's Listen against [frontdoor] listen."""

from __future__ import annotations

from gpushift.cli import check_frontdoor
from gpushift.config.schema import parse
from gpushift.doctor import frontdoor as rules

CONFIG = """
[daemon]
bus = "session"
[metrics]
listen = "127.0.0.1:9840"
[frontdoor]
listen = ["[::]:8000", "127.0.0.1:9000"]
metrics_listen = "127.0.0.1:9000"
[backends.day]
unit = "day.service"
kind = "vllm"
health_url = "http://127.0.0.1:8001/health"
[backends.night]
unit = "night.service"
health_url = "http://192.168.1.5:8081/health"
"""


def codes(found: list) -> list[tuple[str, str, str]]:
    return [(f.severity, f.code, f.backend) for f in found]


def test_ports_and_exposed_backends() -> None:
    cfg = parse(CONFIG)
    found = rules.port_findings(cfg)
    assert codes(found) == [
        ("error", "frontdoor-port-clash", "frontdoor"),  # 127.0.0.1:9000 is its own metrics_listen
        ("warning", "frontdoor-backend-exposed", "night"),  # 192.168.1.5: reachable around the front door
    ]
    assert "'127.0.0.1:9000'" in found[0].message and "metrics_listen" in found[0].message
    wild = parse(CONFIG.replace('metrics_listen = "127.0.0.1:9000"', 'metrics_listen = ""').replace(
        'listen = "127.0.0.1:9840"', 'listen = "127.0.0.1:8000"'))  # fmt: skip
    assert codes(rules.port_findings(wild))[0] == (
        "error",
        "frontdoor-port-clash",
        "frontdoor",
    )  # [::] takes it


def test_every_instances_address_is_checked_for_exposure() -> None:
    pair = """
[daemon]
bus = "session"
[frontdoor]
listen = ["127.0.0.1:8000"]
[backends.pair]
kind = "llama-server"
instances = [
  { unit = "gpushift-llama@0.service", health_url = "http://127.0.0.1:8081/health", gpus = [0] },
  { unit = "gpushift-llama@1.service", health_url = "http://0.0.0.0:8082/health", gpus = [1] },
]
"""
    found = rules.port_findings(parse(pair))
    assert codes(found) == [("warning", "frontdoor-backend-exposed", "pair")]
    assert "gpushift-llama@1.service" in found[0].message and "0.0.0.0:8082" in found[0].message
    assert rules.port_findings(parse(pair.replace("0.0.0.0:8082", "127.0.0.1:8082"))) == []


def test_model_names_against_v1_models() -> None:
    cfg = parse(CONFIG)
    names = {"day": ("qwen",), "night": ()}
    assert codes(rules.model_findings(cfg, names, {})) == [("warning", "frontdoor-models-unknown", "night")]
    assert rules.model_findings(cfg, names, {"day": (["qwen", "x"], None)})[1:] == []
    found = rules.model_findings(cfg, names, {"day": (["/models/qwen2.5"], None)})
    assert codes(found)[0] == ("warning", "frontdoor-model-mismatch", "day")
    assert "does not list qwen at /v1/models (it lists /models/qwen2.5)" in found[0].message
    found = rules.model_findings(cfg, names, {"day": (None, "HTTP 401")})
    assert codes(found)[0] == ("warning", "frontdoor-models-unreadable", "day")
    assert "HTTP 401" in found[0].message


def test_the_socket_units_listen_against_the_config() -> None:
    cfg = parse(CONFIG)
    same = rules.SocketFacts("loaded", ("127.0.0.1:9000", "[::]:8000"))
    assert rules.socket_findings(cfg, same) == []
    other = rules.SocketFacts("loaded", ("[::]:8000", "[::]:8080"))
    (f,) = rules.socket_findings(cfg, other)
    assert (f.severity, f.code) == ("warning", "frontdoor-socket-listen")
    # names both: what the socket unit listens on, and what the config says
    assert "listens on [::]:8000 [::]:8080 but [frontdoor] listen is [::]:8000 127.0.0.1:9000" in f.message
    assert rules.socket_findings(cfg, rules.SocketFacts("not-found")) == []
    assert rules.socket_findings(cfg, rules.SocketFacts(error="no bus")) == []
    assert rules.socket_findings(cfg, None) == []


def test_no_frontdoor_table_no_findings_and_no_section() -> None:
    cfg = parse(CONFIG.split("[frontdoor]")[0] + CONFIG.split('metrics_listen = "127.0.0.1:9000"')[1])
    assert cfg.frontdoor is None
    assert rules.findings(cfg, {}, {}, None) == []
    assert check_frontdoor.collect(cfg, None, {}) is None
    assert check_frontdoor.render(None) == []
