"""Who answered on a backend's port: the verdict's rules (gpushift/backends/served.py)."""

from __future__ import annotations

import pytest

from gpushift.backends.served import (
    Answered,
    Connection,
    Peer,
    RefusedAnswer,
    RefusedForeign,
    RefusedUnknown,
    judge,
    within,
)

UNIT = "/system.slice/gpushift-vllm.service"
CONN = Connection(("127.0.0.1", 50123), ("127.0.0.1", 8000))
NOBODY = Peer(4242, "nobody", "python3 -m http.server 8000", "/user.slice/user-65534.slice/session-3.scope")
OWN = Peer(1000, "vllm", "vllm serve /m", UNIT)


@pytest.mark.parametrize(
    ("cgroup", "expected", "inside"),
    [
        (UNIT, UNIT, True),
        (UNIT + "/worker", UNIT, True),  # a group the unit made below its own (Delegate=)
        (UNIT + "/", UNIT, True),  # the same group, however it is spelled
        ("/system.slice/gpushift-vllm.service2", UNIT, False),  # a neighbour with a longer name
        ("/system.slice", UNIT, False),  # its parent
        ("/user.slice/u.scope", UNIT, False),
        (UNIT, UNIT + "/", True),  # a trailing slash in what systemd said changes nothing
        (UNIT, "", False),  # the unit has no cgroup: nothing is the unit
        ("", UNIT, False),  # the process's cgroup could not be read
        ("/anything", "/", True),  # the root holds every group
    ],
)
def test_within_is_the_unit_s_cgroup_or_below_it_by_whole_path_components(
    cgroup: str, expected: str, inside: bool
) -> None:
    assert within(cgroup, expected) is inside


def test_the_kernel_saying_the_socket_is_the_unit_s_is_enough() -> None:
    assert judge(CONN, UNIT, True, ()) == Answered("127.0.0.1:8000", "socket")


def test_a_socket_made_elsewhere_but_held_by_the_unit_s_process_is_the_backend() -> None:
    # systemd's socket activation: the listener was made by the manager, the service holds it.
    assert judge(CONN, UNIT, False, (OWN,)) == Answered("127.0.0.1:8000", "holder")


def test_a_socket_of_another_cgroup_held_by_another_process_is_foreign_and_named() -> None:
    v = judge(CONN, UNIT, False, (NOBODY,), uid=65534)
    assert isinstance(v, RefusedForeign) and not v.ok
    msg = v.message()
    assert "127.0.0.1:8000" in msg and "PID 4242" in msg and "user nobody" in msg
    assert "python3 -m http.server 8000" in msg and NOBODY.cgroup in msg and UNIT in msg
    assert v.to_dict()["peers"] == [NOBODY.to_dict()] and v.to_dict()["uid"] == 65534
    assert v.to_dict()["message"] == msg


def test_foreign_without_a_holder_still_says_what_the_kernel_knows() -> None:
    # The impostor closed its end before it was found: the kernel's uid and cgroup remain.
    v = judge(CONN, UNIT, False, (), uid=65534, socket_cgroup="/user.slice/x.scope")
    assert isinstance(v, RefusedForeign)
    assert "uid 65534" in v.message() and "/user.slice/x.scope" in v.message()


def test_without_the_kernel_s_word_a_foreign_holder_decides() -> None:
    assert isinstance(judge(CONN, UNIT, None, (NOBODY,)), RefusedForeign)
    assert judge(CONN, UNIT, None, (OWN, NOBODY)) == Answered("127.0.0.1:8000", "holder")


def test_nothing_known_is_refused_as_unknown_never_taken() -> None:
    v = judge(CONN, UNIT, None, (), why="the server has not accepted the connection")
    assert v == RefusedUnknown("127.0.0.1:8000", "the server has not accepted the connection") and not v.ok
    assert "cannot tell who answers on 127.0.0.1:8000" in v.message()


def test_a_unit_without_a_cgroup_has_no_process_that_may_answer() -> None:
    v = judge(CONN, "", False, (OWN,))
    assert isinstance(v, RefusedForeign) and "no process of it runs" in v.message()


def test_a_long_command_is_cut_in_the_message() -> None:
    long = Peer(7, "eve", "x" * 500, "/c")
    v = judge(CONN, UNIT, False, (long,))
    assert (
        isinstance(v, RefusedForeign)
        and len(v.message()) < 400
        and v.to_dict()["peers"][0]["command"] == "x" * 500
    )


def test_an_ipv6_server_is_written_with_brackets_and_the_refusal_carries_its_verdict() -> None:
    conn = Connection(("::1", 40000), ("::1", 8000))
    v = judge(conn, UNIT, False, (NOBODY,))
    assert v.address == "[::1]:8000"
    assert isinstance(v, RefusedForeign)
    e = RefusedAnswer(v)
    assert e.verdict is v and str(e) == v.message()
