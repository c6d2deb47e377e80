"""The real Switcher and VRAM gate on a real GPU: backends are CUDA processes holding real VRAM.

systemd is not on a GPU test box, so "units" here are CUDA processes started and stopped by a small
UnitControl over subprocesses; everything that decides — preflight attribution, the gate, rollback —
is the production code reading real NVML through NvmlGpuProbe.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpushift.config.schema import parse
from gpushift.errors import GpushiftError
from gpushift.host.proc import ProcHost, SystemClock
from gpushift.ports import Ports, states_one_by_one
from gpushift.switch import Switcher, SwitchResult
from gpushift.values import Caller, Health, JobResult, SwitchRecord, UnitState, VersionInfo

HOLD = r"""
import os, sys, time, torch
gib, mode = float(sys.argv[1]), sys.argv[2]
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
if mode == "orphan":
    child = os.fork()
    if child == 0:  # inherits the device files (and so the memory) and outlives the parent
        time.sleep(600)
        os._exit(0)
    print("child", child, flush=True)
print("ready", flush=True)
time.sleep(600)
"""


class ProcessUnits:
    """UnitControl over CUDA processes: start = spawn and wait for 'ready', stop = SIGTERM."""

    def __init__(self, procs: Any, gpu: Any, specs: dict[str, tuple[float, str]]) -> None:
        self.procs, self.gpu, self.specs = procs, gpu, specs
        self.running: dict[str, subprocess.Popen[str]] = {}
        self.orphans: list[int] = []
        self.calls: list[tuple[str, str]] = []

    def _argv(self, unit: str) -> tuple[str, ...]:
        gib, mode = self.specs[unit]
        return (self.procs.python, "-c", "<hold>", str(gib), mode)

    def state(self, unit: str) -> UnitState:
        p = self.running.get(unit)
        up = p is not None and p.poll() is None
        return UnitState(
            name=unit,
            load_state="loaded",
            active_state="active" if up else "inactive",
            sub_state="running" if up else "dead",
            main_pid=p.pid if up and p else 0,
            exec_start=self._argv(unit),
            kill_mode="control-group",
            conflicts=("x",),
        )

    def states(self, units: Sequence[str]) -> dict[str, UnitState | GpushiftError]:
        return states_one_by_one(self.state, units)

    def start(self, unit: str, timeout_s: float) -> JobResult:
        self.calls.append(("start", unit))
        gib, mode = self.specs[unit]
        p = self.procs.start(HOLD, self.gpu, [str(gib), mode])
        while True:
            line = self.procs.readline(p)
            if line.startswith("child "):
                pid = int(line.split()[1])
                self.orphans.append(pid)
                self.procs.adopt(pid)
            if line == "ready":
                break
        self.running[unit] = p
        return JobResult(unit, f"/job/{len(self.calls)}", "done")

    def stop(self, unit: str, timeout_s: float) -> JobResult:
        self.calls.append(("stop", unit))
        p = self.running.get(unit)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
        return JobResult(unit, f"/job/{len(self.calls)}", "done")

    def reset_failed(self, unit: str) -> None:
        pass

    def processes(self, unit: str) -> list[int]:
        p = self.running.get(unit)
        return [p.pid] if p is not None and p.poll() is None else []


class RunningIsHealthy:
    def __init__(self, units: ProcessUnits, urls: dict[str, str]) -> None:
        self.units, self.urls = units, urls

    def health(self, url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        up = self.units.state(self.urls[url]).running
        return Health(up, 200 if up else None, "")

    def version(
        self,
        version_url: str | None,
        version_command: Sequence[str] | None,
        timeout_s: float = 5.0,
        expect_cgroup: str | None = None,
    ) -> VersionInfo:
        return VersionInfo("torch-holder", "none")

    def in_flight(self, backend: Any, expect_cgroup: str | None = None) -> int | None:
        return 0


class ListLedger:
    def __init__(self) -> None:
        self.rows: list[SwitchRecord] = []

    def begin(self, record: SwitchRecord) -> int:
        self.rows.append(record)
        return len(self.rows)

    def finish(self, record: SwitchRecord) -> None:
        pass

    def mark_interrupted(self, now: datetime) -> list[int]:
        return []

    def last(self) -> SwitchRecord | None:
        return self.rows[-1] if self.rows else None

    def get(self, row_id: int) -> SwitchRecord | None:
        return self.rows[row_id - 1]

    def list(self, limit: int = 20, **filters: Any) -> list[SwitchRecord]:
        return list(reversed(self.rows))[:limit]

    def health(self) -> dict[str, Any]:
        return {"state": "ok", "pending": 0, "error": None}


def make(
    probe: Any, gpu: Any, procs: Any, specs: dict[str, tuple[float, str]]
) -> tuple[Switcher, ProcessUnits]:
    cfg = parse(f"""
[gpu]
residual_mib = 256
release_timeout_s = 8
[daemon]
poll_interval_s = 0.1
schedule = ""
[backends.a]
unit = "a.service"
health_url = "http://127.0.0.1:1/a"
gpus = [{gpu.index}]
[backends.b]
unit = "b.service"
health_url = "http://127.0.0.1:1/b"
gpus = [{gpu.index}]
""")
    units = ProcessUnits(procs, gpu, specs)
    health = RunningIsHealthy(
        units, {"http://127.0.0.1:1/a": "a.service", "http://127.0.0.1:1/b": "b.service"}
    )
    sw = Switcher(cfg, Ports(units, probe, health, ListLedger(), ProcHost(), SystemClock()))
    return sw, units


def switch(sw: Switcher, target: str) -> SwitchResult:
    ticket = sw.request(target, "gpu test", Caller(uid=os.getuid(), user="gpu-test"))
    sw.wait(300)
    result = sw.result(ticket)
    assert result is not None, "the switch did not finish"
    return result


def test_real_gpu_switch_waits_for_vram_then_starts(probe, idle_gpu, cuda_procs):
    sw, units = make(probe, idle_gpu, cuda_procs, {"a.service": (4.0, "plain"), "b.service": (2.0, "plain")})
    assert switch(sw, "a").ok
    res = switch(sw, "b")
    assert res.ok, res
    rec = sw.ports.ledger.last()
    released = rec.vram["released"][0]
    assert released["used_mib"] <= 256, released
    ready = rec.vram["ready"][0]
    b_pid = units.state("b.service").main_pid
    assert ready["used_mib"] > 1500 and [h["pid"] for h in ready["holders"]] == [b_pid]
    assert units.calls == [("start", "a.service"), ("stop", "a.service"), ("start", "b.service")]
    assert rec.gpu_facts["simulated"] is False and rec.gpu_facts["gpus"][0]["uuid"] == idle_gpu.uuid


def test_real_gpu_orphan_keeps_gate_closed_and_nothing_starts(probe, idle_gpu, cuda_procs):
    sw, units = make(probe, idle_gpu, cuda_procs, {"a.service": (3.0, "orphan"), "b.service": (2.0, "plain")})
    assert switch(sw, "a").ok
    res = switch(sw, "b")
    assert not res.ok and res.outcome == "failed" and res.failed_phase == "release"
    child = units.orphans[0]
    assert f"pid {child}" in res.message and "rollback to a impossible" in res.message
    assert ("start", "b.service") not in units.calls
    os.kill(child, signal.SIGKILL)
    assert cuda_procs.wait_until(lambda: probe.read([idle_gpu.index])[0].state(256).value == "released", 15)


def test_real_gpu_foreign_holder_refuses_before_stopping(probe, idle_gpu, cuda_procs):
    sw, units = make(probe, idle_gpu, cuda_procs, {"a.service": (2.0, "plain"), "b.service": (2.0, "plain")})
    assert switch(sw, "a").ok
    foreign = cuda_procs.start(HOLD, idle_gpu, ["1.5", "plain"])
    assert cuda_procs.readline(foreign) == "ready"
    res = switch(sw, "b")
    assert res.outcome == "refused" and f"pid {foreign.pid}" in res.message, res
    assert units.calls == [("start", "a.service")]  # a was never stopped
    assert sw.ports.ledger.last().outcome == "refused"
