"""The one null log (``gpushift/host/nulllog.py``): every logger method does nothing, ``bind``
gives the null log back, and the objects that take a log default to it."""

from __future__ import annotations

import copy

import pytest

from gpushift.host.jobwatch import JobWatch
from gpushift.host.nulllog import NULL_LOG
from gpushift.keeper.lookahead import LookAhead
from gpushift.keeper.store import JsonOverrideStore


def test_null_log_drops_every_line() -> None:
    for level in ("debug", "info", "warning", "error", "exception", "critical", "msg"):
        assert getattr(NULL_LOG, level)("event", key="value") is None


def test_null_log_binds_to_itself() -> None:
    assert NULL_LOG.bind(unit="a.service") is NULL_LOG
    assert NULL_LOG.new() is NULL_LOG


def test_null_log_has_no_protocols_it_does_not_implement() -> None:
    with pytest.raises(AttributeError):
        NULL_LOG.__deepcopy__  # noqa: B018
    assert copy.copy(NULL_LOG) is not None


def test_objects_given_no_log_get_the_null_log() -> None:
    assert JsonOverrideStore("/nonexistent/override.json").log is NULL_LOG
    assert LookAhead(lambda: None, lambda: None).log is NULL_LOG  # type: ignore[arg-type,return-value]
    assert JobWatch(None, list)._log is NULL_LOG
