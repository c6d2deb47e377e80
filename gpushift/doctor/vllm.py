"""The doctor's rules for ``kind = "vllm"``: FP8 and BF16 against the GPUs' compute capability,
tensor x pipeline parallelism against the GPU count, the model paths, and ``TimeoutStopSec=``
against ``--shutdown-timeout``.

From the field reports of a 2xV100 host: vLLM refusing FP8 on sm_70 ("FP8 is not supported on this
GPU (sm_70). Please use a GPU with compute capability 8.9"), BF16 emulated on Volta.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpushift.backends import cmdline
from gpushift.doctor.findings import (
    BF16_EMULATED,
    ERROR,
    FP8_UNSUPPORTED,
    TENSOR_PARALLEL_TOO_LARGE,
    UNIT_TIMEOUT_STOP_SHORT,
    WARNING,
    CheckpointFacts,
    Finding,
    Launch,
)
from gpushift.doctor.gpus import cc_text, gpu_count, names, oldest
from gpushift.values import GpuInfo

KIND = "vllm"
DEFAULT_PORT = 8000

#: FP8 GEMM kernels need Ada (sm_89) or Hopper (sm_90) and newer.
FP8_MIN_CC = (8, 9)
#: Native BF16 arrived with Ampere (sm_80); below it BF16 is emulated.
BF16_MIN_CC = (8, 0)

_TOKENIZER = ("--tokenizer",)
_QUANT = ("--quantization", "-q")
_DTYPE = ("--dtype",)
_TP = ("--tensor-parallel-size", "-tp")
_PP = ("--pipeline-parallel-size", "-pp")
_SHUTDOWN = ("--shutdown-timeout",)


def launch_rules(launch: Launch) -> list[Finding]:
    """FP8, BF16 and parallelism against the GPUs the backend runs on."""
    cl = cmdline.parse(launch.args, KIND)
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
    have = gpu_count(launch.backend, launch.env, launch.facts)
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


def _looks_like_path(value: str) -> bool:
    # vLLM also takes Hugging Face ids ("Qwen/Qwen2.5-7B-Instruct"): only names that are plainly
    # filesystem paths are checked.
    return value.startswith(("/", "./", "../", "~"))


def model_paths(args: Sequence[str]) -> list[str]:
    """The model and tokenizer, where they are filesystem paths (not Hugging Face ids)."""
    candidates = [cmdline.vllm_model(args), cmdline.parse(args, KIND).value(_TOKENIZER)]
    return [c for c in candidates if c and _looks_like_path(c)]


def stop_rules(name: str, args: Sequence[str], timeout_stop_usec: int) -> list[Finding]:
    """A finite ``TimeoutStopSec=`` must leave vLLM its ``--shutdown-timeout`` to drain."""
    drain = cmdline.parse(args, KIND).value(_SHUTDOWN)
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
