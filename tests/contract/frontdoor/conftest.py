"""Fixtures of the front door's contract tests (the rig: ``tests/support/frontdoor_rig.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.frontdoor_rig import Door, Rig


@pytest.fixture
def door_factory() -> Iterator[Callable[..., Door]]:
    """``door_factory(clock=None, **frontdoor_keys)``: see :meth:`Rig.door`; all stopped after the test."""
    rig = Rig()
    try:
        yield rig.door
    finally:
        rig.close()
