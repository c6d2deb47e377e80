"""The warm-up request — proof that a backend serves, not only that its health URL answers.

A server can answer ``/health`` 200 while its first request fails or hangs, so after readiness a
switch sends one small inference request and is ``ok`` only when it is answered.  The kinds'
defaults ask for a few tokens, streamed, so the time to the first token can be told apart from the
whole answer:

* vLLM: ``POST /v1/completions`` ``{"model": <the served model, from /v1/models>, "prompt": ...,
  "max_tokens": 4, "stream": true}`` (vLLM's OpenAI-compatible server);
* llama-server: ``POST /completion`` ``{"prompt": ..., "n_predict": 4, "stream": true}``.

A backend started with an API key gets it from where the backend itself reads it: ``--api-key``
on its command line, else the environment variable its server reads (vLLM ``VLLM_API_KEY``,
llama-server ``LLAMA_API_KEY``), sent as ``Authorization: Bearer``.  The key lives in the request's
headers only: it is never logged or recorded.

Pure: everything comes in as values (the backend's config, its argv, its unit's environment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushift.backends import cmdline
from gpushift.config.schema import BackendConfig
from gpushift.values import BackendKind, WarmupRequest

PROMPT = "Hello"
TOKENS = 4

#: The environment variable each kind's server reads its API key from.
API_KEY_ENV = {BackendKind.VLLM: "VLLM_API_KEY", BackendKind.LLAMA_SERVER: "LLAMA_API_KEY"}


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def api_key(kind: BackendKind, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the backend requires, as it reads it itself (the command line wins)."""
    key = cmdline.parse(argv, kind).value(("--api-key",))
    if key:
        return key
    var = API_KEY_ENV.get(kind)
    return env.get(var) or None if var else None


def default_body(kind: BackendKind) -> dict[str, Any]:
    if kind is BackendKind.VLLM:
        return {"prompt": PROMPT, "max_tokens": TOKENS, "stream": True, "temperature": 0}
    return {"prompt": PROMPT, "n_predict": TOKENS, "stream": True}


def request_for(b: BackendConfig, argv: Sequence[str], env: Mapping[str, str]) -> WarmupRequest | None:
    """The warm-up request for backend ``b`` (None: it has none), its argv as it runs."""
    w = b.warmup
    if w is None:
        return None
    origin = _origin(b.health_url)
    body = dict(w.body) if w.body is not None else default_body(b.kind)
    needs_model = w.body is None and b.kind is BackendKind.VLLM
    headers = {"Content-Type": "application/json"}
    key = api_key(b.kind, argv, env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return WarmupRequest(
        url=origin + w.path,
        body=body,
        stream=body.get("stream") is True,
        expect_status=w.expect_status,
        timeout_s=w.timeout_s,
        models_url=origin + "/v1/models" if needs_model else None,
        headers=headers,
    )
