"""GPU tests: the NVML provider on a real GPU with real CUDA processes (``make test-gpu``).

How to run them: README.md beside this file.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import textwrap
import time

import pytest

from gpushift.values import GateState

pytestmark = pytest.mark.gpu

RESIDUAL_MIB = 256.0
HOLD_MIB = 2048

#: A CUDA process that takes ~2 GiB on its (only visible) GPU and waits.
TORCH_HOLDER = textwrap.dedent(
    f"""
    import sys, time, torch
    x = torch.empty({HOLD_MIB} * 1024 * 1024, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("holding", flush=True)
    time.sleep(600)
    """
)

#: The same, but it forks a child that inherits the device files and never touches CUDA; the
#: test then SIGKILLs the parent (vLLM workers outliving a SIGKILLed API server, vllm#55510).
TORCH_FORKER = textwrap.dedent(
    f"""
    import os, sys, time, torch
    x = torch.empty({HOLD_MIB} * 1024 * 1024, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
    """
)


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def test_real_nvml_facts_describe_the_host(probe, gpu):
    f = probe.facts()

    assert f.error is None and f.simulated is False
    assert f.driver_version and re.fullmatch(r"\d+\.\d+(\.\d+)?", f.driver_version)
    assert f.cuda_version and re.fullmatch(r"\d+\.\d", f.cuda_version)
    assert [g.index for g in f.gpus] == list(range(len(f.gpus)))
    assert gpu.uuid.startswith("GPU-") and gpu.name and "SIMULATED" not in gpu.name
    assert gpu.total_mib > 1024
    assert gpu.compute_capability is not None and gpu.compute_capability[0] >= 3
    # A driver of this era has the v2 memory call: no fallback guesswork.
    probe.read([gpu.index])
    assert not probe.uses_v1_fallback


def test_real_nvml_torch_holder_is_named_then_released(probe, idle_gpu, cuda_procs):
    p = cuda_procs.start(TORCH_HOLDER, idle_gpu)
    assert cuda_procs.readline(p) == "holding"

    r = probe.read([idle_gpu.index])[0]

    assert r.state(RESIDUAL_MIB) is GateState.HELD, r
    assert r.used_mib is not None and r.used_mib >= HOLD_MIB
    holder = {h.pid: h for h in r.holders}.get(p.pid)
    assert holder is not None, f"pid {p.pid} not among the holders {r.holders}"
    assert holder.user == _me()
    assert holder.command.startswith("python")
    assert "-c" in holder.cmdline
    assert holder.used_mib is not None and holder.used_mib >= HOLD_MIB

    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)

    assert cuda_procs.wait_until(
        lambda: probe.read([idle_gpu.index])[0].state(RESIDUAL_MIB) is GateState.RELEASED, timeout_s=10
    ), probe.read([idle_gpu.index])[0]
    assert all(h.pid != p.pid for h in probe.read([idle_gpu.index])[0].holders)


def test_real_nvml_child_with_inherited_device_files_keeps_gpu_held(probe, idle_gpu, cuda_procs):
    parent = cuda_procs.start(TORCH_FORKER, idle_gpu)
    child = int(cuda_procs.readline(parent))
    cuda_procs.adopt(child)
    assert probe.read([idle_gpu.index])[0].state(RESIDUAL_MIB) is GateState.HELD

    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)  # reaped: its PID no longer exists

    # Give the driver the time it needs to free a dead process's memory (≈0.1 s measured), then
    # check the memory is still held — by the child — and the dead parent is not named.
    time.sleep(2)
    r = probe.read([idle_gpu.index])[0]
    assert r.state(RESIDUAL_MIB) is GateState.HELD, r
    pids = [h.pid for h in r.holders]
    assert child in pids, f"the child {child} that inherited the device files is not named: {r.holders}"
    assert parent.pid not in pids

    os.kill(child, signal.SIGKILL)
    assert cuda_procs.wait_until(
        lambda: probe.read([idle_gpu.index])[0].state(RESIDUAL_MIB) is GateState.RELEASED, timeout_s=10
    ), probe.read([idle_gpu.index])[0]
