"""The pure rules of a switch: the VRAM gate, the preflight's foreign-memory check, the GPUs watched,
and the one-line messages a person reads when a GPU is not free."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushift.config.schema import Config, parse
from gpushift.switch.policy import (
    describe_reading,
    fmt_mib,
    foreign_memory,
    gate,
    gate_gpus,
    running_backends,
)
from gpushift.values import OFF, GateState, GpuReading, Holder

RESIDUAL = 256.0
DAY_UNIT = "gpushift-day.service"

BOB = Holder(pid=4242, user="bob", command="python", cmdline=("python", "train.py"), used_mib=9318.0)
DAY_PROC = Holder(pid=4000, user="gpushift", command="server", unit=DAY_UNIT, used_mib=14500.0)
PERSISTENCED = Holder(pid=812, user="root", command="nvidia-persistenced", used_mib=0.0)


def reading(
    index: int = 1,
    used: float | None = 0.0,
    holders: tuple[Holder, ...] = (),
    error: str | None = None,
    complete: bool = True,
    unreadable: tuple[int, ...] = (),
) -> GpuReading:
    return GpuReading(
        index=index,
        name="Tesla V100-SXM2-16GB",
        total_mib=16384.0,
        used_mib=used,
        holders=holders,
        holders_complete=complete,
        error=error,
        unreadable_pids=unreadable,
    )


def config(backends_toml: str) -> Config:
    return parse("[gpu]\nresidual_mib = 256\n" + backends_toml, "/etc/gpushift/policy-test.toml")


TWO_BACKENDS = config(
    """
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
gpus = [0, 1]

[backends.night]
unit = "gpushift-night.service"
health_url = "http://127.0.0.1:18080/health"
gpus = [1]

[backends.anywhere]
unit = "gpushift-anywhere.service"
health_url = "http://127.0.0.1:18090/health"
"""
)


# --------------------------------------------------------------------------- messages


@pytest.mark.parametrize(
    ("mib", "text"),
    [
        (None, "unknown"),
        (0, "0 MiB"),
        (812, "812 MiB"),
        (1023.4, "1023 MiB"),
        (1024, "1.0 GiB"),
        (9318, "9.1 GiB"),
    ],
)
def test_policy_fmt_mib_for_a_person(mib: float | None, text: str) -> None:
    assert fmt_mib(mib) == text


def test_policy_describe_reading_names_the_holder_pid_command_user_and_amount() -> None:
    msg = describe_reading(reading(1, 9318.0, (BOB,)), RESIDUAL)
    assert msg.startswith("VRAM on GPU 1 still held by pid 4242 (python, user bob): 9.1 GiB")


def test_policy_describe_reading_lists_biggest_holder_first_with_units() -> None:
    msg = describe_reading(reading(0, 9318.0 + 14500.0, (BOB, DAY_PROC)), RESIDUAL)
    assert msg.index("pid 4000") < msg.index("pid 4242")
    assert "unit gpushift-day.service" in msg
    assert "14.2 GiB" in msg and "9.1 GiB" in msg


def test_policy_describe_reading_unknown_says_why() -> None:
    msg = describe_reading(reading(0, None, error="NVML_ERROR_GPU_IS_LOST"), RESIDUAL)
    assert msg == "VRAM on GPU 0 unknown: NVML_ERROR_GPU_IS_LOST"


def test_policy_describe_reading_incomplete_names_unreadable_pid_and_the_remedy() -> None:
    msg = describe_reading(reading(1, 2048.0, complete=False, unreadable=(31337,)), RESIDUAL)
    assert "GPU 1" in msg and "still held" in msg and "31337" in msg and "root" in msg


def test_policy_describe_reading_memory_without_any_holder() -> None:
    msg = describe_reading(reading(1, 2048.0), RESIDUAL)
    assert "GPU 1" in msg and "2.0 GiB" in msg and "no process seen with the device open" in msg


def test_policy_describe_reading_released() -> None:
    assert describe_reading(reading(0, 12.0), RESIDUAL) == "GPU 0 released (12 MiB used)"


def test_policy_describe_reading_says_simulated() -> None:
    assert "GPU 1 (SIMULATED)" in describe_reading(reading(1, 9318.0, (BOB,)), RESIDUAL, simulated=True)
    assert "(SIMULATED)" not in describe_reading(reading(1, 9318.0, (BOB,)), RESIDUAL)


# --------------------------------------------------------------------------- the gate


def test_policy_gate_opens_when_every_gpu_is_at_or_below_residual() -> None:
    v = gate([reading(0, 0.0), reading(1, RESIDUAL, (PERSISTENCED,))], RESIDUAL)
    assert v.open is True and v.blocking == () and not v.unknown


def test_policy_gate_stays_closed_while_one_gpu_is_held() -> None:
    held = reading(1, RESIDUAL + 1, (BOB,))
    v = gate([reading(0, 0.0), held], RESIDUAL)
    assert v.open is False
    assert v.blocking == (held,)
    assert "pid 4242" in v.message and "GPU 1" in v.message
    assert not v.unknown


@pytest.mark.parametrize(
    "bad",
    [
        reading(1, None, error="NVML_ERROR_UNKNOWN"),
        reading(1, 0.0, error="Driver Not Loaded"),  # a figure with an error is still unknown
        reading(1, None),  # no figure, no error: still never "released"
    ],
)
def test_policy_gate_fails_closed_on_unknown(bad: GpuReading) -> None:
    v = gate([reading(0, 0.0), bad], RESIDUAL)
    assert v.open is False
    assert v.blocking == (bad,)
    assert bad.state(RESIDUAL) is GateState.UNKNOWN


def test_policy_gate_unknown_flag_distinguishes_unknown_from_held() -> None:
    assert gate([reading(1, None, error="x")], RESIDUAL).unknown is True
    assert gate([reading(1, 9000.0, (BOB,))], RESIDUAL).unknown is False


def test_policy_gate_decides_on_memory_and_the_holder_scan_only_names() -> None:
    # Another user's process whose fds cannot be read: memory at the residual is still released...
    assert gate([reading(1, 0.0, complete=False, unreadable=(99,))], RESIDUAL).open is True
    # ...and memory above it stays held, the unreadable pid named as a suspect.
    v = gate([reading(1, 4096.0, complete=False, unreadable=(99,))], RESIDUAL)
    assert v.open is False and "99" in v.message and not v.unknown


def test_policy_gate_never_opens_on_nothing() -> None:
    # NVML lists no GPU (a driver reloading, a GPU fallen off the bus): not "every GPU released".
    v = gate([], RESIDUAL)
    assert v.open is False and v.unknown and "no GPU is visible" in v.message
    # A GPU the backends need that is not listed keeps the gate closed too.
    v = gate([reading(0, 0.0)], RESIDUAL, expected=[0, 1])
    assert v.open is False and v.unknown and "GPU 1" in v.message and "not visible" in v.message


readings_strategy = st.lists(
    st.builds(
        reading,
        index=st.integers(0, 7),
        used=st.one_of(st.none(), st.floats(0, 20000, allow_nan=False)),
        error=st.one_of(st.none(), st.just("NVML_ERROR_UNKNOWN")),
        complete=st.booleans(),
    ),
    max_size=4,
)


@given(readings_strategy, st.floats(0, 1024, allow_nan=False))
def test_policy_gate_opens_iff_there_are_readings_and_every_one_is_known_and_small(
    readings: list[GpuReading], residual: float
) -> None:
    expected = bool(readings) and all(
        r.error is None and r.used_mib is not None and r.used_mib <= residual for r in readings
    )
    v = gate(readings, residual)
    assert v.open is expected
    assert set(v.blocking) == {r for r in readings if r.state(residual) is not GateState.RELEASED}


@given(readings_strategy)
def test_policy_foreign_memory_never_ok_on_an_unknown_gpu(readings: list[GpuReading]) -> None:
    v = foreign_memory(readings, {DAY_UNIT}, set(), RESIDUAL)
    if any(r.state(RESIDUAL) is GateState.UNKNOWN for r in readings):
        assert v.ok is False


# --------------------------------------------------------------------------- preflight: foreign memory


def test_policy_foreign_memory_refuses_a_foreign_holder_and_names_it() -> None:
    v = foreign_memory([reading(1, 9318.0 + 14500.0, (DAY_PROC, BOB))], {DAY_UNIT}, {4000}, RESIDUAL)
    assert v.ok is False
    assert v.foreign == (BOB,)
    assert "GPU 1" in v.message and "pid 4242 (python, user bob)" in v.message and "9.1 GiB" in v.message


def test_policy_foreign_memory_accepts_the_backends_own_memory() -> None:
    v = foreign_memory(
        [reading(0, 14500.0, (DAY_PROC,)), reading(1, 14500.0, (DAY_PROC,))], {DAY_UNIT}, set(), RESIDUAL
    )
    assert v.ok is True and v.foreign == ()


def test_policy_foreign_memory_own_process_by_pid_when_unit_unknown() -> None:
    # the cgroup lookup failed (unit None) but the pid is in the unit's process list
    worker = Holder(pid=4001, user="gpushift", command="VLLM::Worker", used_mib=14000.0)
    assert foreign_memory([reading(1, 14000.0, (worker,))], {DAY_UNIT}, {4000, 4001}, RESIDUAL).ok is True
    refused = foreign_memory([reading(1, 14000.0, (worker,))], {DAY_UNIT}, {4000}, RESIDUAL)
    assert refused.ok is False and "pid 4001" in refused.message


def test_policy_foreign_memory_device_open_without_memory_never_blocks() -> None:
    smi = Holder(pid=813, user="carol", command="nvidia-smi", used_mib=0.0)
    v = foreign_memory([reading(1, 14500.0, (DAY_PROC, PERSISTENCED, smi))], {DAY_UNIT}, set(), RESIDUAL)
    assert v.ok is True


def test_policy_foreign_memory_names_every_process_with_the_device_open_when_blocked() -> None:
    v = foreign_memory([reading(1, 9318.0, (BOB, PERSISTENCED))], set(), set(), RESIDUAL)
    assert v.ok is False
    assert set(v.foreign) == {BOB, PERSISTENCED}
    assert "pid 4242" in v.message and "pid 812" in v.message
    assert v.message.index("pid 4242") < v.message.index("pid 812")  # the one holding memory first


def test_policy_foreign_memory_below_residual_does_not_block() -> None:
    small = Holder(pid=5000, user="eve", command="python", used_mib=RESIDUAL)
    assert foreign_memory([reading(1, RESIDUAL, (small,))], set(), set(), RESIDUAL).ok is True


def test_policy_foreign_memory_unexplained_memory_without_holders_blocks() -> None:
    v = foreign_memory([reading(1, 4096.0)], {DAY_UNIT}, set(), RESIDUAL)
    assert v.ok is False
    assert "4.0 GiB" in v.message and "no process has the device open" in v.message


def test_policy_foreign_memory_more_used_than_the_backend_accounts_for_blocks() -> None:
    # NVML's total is 4 GiB above what the backend's processes hold: a holder we cannot see
    v = foreign_memory([reading(1, 14500.0 + 4096.0, (DAY_PROC,))], {DAY_UNIT}, set(), RESIDUAL)
    assert v.ok is False and "GPU 1" in v.message


def test_policy_foreign_memory_backend_share_unreported_only_reported_foreign_blocks() -> None:
    unreported = Holder(pid=4000, user="gpushift", command="server", unit=DAY_UNIT, used_mib=None)
    assert foreign_memory([reading(1, 14500.0, (unreported,))], {DAY_UNIT}, set(), RESIDUAL).ok is True
    v = foreign_memory([reading(1, 14500.0 + 9318.0, (unreported, BOB))], {DAY_UNIT}, set(), RESIDUAL)
    assert v.ok is False and "pid 4242" in v.message


@pytest.mark.parametrize(
    "bad", [reading(1, None, error="NVML_ERROR_UNKNOWN"), reading(1, None, complete=False, unreadable=(7,))]
)
def test_policy_foreign_memory_refuses_an_unreadable_gpu(bad: GpuReading) -> None:
    v = foreign_memory([bad], {DAY_UNIT}, set(), RESIDUAL)
    assert v.ok is False and "unknown" in v.message


def test_policy_foreign_memory_says_simulated() -> None:
    v = foreign_memory([reading(1, 9318.0, (BOB,))], set(), set(), RESIDUAL, simulated=True)
    assert "(SIMULATED)" in v.message


# --------------------------------------------------------------------------- which GPUs the gate watches


def test_policy_gate_gpus_of_a_backend_are_its_configured_gpus() -> None:
    assert gate_gpus(TWO_BACKENDS, "night", ["day"], [0, 1]) == (1,)
    assert gate_gpus(TWO_BACKENDS, "day", ["night"], [0, 1]) == (0, 1)


def test_policy_gate_gpus_of_a_backend_without_gpus_are_all_gpus() -> None:
    assert gate_gpus(TWO_BACKENDS, "anywhere", [], [0, 1, 2]) == (0, 1, 2)


def test_policy_gate_gpus_of_off_are_the_stopped_backends_gpus() -> None:
    assert gate_gpus(TWO_BACKENDS, OFF, ["night"], [0, 1]) == (1,)
    assert gate_gpus(TWO_BACKENDS, OFF, ["night", "day"], [0, 1]) == (0, 1)


def test_policy_gate_gpus_of_off_with_nothing_running_is_every_gpu() -> None:
    assert gate_gpus(TWO_BACKENDS, OFF, [], [0, 1]) == (0, 1)


def test_policy_running_backends_keeps_config_order() -> None:
    assert running_backends({"day": True, "night": False, "anywhere": True}) == ["day", "anywhere"]
    assert running_backends({"day": False}) == []


def test_policy_foreign_memory_marks_memory_no_live_process_holds_as_orphaned() -> None:
    # a backend that has just ended: its memory, nobody holding it (nvidia-persistenced holds none)
    assert foreign_memory([reading(1, 4096.0)], {DAY_UNIT}, set(), RESIDUAL).orphaned is True
    assert foreign_memory([reading(1, 4096.0, (PERSISTENCED,))], set(), set(), RESIDUAL).orphaned is True
    # a live process that holds memory, or one whose share is not reported, is no moment's leftover
    assert foreign_memory([reading(1, 9318.0, (BOB, PERSISTENCED))], set(), set(), RESIDUAL).orphaned is False
    unknown_share = Holder(pid=5000, user="eve", command="python", used_mib=None)
    assert foreign_memory([reading(1, 9318.0, (unknown_share,))], set(), set(), RESIDUAL).orphaned is False
    assert foreign_memory([reading(0, None, error="NVML: gone")], set(), set(), RESIDUAL).orphaned is False
