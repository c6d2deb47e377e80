"""Clients nobody here wrote, through the real front door, across a real switch.

The real daemon switches two stand-in backends (``day`` serves ``day-model``, ``night`` serves
``night-model``; both answer to the alias ``default``) while the official ``openai`` package streams
chat completions through the socket-activated front door, and so does ``curl -N``:

* every request for a model the switch's target serves (``night-model``, ``default``) is held -- no
  status line -- and answered by the new backend once it is ready (its /health says 200 only after
  ``--start-delay``); the stream arrives whole;
* a request for the model the target does not serve (``day-model``), once the drain has closed the
  old backend (before, it still goes there), gets its 503 at once, while the switch is in progress;
* the switch's ledger row records the held requests (``extra.frontdoor``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from frontdoor_env import DAY, NIGHT, DoorEnv, error_of, post, standin_backend

START_DELAY_S = 3.0
WORDS = " stand-in reply stand-in reply"  # what a 6-chunk stand-in answer says


def _openai() -> Any:
    try:
        import openai
    except ImportError:  # pragma: no cover - the test extra has it
        pytest.fail("the openai package is needed (pip install -e '.[test]')", pytrace=False)
    return openai


def _stream(client: Any, model: str, out: dict[str, Any]) -> None:
    """One streamed chat completion with the official client: when it was sent, when its headers
    and first chunk came, what it said, which backend answered."""
    out["sent"] = time.monotonic()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            extra_body={"chunks": 6, "chunk_interval_s": 0.02},
        )
        out["headers_at"] = time.monotonic()
        out["port"] = raw.headers.get("x-standin-port")
        text = []
        for chunk in raw.parse():
            out.setdefault("first_chunk_at", time.monotonic())
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        out["text"] = "".join(text)
    except Exception as e:  # noqa: BLE001 - asserted by the test
        out["error"] = f"{type(e).__name__}: {e}"


def _frontdoor_status(env: DoorEnv) -> dict[str, Any]:
    """The front door's own ``Status()`` over the sandbox's bus (what the daemon asks)."""
    r = subprocess.run(
        ["busctl", "--user", "--json=short", "call", "org.gpushift.FrontDoor1", "/org/gpushift/FrontDoor1",
         "org.gpushift.FrontDoor1", "Status"],
        env=env.sb.env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if r.returncode != 0:
        return {}
    return dict(json.loads(json.loads(r.stdout)["data"][0]))


def _ready_watch(port: int, seen: dict[str, float], stop: threading.Event) -> None:
    """When the new backend's own /health first answers 200 (asked directly, every 20 ms)."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    seen["ready"] = time.monotonic()
                    return
        except OSError:
            pass
        time.sleep(0.02)


@pytest.mark.timeout(600)
def test_openai_and_curl_streams_are_held_through_a_switch_and_answered_by_the_new_backend(
    sandbox: Any,
) -> None:
    curl = shutil.which("curl")
    assert curl, "curl is needed (apt-get install curl)"
    day = standin_backend("day", DAY)
    night = standin_backend("night", NIGHT, "--start-delay", str(START_DELAY_S), start_timeout_s=60)
    env = DoorEnv(sandbox, Path(sandbox.base_dir) / "gs", [day, night], sample_interval_s=0.5).up()
    env.cli("switch", "day", check=True)
    env.door.activate()
    openai = _openai()
    clients = [
        openai.OpenAI(base_url=env.url("/v1"), api_key="sk-test", max_retries=0, timeout=120)
        for _ in range(6)
    ]
    seen: dict[str, float] = {}
    stop = threading.Event()
    watch = threading.Thread(target=_ready_watch, args=(night.port, seen, stop))
    watch.start()
    switch = env.cli_popen("switch", "night", "--reason", "front door e2e")
    outs: list[dict[str, Any]] = [{} for _ in range(6)]
    threads: list[threading.Thread] = []
    curl_proc: subprocess.Popen[str] | None = None
    try:
        env.wait_for(lambda: env.property("SwitchInProgress") == "b true", 60, "the switch to begin")
        models = [NIGHT, NIGHT, NIGHT, NIGHT, "default", "default"]
        threads = [
            threading.Thread(target=_stream, args=(c, m, o))
            for c, m, o in zip(clients, models, outs, strict=True)
        ]
        for t in threads:
            t.start()
        body = '{"model": "night-model", "messages": [{"role": "user", "content": "hi"}], "stream": true, "chunks": 3}'
        curl_sent = time.monotonic()
        curl_proc = subprocess.Popen(
            [curl, "-sS", "-N", "--max-time", "120", "-H", "Content-Type: application/json", "-d", body,
             env.url("/v1/chat/completions")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # the model the target does not serve, once the drain closed the old backend (until then
        # it still goes there): answered at once, during the switch
        env.wait_for(lambda: "day" in _frontdoor_status(env).get("closed", []), 60, "Close(day)")
        status, headers, raw = post(env.url("/v1/chat/completions"), {"model": DAY, "messages": []})
        assert switch.poll() is None, "the switch ended before the day-model request was answered"
        assert status == 503, raw
        err = error_of(raw)
        assert err["code"] == "model_not_served" and "switching to night" in err["message"], err
        out, errout = switch.communicate(timeout=300)
        assert switch.returncode == 0, (out, errout, env.daemon_log()[-3000:])
        for t in threads:
            t.join(120)
        curl_out, curl_err = curl_proc.communicate(timeout=120)
        curl_done = time.monotonic()
    finally:
        stop.set()
        watch.join(30)
        if curl_proc is not None and curl_proc.poll() is None:
            curl_proc.kill()
            curl_proc.wait(10)
        if switch.poll() is None:
            switch.kill()
            switch.wait(10)
    assert "ready" in seen, "the night backend's /health never answered 200"
    for o in outs:
        assert "error" not in o, (o, env.door.log())
        assert o["port"] == str(night.port) and o["text"] == WORDS, o
        # held: sent while the new backend was not ready yet, answered only once it was (its own
        # /health, asked every 20 ms)
        assert o["sent"] < seen["ready"] <= o["headers_at"] + 0.2, (o, seen)
    assert curl_proc.returncode == 0, curl_err
    events = [e for e in curl_out.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]" and len(events) == 1 + 1 + 3 + 1, curl_out
    assert curl_sent < seen["ready"] < curl_done, (curl_sent, seen, curl_done)
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["to"] == "night" and row["outcome"] == "ok", row
    assert row["extra"]["frontdoor"]["held"] >= len(outs) + 1, row["extra"]
    assert row["extra"]["frontdoor"]["longest_s"] >= 1.0, row["extra"]
