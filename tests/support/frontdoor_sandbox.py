"""The front door in the test sandbox: its bus policy, and its shipped units made to run in the
sandbox's systemd user manager (socket-activated, as on a host).

**The bus.** The sandbox's bus is a session bus (:mod:`tests.support.sandbox`); :func:`bus_config`
gives it the distribution's session configuration plus the front door's SHIPPED policy
(``etc/dbus-1/system.d/org.gpushift.FrontDoor1.conf``), read from the checkout, with one change:
the user that may own ``org.gpushift.FrontDoor1`` is the user the sandbox's front door runs as
(:func:`sandbox_user`), not ``gpushift-frontdoor``.  Everything else is as shipped: nobody else may
own the name, only root may send to it.

**Which user.** A unit of the sandbox's manager runs as the manager's user unless it says
``User=``.  The tests run as root, so the manager is root's and could switch to another user, but
the account ``gpushift-frontdoor`` exists only where ``make install`` ran sysusers, the sandbox's
runtime directory (the bus's socket) is root's 0700, and the test's config lives beside it.  So the
sandboxed front door runs as the manager's user (root here), with every other line of the shipped
unit's hardening (no capabilities, ``PrivateUsers=``, the system call filter, ``IPAddressDeny=``,
...), and the policy names that user.

**The units.** :func:`socket_unit` and :func:`service_unit` are the shipped
``units/gpushift-frontdoor.socket`` and ``.service`` with only what a test must change: the listen
addresses (free ports of the test's), the command (this checkout's ``gpushift frontdoor --config``),
``User=``/``Group=`` left out (above), ``ProtectHome=read-only`` where the checkout or the Python
it runs lives under ``/home`` or ``/root`` (they must stay readable: here the interpreter is a
pyenv build under ``/root``), and the output to the sandbox's journal.
:class:`SandboxFrontDoor` installs them, starts the socket, and waits for what a test waits for.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHIPPED_POLICY = REPO / "etc" / "dbus-1" / "system.d" / "org.gpushift.FrontDoor1.conf"
SHIPPED_SOCKET = REPO / "units" / "gpushift-frontdoor.socket"
SHIPPED_SERVICE = REPO / "units" / "gpushift-frontdoor.service"
SHIPPED_USER = "gpushift-frontdoor"
SOCKET_UNIT = "gpushift-frontdoor.socket"
SERVICE_UNIT = "gpushift-frontdoor.service"
SESSION_CONF = ("/usr/share/dbus-1/session.conf", "/etc/dbus-1/session.conf")
GPUSHIFT = str(Path(sys.executable).parent / "gpushift")
#: Lines of the shipped service a unit of the sandbox's manager leaves out (see the module docstring).
LEFT_OUT = ("User", "Group")


def sandbox_user() -> str:
    """The user a unit of the sandbox's manager runs as (the manager's own: the test's user)."""
    return pwd.getpwuid(os.getuid()).pw_name


def policy_rules(user: str) -> str:
    """The shipped policy's rules (inside ``<busconfig>``), the owning user made ``user``."""
    text = SHIPPED_POLICY.read_text(encoding="utf-8")
    body = text.split("<busconfig>", 1)[1].rsplit("</busconfig>", 1)[0]
    assert f'<policy user="{SHIPPED_USER}">' in body, f"{SHIPPED_POLICY} no longer names {SHIPPED_USER}"
    return body.replace(f'<policy user="{SHIPPED_USER}">', f'<policy user="{user}">')


def bus_config(user: str | None = None) -> str:
    """The sandbox bus's configuration: the session bus's, then the front door's shipped policy."""
    session = next((p for p in SESSION_CONF if os.path.exists(p)), None)
    if session is None:
        raise FileNotFoundError(
            f"no session bus configuration at {' or '.join(SESSION_CONF)} (apt-get install dbus)"
        )
    return (
        '<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"\n'
        ' "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">\n'
        "<busconfig>\n"
        f"  <include>{session}</include>\n"
        f"  <!-- {SHIPPED_POLICY.relative_to(REPO)}, for the sandbox's front door user -->\n"
        f"{policy_rules(user or sandbox_user())}"
        "</busconfig>\n"
    )


def _lines(path: Path) -> list[str]:
    """The unit's lines, continuation lines joined (the shipped units use none in these keys)."""
    return path.read_text(encoding="utf-8").splitlines()


def socket_unit(listen: Sequence[str]) -> str:
    """The shipped socket unit listening on ``listen`` (``HOST:PORT``, ``[::]:PORT``) instead."""
    out: list[str] = []
    for line in _lines(SHIPPED_SOCKET):
        if line.startswith("ListenStream="):
            if not any(o.startswith("ListenStream=") for o in out):
                out += [f"ListenStream={a}" for a in listen]
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def _checkout_under_home() -> bool:
    """The checkout or the interpreter (a pyenv build under /root, say) lives where ``ProtectHome=yes``
    hides it."""
    paths = (str(REPO), os.path.realpath(sys.executable), sys.base_prefix)
    return any(p.startswith(h) for p in paths for h in ("/home/", "/root/", "/run/user/"))


def service_unit(
    config: str | os.PathLike[str],
    gpushift: str = GPUSHIFT,
    environment: Sequence[str] = (),
    service_lines: Sequence[str] = (),
) -> str:
    """The shipped service running this checkout's ``gpushift frontdoor --config CONFIG``."""
    out: list[str] = []
    for line in _lines(SHIPPED_SERVICE):
        key = line.split("=", 1)[0] if "=" in line and not line.startswith("#") else ""
        if key in LEFT_OUT:
            out.append(f"# {line}  (left out in the sandbox: tests/support/frontdoor_sandbox.py)")
            continue
        if key == "ExecStart":
            line = f"ExecStart={gpushift} frontdoor --config {config}"
        elif key == "ProtectHome" and _checkout_under_home():
            line = "ProtectHome=read-only"
        out.append(line)
        if line == "[Service]":
            out += [f"Environment={e}" for e in environment]
            out += ["StandardOutput=journal", "StandardError=journal"]
    text = "\n".join(out) + "\n"
    if service_lines:
        text = text.replace("\n[Install]\n", "\n" + "\n".join(service_lines) + "\n\n[Install]\n")
    return text


def port_of(address: str) -> int:
    m = re.search(r":(\d+)$", address)
    assert m, address
    return int(m.group(1))


class SandboxFrontDoor:
    """The front door's units installed in a started :class:`~tests.support.sandbox.Sandbox`."""

    def __init__(
        self, sandbox: Any, config: str | os.PathLike[str], listen: Sequence[str], **service: Any
    ) -> None:
        self.sb = sandbox
        self.config = str(config)
        self.listen = list(listen)
        self.service = service

    @property
    def ports(self) -> list[int]:
        return [port_of(a) for a in self.listen]

    def install(self) -> SandboxFrontDoor:
        self.sb.install_unit(SOCKET_UNIT, socket_unit(self.listen))
        self.sb.install_unit(SERVICE_UNIT, service_unit(self.config, **self.service))
        self.sb.daemon_reload()
        return self

    def start_socket(self) -> None:
        r = self.sb.systemctl("start", SOCKET_UNIT, check=False)
        assert r.returncode == 0, f"{SOCKET_UNIT} did not start: {r.stderr}\n{self.log()}"

    def state(self, unit: str = SERVICE_UNIT) -> dict[str, str]:
        return dict(self.sb.show(unit, "ActiveState", "SubState", "MainPID", "NRestarts", "Result"))

    def main_pid(self) -> int:
        return int(self.state().get("MainPID") or 0)

    def wait_active(self, timeout_s: float = 60.0) -> int:
        """Wait until the service is active (READY=1 came); its main PID."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.state()
            if st.get("ActiveState") == "active" and int(st.get("MainPID") or 0) > 0:
                return int(st["MainPID"])
            if time.monotonic() > deadline:
                raise AssertionError(f"{SERVICE_UNIT} not active within {timeout_s:g} s: {st}\n{self.log()}")
            time.sleep(0.05)

    def activate(self, timeout_s: float = 60.0) -> int:
        """One connection to the first port (socket activation starts the service); its main PID."""
        with socket.create_connection(("127.0.0.1", self.ports[0]), timeout=timeout_s):
            pass
        return self.wait_active(timeout_s)

    def log(self, lines: int = 60) -> str:
        return str(self.sb.journal_text("-u", SERVICE_UNIT, lines=lines))

    def events(self, event: str) -> list[dict[str, Any]]:
        """The front door's journal entries with ``GPUSHIFT_EVENT=event``."""
        return list(self.sb.journal("SYSLOG_IDENTIFIER=gpushift-frontdoor", f"GPUSHIFT_EVENT={event}"))
