"""A real headless Chromium (Debian's ``chromium`` package) as the tests' browser, driven through the
DevTools protocol: open a page, evaluate JavaScript in it (to read its live DOM), take a screenshot.

:class:`Chromium` starts ``chromium --headless --no-sandbox --remote-debugging-port=0`` with a
profile of its own, reads the DevTools address it prints, and opens pages as targets
(``/json/new``); each :class:`Page` speaks the protocol over a WebSocket (a small client of RFC
6455 written here: text frames, masked, no extensions).  :meth:`Chromium.stop` ends the browser
and every process it started, by PID (recorded with their start times), also when a test fails.
A missing ``chromium`` fails with its name.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.procs import alive, end_pid, proc_starttime

DEADLINE_S = 60.0


def require() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise AssertionError(
            "chromium (Debian's package 'chromium') is needed: the status page's tests use it"
        )
    return path


def _descendants(root: int) -> list[tuple[int, int | None]]:
    """(PID, start time) of every process below ``root``."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            data = Path(f"/proc/{name}/stat").read_bytes()
            parents[int(name)] = int(data[data.rindex(b")") + 2 :].split()[1])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p:
                out.append((child, proc_starttime(child)))
                todo.append(child)
    return out


class WebSocket:
    """A WebSocket client connection (RFC 6455) to ``ws://host:port/path``: text messages only."""

    def __init__(self, url: str, timeout_s: float = DEADLINE_S) -> None:
        m = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert m, url
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "the DevTools WebSocket closed during its handshake"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head[:200]
        self._buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        head = bytes([0x81]) + (
            bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
            if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n)
        )  # fmt: skip
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the DevTools WebSocket closed"
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv(self) -> str:
        parts = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise AssertionError("the DevTools WebSocket was closed by the browser")
            if opcode in (0x9, 0xA):  # ping, pong: not a message
                continue
            parts += payload
            if b0 & 0x80:
                return parts.decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Page:
    """One tab, spoken to through the DevTools protocol."""

    def __init__(self, ws_url: str) -> None:
        self.ws = WebSocket(ws_url)
        self._id = 0
        self._lock = threading.Lock()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        with self._lock:
            self._id += 1
            my = self._id
            self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
            while True:
                msg = json.loads(self.ws.recv())
                if msg.get("id") == my:
                    if "error" in msg:
                        raise AssertionError(f"DevTools {method}: {msg['error']}")
                    return dict(msg.get("result") or {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"the page threw on {expression!r}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, deadline_s: float = DEADLINE_S, poll_s: float = 0.1) -> Any:
        """Evaluate ``expression`` until it is truthy; its value (AssertionError past the deadline)."""
        end = time.monotonic() + deadline_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"not within {deadline_s} s in the page: {expression}")
            time.sleep(poll_s)

    def screenshot(self, path: Path, width: int = 1000, height: int = 1100) -> Path:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.ws.close()


class Chromium:
    """A headless Chromium with a profile of its own under ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starttime: int | None = None
        self.devtools = ""  # http://127.0.0.1:PORT
        self.pages: list[Page] = []
        self.log = workdir / "chromium.log"

    def start(self) -> Chromium:
        exe = require()
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.workdir / 'profile'}", "about:blank"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        self.starttime = proc_starttime(self.proc.pid)
        end = time.monotonic() + DEADLINE_S
        while not self.devtools:
            m = re.search(rb"DevTools listening on ws://([0-9.]+:\d+)/", self.log.read_bytes())
            if m:
                self.devtools = f"http://{m.group(1).decode()}"
            elif self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(
                    f"chromium did not start its DevTools server:\n{self.log.read_text(errors='replace')}"
                )
            else:
                time.sleep(0.1)
        return self

    def open(self, url: str) -> Page:
        req = urllib.request.Request(f"{self.devtools}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=DEADLINE_S) as r:
            target = json.loads(r.read())
        page = Page(target["webSocketDebuggerUrl"])
        self.pages.append(page)
        page.call("Page.enable")
        page.call("Runtime.enable")
        return page

    def stop(self) -> None:
        """End the browser (SIGTERM, then SIGKILL) and anything of it still alive, by PID."""
        for p in self.pages:
            p.close()
        if self.proc is None:
            return
        below = _descendants(self.proc.pid)
        end_pid(self.proc.pid, self.starttime, self.proc, grace_s=10.0)
        for pid, started in below:
            if alive(pid, started):
                end_pid(pid, started, None, grace_s=3.0)
        self.proc = None
