"""A test front door: owns ``org.gpushift.FrontDoor1`` on a (session) bus and answers the daemon's
calls the way the contract says, from files a test writes — so the daemon's side of the contract is
shown against the real bus and the real daemon before (and apart from) the real front door::

    DBUS_SESSION_BUS_ADDRESS=... python -m tests.support.fake_frontdoor --dir DIR [--hang]

In ``DIR`` (read at every call, so a test changes them while the daemon calls):
    in_flight.json   ``{"day": 1}``: what ``Close`` and ``InFlight`` answer per backend (absent: 0)
    held.json        ``{"held": 3, "longest_s": 1.5}``: what the next ``Release`` answers
and it writes:
    calls.jsonl      one JSON line per call received: ``{"t": UNIX time, "call": "Close", "arg": "day"}``
    ready            its PID, once it owns the name

``--hang``: owns the name, records every call, never answers one (a front door that hangs).
Only the standard library and jeepney (pure Python); it ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from jeepney import HeaderFields, MessageType, new_error, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

NAME = "org.gpushift.FrontDoor1"
PATH = "/org/gpushift/FrontDoor1"
INTERFACE = "org.gpushift.FrontDoor1"
_DO_NOT_QUEUE = 4


def _read(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _record(d: Path, call: str, arg: str | None) -> None:
    with open(d / "calls.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "call": call, "arg": arg}) + "\n")


def answer(d: Path, member: str, arg: str | None) -> tuple[str, tuple[Any, ...]] | None:
    """The reply's signature and body for one call (None: not a member of FrontDoor1)."""
    counts = _read(d / "in_flight.json", {})
    if member in ("Close", "InFlight"):
        return "u", (int(counts.get(arg or "", 0)),)
    if member == "Release":
        held = _read(d / "held.json", {})
        (d / "held.json").write_text("{}")
        return "ud", (int(held.get("held", 0)), float(held.get("longest_s", 0.0)))
    if member == "Status":
        doc = {"listen": ["[::]:8000"], "held": int(_read(d / "held.json", {}).get("held", 0)),
               "in_flight": counts, "closed": [], "daemon": "connected", "requests": 0}  # fmt: skip
        return "s", (json.dumps(doc),)
    return None


def serve(d: Path, hang: bool) -> int:
    conn = open_dbus_connection(bus="SESSION")
    reply = conn.send_and_get_reply(message_bus.RequestName(NAME, _DO_NOT_QUEUE), timeout=10)
    if reply.body[0] != 1:  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
        print(f"fake_frontdoor: cannot own {NAME} (reply {reply.body[0]})", file=sys.stderr)
        return 1
    (d / "ready").write_text(str(os.getpid()))
    while True:
        msg = conn.receive()
        h = msg.header
        if h.message_type is not MessageType.method_call:
            continue
        member = h.fields.get(HeaderFields.member)
        arg = str(msg.body[0]) if msg.body else None
        if h.fields.get(HeaderFields.path) != PATH or h.fields.get(HeaderFields.interface) != INTERFACE:
            conn.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", "s", ("not here",)))
            continue
        _record(d, str(member), arg)
        if hang:
            continue  # never answered: the caller's deadline is all that ends its wait
        got = answer(d, str(member), arg)
        if got is None:
            conn.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", "s", (str(member),)))
        else:
            conn.send(new_method_return(msg, got[0], got[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fake_frontdoor", description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="the directory of its files")
    p.add_argument("--hang", action="store_true", help="own the name and never answer")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return serve(Path(a.dir), a.hang)


if __name__ == "__main__":
    sys.exit(main())
