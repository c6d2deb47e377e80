"""The whole front door end to end, for ``test_frontdoor_*_e2e.py``: the real daemon
(``units/gpushift.service``) and stand-in backends in the sandbox's systemd user manager, and the
real front door socket-activated from its shipped units (``tests/support/frontdoor_sandbox.py``),
all reading one config with a ``[frontdoor]`` table.

:class:`DoorEnv` is :class:`gpushift_env.GpushiftEnv` plus the front door: ``up()`` installs and
starts everything, the socket unit listening on ``[::]:PORT`` (free ports of this test) as shipped
(``BindIPv6Only=both``).  Clients reach it on 127.0.0.1 through :meth:`DoorEnv.url`.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support import busctl as bc
from tests.support.frontdoor_sandbox import SandboxFrontDoor

#: Each stand-in backend serves one model, named on its command line as vLLM would
#: (``--served-model-name``) and in the config (``models``); both answer to the alias "default".
DAY, NIGHT = "day-model", "night-model"


def standin_backend(name: str, model: str, *args: str, **kw: Any) -> Backend:
    return Backend(
        name,
        free_port(),
        [0, 1],
        args=["--served-model-name", model, *args],
        extra_config=[f'models = ["{model}"]', 'aliases = ["default"]', *kw.pop("extra_config", [])],
        **kw,
    )


class DoorEnv(GpushiftEnv):
    """A daemon, its backends and the front door, in one sandbox."""

    def __init__(
        self,
        sandbox: Any,
        base: Path,
        backends: list[Backend],
        frontdoor_lines: tuple[str, ...] = (),
        **opts: Any,
    ) -> None:
        super().__init__(sandbox, base, backends, **opts)
        self.door_ports = [free_port(), free_port()]
        self.frontdoor_lines = frontdoor_lines
        self.door = SandboxFrontDoor(sandbox, self.config_path, [f"[::]:{p}" for p in self.door_ports])

    def config_text(self) -> str:
        listen = ", ".join(f'"[::]:{p}"' for p in self.door_ports)
        table = ["", "[frontdoor]", f"listen = [{listen}]", "bus_timeout_s = 5", *self.frontdoor_lines]
        return super().config_text() + "\n".join(table) + "\n"

    def up(self) -> DoorEnv:
        self.install()
        self.door.install()
        self.start_daemon()
        self.door.start_socket()
        return self

    def url(self, path: str, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.door_ports[0]}{path}"

    def property(self, name: str) -> str:
        return bc.get_property(["--user"], name, env=self.sb.env)

    def wait_serving(self, backend: str, timeout_s: float = 90) -> None:
        self.wait_for(lambda: self.status().get("active") == backend, timeout_s, f"{backend} serving")


def post(
    url: str, body: dict[str, Any] | bytes, timeout_s: float = 60, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One POST on a connection of its own (``Connection: close``): (status, headers, body)."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.request(
            "POST",
            path,
            data,
            {"Content-Type": "application/json", "Connection": "close", **(headers or {})},
        )
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def get(url: str, timeout_s: float = 30) -> tuple[int, dict[str, str], bytes]:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def error_of(body: bytes) -> dict[str, Any]:
    """The OpenAI-format error of a body (``{"error": {...}}``)."""
    doc = json.loads(body)
    assert set(doc) == {"error"} and {"message", "type", "param", "code"} <= set(doc["error"]), doc
    return dict(doc["error"])


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (a client "from the network")."""
    r = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/", 1)[0]
    raise AssertionError(
        f"this machine has no non-loopback IPv4 address (ip -o -4 addr: {r.stdout!r} {r.stderr!r})"
    )


def wait_port_answers(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
