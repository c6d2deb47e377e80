"""A port impostor for the tests and the soak: another user's process that binds a backend's port and
answers 200 on every path, ``{"version": V}`` on ``/version`` (issue 20: only the backend unit's
own process may count as the backend).

:func:`start` runs it as user ``nobody`` when the caller is root (else as the caller), outside every
unit of the sandbox's manager; it prints ``listening`` once bound (and exits 1 when the port is
taken), then one line per request it was sent (``GET /health``).  The program is passed with
``python -c``: user nobody need not be able to read the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

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
