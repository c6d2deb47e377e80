"""A local user cannot take the daemon down through ``/metrics`` (issue 20, point 1).

The shipped gpushift.service under a private systemd user manager serves ``/metrics``.  From user
``nobody`` (setpriv, without root's groups) a flooder holds 2,000 idle connections to it (every one
the listener closes is opened again) and a slow client sends its request's headers one byte a
second.  Meanwhile the daemon keeps its PID and its restart count, its open descriptors (the entries
of ``/proc/PID/fd``) stay under half of the unit's ``LimitNOFILE=``, ``gpushift status`` answers and
a ``gpushift switch`` completes; the slow client is cut off by the header deadline; once the flood
ends a normal scrape works.  Before the bounded listener (prometheus-client's thread per
connection) the descriptors passed the bound and GLib aborted the daemon ("Creating pipes for
GWakeup: Too many open files").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, end, free_port

from tests.support.procs import Lines

REPO = Path(__file__).resolve().parents[2]

#: Runs a command as user nobody, without root's groups (the tests run as root).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

CONNECTIONS = 2000

#: argv: host port count.  Holds ``count`` connections (non-blocking, never sending a byte) and
#: opens again every one the server closes, until it is ended.  Opened 25 every 0.1 s: a burst
#: overflows the accept queue, and the handshakes then lost (SYN cookies) never reach the server.
#: Prints "flooding" once ``count`` were opened, then every 2 s how many are established.
FLOODER = r"""
import selectors, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
established = set()
to_open, said, last, batch = count, False, 0.0, 0.0

def open_one():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex((host, port))
    sel.register(s, selectors.EVENT_WRITE)

while True:
    if to_open and time.monotonic() - batch >= 0.1:
        batch = time.monotonic()
        for _ in range(min(to_open, 25)):
            open_one()
            to_open -= 1
    if not to_open and not said:
        said = True
        print("flooding", flush=True)
    for key, _mask in sel.select(0.1):
        s = key.fileobj
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if s not in established and err == 0:
            established.add(s)
            sel.modify(s, selectors.EVENT_READ)
            continue
        try:
            gone = err != 0 or s.recv(4096) == b""  # a byte the server sent is dropped
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:  # closed by the server (or refused): open another one
            sel.unregister(s)
            established.discard(s)
            s.close()
            to_open += 1
    if time.monotonic() - last > 2:
        last = time.monotonic()
        print("established", len(established), flush=True)
"""

#: argv: host port.  Sends a request's head one byte a second; prints "closed after N s" when the
#: server closes the connection, "sent all" if it never does.
SLOW_HEADERS = r"""
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=30)
print("connected", flush=True)
t0 = time.monotonic()
head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"s" * 200 + b"\r\n\r\n"
try:
    for b in head[:-4]:
        s.send(bytes([b]))
        time.sleep(1)
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                break
        except BlockingIOError:
            pass
        finally:
            s.setblocking(True)
    else:
        print("sent all", flush=True)
        time.sleep(3600)
except OSError:
    pass
print(f"closed after {time.monotonic() - t0:.1f} s", flush=True)
"""


def unit_nofile() -> int:
    """The shipped unit's ``LimitNOFILE=`` (its soft limit: the first of ``SOFT:HARD``)."""
    for line in (REPO / "units" / "gpushift.service").read_text().splitlines():
        if line.startswith("LimitNOFILE="):
            return int(line.split("=", 1)[1].split(":")[0])
    raise AssertionError("units/gpushift.service sets no LimitNOFILE=")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        raise AssertionError(f"the daemon (PID {pid}) is gone") from None


def scrape(env: GpushiftEnv) -> str:
    with urllib.request.urlopen(env.metrics_url(), timeout=10) as r:
        return str(r.read().decode())


def test_metrics_flood_from_nobody_leaves_the_daemon_running_under_its_descriptor_bound(
    sandbox: Any, procs: list[subprocess.Popen[str]]
) -> None:
    if os.geteuid() != 0:
        raise AssertionError("this test must run as root: it floods the daemon as user nobody")
    bound = unit_nofile() // 2
    a = Backend("a", free_port(), [0, 1])
    b = Backend("b", free_port(), [1])
    listen = f"127.0.0.1:{free_port()}"
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a, b], metrics_listen=listen).up()
    env.cli("switch", "a", "--reason", "setup", check=True)
    assert "gpushift_build_info" in scrape(env)
    pid = env.main_pid("gpushift.service")
    restarts = sandbox.show("gpushift.service", "NRestarts")["NRestarts"]
    baseline = open_fds(pid)
    assert baseline < bound, (baseline, bound)
    host, port = listen.rsplit(":", 1)

    flooder = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", FLOODER, host, port, str(CONNECTIONS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(flooder)
    flood = Lines(flooder)
    slow = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", SLOW_HEADERS, host, port], stdout=subprocess.PIPE, text=True
    )
    procs.append(slow)
    slow_out = Lines(slow)
    most = baseline

    def check() -> int:
        """The daemon is the same process, under its bound; returns its descriptors now."""
        nonlocal most
        now_pid = env.main_pid("gpushift.service")
        assert now_pid == pid, (
            f"the daemon was restarted (PID {pid} -> {now_pid})\n{env.daemon_log()[-3000:]}"
        )
        n = open_fds(pid)
        most = max(most, n)
        assert n < bound, f"the daemon holds {n} descriptors, the bound is {bound}"
        assert flooder.poll() is None, "the flooder ended"
        return n

    def answers() -> None:
        """``gpushift status`` answers, from the daemon that runs."""
        state = env.status()["daemon"]["state"]
        assert state in ("idle", "switching"), f"status says {state}\n{env.daemon_log()[-3000:]}"

    env.wait_for(lambda: flood.has("flooding"), 60, "the flooder to open its connections")
    # The flood reached the listener: the daemon holds many more descriptors than before.
    env.wait_for(lambda: check() >= baseline + 32, 60, "the daemon to accept the flood's connections")

    # While the flood lasts: status answers, a switch completes, the descriptors stay bounded.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        check()
        answers()
        time.sleep(0.5)
    r = env.cli("switch", "b", "--reason", "during the flood", timeout_s=180)
    check()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.daemon_log()[-3000:]}"
    answers()

    # The slow client is cut off by the header deadline; the descriptors stayed bounded meanwhile.
    env.wait_for(lambda: check() > 0 and slow_out.has("closed after"), 90, "the slow client to be closed")
    assert slow_out.has("sent all") is None
    check()
    assert flood.has("established"), flood.lines[-5:]

    end(flooder)
    end(slow)
    env.wait_for(lambda: open_fds(pid) < baseline + 8, 60, "the flood's connections to be closed")
    assert "gpushift_build_info" in scrape(env)
    assert env.main_pid("gpushift.service") == pid
    assert sandbox.show("gpushift.service", "NRestarts")["NRestarts"] == restarts
    print(f"descriptors: baseline {baseline}, most {most}, bound {bound}")
