"""Hostile clients against the socket-activated front door, all at once, while a normal client's
request goes through: 2,000 idle connections, a head that never finishes, a body over
``max_body_bytes``, a body that is not JSON.  Each gets its error; the normal request is answered
by the backend; the front door (same process) and what serves are unchanged afterwards, and the
idle connections are closed by the front door's head deadline.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
from pathlib import Path
from typing import Any

import pytest
from frontdoor_env import DAY, DoorEnv, error_of, post, standin_backend

IDLE = 2000
MAX_BODY = 65536
HEAD_TIMEOUT_S = 3


def _read_all(sock: socket.socket, deadline_s: float) -> bytes:
    sock.settimeout(deadline_s)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.timeout(600)
def test_hostile_clients_get_their_errors_while_a_normal_request_goes_through(sandbox: Any) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 4096), hard))
    env = DoorEnv(
        sandbox,
        Path(sandbox.base_dir) / "gs",
        [standin_backend("day", DAY)],
        frontdoor_lines=(
            f"header_timeout_s = {HEAD_TIMEOUT_S}",
            "body_timeout_s = 3",
            f"max_body_bytes = {MAX_BODY}",
        ),
        sample_interval_s=0.5,
    ).up()
    env.cli("switch", "day", check=True)
    pid = env.door.activate()
    port = env.door_ports[0]
    idle: list[socket.socket] = []
    hostile: list[socket.socket] = []
    try:
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        slow = socket.create_connection(("127.0.0.1", port), timeout=30)
        hostile.append(slow)
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: applica")  # never finished
        huge = socket.create_connection(("127.0.0.1", port), timeout=30)
        hostile.append(huge)
        huge.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY * 4}\r\n\r\n".encode()
            + b"x" * 4096
        )
        # the normal client, beside all of them (its deadline: a generous 60 s)
        status, headers, raw = post(env.url("/v1/completions"), {"model": DAY, "prompt": "x"}, timeout_s=60)
        assert status == 200 and headers["x-standin-port"] == str(env.backends["day"].port), raw
        assert json.loads(raw)["object"] == "text_completion"
        status, _h, raw = post(env.url("/v1/completions"), b'{"model": "day-model", "prompt": ')
        assert status == 400 and error_of(raw)["message"], raw
        status, _h, raw = post(env.url("/v1/completions"), {"model": 7, "prompt": "x"})
        assert status == 400 and error_of(raw)["param"] == "model", raw
        answer = _read_all(huge, 30)
        assert _status(answer) == 413, answer[:300]
        answer = _read_all(slow, HEAD_TIMEOUT_S + 30)
        assert _status(answer) == 408, answer[:300]
        # the idle ones: each closed by the head deadline, with its 408 (a sample is read)
        for sock in idle[:: IDLE // 20]:
            answer = _read_all(sock, HEAD_TIMEOUT_S + 30)
            assert _status(answer) == 408, answer[:300]
    finally:
        for sock in idle + hostile:
            sock.close()
    assert env.door.main_pid() == pid, env.door.log()
    assert env.status().get("active") == "day"
    status, _h, raw = post(env.url("/v1/completions"), {"model": DAY, "prompt": "x"})
    assert status == 200, raw
