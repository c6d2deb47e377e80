"""Which instance of a backend of several gets a request (gpushift/frontdoor/balance.py): the
fewest in flight, ties round robin, instances marked down skipped, a retry skipping those tried."""

from __future__ import annotations

import pytest

from gpushift.frontdoor.balance import Picker


def test_ties_go_round_robin() -> None:
    p = Picker(["a", "b", "c"])
    got = []
    for _ in range(6):
        i = p.pick()
        assert i is not None
        got.append(i)  # each answered before the next: always a tie
    assert got == [0, 1, 2, 0, 1, 2]


def test_the_fewest_in_flight_wins() -> None:
    p = Picker(["a", "b"])
    first = p.pick()
    assert first == 0
    p.begin(0)
    assert p.pick() == 1  # a has one in flight
    p.begin(1)
    p.begin(1)
    assert p.pick() == 0  # a 1, b 2
    p.begin(0)
    p.begin(0)
    assert p.pick() == 1  # a 3, b 2
    p.end(0)
    p.end(0)
    p.end(0)
    assert p.in_flight == [0, 2]
    assert p.pick() == 0
    assert p.total_in_flight() == 2


def test_concurrent_requests_spread_evenly() -> None:
    p = Picker(["a", "b"])
    for _ in range(32):
        i = p.pick()
        assert i is not None
        p.begin(i)
    assert p.in_flight == [16, 16]


def test_an_instance_marked_down_gets_nothing_until_up_again() -> None:
    p = Picker(["a", "b", "c"])
    assert p.mark(1, False) is True
    assert p.mark(1, False) is False
    assert {p.pick() for _ in range(10)} == {0, 2}
    p.begin(0)
    p.begin(2)
    assert p.pick() in (0, 2)  # b has none in flight, but it is down
    assert p.mark(1, True) is True
    assert p.pick() == 1


def test_a_retry_skips_the_instances_tried() -> None:
    p = Picker(["a", "b", "c"])
    assert p.pick() == 0
    assert p.pick(exclude={0}) == 1
    assert p.pick(exclude={0, 1}) == 2
    assert p.pick(exclude={0, 1, 2}) is None


def test_every_instance_down_still_tries_the_least_busy() -> None:
    p = Picker(["a", "b"])
    p.mark(0, False)
    p.mark(1, False)
    p.begin(0)
    assert p.pick() == 1
    assert p.pick(exclude={1}) == 0
    assert p.pick(exclude={0, 1}) is None


def test_all_up_names_those_that_were_down() -> None:
    p = Picker(["a", "b", "c"])
    p.mark(2, False)
    assert p.all_up() == [2]
    assert p.up == [True, True, True]


def test_one_instance_is_always_picked_and_end_never_goes_below_zero() -> None:
    p = Picker(["only"])
    assert [p.pick() for _ in range(3)] == [0, 0, 0]
    p.end(0)
    assert p.in_flight == [0]
    with pytest.raises(ValueError):
        Picker([])
