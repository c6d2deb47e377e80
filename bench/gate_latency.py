"""Benchmark (GPU host only): how long after a real GPU's memory is physically released gpushift's VRAM gate
opens (goal: ≤ 50 ms median), for a CUDA process ended with SIGTERM and with SIGKILL.

Each run starts a torch process holding ``--hold-gib`` GiB on the GPU (pinned by UUID, as
tests/gpu/conftest.py does) and, once NVML shows it held, starts two watchers in this process
before killing it:

* the reference: a tight NVML poll (``nvmlDeviceGetMemoryInfo`` with ``nvmlMemory_v2``, every
  2 ms) that notes the first sample with used memory at or below the gate's residual
  (``gpu.residual_mib``): the physical release;
* gpushift's gate: the real gate loop, ``gpushift.switch.steps.Steps.wait_released`` over the
  real ``gpushift.host.nvml.NvmlGpuProbe`` (NVML plus the /proc fd scan for holders) with the
  daemon's default config, in a thread started well before the kill, so the kill lands at a
  random point of its polling; the time it returns is when the gate opens.

Reported per series: the median of (gate open − physical release) over ``--runs`` runs, and the
times from the kill to the process's exit and to the release.  Fails at once, saying why, where
NVML finds no GPU or torch cannot be imported.  Needs only the standard library, nvidia-ml-py and
torch (no virtualenv: click, structlog and D-Bus are not imported on the gate path).  From the
repository root:

    PYTHONPATH=. python3 bench/gate_latency.py [--runs 7] [--warmup 1] [--hold-gib 4] [--gpu 0] [--no-write]
    PYTHONPATH=. python3 bench/gate_latency.py --smoke     # 1 run per series, nothing written
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import benchdoc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # gpushift from this checkout (PYTHONPATH=. does the same)
    sys.path.insert(0, str(ROOT))

GOAL_MS = 50.0
MIB = 1024 * 1024
POLL_S = 0.002

#: A CUDA process that fills ``GiB`` on its only visible GPU, says so and waits to be killed.
HOLDER = textwrap.dedent(
    """
    import sys, time, torch
    x = torch.empty(int(float(sys.argv[1]) * 1024**3), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("holding", flush=True)
    time.sleep(3600)
    """
)


def fail(msg: str) -> SystemExit:
    return SystemExit(f"gate_latency: {msg}")


@dataclass
class Run:
    series: str
    kill_at: float
    exited_at: float | None = None
    drop_at: float | None = None  # when the first 2 ms sample below the held level answered
    released_at: float | None = None  # when the first sample at or below the residual answered
    released_asked: float | None = None  # when that sample's NVML call began
    gate_at: float | None = None
    gate_error: str | None = None
    reads: list[tuple[float, float, bool]] = field(default_factory=list)  # the gate's: start, end, holders

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) * 1000.0


class TimedProbe:
    """The real GPU provider, each ``read`` timed (start, end, whether it named holders): where the
    gate's time goes.  Adds two clock reads a call; changes nothing else."""

    def __init__(self, probe: Any, into: list[tuple[float, float, bool]]) -> None:
        self.probe = probe
        self.simulated = probe.simulated
        self.into = into

    def facts(self) -> Any:
        return self.probe.facts()

    def read(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = self.probe.read(*args, **kw)
        self.into.append((t, time.perf_counter(), bool(kw.get("holders", True))))
        return out


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        if importlib.util.find_spec("pynvml") is None:
            raise fail("pynvml is not importable: install nvidia-ml-py")
        from gpushift.config import schema as config_mod
        from gpushift.host.nvml import NvmlGpuProbe

        self.probe = NvmlGpuProbe()
        facts = self.probe.facts()
        if facts.error is not None or not facts.gpus:
            raise fail(
                f"no NVIDIA GPU usable here ({facts.error or 'NVML sees no GPU'}); run it on a GPU host"
            )
        gpus = {g.index: g for g in facts.gpus}
        if args.gpu not in gpus:
            raise fail(f"--gpu {args.gpu}, but NVML sees GPUs {sorted(gpus)}")
        self.gpu = gpus[args.gpu]
        self.facts = facts
        if not args.torch_python and importlib.util.find_spec("torch") is None:
            raise fail(
                "torch is not importable by this Python; install torch with CUDA or pass --torch-python"
            )
        self.python = args.torch_python or sys.executable
        # The daemon's defaults, except the one GPU watched (a backend on it).
        self.config = config_mod.parse(
            '[daemon]\nschedule = ""\n[gpu]\nprovider = "nvml"\n'
            f'[backends.bench]\nunit = "bench.service"\nhealth_url = "http://127.0.0.1:9/health"\ngpus = [{args.gpu}]\n',
            "<gate_latency>",
        )
        import pynvml  # type: ignore[import-untyped]

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)

    def used_mib(self) -> float:
        m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.nvml.nvmlMemory_v2)
        return float(m.used) / MIB

    def check_idle(self) -> None:
        from gpushift.values import GateState

        r = self.probe.read([self.gpu.index])[0]
        if r.state(self.config.gpu.residual_mib) is not GateState.RELEASED:
            holders = ", ".join(h.describe() for h in r.holders) or "nobody named"
            raise fail(
                f"GPU {self.gpu.index} is not idle ({r.used_mib} MiB used, error {r.error}, holders: {holders}); "
                "stop what uses it or pick another with --gpu"
            )

    def holder(self) -> subprocess.Popen[str]:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.gpu.uuid)  # CUDA's order can differ from NVML's
        p = subprocess.Popen(
            [self.python, "-c", HOLDER, f"{self.args.hold_gib:g}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "holding":
            p.kill()
            _, err = p.communicate(timeout=60)
            raise fail(f"the CUDA holder did not start (exit {p.returncode}): {err.strip()[-1500:]}")
        return p

    def gate_thread(self, result: Run, started: threading.Event) -> threading.Thread:
        """gpushift's gate loop on a thread of its own; ``result.gate_at`` when it opens."""
        from gpushift.host.proc import SystemClock
        from gpushift.ports import Ports
        from gpushift.switch.run import StepFailed, SwitchRun
        from gpushift.switch.steps import RunGuard, Steps
        from gpushift.values import Trigger

        clock = SystemClock()
        gpu = TimedProbe(self.probe, result.reads)
        ports = Ports(units=None, gpu=gpu, probe=None, ledger=None, host=None, clock=clock)  # type: ignore[arg-type]
        steps = Steps(ports, RunGuard(), lambda run, phase, line: started.set(), lambda: None)
        run = SwitchRun(
            ticket="bench",
            target="bench",
            trigger=Trigger.MANUAL,
            requested_by="bench",
            reason="gate latency benchmark",
            started_at=datetime.now(timezone.utc),
            started_mono=clock.monotonic(),
        )

        def body() -> None:
            try:
                steps.wait_released(run, self.config, [self.gpu.index], "for the benchmark")
                result.gate_at = time.perf_counter()
            except StepFailed as e:
                result.gate_error = e.message

        return threading.Thread(target=body, name="gate", daemon=True)

    def one(self, series: str, sig: signal.Signals) -> Run:
        self.check_idle()
        p = self.holder()
        try:
            held = self.used_mib()
            if held <= self.config.gpu.residual_mib:
                raise fail(f"NVML shows {held:.0f} MiB used while the holder runs: not held?")
            result = Run(series, kill_at=0.0)
            started = threading.Event()
            gate = self.gate_thread(result, started)
            gate.start()
            if not started.wait(30):
                raise fail("the gate loop did not start")
            # Well into its polling, so the kill lands at a random point of its poll interval.
            time.sleep(max(0.3, 2.5 * self.config.daemon.poll_interval_s))
            if not gate.is_alive():
                raise fail(f"the gate opened before the kill ({result.gate_error or 'released while held?'})")
            stop = threading.Event()
            threshold = held - max(64.0, 0.01 * held)

            def reference() -> None:
                while not stop.is_set():
                    asked = time.perf_counter()
                    used = self.used_mib()
                    t = time.perf_counter()
                    if asked < result.kill_at or result.kill_at == 0:
                        pass  # asked before the kill
                    elif used <= self.config.gpu.residual_mib:
                        result.released_asked, result.released_at = asked, t
                        result.drop_at = result.drop_at or t
                        return
                    elif result.drop_at is None and used < threshold:
                        result.drop_at = t
                    time.sleep(POLL_S)

            ref = threading.Thread(target=reference, name="nvml-2ms", daemon=True)
            ref.start()
            time.sleep(0.1)
            result.kill_at = time.perf_counter()
            p.send_signal(sig)
            p.wait()  # reaped at once (a blocking wait), as systemd reaps a unit's processes
            result.exited_at = time.perf_counter()
            ref.join(60)
            gate.join(self.config.gpu.release_timeout_s + 5)
            stop.set()
            if result.released_at is None:
                raise fail(f"NVML never showed GPU {self.gpu.index} released after {sig.name}")
            if result.gate_at is None:
                raise fail(f"the gate did not open after {sig.name}: {result.gate_error}")
            return result
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(60)
            for s in (p.stdout, p.stderr):
                if s:
                    s.close()


def breakdown(r: Run) -> dict[str, float | None]:
    """Where one run's gate latency went (ms): when the read that opened the gate began after the
    release, how long it took, the rest of the loop after it; the loop's sleeps and read times."""
    reads = r.reads
    if not reads or r.released_at is None or r.gate_at is None:
        return {}
    start, end, _ = reads[-1]
    fast = [(b - a) * 1000 for a, b, named in reads if not named]
    scan = [(b - a) * 1000 for a, b, named in reads if named]
    gaps = [(reads[i + 1][0] - reads[i][1]) * 1000 for i in range(len(reads) - 1)]
    return {
        "open_start": (start - r.released_at) * 1000,
        "open_read": (end - start) * 1000,
        "after": (r.gate_at - end) * 1000,
        "gap": benchdoc.median(gaps) if gaps else None,
        "fast": benchdoc.median(fast) if fast else None,
        "scan": benchdoc.median(scan) if scan else None,
    }


def med(xs: list[float | None], digits: int = 0) -> str:
    got = [x for x in xs if x is not None]
    return f"{benchdoc.median(got):.{digits}f} ms" if got else "–"


def rng(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    return f"{min(got):.0f}–{max(got):.0f} ms" if got else "–"


def section(args: argparse.Namespace, b: Bench, runs: list[Run]) -> str:
    rows = []
    worst = 0.0
    for series in ("SIGTERM", "SIGKILL"):
        rs = [r for r in runs if r.series == series]
        lag = [r.ms(r.released_at, r.gate_at) for r in rs]
        worst = max(worst, benchdoc.median([x for x in lag if x is not None]))
        asked = [r.ms(r.released_asked, r.gate_at) for r in rs]
        call = [r.ms(r.released_asked, r.released_at) for r in rs]
        rows.append(
            f"| {series} | **{med(lag)}** | {rng(lag)} | {med(asked)} | {med(call, 1)} | "
            f"{med([r.ms(r.kill_at, r.exited_at) for r in rs])} | {med([r.ms(r.kill_at, r.drop_at) for r in rs])} | "
            f"{med([r.ms(r.kill_at, r.released_at) for r in rs])} | {med([r.ms(r.kill_at, r.gate_at) for r in rs])} |"
        )
    verdict = "meets" if worst <= GOAL_MS else "MISSES"
    parts = []
    for series in ("SIGTERM", "SIGKILL"):
        bs = [breakdown(r) for r in runs if r.series == series]

        def col(key: str, bs: list[dict[str, float | None]] = bs) -> str:
            return med([b.get(key) for b in bs], 1)

        parts.append(
            f"| {series} | {col('open_start')} | {col('open_read')} | {col('after')} | {col('gap')} | "
            f"{col('fast')} | {col('scan')} |"
        )
    d = b.config.daemon
    intervals = ", ".join(
        f"`{k} = {getattr(d, k)}`" for k in ("poll_interval_s", "fast_poll_interval_s") if hasattr(d, k)
    )
    return f"""## VRAM gate latency on a real GPU

Goal: the gate opens ≤ {GOAL_MS:.0f} ms after the memory is physically released (median per series).
Result: **{worst:.0f} ms** (the worse series), {verdict} the goal.

| Series | Gate open − physical release (median) | Range | Gate open − start of the releasing sample's call | That NVML call took | Kill → process reaped | Kill → memory starts to drop | Kill → physical release | Kill → gate open |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Where the gate's time goes (medians; the gate's reads timed through a thin wrapper around the probe):

| Series | The read that opened the gate began, after the release | That read took | Then until the loop returned | Sleep between reads | A memory-only read | A read naming holders |
|---|---|---|---|---|---|---|
{chr(10).join(parts)}

- Command: `PYTHONPATH=. python3 bench/gate_latency.py --runs {args.runs} --warmup {args.warmup} --hold-gib {args.hold_gib:g} --gpu {args.gpu}`
  ({args.runs} runs per series after {args.warmup} warm-up run(s) per series; a torch process holding
  {args.hold_gib:g} GiB, pinned by UUID, ended with the series' signal).
- Physical release: when the first sample of a 2 ms NVML poll (`nvmlDeviceGetMemoryInfo`, `nvmlMemory_v2`) in
  the same process that shows used memory ≤ `residual_mib` ({b.config.gpu.residual_mib:g} MiB, the gate's own
  threshold) returns: the moment NVML tells anyone. The memory was freed during that call, which may have
  waited on the driver; the column "− start of the releasing sample's call" counts from the call's start instead
  (an upper bound of the gate's lag).
- Reading the breakdown: a read of the gate that began before the release and took far longer than a
  memory-only read waited on the driver, which holds NVML calls while it tears the dead process's
  context down; it returns with the reference's releasing sample (a negative "began after the release").
- The gate: `Steps.wait_released` over the real `NvmlGpuProbe` (NVML and the /proc fd scan for holders) with the
  daemon's defaults ({intervals}), started before the kill.
- GPU: {b.gpu.name} (NVML index {b.gpu.index}), driver {b.facts.driver_version}, CUDA {b.facts.cuda_version}.
- Machine: {benchdoc.machine()}.
- Measured {benchdoc.stamp()}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="measured runs per series (SIGTERM, SIGKILL)")
    ap.add_argument("--warmup", type=int, default=1, help="runs per series first, not counted")
    ap.add_argument("--hold-gib", type=float, default=4.0, help="GiB the CUDA process holds")
    ap.add_argument(
        "--gpu", type=int, default=int(os.environ.get("GPUSHIFT_TEST_GPU", "0")), help="NVML index"
    )
    ap.add_argument(
        "--torch-python", default=os.environ.get("GPUSHIFT_TEST_TORCH_PYTHON"), help="a Python with torch"
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="1 run per series, no warm-up, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.warmup, args.no_write = 1, 0, True
    b = Bench(args)
    runs: list[Run] = []
    for k in range(args.warmup + args.runs):
        for series, sig in (("SIGTERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL)):  # interleaved
            r = b.one(series, sig)
            label = "warm-up" if k < args.warmup else f"run {k - args.warmup + 1}/{args.runs}"
            print(
                f"{label} {series}: reaped {r.ms(r.kill_at, r.exited_at):.0f} ms, released "
                f"{r.ms(r.kill_at, r.released_at):.0f} ms (its NVML call {r.ms(r.released_asked, r.released_at):.1f} ms), "
                f"gate {r.ms(r.kill_at, r.gate_at):.0f} ms after the kill "
                f"(gate − release {r.ms(r.released_at, r.gate_at):.0f} ms; "
                + ", ".join(f"{k} {v:.1f}" for k, v in breakdown(r).items() if v is not None)
                + ")",
                flush=True,
            )
            if k >= args.warmup:
                runs.append(r)
    text = section(args, b, runs)
    print(text)
    if not args.no_write:
        benchdoc.write_section("gate_latency", text)
        print(f"written to {benchdoc.DOC}")
    b.probe.close()


if __name__ == "__main__":
    main()
