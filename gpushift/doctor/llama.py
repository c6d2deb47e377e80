"""The doctor's rules for ``kind = "llama-server"`` (llama.cpp's server): ``--split-mode none``
on several GPUs, and the model files its command line names."""

from __future__ import annotations

from collections.abc import Sequence

from gpushift.backends import cmdline
from gpushift.doctor.findings import SPLIT_MODE_NONE, WARNING, Finding, Launch
from gpushift.doctor.gpus import gpu_count

KIND = "llama-server"
DEFAULT_PORT = 8080

_SPLIT = ("-sm", "--split-mode")


def launch_rules(launch: Launch) -> list[Finding]:
    """``--split-mode none`` leaves every GPU but the main one idle."""
    split = (cmdline.parse(launch.args, KIND).value(_SPLIT) or "").lower()
    have = gpu_count(launch.backend, launch.env, launch.facts)
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
    return [v for v in cmdline.parse(args, KIND).values(cmdline.MODEL_FILE_FLAGS) if v]
