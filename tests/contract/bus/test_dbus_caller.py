"""The D-Bus service reads the caller from the bus; older dbus-daemons send no UnixGroupIDs."""

from __future__ import annotations

import grp
import os
import pwd
from typing import Any

import pytest

from gpushift.bus.service import SwitcherService
from gpushift.errors import AccessDenied


class _Creds:
    def __init__(self, creds: dict[str, Any]) -> None:
        self.creds = creds

    def GetConnectionCredentials(self, sender: str) -> dict[str, Any]:  # noqa: N802 - D-Bus name
        return self.creds


class _Bus:
    def __init__(self, creds: dict[str, Any]) -> None:
        self.dbus = _Creds(creds)


class _Ctx:
    sender = ":1.42"


def service(creds: dict[str, Any], group: str = "gpushift") -> SwitcherService:
    return SwitcherService(_Bus(creds), backend=None, allowed_group=group)  # type: ignore[arg-type]


def test_caller_groups_from_bus_when_the_bus_sends_them() -> None:
    caller, gids = service({"UnixUserID": 65534, "UnixGroupIDs": [7, 9], "ProcessID": 99}).caller(_Ctx())
    assert caller.uid == 65534 and caller.pid == 99 and gids == [7, 9]


def test_caller_groups_from_user_database_when_the_bus_sends_none() -> None:
    root_groups = set(os.getgrouplist("root", 0))
    _caller, gids = service({"UnixUserID": 0}).caller(_Ctx())
    assert set(gids) == root_groups


def test_authorize_member_of_allowed_group_without_unix_group_ids() -> None:
    nobody = pwd.getpwnam("nobody")
    primary = grp.getgrgid(nobody.pw_gid).gr_name  # nobody's own group stands in for "gpushift"
    caller = service({"UnixUserID": nobody.pw_uid}, group=primary).authorize(_Ctx())
    assert caller.user == "nobody"
    with pytest.raises(AccessDenied, match="only root and members of group 'no-such-group'"):
        service({"UnixUserID": nobody.pw_uid}, group="no-such-group").authorize(_Ctx())
