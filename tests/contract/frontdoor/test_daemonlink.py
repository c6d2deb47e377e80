"""The front door's daemon link on a real dbus-daemon: it owns org.gpushift.FrontDoor1 and answers
Close/InFlight/Release/Status by calling the core, introspects, refuses a caller that is neither
root nor the owner of org.gpushift.Switcher1, follows Switcher1's properties (one GetAll, then
PropertiesChanged; a change older than the read is dropped), notices the daemon going and coming
back, and reconnects when the bus itself is restarted.

The daemon is a scripted Switcher1 on the same bus (``switcher_double.py``); the real daemon's side
is in ``tests/integration/test_frontdoor_*_e2e.py``.  Runs as root (a caller as user nobody through
setpriv); fails, never skips, without dbus-daemon, busctl or setpriv.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import structlog
from switcher_double import RecordingCore, SwitcherDouble, start_bus

from gpushift.frontdoor.busconn import CallFailed
from gpushift.frontdoor.daemonlink import Backoff, DaemonLink

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
DAY = {
    "ActiveBackend": "vllm",
    "SwitchInProgress": False,
    "SwitchTarget": "",
    "Phase": "",
    "Mode": "schedule",
    "Models": {"vllm": ["qwen"], "llama": ["llama-night"]},
    "NextServed": {"qwen": 0, "llama-night": 1767250800},
    "TimeZone": "Europe/Berlin",
}


@pytest.fixture
def busdir() -> Iterator[Path]:
    for tool in ("dbus-daemon", "busctl", "setpriv"):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} is needed for the daemon link's tests (apt-get install dbus systemd util-linux)"
            )
    d = Path(tempfile.mkdtemp(prefix="gpushift-fdlink-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Bus:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc, self.address = start_bus(directory)

    def restart(self) -> None:
        self.kill()
        self.proc, self.address = start_bus(self.directory)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def run(busdir: Path, scenario: Callable[[Bus, RecordingCore, DaemonLink], Awaitable[None]]) -> None:
    """Start a bus and a link on it, run ``scenario``, stop both whatever happens."""
    bus = Bus(busdir)

    async def main() -> None:
        core = RecordingCore()
        link = DaemonLink(
            core, bus.address, structlog.get_logger("test"), call_timeout_s=5, backoff=Backoff(0.05, 0.5)
        )
        task = asyncio.ensure_future(link.run())
        try:
            await asyncio.wait_for(link.connected.wait(), 20)
            await scenario(bus, core, link)
        finally:
            await link.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        bus.kill()


async def owned(link: DaemonLink, timeout_s: float = 20.0) -> None:
    async def poll() -> None:
        while not link.owns_name:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


def busctl(address: str, *args: str, nobody: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [*(AS_NOBODY if nobody else []), "busctl", f"--address={address}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_it_owns_its_name_and_answers_the_daemons_calls_by_calling_the_core(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        await owned(link)
        daemon = await SwitcherDouble(bus.address, DAY).start()
        try:
            assert await daemon.call_frontdoor("Close", "s", "vllm") == (2,)
            assert await daemon.call_frontdoor("InFlight", "s", "vllm") == (1,)
            core.held = 3
            assert await daemon.call_frontdoor("Release", "s", "llama") == (3, 1.25)
            (text,) = await daemon.call_frontdoor("Status")
            assert json.loads(text) == {"listen": ["[::]:8000"], "held": 0, "in_flight": {}, "closed": []}
            assert core.calls == [
                ("close", "vllm"),
                ("in_flight", "vllm"),
                ("release", "llama"),
                ("status", None),
            ]
            with pytest.raises(CallFailed) as e:
                await daemon.call_frontdoor("Close", "u", 3)
            assert e.value.name == "org.freedesktop.DBus.Error.InvalidArgs"
            with pytest.raises(CallFailed) as e:
                await daemon.call_frontdoor("Drain", "s", "vllm")
            assert e.value.name == "org.freedesktop.DBus.Error.UnknownMethod"
            with pytest.raises(CallFailed) as e:
                await daemon.call_frontdoor("Close", "s", "two\nlines")
            assert e.value.name == "org.gpushift.Error.InvalidArgument"
        finally:
            await daemon.stop()

    run(busdir, scenario)


def test_introspection_documents_the_contract_and_busctl_can_call_it(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        await owned(link)
        r = await asyncio.to_thread(
            busctl, bus.address, "introspect", "org.gpushift.FrontDoor1", "/org/gpushift/FrontDoor1"
        )
        assert r.returncode == 0, r.stderr
        for member in (".Close", ".InFlight", ".Release", ".Status", ".Introspect", ".Ping"):
            assert member in r.stdout, r.stdout
        assert "su" not in r.stdout.split(".Close", 1)[1].splitlines()[0]
        tree = await asyncio.to_thread(busctl, bus.address, "tree", "org.gpushift.FrontDoor1")
        assert "/org/gpushift/FrontDoor1" in tree.stdout, tree.stdout + tree.stderr
        call = await asyncio.to_thread(
            busctl, bus.address, "call", "org.gpushift.FrontDoor1", "/org/gpushift/FrontDoor1",
            "org.gpushift.FrontDoor1", "InFlight", "s", "vllm",
        )  # fmt: skip
        assert (call.returncode, call.stdout.strip()) == (0, "u 1"), call.stderr  # root may call

    run(busdir, scenario)


def test_a_caller_neither_root_nor_the_daemon_is_refused(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        await owned(link)
        r = await asyncio.to_thread(
            busctl, bus.address, "call", "org.gpushift.FrontDoor1", "/org/gpushift/FrontDoor1",
            "org.gpushift.FrontDoor1", "Close", "s", "vllm", nobody=True,
        )  # fmt: skip
        assert r.returncode != 0 and "is for the gpushift daemon" in r.stderr and "uid 65534" in r.stderr, r
        assert core.calls == []  # never reached the core
        # the same user owning org.gpushift.Switcher1 (the daemon, whatever its user) may call
        script = (
            "import sys, jeepney\n"
            "from jeepney.io.blocking import open_dbus_connection, Proxy\n"
            "c = open_dbus_connection(sys.argv[1])\n"
            "assert Proxy(jeepney.message_bus, c).RequestName('org.gpushift.Switcher1', 4) == (1,)\n"
            "a = jeepney.DBusAddress('/org/gpushift/FrontDoor1', bus_name='org.gpushift.FrontDoor1', interface='org.gpushift.FrontDoor1')\n"
            "print(c.send_and_get_reply(jeepney.new_method_call(a, 'Close', 's', ('vllm',)), timeout=10).body)\n"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        p = await asyncio.to_thread(
            subprocess.run, [*AS_NOBODY, sys.executable, "-c", script, bus.address],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip
        assert p.returncode == 0 and p.stdout.strip() == "(2,)", p.stderr
        assert core.calls == [("close", "vllm")]

    run(busdir, scenario)


def test_it_reads_the_properties_once_and_follows_their_changes(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        daemon = await SwitcherDouble(bus.address, DAY).start()
        try:
            v = await core.wait_view(lambda v: v.connected)
            assert (v.active, v.mode, v.zone, dict(v.models), dict(v.next_served)) == (
                "vllm", "schedule", "Europe/Berlin", {"vllm": ("qwen",), "llama": ("llama-night",)},
                {"qwen": 0, "llama-night": 1767250800},
            )  # fmt: skip
            n = len(core.views)
            await daemon.change(SwitchInProgress=True, SwitchTarget="llama", Phase="drain")
            v = await core.wait_view(lambda v: v.switching, since=n)
            assert (v.target, v.phase, v.active) == ("llama", "drain", "vllm")
            await daemon.change(ActiveBackend="llama", SwitchInProgress=False, SwitchTarget="", Phase="")
            v = await core.wait_view(lambda v: v.active == "llama", since=n)
            assert not v.switching and v.target == ""
            assert daemon.reads == 1  # no polling: one GetAll, then the signals
        finally:
            await daemon.stop()

    run(busdir, scenario)


def test_a_change_sent_before_the_reads_answer_is_older_than_the_read_and_dropped(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        daemon = SwitcherDouble(bus.address, DAY)
        daemon.stale_before_reply = {"ActiveBackend": "stale", "SwitchInProgress": True}
        await daemon.start()
        try:
            await core.wait_view(lambda v: v.connected)
            await daemon.change(Mode="override")  # a later change: once it is in, every earlier one is too
            await core.wait_view(lambda v: v.mode == "override")
            await asyncio.sleep(0.2)
            assert all(v.active != "stale" for v in core.views), core.views
            assert core.views[-1].active == "vllm" and not core.views[-1].switching
        finally:
            await daemon.stop()

    run(busdir, scenario)


def test_the_daemon_going_keeps_the_last_view_and_its_return_is_read_again(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        daemon = await SwitcherDouble(bus.address, DAY).start()
        await core.wait_view(lambda v: v.connected and v.active == "vllm")
        n = len(core.views)
        await daemon.stop()  # the daemon dies: its name loses its owner
        gone = await core.wait_view(lambda v: not v.connected, since=n)
        assert gone.active == "vllm" and dict(gone.models) == {"vllm": ("qwen",), "llama": ("llama-night",)}
        n = len(core.views)
        back = await SwitcherDouble(bus.address, {**DAY, "ActiveBackend": "llama"}).start()
        try:
            v = await core.wait_view(lambda v: v.connected, since=n)
            assert v.active == "llama"
        finally:
            await back.stop()

    run(busdir, scenario)


def test_held_requests_of_a_switch_the_restarted_daemon_lost_are_released(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        await owned(link)
        daemon = await SwitcherDouble(
            bus.address, {**DAY, "SwitchInProgress": True, "SwitchTarget": "llama"}
        ).start()
        assert await daemon.call_frontdoor("Close", "s", "vllm") == (2,)
        core.held = 4
        await daemon.stop()  # dies mid-switch: no Release will come from it
        await core.wait_view(lambda v: not v.connected)
        assert ("release", "llama") not in core.calls
        back = await SwitcherDouble(bus.address, {**DAY, "ActiveBackend": "llama"}).start()  # recovered
        try:
            await core.wait_view(lambda v: v.connected and v.active == "llama")
            for _ in range(100):
                if ("release", "llama") in core.calls:
                    break
                await asyncio.sleep(0.05)
            assert ("release", "llama") in core.calls and core.held == 0 and not core.closed
        finally:
            await back.stop()

    run(busdir, scenario)


def test_a_restarted_bus_is_reconnected_and_the_name_owned_again(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        daemon = await SwitcherDouble(bus.address, DAY).start()
        await core.wait_view(lambda v: v.connected)
        await owned(link)
        n = len(core.views)
        await asyncio.to_thread(bus.kill)
        await core.wait_view(lambda v: not v.connected, since=n)
        await daemon.stop()
        bus.restart()
        await asyncio.wait_for(link.connected.wait(), 20)
        await owned(link)
        back = await SwitcherDouble(bus.address, DAY).start()
        try:
            v = await core.wait_view(lambda v: v.connected, since=n)
            assert v.active == "vllm"
            r = await asyncio.to_thread(busctl, bus.address, "status", "org.gpushift.FrontDoor1")
            assert r.returncode == 0 and f"PID={os.getpid()}" in r.stdout, r.stdout + r.stderr
        finally:
            await back.stop()

    run(busdir, scenario)


def test_no_daemon_on_the_bus_is_a_view_that_is_not_connected(busdir: Path) -> None:
    async def scenario(bus: Bus, core: RecordingCore, link: DaemonLink) -> None:
        await owned(link)
        await asyncio.sleep(0.2)
        assert all(not v.connected for v in core.views)

    run(busdir, scenario)
