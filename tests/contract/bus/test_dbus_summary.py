"""``GetSummary`` on a real bus: the status page's summary, computed at most once every
``SUMMARY_REUSE_S`` however often it is called (the service's clock is the test's), and the same
answer in between.  The service is the real SwitcherService on a private dbus-daemon; busctl is the
client; the daemon behind it is a fake counting its summaries."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gpushift.bus import service as dbus_service
from gpushift.values import Caller
from tests.support import busctl as bc


class SummaryDaemon:
    def __init__(self) -> None:
        self.made = 0
        self.lock = threading.Lock()

    def summary_json(self) -> str:
        with self.lock:
            self.made += 1
            return json.dumps({"version": 1, "n": self.made})

    def status_json(self) -> str:
        return "{}"

    def property_values(self) -> dict[str, Any]:
        return dict(dbus_service.PROPERTY_DEFAULTS)

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str:
        return "t"

    def cancel(self, caller: Caller) -> str:
        return "t"

    def resume(self, caller: Caller) -> str:
        return ""

    def reload(self, caller: Caller) -> str:
        return ""


def _summary(s: Any) -> dict[str, Any]:
    out = bc.call(s.busctl, "GetSummary", "--json=short").stdout
    return dict(json.loads(json.loads(out)["data"][0]))


@pytest.fixture
def served(serve: Callable[..., Any]) -> tuple[Any, SummaryDaemon, list[float]]:
    bc.require()
    fake = SummaryDaemon()
    s = serve(fake)
    clock = [1000.0]
    s.service.clock = lambda: clock[0]
    return s, fake, clock


def test_get_summary_is_computed_at_most_once_per_reuse_interval_whatever_the_calls(
    served: tuple[Any, SummaryDaemon, list[float]],
) -> None:
    s, fake, clock = served
    assert _summary(s) == {"version": 1, "n": 1}
    for _ in range(20):  # a flood within the interval: the same document, nothing computed
        assert _summary(s) == {"version": 1, "n": 1}
    s.on_loop(s.service.announce)  # a property change does not refresh it either
    clock[0] += dbus_service.SUMMARY_REUSE_S - 0.01
    assert _summary(s)["n"] == 1
    clock[0] += 0.02
    assert _summary(s)["n"] == 2
    assert fake.made == 2


def test_get_summary_is_in_the_interface_and_the_policy_lets_everybody_call_it() -> None:
    xml = dbus_service.interface_xml()
    assert '<method name="GetSummary">' in xml and 'name="summary_json" type="s" direction="out"' in xml
    from pathlib import Path

    policy = (
        Path(__file__).resolve().parents[3] / "etc/dbus-1/system.d/org.gpushift.Switcher1.conf"
    ).read_text()
    default = policy.split('<policy context="default">', 1)[1]
    assert 'send_interface="org.gpushift.Switcher1" send_member="GetSummary"' in default
