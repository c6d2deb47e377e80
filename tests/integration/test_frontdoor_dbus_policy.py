"""The front door's SHIPPED D-Bus policy on a REAL dbus-daemon shaped like the system bus.

The bus (type system, EXTERNAL auth, the system bus's default policy: no name owned and no method
called without a service's own hole) ``<include>``s both shipped policies,
``etc/dbus-1/system.d/org.gpushift.Switcher1.conf`` and ``org.gpushift.FrontDoor1.conf``, by absolute
path.  The REAL daemon link runs as user ``gpushift-frontdoor`` (made for these tests where missing,
with the shipped sysusers.d line's fields, and removed again only then); a scripted Switcher1 runs as
root, as the daemon does.  What is shown: only ``gpushift-frontdoor`` may own the name (not root, not
nobody); as that user the link reads the daemon's properties and owns its name; root's calls reach
it; nobody's calls and introspection are refused by the bus before the front door sees them.

Runs as root (setpriv); fails, never skips, without dbus-daemon, setpriv, useradd or userdel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.frontdoor_sandbox import SHIPPED_POLICY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract" / "frontdoor"))
from switcher_double import SwitcherDouble  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).resolve().parent / "frontdoor_policy_helper.py"
SWITCHER_POLICY = REPO / "etc" / "dbus-1" / "system.d" / "org.gpushift.Switcher1.conf"
USER = "gpushift-frontdoor"
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
DENIED = "org.freedesktop.DBus.Error.AccessDenied"
BUS = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  <include>{switcher}</include>
  <include>{frontdoor}</include>
</busconfig>
"""


@pytest.fixture(scope="module")
def frontdoor_uid() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.fail(
            "the front door's policy tests run as root (they switch users with setpriv)", pytrace=False
        )
    for tool in ("dbus-daemon", "setpriv", "useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed (apt-get install dbus util-linux passwd)", pytrace=False)
    created = False
    try:
        uid = pwd.getpwnam(USER).pw_uid
    except KeyError:  # the shipped sysusers.d line: a system user, its own group, home /, no shell
        subprocess.run(
            ["useradd", "--system", "--user-group", "--home-dir", "/", "--no-create-home",
             "--shell", "/usr/sbin/nologin", "--comment", "gpushift front door", USER],
            check=True, capture_output=True,
        )  # fmt: skip
        created = True
        uid = pwd.getpwnam(USER).pw_uid
    try:
        yield uid
    finally:
        if created:
            subprocess.run(["userdel", USER], check=False, capture_output=True)


@pytest.fixture
def system_bus(frontdoor_uid: int) -> Iterator[str]:
    base = Path(tempfile.mkdtemp(prefix="gpushift-fd-policy-", dir="/run"))
    base.chmod(0o755)
    sock = base / "system_bus_socket"
    conf = base / "bus.conf"
    conf.write_text(BUS.format(socket=sock, switcher=SWITCHER_POLICY, frontdoor=SHIPPED_POLICY))
    p = subprocess.Popen(
        [
            "dbus-daemon",
            f"--config-file={conf}",
            "--nofork",
            "--nopidfile",
            "--nosyslog",
            "--print-address=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], 10)
        assert ready and p.stdout.readline().strip(), p.stderr.read() if p.stderr else b""
        yield f"unix:path={sock}"
    finally:
        p.kill()
        p.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def as_user(user: str) -> list[str]:
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]


def helper(prefix: list[str], *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    r = subprocess.run(
        [*prefix, sys.executable, str(HELPER), *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_only_the_front_doors_user_may_own_its_name(system_bus: str) -> None:
    name = "org.gpushift.FrontDoor1"
    assert helper([], "own", system_bus, name) == {"error": DENIED}  # not even root
    assert helper(AS_NOBODY, "own", system_bus, name) == {"error": DENIED}
    assert helper(as_user(USER), "own", system_bus, name) == {"answer": 1}
    assert helper(as_user(USER), "own", system_bus, "org.gpushift.Switcher1") == {"error": DENIED}


def test_the_link_as_its_user_reads_the_daemon_and_only_root_reaches_it(system_bus: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    link = subprocess.Popen(
        [*as_user(USER), sys.executable, str(HELPER), "link", system_bus],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    lines: list[dict[str, Any]] = []

    def until(cond: Any, timeout_s: float = 30.0) -> dict[str, Any]:
        assert link.stdout is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for got in lines:
                if cond(got):
                    return got
            ready, _, _ = select.select([link.stdout], [], [], 0.2)
            if ready:
                line = link.stdout.readline()
                if not line:
                    break
                lines.append(json.loads(line))
        raise AssertionError(
            f"the link never printed what was awaited: {lines}\n{link.stderr.read() if link.poll() is not None and link.stderr else ''}"
        )

    async def scenario() -> None:
        daemon = await SwitcherDouble(
            system_bus, {"ActiveBackend": "vllm", "SwitchInProgress": False}
        ).start()
        try:
            await asyncio.to_thread(until, lambda g: g.get("owns") is True)
            view = await asyncio.to_thread(until, lambda g: (g.get("view") or {}).get("connected"))
            assert view["view"] == {"connected": True, "active": "vllm", "switching": False}
            assert await daemon.call_frontdoor("Close", "s", "vllm") == (2,)  # root, the daemon
            await asyncio.to_thread(until, lambda g: g.get("call") == ["close", "vllm"])
        finally:
            await daemon.stop()

    try:
        asyncio.run(scenario())
        for member in ("Close", "Status", "Introspect"):
            args = ["vllm"] if member == "Close" else []
            assert helper(AS_NOBODY, "call", system_bus, member, *args) == {"error": DENIED}, member
        assert helper([], "call", system_bus, "InFlight", "vllm") == {"body": [0]}  # root may
        calls = [g["call"] for g in lines if "call" in g]
        assert ["status", None] not in calls and calls.count(["close", "vllm"]) == 1, calls
    finally:
        link.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            link.wait(10)
        if link.poll() is None:
            link.kill()
            link.wait(10)
