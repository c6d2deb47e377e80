"""A flood of pipelined ``GetStatus`` calls on the daemon's bus, as any local user could send it.

Each connection authenticates (``EXTERNAL``), says ``Hello`` (answered before the next connection
is opened) and then writes its calls without waiting for a reply; the replies are counted from their fixed headers, never decoded.  Two shapes:

* **window** (``--window W --duration S``): every connection keeps ``W`` calls outstanding for ``S``
  seconds — each reply (or error) is followed by the next call.  With the system bus's limit of 128
  pending replies per connection (``max_replies_per_connection``), ``W = 128`` on each of many
  connections is the most one user can keep queued at the daemon (``max_connections_per_user``: 256).
* **burst** (``--burst N``): every connection writes ``N`` calls at once and reads until all are
  answered (45,000 on one connection of the session bus, whose limit is 50,000).

A call the bus refuses (``org.freedesktop.DBus.Error.LimitsExceeded``, one over the limit) counts as
``refused``, any other error as ``errors``.  One JSON line a second on stdout (``sent``, ``answered``,
``refused``, ``errors``, ``open``: connections still up; ``answered_per_s`` over that second) and a
last one with ``"done": true`` and the totals.  Standard library and jeepney only; bounded: it ends
after ``--duration`` (window) or ``--max-s`` (burst), whatever the daemon does.

    python -m tests.support.busflood --connections 200 --window 128 --duration 40
    python -m tests.support.busflood --connections 1 --burst 45000
    python -m tests.support.busflood --member Ping ...   # the same flood on GDBus's own Peer.Ping
    (the bus: --address, else $DBUS_SESSION_BUS_ADDRESS)
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUS_NAME = "org.gpushift.Switcher1"
OBJECT_PATH = "/org/gpushift/Switcher1"
INTERFACE = "org.gpushift.Switcher1"
LIMITS_EXCEEDED = "org.freedesktop.DBus.Error.LimitsExceeded"

_METHOD_RETURN, _ERROR = 2, 3


def unix_path(address: str) -> str:
    """The socket of a ``unix:path=...`` (or ``unix:abstract=...``) bus address."""
    for part in address.split(";"):
        if not part.startswith("unix:"):
            continue
        for kv in part[len("unix:") :].split(","):
            key, _, value = kv.partition("=")
            if key == "path":
                return value
            if key == "abstract":
                return "\0" + value
    raise ValueError(f"not a unix bus address: {address!r}")


#: What a flood may call: the daemon's GetStatus, or ``org.freedesktop.DBus.Peer.Ping`` on the same
#: object, which GDBus answers itself on its own thread, in C (the floor: the bus's cost alone).
MEMBERS = {"GetStatus": INTERFACE, "Ping": "org.freedesktop.DBus.Peer"}


def _call_template(member: str = "GetStatus") -> bytes:
    from jeepney import DBusAddress, new_method_call

    addr = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=MEMBERS[member])
    return bytes(new_method_call(addr, member).serialise(serial=1))


def _hello() -> bytes:
    from jeepney import DBusAddress, new_method_call

    bus = DBusAddress(
        "/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus"
    )
    return bytes(new_method_call(bus, "Hello").serialise(serial=1))


def _error_name(raw: bytes) -> str:
    from jeepney.low_level import HeaderFields, Parser

    p = Parser()
    p.add_data(raw)
    msg = p.get_next_message()
    return str(msg.header.fields.get(HeaderFields.error_name, "")) if msg is not None else ""


def _message_length(buf: bytearray | bytes, at: int) -> int | None:
    """The whole length of the message that starts at ``buf[at]``, or None while its header is short."""
    if len(buf) - at < 16:
        return None
    fmt = "<I" if buf[at] == ord("l") else ">I"
    (body,) = struct.unpack_from(fmt, buf, at + 4)
    (fields,) = struct.unpack_from(fmt, buf, at + 12)
    head = 16 + int(fields)
    head += -head % 8
    return head + int(body)


def authenticate(path: str, timeout_s: float = 30.0) -> tuple[socket.socket, bytes]:
    """A connected socket to the bus that has said ``Hello`` and had its answer (the bus counts a
    connection as incomplete until then, and takes at most 64 such at once on the system bus); the
    bytes read after that answer come back beside it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout_s)
    s.connect(path)
    s.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
    answer = b""
    while not answer.endswith(b"\r\n"):
        chunk = s.recv(256)
        if not chunk:
            raise ConnectionError("the bus closed the connection during authentication")
        answer += chunk
    if not answer.startswith(b"OK"):
        raise ConnectionError(f"the bus refused authentication: {answer!r}")
    s.sendall(b"BEGIN\r\n" + _hello())
    buf = b""
    while True:
        n = _message_length(buf, 0)
        if n is not None and len(buf) >= n:
            if buf[1] == _METHOD_RETURN:
                break
            buf = buf[n:]  # anything before the answer (nothing is expected)
            continue
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("the bus closed the connection before answering Hello")
        buf += chunk
    s.setblocking(False)
    return s, buf[n:]


@dataclass
class Conn:
    sock: socket.socket
    to_send: int  # calls still to write (burst), or the window's refills waiting
    outstanding: int = 0
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    serial: int = 1
    open: bool = True


@dataclass
class Counts:
    sent: int = 0
    answered: int = 0
    refused: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(sent=self.sent, answered=self.answered, refused=self.refused, errors=self.errors)


class Flood:
    """The flooding connections and their counts; :meth:`run` drives them until the end."""

    def __init__(
        self, address: str, connections: int, window: int = 0, burst: int = 0, member: str = "GetStatus"
    ) -> None:
        if (window > 0) == (burst > 0):
            raise ValueError("give a window or a burst, not both")
        self.path = unix_path(address)
        self.window, self.burst = window, burst
        self.counts = Counts()
        self.template = bytearray(_call_template(member))
        self.sel = selectors.DefaultSelector()
        self.conns: list[Conn] = []
        for _ in range(connections):
            sock, rest = authenticate(self.path)
            c = Conn(sock, to_send=burst or window)
            c.inbuf += rest
            self.conns.append(c)
            self.sel.register(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def _queue_calls(self, c: Conn, n: int) -> None:
        for _ in range(n):
            c.serial += 1
            struct.pack_into("<I", self.template, 8, c.serial)
            c.outbuf += self.template
        c.outstanding += n
        self.counts.sent += n

    def _on_message(self, c: Conn, raw: bytes, refill: bool) -> None:
        kind = raw[1]
        if kind not in (_METHOD_RETURN, _ERROR):
            return  # a signal (NameAcquired)
        c.outstanding -= 1
        if kind == _METHOD_RETURN:
            self.counts.answered += 1
        elif _error_name(raw) == LIMITS_EXCEEDED:
            self.counts.refused += 1
        else:
            self.counts.errors += 1
        if refill:
            c.to_send += 1

    def _read(self, c: Conn, refill: bool) -> None:
        try:
            data = c.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        c.inbuf += data
        at = 0
        while True:
            n = _message_length(c.inbuf, at)
            if n is None or len(c.inbuf) - at < n:
                break
            self._on_message(c, bytes(c.inbuf[at : at + n]), refill)
            at += n
        del c.inbuf[:at]

    def _write(self, c: Conn) -> None:
        if c.to_send:
            self._queue_calls(c, c.to_send)
            c.to_send = 0
        if not c.outbuf:
            return
        try:
            sent = c.sock.send(c.outbuf)
        except BlockingIOError:
            return
        except OSError:
            self._close(c)
            return
        del c.outbuf[:sent]

    def _close(self, c: Conn) -> None:
        if c.open:
            c.open = False
            self.sel.unregister(c.sock)
            c.sock.close()

    def run(self, duration_s: float, report: Callable[[dict[str, Any]], None] | None = None) -> Counts:
        """Window: flood for ``duration_s``; burst: until every call is answered or ``duration_s``."""
        start = last = time.monotonic()
        answered_then = 0
        while True:
            now = time.monotonic()
            flooding = now - start < duration_s
            live = [c for c in self.conns if c.open]
            if not flooding or not live:
                break
            if self.burst and all(c.to_send == 0 and c.outstanding == 0 and not c.outbuf for c in live):
                break
            for c in live:
                want = selectors.EVENT_READ
                if c.outbuf or c.to_send:
                    want |= selectors.EVENT_WRITE
                self.sel.modify(c.sock, want, c)
            for key, mask in self.sel.select(0.2):
                c = key.data
                if mask & selectors.EVENT_READ and c.open:
                    self._read(c, refill=bool(self.window))
                if mask & selectors.EVENT_WRITE and c.open:
                    self._write(c)
            if report is not None and now - last >= 1.0:
                answered = self.counts.answered
                report(self.progress(answered_per_s=round((answered - answered_then) / (now - last))))
                last, answered_then = now, answered
        return self.counts

    def progress(self, **extra: Any) -> dict[str, Any]:
        return {**self.counts.as_dict(), "open": sum(c.open for c in self.conns), **extra}

    def close(self) -> None:
        for c in self.conns:
            self._close(c)
        self.sel.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default=os.environ.get("DBUS_SESSION_BUS_ADDRESS", ""))
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--window", type=int, default=0, help="calls kept outstanding per connection")
    ap.add_argument("--burst", type=int, default=0, help="calls written at once per connection")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds (window); the most (burst)")
    ap.add_argument(
        "--member", choices=sorted(MEMBERS), default="GetStatus", help="the call (default GetStatus)"
    )
    args = ap.parse_args(argv)
    if not args.address:
        ap.error("no bus address: give --address or set DBUS_SESSION_BUS_ADDRESS")
    if (args.window > 0) == (args.burst > 0):
        ap.error(f"give --window or --burst (got --window {args.window}, --burst {args.burst})")
    if not 1 <= args.connections <= 4096 or not 0 < args.duration <= 3600:
        ap.error(
            f"--connections {args.connections} (1..4096) or --duration {args.duration} (0..3600] out of range"
        )
    started = time.monotonic()
    flood = Flood(args.address, args.connections, window=args.window, burst=args.burst, member=args.member)
    print(json.dumps({"flooding": True, "connections": args.connections}), flush=True)

    def report(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    try:
        flood.run(args.duration, report)
        final = flood.progress(
            done=True, seconds=round(time.monotonic() - started, 1)
        )  # open: before closing
    finally:
        flood.close()
    print(json.dumps(final), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
