"""The D-Bus face's typed members against a real bus: the read-only properties and their
PropertiesChanged signals, SwitchTo's a{sv} options, and the CLI's client falling back for a daemon
older than SwitchTo.  The service is the real SwitcherService on a private dbus-daemon (the ``serve``
fixture); the daemon behind it is a fake whose values the test sets.  busctl is the client."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gpushift.bus import lightclient
from gpushift.bus import service as dbus_service
from gpushift.bus.client import Client
from gpushift.errors import InvalidArgument
from gpushift.values import Caller
from tests.support import busctl as bc

DAY_NIGHT = {
    "ActiveBackend": "day",
    "Mode": "schedule",
    "SwitchInProgress": False,
    "Phase": "",
    "NextSwitch": ("night", 1_796_000_400),
    "Backends": ["day", "night"],
}


class FakeDaemon:
    """The daemon's side of the service: property values the test sets, switches it records."""

    def __init__(self) -> None:
        self.values = dict(DAY_NIGHT)
        self.fail: Exception | None = None
        self.switches: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def status_json(self) -> str:
        return '{"daemon": {"running": true}}'

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str:
        with self.lock:
            self.switches.append((backend, options))
            self.values.update(SwitchInProgress=True, Phase="preflight")
        return "ticket-1"

    def cancel(self, caller: Caller) -> str:
        return "ticket-1"

    def resume(self, caller: Caller) -> str:
        with self.lock:
            self.values["Mode"] = "schedule"
        return "obeying the schedule"

    def reload(self, caller: Caller) -> str:
        return "reloaded"

    def property_values(self) -> dict[str, Any]:
        with self.lock:
            if self.fail is not None:
                raise self.fail
            return dict(self.values)


@pytest.fixture
def served(serve: Callable[..., Any]) -> tuple[Any, FakeDaemon]:
    bc.require()
    fake = FakeDaemon()
    return serve(fake), fake


@pytest.fixture
def monitor(served: tuple[Any, FakeDaemon]) -> Any:
    s, _fake = served
    m = bc.Monitor(s.busctl)
    try:
        yield m.start(lambda: bc.call(s.busctl, "GetStatus"))
    finally:
        m.stop()


STATUS = '{"daemon": {"running": true}}'


def _status_answers(ms: list[dict[str, Any]]) -> int:
    return sum(
        1 for x in ms if x.get("type") == "method_return" and x.get("payload", {}).get("data") == [STATUS]
    )


def _sync(s: Any, m: bc.Monitor) -> list[dict[str, Any]]:
    """Every message up to the answer of a GetStatus called after what the test did (one bus
    connection delivers in order, and the monitor sees the service's messages in sending order)."""
    before = _status_answers(m.snapshot())
    bc.call(s.busctl, "GetStatus")
    assert m.wait_for(lambda ms: _status_answers(ms) > before, 10), "the monitor missed a GetStatus answer"
    return m.snapshot()


def test_busctl_reads_every_property_in_its_type(served: tuple[Any, FakeDaemon]) -> None:
    s, _fake = served
    assert bc.get_property(s.busctl, "ActiveBackend") == 's "day"'
    assert bc.get_property(s.busctl, "Mode") == 's "schedule"'
    assert bc.get_property(s.busctl, "SwitchInProgress") == "b false"
    assert bc.get_property(s.busctl, "Phase") == 's ""'
    assert bc.get_property(s.busctl, "NextSwitch") == '(st) "night" 1796000400'
    assert bc.get_property(s.busctl, "Backends") == 'as 2 "day" "night"'


def test_introspection_shows_each_member_with_its_signature(served: tuple[Any, FakeDaemon]) -> None:
    s, _fake = served
    out = bc.busctl(s.busctl, "introspect", bc.BUS_NAME, bc.OBJECT_PATH, bc.INTERFACE).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(".")}
    assert rows[".SwitchTo"][:3] == ["method", "sa{sv}", "s"], out
    for name, sig in (
        ("ActiveBackend", "s"),
        ("Mode", "s"),
        ("SwitchInProgress", "b"),
        ("Phase", "s"),
        ("NextSwitch", "(st)"),
        ("Backends", "as"),
    ):
        assert rows[f".{name}"][:2] == ["property", sig], (name, out)
    # the old members are unchanged
    assert rows[".GetStatus"][:3] == ["method", "-", "s"]
    assert rows[".SwitchWithOptions"][:3] == ["method", "ss", "s"]
    assert rows[".Switch"][:3] == ["method", "ss", "s"]


def test_only_changed_values_are_sent_and_nothing_without_a_change(
    served: tuple[Any, FakeDaemon], monitor: bc.Monitor
) -> None:
    s, fake = served
    for _ in range(3):  # reads and announcements without a change send nothing
        bc.get_property(s.busctl, "Mode")
        s.on_loop(s.service.announce)
    assert bc.properties_changed(_sync(s, monitor)) == []

    with fake.lock:
        fake.values.update(ActiveBackend="off", NextSwitch=("day", 1_796_040_000))
    assert bc.get_property(s.busctl, "Backends") == 'as 2 "day" "night"'  # a read announces first
    changes = bc.properties_changed(_sync(s, monitor))
    assert changes == [{"ActiveBackend": "off", "NextSwitch": ["day", 1_796_040_000]}]

    s.on_loop(s.service.announce)
    bc.get_property(s.busctl, "ActiveBackend")
    assert bc.properties_changed(_sync(s, monitor)) == changes  # still only the one


def test_properties_changed_goes_out_before_the_method_answers(
    served: tuple[Any, FakeDaemon], monitor: bc.Monitor
) -> None:
    s, _fake = served
    r = bc.call(s.busctl, "SwitchTo", "sa{sv}", "night", "1", "now", "b", "true")
    assert r.stdout.strip() == 's "ticket-1"'
    msgs = _sync(s, monitor)
    signal_at = next(
        i
        for i, m in enumerate(msgs)
        if bc.properties_changed([m]) == [{"SwitchInProgress": True, "Phase": "preflight"}]
    )
    answer_at = next(
        i
        for i, m in enumerate(msgs)
        if m.get("type") == "method_return" and m.get("payload", {}).get("data") == ["ticket-1"]
    )
    assert signal_at < answer_at, msgs[signal_at : answer_at + 1]


def test_switch_to_decodes_typed_options(served: tuple[Any, FakeDaemon]) -> None:
    s, fake = served
    bc.call(s.busctl, "SwitchTo", "sa{sv}", "night", "3", "now", "b", "true", "until", "x", "1893456000",
            "reason", "s", "maintenance window")  # fmt: skip
    bc.call(s.busctl, "SwitchTo", "sa{sv}", "day", "2", "hold", "b", "true", "when_idle", "b", "false")
    bc.call(s.busctl, "SwitchTo", "sa{sv}", "off", "1", "until", "s", "2026-12-01 08:00")
    bc.call(s.busctl, "SwitchTo", "sa{sv}", "day", "1", "restart", "b", "true")
    assert fake.switches == [
        ("night", {"now": True, "until": "2030-01-01T00:00:00+00:00", "reason": "maintenance window"}),
        ("day", {"hold": True, "when_idle": False, "reason": ""}),
        ("off", {"until": "2026-12-01 08:00", "reason": ""}),
        ("day", {"restart": True, "reason": ""}),
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["1", "bogus", "b", "true"], "option 'bogus': unknown"),
        (["1", "now", "s", "yes"], "option now: expected a boolean (b)"),
        (["1", "until", "b", "true"], "option until: expected a string (s) or an integer (x)"),
        (["1", "reason", "i", "7"], "option reason: expected a string (s)"),
        (["2", "hold", "b", "true", "until", "x", "1893456000"], "hold and until exclude each other"),
        (["1", "until", "x", "99999999999999999"], "is not a time in UNIX seconds"),
    ],
)
def test_switch_to_refuses_unknown_keys_wrong_types_and_hold_with_until(
    served: tuple[Any, FakeDaemon], options: list[str], message: str
) -> None:
    s, fake = served
    r = bc.call(s.busctl, "SwitchTo", "sa{sv}", "night", *options, check=False)
    assert r.returncode != 0 and message in r.stderr, (r.returncode, r.stderr)
    assert fake.switches == []


def test_a_refusal_carries_the_invalid_args_error_name(
    served: tuple[Any, FakeDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    s, fake = served
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", s.address)
    client = Client("session")
    proxy = client._proxy()
    from gi.repository import GLib

    with pytest.raises(GLib.Error, match=r"org\.gpushift\.Error\.InvalidArgument: option 'nope': unknown"):
        proxy.SwitchTo("night", {"nope": GLib.Variant("b", True)})
    with pytest.raises(InvalidArgument, match="backend"):
        lightclient.switch("session", "", {"reason": ""}, wait=False)
    assert fake.switches == []


def test_when_computing_fails_the_last_values_stay_and_methods_answer(
    served: tuple[Any, FakeDaemon], monitor: bc.Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    s, fake = served
    caplog.set_level(logging.ERROR, logger="gpushift")
    with fake.lock:
        fake.fail = RuntimeError("sampler gone")
    for _ in range(3):
        assert bc.get_property(s.busctl, "ActiveBackend") == 's "day"'
        s.on_loop(s.service.announce)
    assert bc.call(s.busctl, "GetStatus").returncode == 0
    assert bc.call(s.busctl, "SwitchTo", "sa{sv}", "night", "0").stdout.strip() == 's "ticket-1"'
    failures = [r for r in caplog.records if "dbus_properties_failed" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert bc.properties_changed(_sync(s, monitor)) == []
    with fake.lock:
        fake.fail = None
    assert bc.get_property(s.busctl, "Phase") == 's "preflight"'  # back: the switch's values


class OldService(dbus_service.SwitcherService):
    """The daemon before SwitchTo: its introspection has no such member."""

    dbus = re.sub(r"\s*<method name=\"SwitchTo\">.*?</method>", "", dbus_service.interface_xml(), flags=re.S)


def test_the_cli_client_uses_switch_to_and_falls_back_for_an_older_daemon(
    serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "SwitchTo" not in OldService.dbus and "SwitchWithOptions" in OldService.dbus
    options = {"reason": "why", "now": True, "hold": True, "restart": False}
    for cls in (dbus_service.SwitcherService, OldService):
        fake = FakeDaemon()
        s = serve(fake, cls)
        m = bc.Monitor(s.busctl).start(lambda s=s: bc.call(s.busctl, "GetStatus"))
        try:
            monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", s.address)
            assert lightclient.switch("session", "night", options, wait=False) == {
                "ticket": "ticket-1",
                "queued": True,
            }
            msgs = _sync(s, m)
        finally:
            m.stop()
        assert fake.switches == [("night", options)]
        calls = [
            x.get("member")
            for x in msgs
            if x.get("type") == "method_call" and "Switch" in str(x.get("member"))
        ]
        # an older daemon refuses SwitchTo as an unknown method: the client then asks it the old way
        assert calls == (
            ["SwitchTo"] if cls is dbus_service.SwitcherService else ["SwitchTo", "SwitchWithOptions"]
        ), calls
