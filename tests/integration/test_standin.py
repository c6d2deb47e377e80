"""The stand-in backend: what gpushift's tests rely on it to do (HTTP endpoints, SIGTERM behaviours)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import standin

PY = sys.executable


def _get(url: str, timeout_s: float = 2.0) -> tuple[int | None, str]:
    """(status, body); status None when the connection failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def _post(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.status, json.loads(r.read())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] != b"Z"


def _holds(pid: int, path: Path) -> bool:
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    links = []
    for fd in fds:
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return target in links


def _cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    return next((ln[3:] for ln in lines if ln.startswith("0::")), lines[0].split(":", 2)[2])


class Standin:
    """A stand-in run directly as a child of the test (no systemd)."""

    def __init__(self, port: int, log: Path, *args: str) -> None:
        self.port = port
        self.log = log
        self._log_file = open(log, "ab")  # noqa: SIM115 - closed in end()
        self.proc = subprocess.Popen(
            [PY, "-m", "tests.support.standin", "--port", str(port), *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(standin.CHECKOUT)},
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_listening(self, wait_for: Any) -> None:
        wait_for(
            lambda: _get(self.url("/version"))[0] == 200 or self.proc.poll() is not None,
            15,
            "the stand-in to listen",
            self.log_text,
        )
        assert self.proc.poll() is None, self.log_text()

    def end(self) -> None:
        """Stop the process this test started, by its PID, even if it ignores SIGTERM."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._log_file.close()


@pytest.fixture
def run_standin(tmp_path: Path, free_port: Any) -> Iterator[Any]:
    started: list[Standin] = []

    def run(*args: str) -> Standin:
        s = Standin(free_port(), tmp_path / f"standin-{len(started)}.log", *args)
        started.append(s)
        return s

    try:
        yield run
    finally:
        for s in started:
            s.end()


def test_standin_health_is_503_while_loading_then_200(run_standin, wait_for):
    s = run_standin("--start-delay", "1.5")
    s.wait_listening(wait_for)
    status, body = _get(s.url("/health"))
    assert status == 503 and json.loads(body)["status"] == "loading"
    wait_for(lambda: _get(s.url("/health"))[0] == 200, 10, "health 200", s.log_text)
    assert json.loads(_get(s.url("/health"))[1]) == {"status": "ok"}


def test_standin_never_ready_keeps_answering_503(run_standin, wait_for):
    s = run_standin("--never-ready")
    s.wait_listening(wait_for)
    for _ in range(5):
        assert _get(s.url("/health"))[0] == 503
        time.sleep(0.2)


def test_standin_version_reports_the_given_version(run_standin, wait_for):
    s = run_standin("--version", "0.9.2-test")
    s.wait_listening(wait_for)
    status, body = _get(s.url("/version"))
    assert status == 200 and json.loads(body) == {"version": "0.9.2-test"}


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


def test_standin_metrics_count_requests_while_they_run(run_standin, wait_for):
    s = run_standin("--request-seconds", "0")
    s.wait_listening(wait_for)
    text = _get(s.url("/metrics"))[1]
    assert _metric(text, "standin:requests_running") == 0
    assert _metric(text, "vllm:num_requests_running") == 0
    assert _metric(text, "vllm:num_requests_waiting") == 0

    answers: list[Any] = []
    slow = threading.Thread(target=lambda: answers.append(_post(s.url("/v1/completions"), {"sleep": 2})))
    slow.start()
    try:
        wait_for(
            lambda: _metric(_get(s.url("/metrics"))[1], "standin:requests_running") == 1,
            5,
            "one running request",
        )
        assert _metric(_get(s.url("/metrics"))[1], "vllm:num_requests_running") == 1
    finally:
        slow.join(30)
    status, completion = answers[0]
    assert status == 200
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]
    assert _metric(_get(s.url("/metrics"))[1], "standin:requests_running") == 0


def test_standin_exit_at_once_exits_1_without_listening(run_standin):
    s = run_standin("--exit-at-once")
    assert s.proc.wait(15) == 1
    assert _get(s.url("/health"))[0] is None


def test_standin_sigterm_exits_0(run_standin, wait_for):
    s = run_standin()
    s.wait_listening(wait_for)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(10) == 0
    assert "SIGTERM: stopping" in s.log_text()


def test_standin_ignore_sigterm_keeps_serving(run_standin, wait_for):
    s = run_standin("--ignore-sigterm")
    s.wait_listening(wait_for)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert s.proc.poll() is None
    assert _get(s.url("/health"))[0] == 200


def test_standin_hold_device_keeps_the_files_open(run_standin, wait_for, tmp_path):
    devices = [tmp_path / "nvidia0", tmp_path / "nvidia1"]
    for d in devices:
        d.write_bytes(b"")
    s = run_standin("--hold-device", str(devices[0]), str(devices[1]))
    s.wait_listening(wait_for)
    assert all(_holds(s.proc.pid, d) for d in devices)


def test_standin_hold_device_that_is_missing_exits_1(run_standin, tmp_path):
    s = run_standin("--hold-device", str(tmp_path / "nvidia9"))
    assert s.proc.wait(15) == 1
    assert "cannot open device" in s.log_text()


def test_standin_orphan_on_sigterm_leaves_a_holder_outside_the_units_cgroup(
    sandbox, install_standin, wait_for, tmp_path
):
    device = tmp_path / "nvidia1"
    device.write_bytes(b"")
    pid_file = tmp_path / "orphan.pid"
    a = install_standin(
        "standin-a.service",
        "--hold-device",
        str(device),
        "--orphan-on-sigterm",
        str(device),
        "--orphan-pid-file",
        str(pid_file),
    )
    sandbox.systemctl("start", a.name)
    main = int(sandbox.show(a.name, "MainPID")["MainPID"])
    wait_for(lambda: "listening" in a.log_text(), 15, "the stand-in to listen", a.log_text)
    unit_cgroup = _cgroup(main)

    sandbox.systemctl("stop", a.name)  # waits for the stop job

    assert pid_file.exists(), a.log_text()
    orphan = int(pid_file.read_text())
    assert not _alive(main)
    assert _alive(orphan), a.log_text()
    assert _holds(orphan, device)
    # Outside the stopped unit's cgroup (which KillMode=control-group emptied): in its own scope.
    assert _cgroup(orphan) != unit_cgroup
    assert _cgroup(orphan).endswith(".scope")
    assert f"orphan pid {orphan}" in a.log_text()
    assert sandbox.show(a.name, "ActiveState")["ActiveState"] == "inactive"


def test_standin_health_control_fails_hangs_and_recovers(run_standin, wait_for):
    s = run_standin()
    s.wait_listening(wait_for)
    assert _post(s.url("/_standin/health"), {"mode": "fail"}) == (200, {"mode": "fail"})
    status, body = _get(s.url("/health"))
    assert status == 500 and json.loads(body)["status"] == "failing"
    assert _post(s.url("/_standin/health"), {"mode": "hang"}) == (200, {"mode": "hang"})
    t0 = time.monotonic()
    assert _get(s.url("/health"), timeout_s=1.0) == (None, "")  # connected, never answered
    assert time.monotonic() - t0 >= 0.9
    assert _get(s.url("/version"))[0] == 200  # the rest of the server still answers
    assert _post(s.url("/_standin/health"), {"mode": "ok"}) == (200, {"mode": "ok"})
    assert _get(s.url("/health"))[0] == 200
    with pytest.raises(urllib.error.HTTPError):
        _post(s.url("/_standin/health"), {"mode": "sideways"})


# ------------------------------------------------------------------ the OpenAI routes (the front door's upstream)


def _sse(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, dict[str, str], list[str]]:
    """POST, read a server-sent-event answer to its end: (status, headers, each ``data:`` payload)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        text = r.read().decode()
        headers = {k.lower(): v for k, v in r.headers.items()}
        status = r.status
    events = [block for block in text.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events), text
    return status, headers, [e[len("data: ") :] for e in events]


def test_standin_lists_its_served_model_names_like_vllm(run_standin, wait_for):
    s = run_standin("--served-model-name", "qwen-day", "qwen")
    s.wait_listening(wait_for)
    status, body = _get(s.url("/v1/models"))
    listed = json.loads(body)
    assert status == 200 and listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["qwen-day", "qwen"]
    assert all(m["object"] == "model" for m in listed["data"])


def test_standin_lists_an_alias_like_llama_server_and_defaults_to_standin(run_standin, wait_for):
    a = run_standin("--alias", "llama-night")
    b = run_standin()
    a.wait_listening(wait_for)
    b.wait_listening(wait_for)
    assert [m["id"] for m in json.loads(_get(a.url("/v1/models"))[1])["data"]] == ["llama-night"]
    assert [m["id"] for m in json.loads(_get(b.url("/v1/models"))[1])["data"]] == ["standin"]


def test_standin_streams_chat_completions_as_server_sent_events(run_standin, wait_for):
    s = run_standin("--served-model-name", "qwen")
    s.wait_listening(wait_for)
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True, "chunks": 5}
    status, headers, events = _sse(s.url("/v1/chat/completions"), body)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["x-standin-port"] == str(s.port)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "qwen" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(content) == 5 and all(content)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_standin_streams_completions_with_the_bodys_count_and_interval(run_standin, wait_for):
    s = run_standin("--chunks", "2")
    s.wait_listening(wait_for)
    status, _h, events = _sse(s.url("/v1/completions"), {"prompt": "x", "stream": True})
    assert status == 200 and len(events) == 3 and events[-1] == "[DONE]"  # --chunks 2, then [DONE]
    t0 = time.monotonic()
    body = {"prompt": "x", "stream": True, "max_tokens": 4, "chunk_interval_s": 0.2}
    status, _h, events = _sse(s.url("/v1/completions"), body)
    assert time.monotonic() - t0 >= 0.6  # three pauses between four chunks: a lower bound only
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert len(texts) == 4 and all(texts) and events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"


def test_standin_answers_chat_whole_and_refuses_a_model_it_does_not_serve(run_standin, wait_for):
    s = run_standin("--served-model-name", "qwen")
    s.wait_listening(wait_for)
    status, answer = _post(s.url("/v1/chat/completions"), {"model": "qwen", "messages": []})
    assert status == 200 and answer["object"] == "chat.completion"
    assert (
        answer["choices"][0]["message"]["role"] == "assistant" and answer["choices"][0]["message"]["content"]
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(s.url("/v1/chat/completions"), {"model": "llama", "messages": []})
    assert e.value.code == 404
    error = json.loads(e.value.read())["error"]
    assert error["type"] == "NotFoundError" and "llama" in error["message"]


def test_standin_counts_a_stream_as_running_until_its_client_goes(run_standin, wait_for):
    s = run_standin()
    s.wait_listening(wait_for)
    import socket

    body = json.dumps({"prompt": "x", "stream": True, "chunks": 1000, "chunk_interval_s": 0.05}).encode()
    client = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    client.sendall(head.encode() + body)
    first = b""
    while b"data: " not in first:  # the stream has begun
        first += client.recv(4096)
    assert first.startswith(b"HTTP/1.0 200"), first
    running = lambda: _metric(_get(s.url("/metrics"))[1], "standin:requests_running")  # noqa: E731
    assert running() == 1
    client.close()  # the client goes away mid-stream
    wait_for(lambda: running() == 0, 10, "the aborted stream to stop running", s.log_text)
    wait_for(lambda: "stream aborted by the client" in s.log_text(), 10, "the abort in the log", s.log_text)
