"""The front door under a real systemd: socket-activated from its shipped units in the sandbox's
user manager, in front of the real daemon and stand-in backends (``frontdoor_env.py``).

* The first connection starts the service (``Type=notify``: active once it serves), which takes the
  socket unit's sockets (``activated``), owns ``org.gpushift.FrontDoor1`` on the sandbox's bus (its
  shipped policy), forwards a streamed chat completion to the serving backend, and runs with the
  unit's confinement (no capabilities, no new privileges, a system call filter).
* The service's ``IPAddressDeny=any``/``IPAddressAllow=localhost`` do not stop clients from the
  network: a client connecting from this machine's non-loopback address is answered (the accepted
  connection is the socket unit's), while the front door itself cannot reach that address.
* 16 clients send requests without pause while the front door is restarted twice and the daemon is
  SIGKILLed (systemd restarts both): no connection is refused, every request is answered 200 by the
  backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from frontdoor_env import DAY, DoorEnv, get, non_loopback_address, post, standin_backend

CLIENTS = 16


def _status_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return {k: v.strip() for k, v in (ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)}


def _env(sandbox: Any, **opts: Any) -> DoorEnv:
    base = Path(sandbox.base_dir) / "gs"
    day = standin_backend("day", DAY, "--request-seconds", "0.05")
    return DoorEnv(sandbox, base, [day], sample_interval_s=0.5, **opts)


def _chunks(body: bytes) -> list[str]:
    return [e[len(b"data: ") :].decode() for e in body.split(b"\n\n") if e.startswith(b"data: ")]


def test_the_first_connection_starts_the_front_door_which_forwards_to_the_serving_backend(
    sandbox: Any,
) -> None:
    env = _env(sandbox).up()
    env.cli("switch", "day", "--reason", "front door test", check=True)
    assert env.door.state()["ActiveState"] == "inactive"  # nothing started it yet: the socket listens
    assert sandbox.show("gpushift-frontdoor.socket", "ActiveState")["ActiveState"] == "active"
    body = {"model": DAY, "messages": [{"role": "user", "content": "hi"}], "stream": True, "chunks": 4}
    status, headers, raw = post(env.url("/v1/chat/completions"), body)  # this connection starts it
    assert status == 200, (raw, env.door.log())
    assert headers["x-standin-port"] == str(env.backends["day"].port)
    events = _chunks(raw)
    assert events[-1] == "[DONE]" and len(events) == 1 + 1 + 4 + 1  # role, 4 words, finish, DONE
    pid = env.door.wait_active()
    serving = env.door.events("frontdoor_serving")
    assert serving and serving[-1].get("GPUSHIFT_ACTIVATED") == "true", serving
    assert json.loads(serving[-1]["GPUSHIFT_LISTEN"]) == [f"[::]:{p}" for p in env.door_ports]
    # the second socket of the unit serves too, and /v1/models lists what serves
    status, _h, raw = get(env.url("/v1/models", env.door_ports[1]))
    assert status == 200 and DAY in [m["id"] for m in json.loads(raw)["data"]], raw
    # it owns its name on the sandbox's bus (the shipped policy, for the sandbox's user)
    owner = env.sb.systemctl("show", "gpushift-frontdoor.service", "-p", "MainPID").stdout
    names = sandbox.journal("SYSLOG_IDENTIFIER=gpushift-frontdoor", "GPUSHIFT_EVENT=frontdoor_name_owned")
    assert names, env.door.log()
    assert owner.strip() == f"MainPID={pid}"
    # the unit's confinement is on the process
    fields = _status_fields(pid)
    assert fields["CapEff"] == "0000000000000000" and fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    # the daemon sees it: gpushift status names the front door and its addresses (the daemon's
    # figure is sampled: one taken before the front door owned its name says it did not answer)
    env.wait_for(
        lambda: (env.status().get("frontdoor") or {}).get("answered") is True,
        60,
        "status: front door answered",
    )
    st = env.status()
    assert st["frontdoor"]["answered"] is True, st.get("frontdoor")


def test_clients_from_the_network_are_the_socket_units_and_the_service_reaches_only_loopback(
    sandbox: Any,
) -> None:
    env = _env(sandbox).up()
    env.cli("switch", "day", check=True)
    outside = non_loopback_address()
    env.door.activate()
    conn = socket.create_connection((outside, env.door_ports[0]), timeout=30)
    try:
        body = json.dumps({"model": DAY, "prompt": "x"}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {outside}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
    finally:
        conn.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    # the service's own sockets are filtered: a process in its cgroup cannot reach that address,
    # but reaches loopback
    assert _connect_from_cgroup_of(sandbox, "gpushift-frontdoor.service", outside, env.door_ports[0]) != 0
    assert _connect_from_cgroup_of(sandbox, "gpushift-frontdoor.service", "127.0.0.1", env.door_ports[0]) == 0


def _unified_root() -> str:
    """Where the cgroup v2 hierarchy is mounted (the hybrid layout's ``unified``, or pure v2)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split()[:1] == ["cgroup2"]:
                return pre.split()[4]
    raise AssertionError("no cgroup v2 hierarchy is mounted (the BPF firewall of IPAddressDeny= needs one)")


def _connect_from_cgroup_of(sandbox: Any, unit: str, host: str, port: int) -> int:
    """A probe of this test's, moved into ``unit``'s cgroup before it makes its socket, connects to
    host:port (3 s); its exit status (0: connected)."""
    group = sandbox.show(unit, "ControlGroup")["ControlGroup"]
    code = (
        "import socket, sys\nsys.stdin.readline()\n"
        f"socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        with open(os.path.join(_unified_root(), group.lstrip("/"), "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.close()
        return p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _client(env: DoorEnv, stop: threading.Event, results: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            status, headers, raw = post(
                env.url("/v1/completions"), {"model": DAY, "prompt": "x"}, timeout_s=60
            )
            results.append(
                {"t": t0, "status": status, "port": headers.get("x-standin-port"), "body": raw[:200]}
            )
        except OSError as e:
            results.append({"t": t0, "error": f"{type(e).__name__}: {e}"})


@pytest.mark.timeout(600)
def test_restarting_the_front_door_and_killing_the_daemon_refuse_and_lose_nothing(sandbox: Any) -> None:
    env = _env(sandbox).up()
    env.cli("switch", "day", check=True)
    first = env.door.activate()
    stop = threading.Event()
    results: list[list[dict[str, Any]]] = [[] for _ in range(CLIENTS)]
    threads = [threading.Thread(target=_client, args=(env, stop, r)) for r in results]
    for t in threads:
        t.start()
    try:

        def answered() -> int:
            return sum(len(r) for r in results)

        def more(n: int, what: str) -> None:
            target = answered() + n
            env.wait_for(lambda: answered() >= target, 120, what)

        more(100, "the clients' first requests")
        sandbox.systemctl("restart", "gpushift-frontdoor.service", timeout_s=120)
        second = env.door.wait_active()
        more(100, "requests after the first restart")
        killed = env.kill_daemon()
        more(100, "requests while and after the daemon was killed")
        sandbox.systemctl("restart", "gpushift-frontdoor.service", timeout_s=120)
        third = env.door.wait_active()
        more(100, "requests after the second restart")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert len({first, second, third}) == 3, (first, second, third)
    assert env.main_pid("gpushift.service") not in (0, killed)
    every = [x for r in results for x in r]
    failed = [x for x in every if x.get("status") != 200]
    assert not failed, f"{len(failed)} of {len(every)} requests failed: {failed[:5]}\n{env.door.log()}"
    assert {x["port"] for x in every} == {str(env.backends["day"].port)}
    with contextlib.suppress(Exception):
        print(f"front door restarts: {len(every)} requests from {CLIENTS} clients, none refused or lost")
