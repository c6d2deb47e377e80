"""A port impostor for the tests and the soak: another user's process that binds a backend's port and
answers 200 on every path, ``{"version": V}`` on ``/version`` (issue 20: only the backend unit's
own process may count as the backend).

:func:`start` runs it as user ``nobody`` when the caller is root (else as the caller), outside every
unit of the sandbox's manager; it prints ``listening`` once bound (and exits 1 when the port is
taken), then one line per request it was sent (``GET /health``).  The program is passed with
``python -c``: user nobody need not be able to read the checkout.

For the end-to-end tests: :func:`require_root`, :func:`listening` (start it and wait until it
listens, its output read by :class:`tests.support.procs.Lines`) and :func:`version_of`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from tests.support.procs import Lines

#: The version the impostor claims.
VERSION = "6.6.6-impostor"

#: argv: port version.
SCRIPT = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, version = int(sys.argv[1]), sys.argv[2]

class H(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        print("GET", self.path, flush=True)
        self._send({"version": version} if self.path.startswith("/version") else {"status": "ok"})
    def do_POST(self):
        print("POST", self.path, flush=True)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"index": 0, "text": "impostor", "finish_reason": "stop"}]})

try:
    server = ThreadingHTTPServer(("127.0.0.1", port), H)
except OSError as e:
    print("cannot bind:", e, flush=True)
    sys.exit(1)
print("listening", flush=True)
server.serve_forever()
"""


def argv(port: int, version: str = VERSION) -> list[str]:
    """The impostor's command line: as user nobody (without root's groups) when we are root."""
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise AssertionError("setpriv (util-linux) is needed to run the port impostor as user nobody")
    prefix = as_nobody if os.geteuid() == 0 else []
    return [*prefix, sys.executable, "-c", SCRIPT, str(port), version]


def start(port: int, version: str = VERSION) -> subprocess.Popen[str]:
    """Start the impostor on ``port``; the caller reads ``listening`` (or ``cannot bind``) from its
    stdout and ends it by PID."""
    return subprocess.Popen(argv(port, version), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Waits(Protocol):
    """What :func:`listening` waits with (the integration tests' ``GpushiftEnv``)."""

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> None: ...


def require_root() -> None:
    """A test whose impostor must run as user nobody fails (it does not skip) when not run as root."""
    if os.geteuid() != 0:
        raise AssertionError("this test must run as root: its impostor runs as user nobody")


def listening(procs: list[subprocess.Popen[str]], port: int, env: Waits) -> tuple[int, Lines]:
    """The impostor (user nobody) on ``port``, once it listens, added to ``procs`` (the processes the
    test ends by PID); returns its PID and its output."""
    p = start(port)
    procs.append(p)
    out = Lines(p)
    env.wait_for(lambda: "listening" in out.lines or p.poll() is not None, 30, "the impostor to listen")
    assert p.poll() is None, f"the impostor did not start: {out.lines}"
    return p.pid, out


def version_of(port: int) -> str:
    """The version that whatever listens on ``port`` answers on ``/version``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=10) as r:
        return str(json.loads(r.read())["version"])
