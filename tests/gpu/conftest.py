"""Fixtures of the GPU tests (``make test-gpu``): a real NVML, real CUDA processes.

These tests need an NVIDIA GPU, its driver, nvidia-ml-py and a Python with CUDA-enabled torch.
Where there is no GPU they are skipped — the one place in gpushift's tests where skipping is
allowed; ``make test`` never runs them.  See README.md beside this file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from gpushift.host.nvml import NvmlGpuProbe
from gpushift.values import GateState, GpuInfo

#: The residual the gate uses by default (config ``gpu.residual_mib``).
RESIDUAL_MIB = 256.0


@pytest.fixture(scope="session")
def probe() -> Iterator[NvmlGpuProbe]:
    """The real NVML provider; skips every GPU test where NVML finds no GPU."""
    p = NvmlGpuProbe()
    facts = p.facts()
    if facts.error is not None or not facts.gpus:
        pytest.skip(f"no NVIDIA GPU usable here: {facts.error or 'NVML sees no GPU'}")
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="session")
def gpu(probe: NvmlGpuProbe) -> GpuInfo:
    """The GPU under test: ``$GPUSHIFT_TEST_GPU`` (NVML index), default 0."""
    index = int(os.environ.get("GPUSHIFT_TEST_GPU", "0"))
    gpus = {g.index: g for g in probe.facts().gpus}
    if index not in gpus:
        raise AssertionError(f"GPUSHIFT_TEST_GPU={index}, but NVML sees GPUs {sorted(gpus)}")
    return gpus[index]


@pytest.fixture(scope="session")
def torch_python() -> str:
    """A Python that can import torch (this one, or ``$GPUSHIFT_TEST_TORCH_PYTHON``)."""
    explicit = os.environ.get("GPUSHIFT_TEST_TORCH_PYTHON")
    if explicit:
        return explicit
    if importlib.util.find_spec("torch") is None:
        raise AssertionError(
            "torch is not importable by this Python; install torch with CUDA or set "
            "GPUSHIFT_TEST_TORCH_PYTHON to a Python that has it"
        )
    return sys.executable


@pytest.fixture
def idle_gpu(probe: NvmlGpuProbe, gpu: GpuInfo) -> GpuInfo:
    """The GPU under test, checked to be released before the test starts."""
    r = probe.read([gpu.index])[0]
    state = r.state(RESIDUAL_MIB)
    if state is not GateState.RELEASED:
        holders = ", ".join(h.describe() for h in r.holders) or "nobody named"
        raise AssertionError(
            f"GPU {gpu.index} is not idle before the test ({state.value}, used {r.used_mib} MiB, "
            f"error {r.error}, holders: {holders}); stop what uses it or pick another with GPUSHIFT_TEST_GPU"
        )
    return gpu


class CudaProcesses:
    """Starts CUDA processes pinned to one GPU and ends every one of them (by PID) afterwards."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.started: list[subprocess.Popen[str]] = []
        self.extra_pids: list[int] = []

    def start(self, script: str, gpu: GpuInfo, args: Sequence[str] = ()) -> subprocess.Popen[str]:
        env = dict(os.environ)
        # Pin by UUID: CUDA's device order can differ from NVML's index order.
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
        p = subprocess.Popen(
            [self.python, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.started.append(p)
        return p

    def adopt(self, pid: int) -> None:
        self.extra_pids.append(pid)

    @staticmethod
    def readline(p: subprocess.Popen[str]) -> str:
        """The next line the process prints; fails with its stderr when it exits instead."""
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            p.wait(timeout=30)
            err = p.stderr.read() if p.stderr else ""
            raise AssertionError(f"CUDA process exited with {p.returncode}: {err[-2000:]}")
        return line.strip()

    @staticmethod
    def wait_until(cond: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if cond():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval_s)

    def stop_all(self) -> None:
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.started:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def cuda_procs(torch_python: str) -> Iterator[CudaProcesses]:
    ps = CudaProcesses(torch_python)
    try:
        yield ps
    finally:
        ps.stop_all()
