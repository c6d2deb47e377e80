"""The warm-up request — proof that a backend serves, not only that its health URL answers.

A server can answer ``/health`` 200 while its first request fails or hangs, so after readiness a
switch sends one small inference request and is ``ok`` only when it is answered.  The kinds'
defaults (each kind's module says its own: ``warmup``, ``warmup_body``) ask for a few tokens,
streamed, so the time to the first token can be told apart from the whole answer:

* vLLM: ``POST /v1/completions`` ``{"model": <the served model, from /v1/models>, "prompt": ...,
  "max_tokens": 4, "stream": true}`` (vLLM's OpenAI-compatible server);
* llama-server: ``POST /completion`` ``{"prompt": ..., "n_predict": 4, "stream": true}``.

A backend started with an API key gets it from where the backend itself reads it: ``--api-key``
on its command line, else the environment variable its server reads (the kind's ``api_key_env``:
vLLM ``VLLM_API_KEY``, llama-server ``LLAMA_API_KEY``), sent as ``Authorization: Bearer``.  The
key lives in the request's headers only: it is never logged or recorded.

Pure: everything comes in as values (the backend's config, its argv, its unit's environment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpushift.backends import cmdline
from gpushift.backends.kind import WarmupConfig
from gpushift.backends.kinds import kind_of
from gpushift.values import WarmupRequest


class WarmedBackend(Protocol):
    """What the warm-up reads of a backend's config (:class:`gpushift.config.schema.BackendConfig`)."""

    @property
    def kind(self) -> str: ...

    @property
    def health_url(self) -> str: ...

    @property
    def warmup(self) -> WarmupConfig | None: ...


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def api_key(kind: str, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the backend requires, as it reads it itself (the command line wins)."""
    key = cmdline.parse(argv, kind).value(("--api-key",))
    if key:
        return key
    var = kind_of(kind).api_key_env
    return env.get(var) or None if var else None


def default_body(kind: str) -> dict[str, Any] | None:
    """The body of the kind's warm-up request (None: it has none, the config gives one)."""
    body = kind_of(kind).warmup_body
    return dict(body) if body is not None else None


def request_for(b: WarmedBackend, argv: Sequence[str], env: Mapping[str, str]) -> WarmupRequest | None:
    """The warm-up request for backend ``b`` (None: it has none), its argv as it runs."""
    w = b.warmup
    if w is None:
        return None
    origin = _origin(b.health_url)
    body = dict(w.body) if w.body is not None else default_body(b.kind)
    if body is None:  # a kind without a default body: the config refuses a warm-up without one
        return None
    needs_model = w.body is None and kind_of(b.kind).warmup_needs_model
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


def models_query(b: WarmedBackend, argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The URL of the backend's ``/v1/models`` (on its health URL's origin) and the headers it
    needs (its API key, as the warm-up sends it)."""
    key = api_key(b.kind, argv, env)
    return _origin(b.health_url) + "/v1/models", ({"Authorization": f"Bearer {key}"} if key else {})
