"""Proof of inference after ready: the warm-up request (gpushift/backends/warmup.py) and its place in a switch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpushift.backends import warmup
from gpushift.config.schema import BackendConfig, WarmupConfig, parse
from gpushift.errors import ConfigError
from gpushift.values import BackendKind, Outcome, Phase, WarmupResult

VLLM = BackendConfig(
    "vllm",
    "v.service",
    "http://127.0.0.1:8000/health",
    kind=BackendKind.VLLM,
    warmup=WarmupConfig("/v1/completions"),
)
LLAMA = BackendConfig(
    "llama",
    "l.service",
    "http://127.0.0.1:8080/health",
    kind=BackendKind.LLAMA_SERVER,
    warmup=WarmupConfig("/completion"),
)


def test_warmup_kind_defaults_stream_a_few_tokens() -> None:
    v = warmup.request_for(VLLM, ["vllm", "serve", "/m/q"], {})
    assert v is not None and v.url == "http://127.0.0.1:8000/v1/completions" and v.stream
    assert v.models_url == "http://127.0.0.1:8000/v1/models" and v.body["max_tokens"] == 4
    lr = warmup.request_for(LLAMA, ["llama-server", "-m", "/m/q.gguf"], {})
    assert (
        lr is not None
        and lr.url.endswith("/completion")
        and lr.body["n_predict"] == 4
        and lr.models_url is None
    )


def test_warmup_takes_the_api_key_where_the_backend_reads_it() -> None:
    on_argv = warmup.request_for(
        VLLM, ["vllm", "serve", "m", "--api-key", "s3cret"], {"VLLM_API_KEY": "other"}
    )
    assert on_argv is not None and on_argv.headers["Authorization"] == "Bearer s3cret"
    from_env = warmup.request_for(LLAMA, ["llama-server"], {"LLAMA_API_KEY": "k2"})
    assert from_env is not None and from_env.headers["Authorization"] == "Bearer k2"
    assert "Authorization" not in (warmup.request_for(LLAMA, ["llama-server"], {}) or from_env).headers


def config_with(extra: str, kind: str = "generic") -> Any:
    return parse(
        f'[backends.b]\nunit = "b.service"\nkind = "{kind}"\nhealth_url = "http://127.0.0.1:1/health"\n{extra}\n',
        "/t.toml",
    ).backends["b"]


def test_warmup_config_forms() -> None:
    assert config_with("", "vllm").warmup == WarmupConfig("/v1/completions")
    assert config_with("warmup = false", "vllm").warmup is None
    assert config_with("").warmup is None  # generic: none by default
    custom = config_with('warmup = { path = "/v1/chat", body = { prompt = "hi" }, timeout_s = 5 }')
    assert custom.warmup == WarmupConfig("/v1/chat", {"prompt": "hi"}, 200, 5)
    with pytest.raises(ConfigError, match="no default warm-up"):
        config_with("warmup = true")  # generic has no default request
    with pytest.raises(ConfigError, match="warmup.path"):
        config_with('warmup = { path = "v1", body = {} }')


def with_warmup(world: Any) -> Any:
    b = world.config.backends["night"]
    night = replace(b, warmup=WarmupConfig("/v1/completions", {"prompt": "x", "stream": True}))
    world.switcher.reconfigure(replace(world.config, backends={**world.config.backends, "night": night}))
    return night


def test_switch_is_ok_only_after_the_warmup_answers_and_records_it(world: Any) -> None:
    with_warmup(world)
    res = world.switch("night")
    assert res.ok, res
    rec = world.record(res)
    w = rec.extra["warmup"]
    assert w["ok"] and 0 < w["ttft_s"] <= w["total_s"] and w["path"] == "/v1/completions"
    # after the health URL answered, before the version and the row's end
    assert world.log.first("probe.warmup") > world.log.last("probe.health")
    assert Phase.WARMUP.value in world.phases(res.ticket)


def test_switch_whose_warmup_fails_is_a_failed_start_and_rolls_back(world: Any) -> None:
    with_warmup(world)
    world.probe.warmup_results["http://127.0.0.1:18080/v1/completions"] = WarmupResult(False, 500, "HTTP 500")
    res = world.switch("night")
    assert res.ok is False and res.outcome == Outcome.ROLLED_BACK.value
    assert res.failed_phase == Phase.WARMUP.value and "not a request" in res.message
    assert world.running() == ["day"]
