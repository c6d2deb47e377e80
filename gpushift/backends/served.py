"""Who answered on a backend's port: the verdict on one checked connection (pure).

An answer on a backend's port proves nothing by itself: while the backend is stopped or starting,
any local user may bind that port and answer 200 with the version it likes.  A checked request
(readiness, the sampler's health, the warm-up, the version) therefore connects, asks the host who
holds the server end of THAT connection (:class:`PeerCheck`, implemented by
:mod:`gpushift.host.peer`), and sends its request only when that end belongs to the backend
unit's control group (its ``ControlGroup`` from systemd, or a group below it).  The verdict is one
of:

* :class:`Answered` — the unit's own process holds the connection;
* :class:`RefusedForeign` — something outside the unit does (its PID, user, command and cgroup
  where they could be found): the answer is not the backend's;
* :class:`RefusedUnknown` — it cannot be told (the kernel lists no such connection, nothing holds
  it before the deadline): the answer is not taken either (fail closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: How much of a process's command line a message shows.
COMMAND_CHARS = 120


@dataclass(frozen=True)
class Connection:
    """One TCP connection as its client sees it: our end and the server's (``getsockname`` and
    ``getpeername`` of the client's socket)."""

    client: tuple[str, int]
    server: tuple[str, int]

    @property
    def address(self) -> str:
        """The server's address as a person writes it: ``127.0.0.1:8000``, ``[::1]:8000``."""
        host, port = self.server
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Peer:
    """A process that holds the server end of a connection."""

    pid: int
    user: str
    command: str  # its command line (or short name when that cannot be read)
    cgroup: str  # its cgroup path (the unified hierarchy's), "" when it cannot be read

    def describe(self) -> str:
        command = self.command if len(self.command) <= COMMAND_CHARS else self.command[:COMMAND_CHARS] + "..."
        return f"PID {self.pid} (user {self.user}, command {command!r}, cgroup {self.cgroup or '?'})"

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command, "cgroup": self.cgroup}


@dataclass(frozen=True)
class Answered:
    """The backend's own process holds the connection.  ``how``: ``socket`` (the kernel says the
    server's socket was made in the unit's cgroup) or ``holder`` (a process of the unit holds it:
    a socket made elsewhere and handed over, as systemd's socket activation does)."""

    address: str
    how: str = "socket"

    @property
    def ok(self) -> bool:
        return True


@dataclass(frozen=True)
class RefusedForeign:
    """Something outside the backend's unit holds the server end of the connection."""

    address: str
    expected_cgroup: str
    peers: tuple[Peer, ...] = ()
    uid: int | None = None  # the server socket's owner, as the kernel lists it
    socket_cgroup: str = ""  # the cgroup the server socket was made in, when the kernel says

    @property
    def ok(self) -> bool:
        return False

    def message(self) -> str:
        """One line naming the impostor: who holds the port, and where the backend should be."""
        where = (
            f"outside the backend's unit ({self.expected_cgroup})"
            if self.expected_cgroup
            else "while the backend's unit has no control group (no process of it runs)"
        )
        if self.peers:
            who = "; ".join(p.describe() for p in self.peers)
        else:
            uid = f"uid {self.uid}" if self.uid is not None else "an unknown user"
            made = f", socket made in cgroup {self.socket_cgroup}" if self.socket_cgroup else ""
            who = f"a process of {uid}{made} (no process holding it was found)"
        return f"not the backend: {self.address} is answered by {who}, {where}"

    def to_dict(self) -> dict[str, Any]:
        """The facts, for a ledger row's ``extra`` and status."""
        return {
            "address": self.address,
            "expected_cgroup": self.expected_cgroup,
            "peers": [p.to_dict() for p in self.peers],
            "uid": self.uid,
            "socket_cgroup": self.socket_cgroup,
            "message": self.message(),
        }


@dataclass(frozen=True)
class RefusedUnknown:
    """Who holds the connection cannot be told: the answer is not taken."""

    address: str
    why: str

    @property
    def ok(self) -> bool:
        return False

    def message(self) -> str:
        return f"cannot tell who answers on {self.address}: {self.why}"


Served = Answered | RefusedForeign | RefusedUnknown


class PeerCheck(Protocol):
    """Who holds the server end of a connection we opened (:mod:`gpushift.host.peer`)."""

    def check(self, conn: Connection, expect_cgroup: str, deadline: float) -> Served:
        """The verdict on ``conn`` for a backend whose unit's cgroup is ``expect_cgroup`` (``""``:
        the unit has none, so nothing that answers is the backend).  ``deadline``: a
        ``time.monotonic()`` instant it returns by.  Never raises."""
        ...


class RefusedAnswer(Exception):
    """A checked request that was not sent: the connection is not the backend's (``verdict``)."""

    def __init__(self, verdict: RefusedForeign | RefusedUnknown) -> None:
        super().__init__(verdict.message())
        self.verdict = verdict


def within(cgroup: str, expected: str) -> bool:
    """Whether ``cgroup`` is ``expected`` or a group below it (``/a/b.service/x`` is within
    ``/a/b.service``; ``/a/b.service2`` is not).  Nothing is within ``""`` (no cgroup)."""
    if not expected or not cgroup:
        return False
    base = expected.rstrip("/")
    return cgroup in (expected, base) or cgroup.startswith(base + "/")


def judge(
    conn: Connection,
    expected: str,
    socket_within: bool | None,
    peers: Sequence[Peer],
    uid: int | None = None,
    socket_cgroup: str = "",
    why: str = "",
) -> Served:
    """The verdict from what the host found.

    Args:
        conn: the connection.
        expected: the unit's cgroup (``""``: none).
        socket_within: whether the kernel says the server socket was made within ``expected``
            (None: the kernel does not say).
        peers: the processes found holding the server end (may be empty).
        uid: the server socket's owner, as the kernel lists it.
        socket_cgroup: the cgroup the socket was made in, when known.
        why: what stood in the way, for a verdict that cannot be told.
    """
    if socket_within:
        return Answered(conn.address, "socket")
    if any(within(p.cgroup, expected) for p in peers):
        return Answered(conn.address, "holder")
    if peers or socket_within is False:
        return RefusedForeign(conn.address, expected, tuple(peers), uid, socket_cgroup)
    return RefusedUnknown(conn.address, why or "no process was found holding the connection")
