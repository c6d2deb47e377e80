"""Sd_notify — one datagram to $NOTIFY_SOCKET (systemd's man/sd_notify.xml).

A no-op when the daemon is not started by systemd with Type=notify (no $NOTIFY_SOCKET).
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False when there is no socket or it failed."""
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):  # abstract namespace
            addr = "\0" + addr[1:]
        msg = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(addr)
                s.sendall(msg)
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, line: str) -> bool:
        return self.send("STATUS=" + line.replace("\n", " "))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")


def watchdog_interval_s() -> float | None:
    """Half of $WATCHDOG_USEC (systemd's advice), when the watchdog is on for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
