"""The one interface of a backend kind: everything gpushift knows about one kind of server.

A kind's module (``backends/vllm.py``, ``llama.py``, ``generic.py``) builds one :class:`Kind`;
the table in :mod:`gpushift.backends.kinds` maps the config's ``kind = "..."`` to it, and every
part of gpushift that depends on the kind asks that table: the config reader (the endpoints and
the warm-up a kind brings), the drain (its in-flight gauge), the warm-up (its body and API key),
the pre-warm (its model files) and the doctor (its rules).  A kind is plain values and pure
functions of plain values (an argv, an environment, a page of text): it reads no file and opens
no socket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.backends.rules import KindRules

#: The kinds' warm-up requests ask for a few tokens of this prompt, streamed (docs/config.md).
WARMUP_PROMPT = "Hello"
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class WarmupConfig:
    """The warm-up request after ready: ``body`` None means the kind's default body."""

    path: str
    body: Mapping[str, Any] | None = None
    expect_status: int = 200
    timeout_s: float = 60.0


def no_checkpoint(args: Sequence[str]) -> str | None:
    """For a kind whose command line names no checkpoint directory the doctor reads."""
    return None


def no_models(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """For a kind that cannot tell the model names it serves from its command line."""
    return ()


@dataclass(frozen=True)
class Kind:
    """What gpushift knows about one kind of inference server.

    Attributes:
        name: the config's ``kind`` (``"vllm"``).
        prewarm_paths: the model files or directories a command line (expanded) reads at start,
            given the unit's environment: what the pre-warm reads into the page cache.
        version_path: where on the health URL's host the server reports its version (``/version``),
            when the config names neither a ``version_url`` nor a ``version_command``.
        metrics_path: where it tells the requests it serves (``/metrics``), when the config names no
            ``metrics_url``: the drain waits on it.
        in_flight: the requests running or queued, read from that page's text (None: unknown);
            None for a kind that reads any kind's page (``generic``: a ``metrics_url`` the config
            names may be any server's).
        warmup: the warm-up request sent after ready when the config says nothing (or ``true``);
            None: the kind has none, the config must give one.
        warmup_body: the body of a warm-up request that names none.
        warmup_needs_model: the body names the served model, asked of ``/v1/models`` first.
        api_key_env: the environment variable the server reads its API key from.
        checkpoint_dir: the local model directory whose ``config.json`` the doctor reads.
        doctor: the doctor's rules for the kind; None: only the rules for every backend.
        native_routes: the kind's own inference routes beside the OpenAI ones (``/v1/...``), which
            the front door forwards too (``/completion``, ``/tokenize``, ...): exact paths.  Its
            administrative routes (slots, props, metrics) are left out on purpose.
        served_models: the model names the server answers to (what its ``/v1/models`` lists as
            ``id``), read from a command line (expanded) and the unit's environment; () when the
            command line does not tell (the config's ``models`` then must).
    """

    name: str
    prewarm_paths: Callable[[Sequence[str], Mapping[str, str]], list[str]]
    version_path: str | None = None
    metrics_path: str | None = None
    in_flight: Callable[[str], int | None] | None = None
    warmup: WarmupConfig | None = None
    warmup_body: Mapping[str, Any] | None = None
    warmup_needs_model: bool = False
    api_key_env: str | None = None
    checkpoint_dir: Callable[[Sequence[str]], str | None] = no_checkpoint
    doctor: KindRules | None = None
    native_routes: tuple[str, ...] = ()
    served_models: Callable[[Sequence[str], Mapping[str, str]], tuple[str, ...]] = no_models
