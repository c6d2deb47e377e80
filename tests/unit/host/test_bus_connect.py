"""A host without PyGObject/pydbus (a GPU test box, a broken install): opening the bus says so as a
gpushift error of the caller's kind, so `gpushift status` falls back to what it can read itself
instead of dying with an ImportError."""

from __future__ import annotations

import sys

import pytest

from gpushift.errors import DaemonUnavailable, SystemdError
from gpushift.host.dbus import connect


@pytest.mark.parametrize("missing", ["pydbus", "gi"])
def test_connect_without_pydbus_or_gi_raises_the_callers_error(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # import of it raises ImportError
    if missing == "gi":
        monkeypatch.setitem(sys.modules, "gi.repository", None)
    with pytest.raises(DaemonUnavailable, match="pydbus/PyGObject are not installed"):
        connect("session", error=DaemonUnavailable)
    with pytest.raises(SystemdError, match="cannot reach the system bus"):
        connect("system")
