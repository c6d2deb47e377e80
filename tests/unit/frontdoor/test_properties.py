"""Switcher1's properties as jeepney delivers them → the front door's DaemonView (pure)."""

from __future__ import annotations

import re
from pathlib import Path

from gpushift.bus import names
from gpushift.frontdoor import properties as p
from gpushift.frontdoor.view import DaemonView

XML = Path(__file__).resolve().parents[3] / "gpushift" / "bus" / "org.gpushift.Switcher1.xml"


def test_the_names_are_the_daemons() -> None:
    assert (p.SWITCHER_BUS_NAME, p.SWITCHER_PATH, p.SWITCHER_INTERFACE) == (
        names.BUS_NAME,
        names.OBJECT_PATH,
        names.INTERFACE,
    )


def test_each_property_the_daemon_documents_has_the_signature_read_here() -> None:
    documented = dict(re.findall(r'<property name="(\w+)" type="([^"]+)"', XML.read_text()))
    for name in ("ActiveBackend", "Mode", "SwitchInProgress", "Phase"):
        assert documented[name] == p.SIGNATURES[name]
    for name, signature in p.SIGNATURES.items():
        if name in documented:  # the daemon's new ones (SwitchTarget, NextServed, ...) once it has them
            assert documented[name] == signature, name


def test_a_full_read_becomes_a_connected_view() -> None:
    props = {
        "ActiveBackend": ("s", "vllm"),
        "SwitchInProgress": ("b", True),
        "SwitchTarget": ("s", "llama"),
        "Phase": ("s", "drain"),
        "Mode": ("s", "schedule"),
        "Models": ("a{sas}", {"vllm": ["qwen"], "llama": ["llama-night", "q4"]}),
        "NextServed": ("a{st}", {"qwen": 0, "llama-night": 1767250800}),
        "TimeZone": ("s", "Europe/Berlin"),
        "NextSwitch": ("(st)", ("llama", 1767250800)),  # not the front door's
    }
    assert p.view_of(props) == DaemonView(
        connected=True,
        active="vllm",
        switching=True,
        target="llama",
        phase="drain",
        mode="schedule",
        models={"vllm": ("qwen",), "llama": ("llama-night", "q4")},
        next_served={"qwen": 0, "llama-night": 1767250800},
        zone="Europe/Berlin",
    )


def test_a_daemon_without_the_new_properties_gives_their_defaults() -> None:
    v = p.view_of({"ActiveBackend": ("s", "off"), "SwitchInProgress": ("b", False)})
    assert v == DaemonView(connected=True, active="off")


def test_a_wrong_signature_or_value_is_left_out() -> None:
    v = p.view_of(
        {
            "ActiveBackend": ("i", 3),
            "SwitchInProgress": ("b", "yes"),
            "Mode": ("s", "x" * (p.MAX_NAME + 1)),
            "Models": ("a{sas}", {"ok": ["a", 7, "b" * 999], "x" * 999: ["c"]}),
            "NextServed": ("a{st}", {"a": -1, "b": True, "c": 5}),
            "TimeZone": "UTC",  # not a variant
        }
    )
    assert v == DaemonView(connected=True, models={"ok": ("a",)}, next_served={"c": 5})


def test_sizes_are_bounded() -> None:
    many = {f"m{i}": i for i in range(p.MAX_ENTRIES + 10)}
    v = p.view_of({"NextServed": ("a{st}", many)})
    assert len(v.next_served) == p.MAX_ENTRIES


def test_changes_merge_over_what_is_known_and_invalidated_names_go() -> None:
    known = {"ActiveBackend": ("s", "vllm"), "Mode": ("s", "schedule")}
    after = p.merged(known, {"ActiveBackend": ("s", "llama"), "Bogus": ("s", "x")}, ["Mode"])
    assert after == {"ActiveBackend": ("s", "llama")}
    assert known == {"ActiveBackend": ("s", "vllm"), "Mode": ("s", "schedule")}  # not changed in place
