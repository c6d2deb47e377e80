"""The D-Bus access rules, proven against a REAL dbus-daemon with the SHIPPED policy file.

Each test starts a private dbus-daemon whose config is shaped like the system bus (type system,
EXTERNAL auth, a unix socket under /run, a default policy that denies owning names and method
calls except to the bus itself) and ``<include>``s ``etc/dbus-1/system.d/org.gpushift.Switcher1.conf``
by absolute path.  As root, the real ``SwitcherService`` is published on it (``publish()``) over a
stub backend that answers fixed values and records who called (``dbus_policy_helper.py``).  The
real CLI and plain pydbus clients then call it as root, as user nobody (uid 65534), and as nobody
with group ``gpushift``.  A second, permissive bus shows the daemon's own check (defence in depth).

These tests run as root (setpriv switches users); they fail, never skip, when root, dbus-daemon,
setpriv or groupadd is missing.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED_POLICY = REPO / "etc" / "dbus-1" / "system.d" / "org.gpushift.Switcher1.conf"
HELPER = Path(__file__).resolve().parent / "dbus_policy_helper.py"
PY = sys.executable
GPUSHIFT = str(Path(sys.executable).parent / "gpushift")
NOBODY = 65534
GROUP = "gpushift"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

BUS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"
DAEMON_DENIED = "org.gpushift.Error.AccessDenied"

# What the system bus allows by default (the shape of /usr/share/dbus-1/system.conf): anyone may
# connect and talk to the bus itself; owning names and calling methods need a hole punched by a
# service's own policy file; replies and signals flow.
SYSTEM_LIKE_POLICY = """\
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
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"
          send_member="UpdateActivationEnvironment"/>
  </policy>
  <include>{shipped}</include>
"""

# A bus that lets every call through: only the service's own check stands between a caller and
# Switch.
PERMISSIVE_POLICY = """\
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow send_type="signal"/>
    <allow receive_sender="*"/>
  </policy>
"""


def bus_config(socket_path: Path, policy: str) -> str:
    return f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket_path}</listen>
  <auth>EXTERNAL</auth>
{policy}</busconfig>
"""


CLI_CONFIG = """\
[daemon]
bus = "system"
state_dir = "{state}"
runtime_dir = "{state}/run"
schedule = ""

[gpu]
provider = "simulated"

[backends.alpha]
unit = "gs-policy-alpha.service"
health_url = "http://127.0.0.1:9/health"
"""


def _require(cond: bool, what: str) -> None:
    if not cond:
        pytest.fail(f"the D-Bus policy tests need {what}")


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class PolicyBus:
    """A private system-like bus with the service published on it, and ways to call it as anyone."""

    def __init__(self, base: Path, policy: str) -> None:
        self.base = base
        self.socket = base / "bus"
        self.address = f"unix:path={self.socket}"
        self.bus_conf = base / "bus.conf"
        self.bus_conf.write_text(bus_config(self.socket, policy), encoding="utf-8")
        self.record = base / "calls.jsonl"
        self.config = base / "gpushift.toml"
        self.config.write_text(CLI_CONFIG.format(state=base / "state"), encoding="utf-8")
        self.bus_log = base / "dbus-daemon.log"
        self.service_log = base / "service.log"
        self.bus_proc: subprocess.Popen[bytes] | None = None
        self.service_proc: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------- lifecycle

    def env(self) -> dict[str, str]:
        # A clean environment: nothing may lead a client to another bus than the private one.
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self.base),
            "DBUS_SYSTEM_BUS_ADDRESS": self.address,
            "GPUSHIFT_CONFIG": str(self.config),
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def _read_line(self, proc: subprocess.Popen[bytes], timeout_s: float, what: str, log: Path) -> str:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line:
            proc.poll()
            pytest.fail(
                f"{what} did not come up within {timeout_s:g} s (exit {proc.returncode}):\n"
                f"{log.read_text(errors='replace') if log.exists() else ''}"
            )
        return line

    def start(self) -> None:
        with self.bus_log.open("wb") as log:
            self.bus_proc = subprocess.Popen(
                [
                    "dbus-daemon",
                    f"--config-file={self.bus_conf}",
                    "--nofork",
                    "--nopidfile",
                    "--nosyslog",
                    "--print-address=1",
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env(),
            )
        address = self._read_line(self.bus_proc, 10, "dbus-daemon", self.bus_log)
        assert str(self.socket) in address, address
        with self.service_log.open("wb") as log:
            self.service_proc = subprocess.Popen(
                [PY, str(HELPER), "serve", str(self.record)],
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env(),
                cwd="/",
            )
        line = self._read_line(self.service_proc, 20, "the published SwitcherService", self.service_log)
        assert line == "ready", line

    def stop(self) -> None:
        for proc in (self.service_proc, self.bus_proc):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    # ---------------------------------------------------------------- callers

    def cli(self, *args: str, prefix: list[str] | None = None) -> Run:
        """The real `gpushift` command, as root or under the setpriv ``prefix``."""
        p = subprocess.run(
            [*(prefix or []), GPUSHIFT, *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd="/",
            timeout=60,
        )
        return Run(p.returncode, p.stdout, p.stderr)

    def probe(self, method: str, *args: str, prefix: list[str] | None = None) -> dict[str, Any]:
        """A plain pydbus client: the result, or the D-Bus error name it saw."""
        p = subprocess.run(
            [*(prefix or []), PY, str(HELPER), "probe", method, *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd="/",
            timeout=60,
        )
        assert p.returncode == 0, f"probe {method} crashed:\n{p.stdout}\n{p.stderr}"
        return dict(json.loads(p.stdout))

    def calls(self) -> list[dict[str, Any]]:
        """What reached the stub backend, in order."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')}"
            for p in (self.bus_log, self.service_log)
            if p.exists()
        )


# -------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def group_gid() -> Iterator[int]:
    """Group ``gpushift``: created for these tests where missing, removed again only then."""
    _require(os.geteuid() == 0, "to run as root (they switch users with setpriv)")
    for tool in ("dbus-daemon", "setpriv", "groupadd", "groupdel"):
        _require(shutil.which(tool) is not None, f"{tool} (apt-get install dbus util-linux passwd)")
    created = False
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "-r", GROUP], check=True, capture_output=True)
        created = True
        gid = grp.getgrnam(GROUP).gr_gid
    try:
        yield gid
    finally:
        if created:
            subprocess.run(["groupdel", GROUP], check=False, capture_output=True)


@pytest.fixture
def as_member(group_gid: int) -> list[str]:
    """setpriv prefix: user nobody with group gpushift as its primary and only group."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={group_gid}", f"--groups={group_gid}"]


@contextlib.contextmanager
def _policy_bus(policy: str) -> Iterator[PolicyBus]:
    # Under /run, not /tmp: a system bus socket lives there, and the directory must be reachable
    # by the unprivileged callers.
    base = Path(tempfile.mkdtemp(prefix="gpushift-dbus-policy-", dir="/run"))
    try:
        base.chmod(0o755)
        pb = PolicyBus(base, policy)
        try:
            pb.start()
            yield pb
        finally:
            pb.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def system_bus(group_gid: int) -> Iterator[PolicyBus]:
    """System-like bus with the shipped policy (the group must exist before the bus reads it)."""
    with _policy_bus(SYSTEM_LIKE_POLICY.format(shipped=SHIPPED_POLICY)) as pb:
        yield pb


@pytest.fixture
def permissive_bus(group_gid: int) -> Iterator[PolicyBus]:
    with _policy_bus(PERMISSIVE_POLICY) as pb:
        yield pb


# -------------------------------------------------------------------- the shipped policy


def test_policy_root_may_switch_and_is_recorded(system_bus: PolicyBus) -> None:
    r = system_bus.cli("switch", "alpha", "--reason", "policy test")
    assert r.rc == 0, f"{r}\n{system_bus.logs()}"
    assert "stub switched to alpha" in r.out
    assert "starting stub unit of alpha" in r.out  # the Progress signal reached the CLI
    calls = system_bus.calls()
    assert [(c["method"], c["backend"], c["uid"]) for c in calls] == [("switch", "alpha", 0)]
    assert calls[0]["options"]["reason"] == "policy test"


def test_policy_anyone_may_introspect_and_read_status_from_the_daemon(system_bus: PolicyBus) -> None:
    r = system_bus.cli("status", "--json", prefix=AS_NOBODY)
    assert r.rc == 0, f"{r}\n{system_bus.logs()}"
    status = json.loads(r.out)
    # The stub's answer, not the CLI's local fallback view (that one says the daemon is down).
    assert status["active"] == "stub-marker-backend"
    assert status["daemon"]["version"] == "stub-0"

    intro = system_bus.probe("Introspect", prefix=AS_NOBODY)
    assert intro["ok"], intro
    assert '<interface name="org.gpushift.Switcher1">' in intro["value"]
    assert '<method name="Switch">' in intro["value"]
    got = system_bus.probe("GetStatus", prefix=AS_NOBODY)
    assert got["ok"], got
    assert json.loads(got["value"])["active"] == "stub-marker-backend"
    # The status page's redacted summary: the front door's user (in no group of ours) asks for it.
    got = system_bus.probe("GetSummary", prefix=AS_NOBODY)
    assert got["ok"], got
    assert json.loads(got["value"])["serving"] == {"backend": "stub-marker-backend"}


@pytest.mark.parametrize(
    "method,args",
    [
        ("Switch", ("alpha", "r")),
        ("SwitchWithOptions", ("alpha", "{}")),
        ("SwitchTo", ("alpha",)),
        ("Cancel", ()),
        ("Resume", ()),
        ("Reload", ()),
    ],
)
def test_policy_non_member_is_refused_by_the_bus_itself(
    system_bus: PolicyBus, method: str, args: tuple[str, ...]
) -> None:
    got = system_bus.probe(method, *args, prefix=AS_NOBODY)
    assert not got["ok"], got
    assert got["error"] == BUS_DENIED, got
    assert system_bus.calls() == []  # the call never reached the service


def test_policy_anyone_may_read_the_properties_with_busctl(system_bus: PolicyBus) -> None:
    """busctl as user nobody: every property readable, one by one and all at once."""
    _require(shutil.which("busctl") is not None, "busctl (systemd)")
    where = [f"--address={system_bus.address}"]
    obj = ["org.gpushift.Switcher1", "/org/gpushift/Switcher1", "org.gpushift.Switcher1"]

    def busctl(*args: str) -> Run:
        p = subprocess.run(
            [*AS_NOBODY, "busctl", *where, *args],
            capture_output=True,
            text=True,
            env=system_bus.env(),
            timeout=60,
        )
        return Run(p.returncode, p.stdout, p.stderr)

    r = busctl("get-property", *obj, "ActiveBackend", "Backends", "NextSwitch")
    assert r.rc == 0, f"{r}\n{system_bus.logs()}"
    assert r.out.splitlines() == ['s "stub-marker-backend"', 'as 2 "alpha" "beta"', '(st) "" 0']
    r = busctl("introspect", *obj)  # reads every property's value (GetAll)
    assert r.rc == 0, r
    assert ".Mode" in r.out and '"manual"' in r.out, r.out
    r = busctl("call", *obj, "SwitchTo", "sa{sv}", "alpha", "0")
    assert r.rc != 0 and "denied" in r.err.lower(), r
    assert system_bus.calls() == []


def test_policy_member_may_call_switch_to(system_bus: PolicyBus, as_member: list[str]) -> None:
    got = system_bus.probe("SwitchTo", "alpha", prefix=as_member)
    assert got["ok"], got
    assert [(c["method"], c["backend"], c["uid"], c["options"]) for c in system_bus.calls()] == [
        ("switch", "alpha", NOBODY, {"reason": ""})
    ]


def test_policy_non_member_cli_switch_exits_5_with_the_bus_refusal(system_bus: PolicyBus) -> None:
    r = system_bus.cli("switch", "alpha", prefix=AS_NOBODY)
    assert r.rc == 5, f"{r}\n{system_bus.logs()}"
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r
    assert lines[0].startswith("gpushift: the bus refused the call"), r
    assert system_bus.calls() == []


def test_policy_group_member_may_switch_and_its_uid_is_recorded(
    system_bus: PolicyBus, as_member: list[str]
) -> None:
    r = system_bus.cli("switch", "alpha", "--reason", "member", prefix=as_member)
    assert r.rc == 0, f"{r}\n{system_bus.logs()}"
    assert "stub switched to alpha" in r.out
    calls = system_bus.calls()
    assert [(c["method"], c["backend"], c["uid"]) for c in calls] == [("switch", "alpha", NOBODY)]
    assert calls[0]["user"] == "nobody"
    assert calls[0]["pid"] is not None

    got = system_bus.probe("Switch", "alpha", "plain", prefix=as_member)
    assert got["ok"], got
    assert system_bus.calls()[-1]["uid"] == NOBODY


# -------------------------------------------------------------------- defence in depth


def test_daemon_check_refuses_non_member_on_a_permissive_bus(permissive_bus: PolicyBus) -> None:
    got = permissive_bus.probe("Switch", "alpha", "r", prefix=AS_NOBODY)
    assert not got["ok"], got
    assert got["error"] == DAEMON_DENIED, got
    assert "uid 65534" in got["message"]

    r = permissive_bus.cli("switch", "alpha", prefix=AS_NOBODY)
    assert r.rc == 5, f"{r}\n{permissive_bus.logs()}"
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r
    assert "may not change the running backend" in lines[0]
    assert "bus refused" not in lines[0]
    assert permissive_bus.calls() == []  # refused at the service's edge, before the backend


def test_daemon_check_lets_group_member_through_on_a_permissive_bus(
    permissive_bus: PolicyBus, as_member: list[str]
) -> None:
    r = permissive_bus.cli("switch", "alpha", prefix=as_member)
    assert r.rc == 0, f"{r}\n{permissive_bus.logs()}"
    assert [(c["method"], c["uid"]) for c in permissive_bus.calls()] == [("switch", NOBODY)]


# -------------------------------------------------------------------- error names


@pytest.mark.parametrize(
    "backend,name,code",
    [("nosuch", "org.gpushift.Error.UnknownBackend", 3), ("busy", "org.gpushift.Error.SwitchInProgress", 4)],
)
def test_service_errors_reach_clients_with_dotted_names(
    system_bus: PolicyBus, backend: str, name: str, code: int
) -> None:
    got = system_bus.probe("Switch", backend, "r")
    assert not got["ok"], got
    assert got["error"] == name, got

    r = system_bus.cli("switch", backend)
    assert r.rc == code, f"{r}\n{system_bus.logs()}"
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r
    assert lines[0].startswith("gpushift: "), r
    assert "GDBus.Error" not in lines[0]  # the CLI shows the message, not the wire form


def test_service_bug_reaches_clients_as_failed_not_unknown(system_bus: PolicyBus) -> None:
    got = system_bus.probe("Switch", "crash", "r")
    assert not got["ok"], got
    assert got["error"] == "org.gpushift.Error.Failed", got
    # The service survived its handler's crash.
    assert system_bus.probe("GetStatus")["ok"]


def test_status_without_the_service_says_the_daemon_is_down(system_bus: PolicyBus) -> None:
    # The other side of the marker checks above: on the same private bus, with the service gone,
    # the CLI falls back to its local view, says the daemon is down and exits 6.
    assert system_bus.service_proc is not None
    system_bus.service_proc.send_signal(signal.SIGTERM)
    system_bus.service_proc.wait(10)
    deadline = time.monotonic() + 10
    while True:
        r = system_bus.cli("status", "--json")
        if r.rc != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.rc == 6, r
    assert json.loads(r.out)["daemon"]["running"] is False
