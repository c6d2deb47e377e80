"""The daemon's typed D-Bus face, with busctl as the client: the real daemon under the sandbox's
systemd user manager, its session bus, stand-in backends on simulated GPUs.

busctl get-property answers the serving backend; introspection shows every member's signature;
``busctl call ... SwitchTo 'sa{sv}' night 1 now b true`` switches; and a ``busctl monitor`` started
beforehand sees the properties change in order: the phases from preflight to idle, ActiveBackend
"off" while the VRAM is released, and the final values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support import busctl as bc

USER = ["--user"]


def fold(changes: list[dict[str, Any]], start: dict[str, Any]) -> list[dict[str, Any]]:
    """The properties as a watcher knows them after each PropertiesChanged (from ``start``)."""
    states = []
    state = dict(start)
    for c in changes:
        state = {**state, **c}
        states.append(state)
    return states


def test_busctl_reads_properties_and_watches_a_switch_made_with_switch_to(sandbox: Any) -> None:
    bc.require()
    day = Backend("day", free_port(), [0, 1], version="1.0.0")
    night = Backend("night", free_port(), [1], version="2.0.0")
    env = GpushiftEnv(
        sandbox,
        Path(sandbox.base_dir) / "gs",
        [day, night],
        sample_interval_s=0.5,
        simulated_release_delay_s=3,  # the release lasts long enough for a sample to see it
        release_timeout_s=20,
    ).up()
    uenv = sandbox.env
    env.cli("switch", "day", "--reason", "setup", check=True)

    assert bc.get_property(USER, "ActiveBackend", env=uenv) == 's "day"'
    assert bc.get_property(USER, "Mode", env=uenv) == 's "manual"'  # no schedule configured
    assert bc.get_property(USER, "SwitchInProgress", env=uenv) == "b false"
    assert bc.get_property(USER, "Phase", env=uenv) == 's ""'
    assert bc.get_property(USER, "NextSwitch", env=uenv) == '(st) "" 0'
    assert bc.get_property(USER, "Backends", env=uenv) == 'as 2 "day" "night"'

    out = bc.busctl(USER, "introspect", bc.BUS_NAME, bc.OBJECT_PATH, bc.INTERFACE, env=uenv).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(".")}
    assert rows[".SwitchTo"][:3] == ["method", "sa{sv}", "s"], out
    assert rows[".SwitchWithOptions"][:3] == ["method", "ss", "s"], out
    assert rows[".GetStatus"][:3] == ["method", "-", "s"], out
    for name, sig, value in (
        ("ActiveBackend", "s", '"day"'),
        ("Mode", "s", '"manual"'),
        ("SwitchInProgress", "b", "false"),
        ("Phase", "s", '""'),
        ("NextSwitch", "(st)", "-"),  # busctl shows no value for a struct here
        ("Backends", "as", '2 "day" "night"'),
    ):
        assert rows[f".{name}"][:2] == ["property", sig], (name, out)
        assert " ".join(rows[f".{name}"][2:]).startswith(value), (name, out)
        assert rows[f".{name}"][-1] == "emits-change", (name, out)
    start = {
        "ActiveBackend": "day",
        "Mode": "manual",
        "SwitchInProgress": False,
        "Phase": "",
        "NextSwitch": ["", 0],
        "Backends": ["day", "night"],
        "SwitchTarget": "",
    }

    monitor = bc.Monitor(USER, env=uenv)
    try:
        monitor.start(lambda: bc.call(USER, "GetStatus", env=uenv))
        r = bc.call(USER, "SwitchTo", "sa{sv}", "night", "1", "now", "b", "true", env=uenv)
        ticket = r.stdout.strip().removeprefix("s ").strip('"')
        assert ticket, r.stdout

        def finished(ms: list[dict[str, Any]]) -> bool:
            return any(m.get("member") == "Finished" and m["payload"]["data"][0] == ticket for m in ms)

        def settled(ms: list[dict[str, Any]]) -> bool:
            states = fold(bc.properties_changed(ms), start)
            return (
                bool(states) and states[-1]["ActiveBackend"] == "night" and not states[-1]["SwitchInProgress"]
            )

        env.wait_for(lambda: finished(monitor.snapshot()), 120, "the Finished signal of the switch")
        env.wait_for(lambda: settled(monitor.snapshot()), 10, "the properties after the switch")
        msgs = monitor.snapshot()
    finally:
        monitor.stop()

    finished_ok = [m["payload"]["data"][1] for m in msgs if m.get("member") == "Finished"]
    assert finished_ok == [True], finished_ok
    progress = [m["payload"]["data"][1] for m in msgs if m.get("member") == "Progress"]
    states = fold(bc.properties_changed(msgs), start)
    phases = [s["Phase"] for s in states]
    seen = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    # the phases in the order the switch reported them (a phase the worker left before the loop
    # announced it may be passed over: a property is the state now), then idle
    it = iter([*progress, ""])
    assert all(any(p == q for q in it) for p in seen), (seen, progress)
    assert seen[-1] == "" and "" not in seen[:-1], seen
    assert seen[0] == "preflight" and seen.index("stop") < seen.index("release") < seen.index("start"), seen
    assert [s["SwitchInProgress"] for s in states][0] is True
    assert any(s["Phase"] == "release" and s["ActiveBackend"] == "off" for s in states), states
    assert all(s["SwitchTarget"] == ("night" if s["SwitchInProgress"] else "") for s in states), states
    assert states[-1] == {**start, "ActiveBackend": "night"}, states[-1]
    assert bc.get_property(USER, "ActiveBackend", env=uenv) == 's "night"'
    assert env.status()["active"] == "night"
