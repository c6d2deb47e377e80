"""The table of backend kinds (gpushift/backends/kinds.py): every part of gpushift that depends on a
kind asks it, so a kind added to it (one module, one line) is accepted by the config and brings its
endpoints, warm-up, drain probe and model files; the built-in kinds agree with ``BackendKind``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from gpushift.backends import kinds, probe, warmup
from gpushift.backends.kind import Kind, WarmupConfig
from gpushift.config.schema import BACKEND_KINDS, parse
from gpushift.errors import ConfigError
from gpushift.prewarm import plan
from gpushift.values import BackendKind

VLLM_METRICS = "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n"
SLOTS = json.dumps([{"is_processing": True}, {"is_processing": False}, {"is_processing": True}])


def test_every_backend_kind_names_a_row_of_the_table_and_the_config_lists_them_in_order() -> None:
    for member in BackendKind:
        assert kinds.kind_of(member).name == member.value
    # The built-in kinds first, in the order the config's message lists them (a new kind follows).
    assert tuple(kinds.KINDS) == BACKEND_KINDS and BACKEND_KINDS[:3] == ("generic", "vllm", "llama-server")
    assert kinds.DEFAULT == BackendKind.GENERIC
    assert all(name == k.name for name, k in kinds.KINDS.items())


def test_each_kind_reads_its_own_metrics_page_and_generic_reads_any() -> None:
    vllm, llama, generic = (kinds.kind_of(k) for k in ("vllm", "llama-server", "generic"))
    assert vllm.in_flight is not None and llama.in_flight is not None and generic.in_flight is None
    assert vllm.in_flight(VLLM_METRICS) == 3 and vllm.in_flight(SLOTS) is None
    assert llama.in_flight(SLOTS) == 2 and llama.in_flight("llamacpp:requests_processing 4\n") == 4
    assert llama.in_flight(VLLM_METRICS) is None
    assert kinds.any_in_flight(VLLM_METRICS) == 3 and kinds.any_in_flight(SLOTS) == 2
    assert kinds.any_in_flight("other 1\n") is None


def _demo_prewarm(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    return [a for a in args if a.endswith(".weights")]


DEMO = Kind(
    name="demo",
    prewarm_paths=_demo_prewarm,
    version_path="/about",
    metrics_path="/load",
    in_flight=lambda text: int(text) if text.strip().isdigit() else None,
    warmup=WarmupConfig("/generate"),
    warmup_body={"input": "hi", "stream": True},
    api_key_env="DEMO_KEY",
)


def test_a_kind_added_to_the_table_brings_everything_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kinds.KINDS, "demo", DEMO)
    b = parse(
        '[backends.d]\nunit = "d.service"\nkind = "demo"\nhealth_url = "http://127.0.0.1:7000/health"\n'
    ).backends["d"]
    # The config: accepted, with the kind's endpoints and warm-up where it names none.
    assert b.kind == "demo" and b.warmup == WarmupConfig("/generate")
    assert b.version_url == "http://127.0.0.1:7000/about" and b.metrics_url == "http://127.0.0.1:7000/load"
    # The warm-up: its body, its API key variable, no model asked of /v1/models.
    req = warmup.request_for(b, ["demo-server"], {"DEMO_KEY": "k"})
    assert req is not None and req.url == "http://127.0.0.1:7000/generate" and req.stream
    assert req.body == {"input": "hi", "stream": True} and req.models_url is None
    assert req.headers["Authorization"] == "Bearer k"
    # The pre-warm: its model files, the unit's variables expanded.
    assert plan.model_paths(b, ["demo-server", "${W}"], {"W": "/m/x.weights"}) == ["/m/x.weights"]
    # The drain: its page read its way.
    monkeypatch.setattr(probe, "_get", lambda url, timeout_s, *checked: (200, b"5\n"))
    assert probe.HttpBackendProbe().in_flight(b) == 5


def test_a_kind_without_a_warmup_body_needs_one_in_the_config() -> None:
    text = '[backends.g]\nunit = "g.service"\nhealth_url = "http://127.0.0.1:1/health"\n'
    with pytest.raises(ConfigError, match="no default warm-up body"):
        parse(text + 'warmup = { path = "/x" }\n')
    assert warmup.default_body("generic") is None and warmup.default_body("vllm") is not None
