"""The ``vllm`` kind: vLLM's OpenAI-compatible server (``vllm serve MODEL``,
``python -m vllm.entrypoints.openai.api_server --model MODEL``).

What gpushift knows about it: ``/version`` and ``/metrics`` on the health URL's host (the drain
waits on the gauges ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``), the warm-up
``POST /v1/completions`` naming the served model (from ``/v1/models``), the API key in
``VLLM_API_KEY``, the model to pre-warm (a directory, or a Hugging Face id's snapshot in the hub
cache), and the doctor's rules: FP8 and BF16 against the GPUs' compute capability, tensor x
pipeline parallelism against the GPU count, the model paths, and ``TimeoutStopSec=`` against
``--shutdown-timeout``.

From the field reports of a 2xV100 host: vLLM refusing FP8 on sm_70 ("FP8 is not supported on this
GPU (sm_70). Please use a GPU with compute capability 8.9"), BF16 emulated on Volta.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import partial

from gpushift.backends import cmdline, gauges
from gpushift.backends.kind import WARMUP_PROMPT, WARMUP_TOKENS, Kind, WarmupConfig
from gpushift.backends.rules import (
    BF16_EMULATED,
    ERROR,
    FP8_UNSUPPORTED,
    TENSOR_PARALLEL_TOO_LARGE,
    UNIT_TIMEOUT_STOP_SHORT,
    WARNING,
    CheckpointFacts,
    Finding,
    KindRules,
    Launch,
    cc_text,
    names,
    oldest,
)
from gpushift.values import GpuInfo

NAME = "vllm"
DEFAULT_PORT = 8000

#: FP8 GEMM kernels need Ada (sm_89) or Hopper (sm_90) and newer.
FP8_MIN_CC = (8, 9)
#: Native BF16 arrived with Ampere (sm_80); below it BF16 is emulated.
BF16_MIN_CC = (8, 0)

#: The Prometheus gauges of /metrics that count requests still being served or queued.
IN_FLIGHT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")

_TOKENIZER = ("--tokenizer",)
_QUANT = ("--quantization", "-q")
_DTYPE = ("--dtype",)
_TP = ("--tensor-parallel-size", "-tp")
_PP = ("--pipeline-parallel-size", "-pp")
_SHUTDOWN = ("--shutdown-timeout",)


def launch_rules(launch: Launch) -> list[Finding]:
    """FP8, BF16 and parallelism against the GPUs the backend runs on."""
    cl = cmdline.parse(launch.args, NAME)
    oldest_gpu = oldest(launch.gpus) if launch.facts.error is None else None
    out: list[Finding] = []
    if oldest_gpu is not None and oldest_gpu.compute_capability is not None:
        model = cmdline.vllm_model(launch.args) or ""
        quant = (cl.value(_QUANT) or "").lower()
        if oldest_gpu.compute_capability < FP8_MIN_CC:
            out.extend(_fp8_rule(launch.name, oldest_gpu, quant, model, launch.checkpoint))
        dtype = (cl.value(_DTYPE) or "auto").lower()
        if oldest_gpu.compute_capability < BF16_MIN_CC:
            out.extend(_bf16_rule(launch.name, oldest_gpu, dtype, launch.checkpoint))
    out.extend(_parallel_rule(launch, cl.value(_TP), cl.value(_PP)))
    return out


def _is_fp8_name(model: str) -> bool:
    # Checkpoints name their format: "DeepSeek-R1-Distill-Qwen-7B-FP8", "Llama-3.1-8B-Instruct-FP8-dynamic".
    return re.search(r"(^|[^a-z0-9])fp8([^a-z0-9]|$)", model.lower()) is not None


def _fp8_rule(
    name: str, gpu: GpuInfo, quant: str, model: str, checkpoint: CheckpointFacts | None
) -> list[Finding]:
    assert gpu.compute_capability is not None
    why = None
    if "fp8" in quant:
        why = f"--quantization {quant}"
    elif (
        not quant and checkpoint is not None and checkpoint.quant_method and "fp8" in checkpoint.quant_method
    ):
        why = f"the checkpoint {model or '(model)'} is quantized with {checkpoint.quant_method}"
    elif not quant and model and _is_fp8_name(model):
        why = f"the checkpoint {model} is an FP8 checkpoint (by its name)"
    if not why:
        return []
    cc = gpu.compute_capability
    return [
        Finding(
            ERROR,
            FP8_UNSUPPORTED,
            name,
            f"{why}: {gpu.name} (GPU {gpu.index}, sm_{cc[0]}{cc[1]}, compute capability {cc_text(cc)}) has no "
            f"FP8 support; FP8 needs compute capability {cc_text(FP8_MIN_CC)} (Ada, Hopper). vLLM stops "
            f'with "FP8 is not supported on this GPU" or silently dequantizes to FP16 with no gain',
            "serve FP16 weights (an FP16 checkpoint, --dtype float16) and save memory with "
            "--kv-cache-dtype fp8_e5m2, which needs no FP8 hardware",
        )
    ]


def _bf16_rule(name: str, gpu: GpuInfo, dtype: str, checkpoint: CheckpointFacts | None) -> list[Finding]:
    assert gpu.compute_capability is not None
    bf16 = None
    if dtype in ("bfloat16", "bf16"):
        bf16 = f"--dtype {dtype}"
    elif dtype == "auto" and checkpoint is not None and checkpoint.torch_dtype == "bfloat16":
        bf16 = "--dtype auto with a BF16 checkpoint"
    if not bf16:
        return []
    return [
        Finding(
            WARNING,
            BF16_EMULATED,
            name,
            f"{bf16} on {gpu.name} (GPU {gpu.index}, compute capability {cc_text(gpu.compute_capability)}): "
            f"BF16 has no native support below compute capability {cc_text(BF16_MIN_CC)}; it is emulated "
            "and slow, and some vLLM releases refuse it",
            "use --dtype float16",
        )
    ]


def _parallel_rule(launch: Launch, tp_s: str | None, pp_s: str | None) -> list[Finding]:
    if launch.facts.error is not None or not (tp_s or pp_s):
        return []
    tp = int(tp_s) if tp_s and tp_s.isdigit() else 1
    pp = int(pp_s) if pp_s and pp_s.isdigit() else 1
    have = launch.gpu_count
    if tp * pp <= have:
        return []
    asked = f"--tensor-parallel-size {tp}" + (f" x --pipeline-parallel-size {pp}" if pp > 1 else "")
    return [
        Finding(
            ERROR,
            TENSOR_PARALLEL_TOO_LARGE,
            launch.name,
            f"{asked} needs {tp * pp} GPUs, but the backend has {have}"
            + (f" ({names(launch.gpus)})" if launch.gpus else ""),
            f"lower --tensor-parallel-size to at most {have}, or give the backend more GPUs "
            "(gpus = [...] in the config, CUDA_VISIBLE_DEVICES in the unit)",
        )
    ]


def model_paths(args: Sequence[str]) -> list[str]:
    """The model and tokenizer the doctor checks, where they are filesystem paths (not Hugging Face ids)."""
    # vLLM also takes Hugging Face ids ("Qwen/Qwen2.5-7B-Instruct"): only names that are plainly
    # filesystem paths are checked.
    candidates = [cmdline.vllm_model(args), cmdline.parse(args, NAME).value(_TOKENIZER)]
    return [c for c in candidates if c and _looks_local(c)]


def stop_rules(name: str, args: Sequence[str], timeout_stop_usec: int) -> list[Finding]:
    """A finite ``TimeoutStopSec=`` must leave vLLM its ``--shutdown-timeout`` to drain."""
    drain = cmdline.parse(args, NAME).value(_SHUTDOWN)
    if not (drain and drain.isdigit() and timeout_stop_usec <= int(drain) * 1_000_000):
        return []
    return [
        Finding(
            WARNING,
            UNIT_TIMEOUT_STOP_SHORT,
            name,
            f"TimeoutStopSec ({timeout_stop_usec / 1e6:g} s) does not exceed --shutdown-timeout "
            f"{drain}: systemd kills vLLM before it has drained",
            f"set TimeoutStopSec= above {drain} s",
        )
    ]


def _looks_local(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~"))


def hf_cache_dir(model_id: str, env: Mapping[str, str]) -> str:
    """Where the Hugging Face hub keeps ``org/name``: ``$HF_HUB_CACHE``, ``$HF_HOME/hub``, or
    ``~/.cache/huggingface/hub``, then ``models--org--name/snapshots``."""
    if env.get("HF_HUB_CACHE"):
        base = env["HF_HUB_CACHE"]
    elif env.get("HF_HOME"):
        base = env["HF_HOME"].rstrip("/") + "/hub"
    else:
        base = env.get("HOME", "/root").rstrip("/") + "/.cache/huggingface/hub"
    return f"{base}/models--{model_id.replace('/', '--')}/snapshots"


def prewarm_paths(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The model vLLM loads: its directory, or a Hugging Face id's snapshots in the hub cache."""
    model = cmdline.vllm_model(args)
    if not model:
        return []
    return [model] if _looks_local(model) else [hf_cache_dir(model, env)]


def served_models(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """``--served-model-name`` (one or more names; the last occurrence), else the model as given
    (``--model`` or ``serve MODEL``): what vLLM's ``/v1/models`` lists as ``id``."""
    names = cmdline.parse(args, NAME).group(("--served-model-name",))
    if names:
        return tuple(dict.fromkeys(names))
    model = cmdline.vllm_model(args)
    return (model,) if model else ()


def checkpoint_dir(args: Sequence[str]) -> str | None:
    """The model directory whose ``config.json`` tells its dtype and quantization."""
    return cmdline.vllm_model(args)


#: Its own inference routes beside ``/v1/...`` the front door forwards (vLLM's "OpenAI-Compatible
#: Server" page, https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html: the tokenizer,
#: pooling, classification, score and re-rank APIs); not ``/metrics``,
#: ``/version``, nor the development routes.
NATIVE_ROUTES = ("/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank")


KIND = Kind(
    name=NAME,
    prewarm_paths=prewarm_paths,
    version_path="/version",
    metrics_path="/metrics",
    in_flight=partial(gauges.prometheus_sum, names=IN_FLIGHT_GAUGES),
    warmup=WarmupConfig("/v1/completions"),
    warmup_body={"prompt": WARMUP_PROMPT, "max_tokens": WARMUP_TOKENS, "stream": True, "temperature": 0},
    warmup_needs_model=True,
    api_key_env="VLLM_API_KEY",
    checkpoint_dir=checkpoint_dir,
    doctor=KindRules(DEFAULT_PORT, launch_rules, model_paths, stop_rules),
    native_routes=NATIVE_ROUTES,
    served_models=served_models,
)
