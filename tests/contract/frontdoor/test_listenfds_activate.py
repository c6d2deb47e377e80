"""The front door's sd_listen_fds against systemd's own socket activation: ``systemd-socket-activate``
(systemd's tool) binds two addresses, names them with ``--fdname`` and execs a probe with them from
descriptor 3 on and the three variables set, as a socket unit does.  The probe takes them with
:func:`gpushift.frontdoor.listenfds.listen_fds`, reports what it got, shows that a child of its own
sees none of the variables, and answers one connection on each socket."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from typing import Any

PROBE = r"""
import json, os, socket, subprocess, sys
from gpushift.frontdoor.listenfds import listen_fds
got = listen_fds()
child = subprocess.run([sys.executable, "-c", "import os, json; print(json.dumps({k: os.environ.get(k) for k in ('LISTEN_PID', 'LISTEN_FDS', 'LISTEN_FDNAMES')}))"], capture_output=True, text=True)
print(json.dumps({"sockets": [[s.fd, s.name, s.address] for s in got], "child": json.loads(child.stdout)}), flush=True)
for s in got:
    s.sock.setblocking(True)
    conn, _ = s.sock.accept()
    conn.sendall(s.address.encode())
    conn.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connect(port: int, deadline_s: float = 20.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def test_sockets_passed_by_systemd_socket_activate_are_taken_named_and_served(procs: Any) -> None:
    tool = shutil.which("systemd-socket-activate")
    assert tool, "systemd-socket-activate is missing (Debian/Ubuntu: apt-get install systemd)"
    a, b = _free_port(), _free_port()
    p = procs.start(
        [tool, "-l", f"127.0.0.1:{a}", "-l", f"127.0.0.1:{b}", "--fdname=frontdoor:frontdoor-b",
         sys.executable, "-c", PROBE]
    )  # fmt: skip
    # The tool binds at once and execs the probe on the first connection (it is not --accept).
    first = _connect(a)
    assert p.stdout is not None
    report = json.loads(p.stdout.readline() or "{}")
    assert report.get("sockets") == [
        [3, "frontdoor", f"127.0.0.1:{a}"],
        [4, "frontdoor-b", f"127.0.0.1:{b}"],
    ], (report, p.stderr.read() if p.poll() is not None and p.stderr else "")
    assert report["child"] == {"LISTEN_PID": None, "LISTEN_FDS": None, "LISTEN_FDNAMES": None}
    assert first.recv(100) == f"127.0.0.1:{a}".encode()
    first.close()
    with _connect(b) as second:
        assert second.recv(100) == f"127.0.0.1:{b}".encode()
    assert p.wait(20) == 0
