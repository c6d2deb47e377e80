"""The REAL vLLM (CPU build) and the REAL llama-server behind the front door: one address for both
models, across a real switch.  Both servers run as units of the sandbox's systemd user manager
(with their shipped units' hardening blocks), the daemon from ``units/gpushift.service``, the front
door socket-activated from ``units/gpushift-frontdoor.*`` (``tests/integration/frontdoor_env.py``).

1. vLLM serves: a completion for its model (``tiny``, its ``--served-model-name``) through the front
   door is vLLM's answer; one for llama-server's (``tiny-gguf``, its ``--alias``) is a 503 saying it
   is not served now (the model names come from the units' command lines, the config names none).
2. A switch to llama-server: a request for ``tiny-gguf`` sent while it runs is held and answered by
   llama-server once it is ready; afterwards ``tiny`` is the 503 and ``tiny-gguf`` is served, both
   through the same address.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from realbackends_support import OFFLINE_ENV, RealBackends, TinyModel, free_port, hardening_block

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from frontdoor_env import DoorEnv, error_of, post  # noqa: E402
from gpushift_env import Backend  # noqa: E402

from tests.support.sandbox import Sandbox  # noqa: E402

pytestmark = pytest.mark.realbackends

VLLM_MODEL, LLAMA_MODEL = "tiny", "tiny-gguf"


@pytest.fixture
def sandbox():
    sb = Sandbox()
    try:
        sb.start()
        yield sb
    finally:
        sb.stop()


def _completion(
    env: DoorEnv, model: str, timeout_s: float = 300
) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {
        "model": model,
        "prompt": "The gpu host serves",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    status, headers, raw = post(env.url("/v1/completions"), body, timeout_s=timeout_s)
    return status, headers, json.loads(raw)


@pytest.mark.timeout(1800)
def test_both_real_backends_answer_through_one_address_across_a_switch(
    sandbox: Any, realbackends: RealBackends, tiny_model: TinyModel
) -> None:
    vport, lport = free_port(), free_port()
    vllm = Backend(
        "vllm",
        vport,
        [0, 1],
        kind="vllm",
        start_timeout_s=900,
        timeout_stop_s=60,
        exec_start=(
            f"{realbackends.python} -m vllm.entrypoints.openai.api_server --model {tiny_model.hf_dir} "
            f"--served-model-name {VLLM_MODEL} --host 127.0.0.1 --port {vport} --max-model-len 1024 "
            "--dtype float32 --enforce-eager --max-num-seqs 1"
        ),
        environment={"VLLM_CPU_KVCACHE_SPACE": "1", **OFFLINE_ENV},
        extra_service="CPUAffinity=0\n" + hardening_block("gpushift-vllm.service"),
    )
    llama = Backend(
        "llama",
        lport,
        [0, 1],
        kind="llama-server",
        start_timeout_s=300,
        timeout_stop_s=30,
        exec_start=(
            f"{realbackends.llama_server} -m {tiny_model.gguf} --alias {LLAMA_MODEL} --host 127.0.0.1 "
            f"--port {lport} --metrics --slots -c 512 --parallel 1 -t 1"
        ),
        version_command=[str(realbackends.llama_server), "--version"],
        extra_service=hardening_block("gpushift-llama.service"),
    )
    env = DoorEnv(sandbox, Path(sandbox.base_dir) / "gs", [vllm, llama], release_timeout_s=30).up()
    t0 = time.monotonic()
    env.cli("switch", "vllm", "--reason", "day", timeout_s=1000, check=True)
    print(f"realbackends timing: switch to vllm (cold start): {time.monotonic() - t0:.1f} s")
    env.door.activate()

    status, _h, body = _completion(env, VLLM_MODEL)
    assert status == 200 and body["model"] == VLLM_MODEL and body["usage"]["completion_tokens"] == 8, body
    status, _h, body = _completion(env, LLAMA_MODEL)
    assert status == 503 and error_of(json.dumps(body).encode())["code"] == "model_not_served", body

    held: dict[str, Any] = {}

    def held_request() -> None:
        held["sent"] = time.monotonic()
        held["answer"] = _completion(env, LLAMA_MODEL, timeout_s=600)
        held["done"] = time.monotonic()

    switch = env.cli_popen("switch", "llama", "--reason", "night")
    t0 = time.monotonic()
    waiter = threading.Thread(target=held_request)
    try:
        env.wait_for(lambda: env.property("SwitchInProgress") == "b true", 120, "the switch to begin")
        waiter.start()
        out, err = switch.communicate(timeout=900)
        assert switch.returncode == 0, (out, err)
        print(
            f"realbackends timing: switch vllm -> llama behind the front door: {time.monotonic() - t0:.1f} s"
        )
        waiter.join(600)
    finally:
        if switch.poll() is None:
            switch.kill()
            switch.wait(10)
    status, _h, body = held["answer"]
    assert status == 200 and body["usage"]["completion_tokens"] == 8, body  # llama-server's answer
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["to"] == "llama" and row["outcome"] == "ok" and row["extra"]["frontdoor"]["held"] >= 1, row
    status, _h, body = _completion(env, VLLM_MODEL)
    assert status == 503 and error_of(json.dumps(body).encode())["code"] == "model_not_served", body
    status, _h, body = _completion(env, LLAMA_MODEL)
    assert status == 200 and body["usage"]["completion_tokens"] == 8, body
