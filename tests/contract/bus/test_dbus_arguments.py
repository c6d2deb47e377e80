"""The daemon's D-Bus methods check every argument before anything changes: a hostile backend name
or reason, unknown or mistyped options, options nested deeply enough to exhaust the JSON parser —
each is ``org.gpushift.Error.InvalidArgument`` naming the field (exit 2 at the CLI), never an
"internal error", and the daemon is never asked to switch."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from gpushift.bus.service import SwitcherService
from gpushift.errors import InvalidArgument
from gpushift.values import Caller

INVALID = InvalidArgument.dbus_name()


class _Creds:
    def GetConnectionCredentials(self, sender: str) -> dict[str, Any]:  # noqa: N802 - D-Bus name
        return {"UnixUserID": os.getuid(), "ProcessID": os.getpid()}


class _Bus:
    dbus = _Creds()


class _Ctx:
    sender = ":1.42"


class _Daemon:
    """Records the switches it is asked for."""

    def __init__(self) -> None:
        self.switches: list[tuple[str, dict[str, Any]]] = []

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str:
        self.switches.append((backend, options))
        return "t-1"

    def property_values(self) -> dict[str, Any]:
        from gpushift.bus.service import PROPERTY_DEFAULTS

        return dict(PROPERTY_DEFAULTS)


def call(method: str, *args: Any) -> tuple[str | None, str, _Daemon]:
    """(D-Bus error name or None, message or ticket, the daemon)."""
    daemon = _Daemon()
    svc = SwitcherService(_Bus(), daemon)  # type: ignore[arg-type]
    try:
        return None, getattr(svc, method)(*args, dbus_context=_Ctx()), daemon
    except Exception as e:  # the handler raises an exception class named after the D-Bus error
        return type(e).__name__, str(e), daemon


def nested(depth: int) -> str:
    return '{"reason": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    ("method", "args", "field"),
    [
        ("Switch", ("a", "deploy\x1b]0;owned\x07"), "reason"),
        ("Switch", ("a", "line one\nline two"), "reason"),
        ("Switch", ("a", "\u202eevil"), "reason"),
        ("Switch", ("a", "x" * 1001), "reason"),
        ("Switch", ("--now", ""), "backend"),
        ("Switch", ("-h", ""), "backend"),
        ("Switch", ("../x", ""), "backend"),
        ("Switch", ("a" * 65, ""), "backend"),
        ("Switch", ("", ""), "backend"),
        ("SwitchWithOptions", ("a", nested(5000)), "options"),
        ("SwitchWithOptions", ("a", nested(100)), "options"),
        ("SwitchWithOptions", ("a", nested(20)), "reason"),
        ("SwitchWithOptions", ("a", "[1]"), "options"),
        ("SwitchWithOptions", ("a", "{"), "options"),
        ("SwitchWithOptions", ("a", '{"now": "yes"}'), "now"),
        ("SwitchWithOptions", ("a", '{"shell": "rm"}'), "shell"),
        ("SwitchWithOptions", ("a", '{"until": 5}'), "until"),
        ("SwitchWithOptions", ("a", '{"hold": true, "until": "2030-01-01 08:00"}'), "until"),
        ("SwitchWithOptions", ("a", json.dumps({"reason": "r" * 5000})), "options"),
        ("SwitchWithOptions", ("a\x00b", "{}"), "backend"),
    ],
)
def test_hostile_arguments_are_invalid_argument_and_change_nothing(
    method: str, args: tuple[str, str], field: str
) -> None:
    name, message, daemon = call(method, *args)
    assert name == INVALID, (name, message)
    assert field in message
    assert "internal error" not in message
    assert daemon.switches == []


def test_good_arguments_reach_the_daemon_checked() -> None:
    name, ticket, daemon = call("Switch", "llama_2-b", "nightly batch")
    assert (name, ticket) == (None, "t-1")
    assert daemon.switches == [("llama_2-b", {"reason": "nightly batch"})]
    opts = {"reason": "x", "now": True, "until": "2030-01-01 08:00", "when_idle": False}
    name, ticket, daemon = call("SwitchWithOptions", "off", json.dumps(opts))
    assert name is None and daemon.switches == [("off", opts)]
    name, ticket, daemon = call("SwitchWithOptions", "a", "")
    assert name is None and daemon.switches == [("a", {"reason": ""})]


def test_invalid_argument_has_exit_code_2() -> None:
    assert InvalidArgument.code == 2
    assert INVALID == "org.gpushift.Error.InvalidArgument"
