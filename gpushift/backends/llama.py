"""The ``llama-server`` kind: llama.cpp's HTTP server.

What gpushift knows about it: ``/props`` (its ``build_info`` is the version) and ``/slots`` (per
slot, whether it is processing a request: what the drain waits on; a ``metrics_url`` on its
``/metrics``, served with ``--metrics``, is read by the gauges ``llamacpp:requests_processing`` and
``llamacpp:requests_deferred``), the warm-up ``POST /completion``, the API key in
``LLAMA_API_KEY``, the model files to pre-warm (the model, draft model, projector and LoRA files),
and the doctor's rules: ``--split-mode none`` on several GPUs, and the model files must exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpushift.backends import cmdline, gauges
from gpushift.backends.kind import WARMUP_PROMPT, WARMUP_TOKENS, Kind, WarmupConfig
from gpushift.backends.rules import SPLIT_MODE_NONE, WARNING, Finding, KindRules, Launch

NAME = "llama-server"
DEFAULT_PORT = 8080

#: The Prometheus gauges of /metrics (with --metrics) that count requests served or deferred.
IN_FLIGHT_GAUGES = ("llamacpp:requests_processing", "llamacpp:requests_deferred")

_SPLIT = ("-sm", "--split-mode")
_ALIAS = ("-a", "--alias")
_MODEL = ("-m", "--model")

#: Its own inference routes the front door forwards (llama.cpp's server README, "API Endpoints":
#: https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md); not ``/slots`` (it can save and restore a slot's cache to files), ``/props`` (it
#: can change the server's settings), ``/metrics`` nor ``/lora-adapters``.
NATIVE_ROUTES = (
    "/completion",
    "/completions",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/embedding",
    "/embeddings",
    "/reranking",
    "/rerank",
    "/infill",
)


def launch_rules(launch: Launch) -> list[Finding]:
    """``--split-mode none`` leaves every GPU but the main one idle."""
    split = (cmdline.parse(launch.args, NAME).value(_SPLIT) or "").lower()
    have = launch.gpu_count
    if split != "none" or launch.facts.error is not None or have <= 1:
        return []
    return [
        Finding(
            WARNING,
            SPLIT_MODE_NONE,
            launch.name,
            f"--split-mode none on {have} GPUs: llama-server uses only the main GPU and the others stay idle",
            "use --split-mode layer (the default) to spread the layers over every GPU, or give the "
            "backend only one GPU",
        )
    ]


def model_paths(args: Sequence[str]) -> list[str]:
    """The model, draft model, projector and LoRA files."""
    return [v for v in cmdline.parse(args, NAME).values(cmdline.MODEL_FILE_FLAGS) if v]


def prewarm_paths(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The files it reads at start: the same model files."""
    return model_paths(args)


def served_models(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """``--alias`` (a comma-separated list), else the model file as given to ``-m``: what
    llama-server's ``/v1/models`` lists as ``id`` ("By default, model `id` field is the path to
    model file, specified via `-m`", tools/server/README.md of ggml-org/llama.cpp).  A flag wins
    over its variable (``LLAMA_ARG_ALIAS``, ``LLAMA_ARG_MODEL``), as in llama.cpp."""
    cl = cmdline.parse(args, NAME)
    alias = cl.value(_ALIAS) or env.get("LLAMA_ARG_ALIAS", "")
    names = [a.strip() for a in alias.split(",") if a.strip()]
    if names:
        return tuple(dict.fromkeys(names))
    model = cl.value(_MODEL) or env.get("LLAMA_ARG_MODEL", "")
    return (model,) if model else ()


def in_flight(text: str) -> int | None:
    """``/slots`` (a JSON list), or the gauges of ``/metrics``."""
    if text.lstrip().startswith("["):
        return gauges.processing_slots(text)
    return gauges.prometheus_sum(text, IN_FLIGHT_GAUGES)


KIND = Kind(
    name=NAME,
    prewarm_paths=prewarm_paths,
    version_path="/props",
    metrics_path="/slots",
    in_flight=in_flight,
    warmup=WarmupConfig("/completion"),
    warmup_body={"prompt": WARMUP_PROMPT, "n_predict": WARMUP_TOKENS, "stream": True},
    api_key_env="LLAMA_API_KEY",
    doctor=KindRules(DEFAULT_PORT, launch_rules, model_paths),
    native_routes=NATIVE_ROUTES,
    served_models=served_models,
)
