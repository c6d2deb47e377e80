"""SystemdUnits.states (the sampler's read of every backend unit, every period) against a real systemd
user manager: it tells what a full ``state()`` tells about a unit's state, sees a relaunch that leaves
the states as they were, and keeps each unit's error its own."""

from __future__ import annotations

from typing import Any

import pytest

from gpushift.errors import SystemdError
from gpushift.host.peer import cgroup_of
from gpushift.host.systemd import SystemdUnits
from gpushift.values import UnitState

SLEEPER = "[Service]\nType=simple\nExecStart=/bin/sleep 300\nKillMode=control-group\nTimeoutStopSec=3\n"

#: What states() fills in (the unit's configuration is left out).
FIELDS = (
    "name",
    "load_state",
    "active_state",
    "sub_state",
    "result",
    "main_pid",
    "main_start_us",
    "exec_main_code",
    "exec_main_status",
    "n_restarts",
    "control_group",
)


@pytest.fixture
def units(bus: Any) -> SystemdUnits:
    return SystemdUnits(bus)


def brief(st: UnitState) -> dict[str, Any]:
    return {f: getattr(st, f) for f in FIELDS}


def read(units: SystemdUnits, *names: str) -> dict[str, UnitState]:
    got = units.states(list(names))
    assert set(got) == set(names)
    assert all(isinstance(v, UnitState) for v in got.values()), got
    return {k: v for k, v in got.items() if isinstance(v, UnitState)}


def test_unit_states_tell_what_state_tells_for_active_inactive_failed_and_missing_units(
    sandbox, install_standin, units, wait_for
):
    a = install_standin("standin-a.service", "--version", "1.0")
    b = install_standin("standin-b.service", "--exit-at-once")
    sandbox.install_unit("sleeper.service", SLEEPER)
    sandbox.daemon_reload()
    units.start(a.name, timeout_s=10)
    units.start(b.name, timeout_s=10)
    wait_for(lambda: units.state(b.name).failed, 5, "standin-b to fail", lambda: b.log_text())
    names = (a.name, b.name, "sleeper.service", "no-such-backend.service")
    for _ in range(2):  # the second read carries over what did not move: still the same answers
        got = read(units, *names)
        for name in names:
            assert brief(got[name]) == brief(units.state(name)), name
    assert got[a.name].active_state == "active" and got[a.name].main_pid > 0
    assert got[a.name].main_start_us > 0
    # Its cgroup, as its process's own /proc/PID/cgroup says (the peer check compares against it).
    assert got[a.name].control_group == cgroup_of(got[a.name].main_pid)
    assert got[a.name].control_group.endswith("/" + a.name)
    assert got["sleeper.service"].control_group == "" and got[b.name].control_group == ""
    assert (got[b.name].active_state, got[b.name].result) == ("failed", "exit-code")
    assert got[b.name].exec_main_code == 1 and got[b.name].exec_main_status != 0
    assert got["sleeper.service"].active_state == "inactive" and got["sleeper.service"].main_pid == 0
    assert got["no-such-backend.service"].load_state == "not-found"
    # The unit's configuration is not read every period: the switch's own state() reads it.
    assert got[a.name].exec_start == () and units.state(a.name).exec_start != ()


def test_unit_states_see_a_relaunch_that_leaves_the_states_as_they_were(sandbox, units, wait_for):
    sandbox.install_unit("sleeper.service", SLEEPER)
    sandbox.daemon_reload()
    units.start("sleeper.service", timeout_s=10)
    first = read(units, "sleeper.service")["sleeper.service"]
    assert (first.active_state, first.sub_state) == ("active", "running") and first.main_pid > 0
    sandbox.systemctl("restart", "sleeper.service")  # behind the reader's back, between two reads
    again = read(units, "sleeper.service")["sleeper.service"]
    assert (again.active_state, again.sub_state) == ("active", "running")
    assert again.main_pid != first.main_pid and again.main_pid == units.state("sleeper.service").main_pid
    assert again.main_start_us > first.main_start_us
    # Stopped, then started and failing: each read tells the state and result of that moment.
    units.stop("sleeper.service", timeout_s=10)
    stopped = read(units, "sleeper.service")["sleeper.service"]
    assert (stopped.active_state, stopped.main_pid) == ("inactive", 0)
    sandbox.install_unit("sleeper.service", "[Service]\nType=simple\nExecStart=/bin/false\n")
    sandbox.daemon_reload()
    units.start("sleeper.service", timeout_s=10)
    wait_for(lambda: units.state("sleeper.service").failed, 5, "the unit to fail")
    failed = read(units, "sleeper.service")["sleeper.service"]
    assert (failed.active_state, failed.result, failed.exec_main_code) == ("failed", "exit-code", 1)


def test_unit_states_keep_an_invalid_names_error_its_own(sandbox, units):
    sandbox.install_unit("sleeper.service", SLEEPER)
    sandbox.daemon_reload()
    got = units.states(["not a unit name", "sleeper.service"])
    assert isinstance(got["not a unit name"], SystemdError) and "not valid" in str(got["not a unit name"])
    ok = got["sleeper.service"]
    assert isinstance(ok, UnitState) and ok.load_state == "loaded" and ok.active_state == "inactive"
