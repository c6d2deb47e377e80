"""Opening the bus (gpushift.host.dbus.connect) against private dbus-daemons."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushift.errors import DaemonUnavailable, SystemdError
from gpushift.host.dbus import connect


@contextlib.contextmanager
def _opened(*args: Any, **kwargs: Any) -> Iterator[Any]:
    b = connect(*args, **kwargs)
    try:
        yield b
    finally:
        b.con.close_sync(None)


def test_connect_session_reads_the_address_now_each_time(
    start_bus: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = start_bus(), start_bus()
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", first)
    with _opened("session") as a:
        first_id = a.dbus.GetId()
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", second)
    with _opened("session") as b:
        second_id = b.dbus.GetId()
    with _opened("session", first) as c:  # an explicit address wins over the environment
        assert c.dbus.GetId() == first_id
    assert first_id != second_id


def test_connect_to_an_absent_bus_raises_systemd_error(tmp_path: Path) -> None:
    with pytest.raises(SystemdError, match="cannot connect"):
        connect("session", f"unix:path={tmp_path}/no-bus-here")
    with pytest.raises(ValueError):
        connect("tcp")


def test_connect_for_the_cli_raises_daemon_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus-here")
    with pytest.raises(DaemonUnavailable, match=f"cannot connect to unix:path={tmp_path}/no-bus-here") as e:
        connect("session", error=DaemonUnavailable)
    assert e.value.code == 6
