"""Who holds the server end of a TCP connection we opened: the :class:`~gpushift.backends.served.PeerCheck`.

A health, version or warm-up request is checked on its own connection, once connected and before
a byte is sent (:mod:`gpushift.backends.httpget`).  The server's end of a loopback connection is a
socket of this machine, and the kernel says two things about it:

1. **Its cgroup.**  The kernel's socket diagnostics (``NETLINK_SOCK_DIAG``, what ``ss`` reads)
   find the one socket of the connection's four-tuple and report, besides its owner's uid and its
   inode, the cgroup (v2) it belongs to (``INET_DIAG_CGROUP_ID``, attribute 21 of the kernel's
   ``include/uapi/linux/inet_diag.h``; measured here on Linux 6.18).  An accepted socket
   carries the cgroup of the listening socket it came from, which is the cgroup of the process that
   made the listener; it is known as soon as the handshake is done, before the server has even
   called ``accept``.  The id is the inode number of the cgroup's directory in the cgroup2 file
   system, so "the unit's cgroup or below it" is one ``stat`` of the unit's ``ControlGroup`` (and
   a walk of its sub-groups, when it has any): the check costs one netlink round trip and one
   ``stat`` (docs/benchmarks.md).
2. **Who holds it.**  When the cgroup is not the unit's (a listener made elsewhere and handed over,
   as systemd's socket activation does; or an impostor), or the kernel does not say, the socket's
   inode is looked for among the open files of processes (``/proc/PID/fd`` →
   ``socket:[INODE]``): the unit's own processes first (its ``cgroup.procs``), then every process
   (:func:`gpushift.host.procscan.scan_holders`), which names the impostor (PID, user, command,
   cgroup).  An inode is 0 until the server accepts; this waits for that, briefly.

Without socket diagnostics (a kernel built without them), the connection's line in
``/proc/net/tcp``/``tcp6`` gives the uid and the inode; there, and where the diagnostics do not
report the cgroup, the holder search decides.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpushift.backends.served import Connection, Peer, Served, judge
from gpushift.host import procscan

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
INET_DIAG_CGROUP_ID = 21
_NLMSG_HDR = struct.Struct("=IHHII")
_DIAG_MSG_BYTES = 72  # struct inet_diag_msg

#: How long a check waits for the server to accept the connection (its socket's inode is 0 until
#: then) before it says it cannot tell; only a socket outside the unit's cgroup is waited for.
ACCEPT_WAIT_S = 0.5
#: The most cgroup directories walked to name the cgroup an outside socket was made in.
CGROUP_WALK_LIMIT = 20000


@dataclass(frozen=True)
class SocketEnd:
    """What the kernel says about the server end of a connection."""

    uid: int
    inode: int  # 0: not accepted yet, or closed
    cgroup_id: int | None  # None: the kernel does not say
    source: str  # "sock_diag" or "/proc/net/tcp"


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def diag_end(conn: Connection, timeout_s: float = 1.0) -> SocketEnd | None:
    """The server end of ``conn`` from the kernel's socket diagnostics; None when it has none.

    Raises:
        OSError: socket diagnostics cannot be used here (no such netlink protocol, refused).
    """
    family = _family(conn.server[0])
    pad = b"\0" * (12 if family == socket.AF_INET else 0)
    sock_id = (
        struct.pack("!HH", conn.server[1], conn.client[1])
        + socket.inet_pton(family, conn.server[0])
        + pad
        + socket.inet_pton(family, conn.client[0])
        + pad
        + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    )
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sock_id
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(timeout_s)
        nl.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req)
        data = nl.recv(65536)
    length, kind, _flags, _seq, _pid = _NLMSG_HDR.unpack_from(data)
    if kind == NLMSG_ERROR:
        return None  # ENOENT: no socket of that four-tuple (the server closed and it is gone)
    if kind != SOCK_DIAG_BY_FAMILY or length < _NLMSG_HDR.size + _DIAG_MSG_BYTES:
        raise OSError(f"socket diagnostics answered message type {kind} of {length} bytes")
    msg = _NLMSG_HDR.size
    uid, inode = struct.unpack_from("=II", data, msg + 64)
    return SocketEnd(
        uid, inode, _cgroup_attr(data, msg + _DIAG_MSG_BYTES, min(length, len(data))), "sock_diag"
    )


def _cgroup_attr(data: bytes, at: int, end: int) -> int | None:
    """The INET_DIAG_CGROUP_ID attribute among the message's attributes (None: not there)."""
    while at + 4 <= end:
        size, kind = struct.unpack_from("=HH", data, at)
        if size < 4:
            break
        if kind == INET_DIAG_CGROUP_ID and size >= 12:
            return int(struct.unpack_from("=Q", data, at + 4)[0])
        at += (size + 3) & ~3
    return None


def _hex_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp{,6}`` prints it (each 32-bit word in host byte order)."""
    raw = socket.inet_pton(_family(host), host)
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def proc_net_end(conn: Connection, proc: str = procscan.PROC) -> SocketEnd | None:
    """The server end of ``conn`` from its line in ``/proc/net/tcp`` (``tcp6``): uid and inode.

    An IPv4 connection to a dual-stack listener (``[::]``) is a line of ``tcp6`` with IPv4-mapped
    addresses (``::ffff:127.0.0.1``): looked for there when ``tcp`` has none."""
    (shost, sport), (chost, cport) = conn.server, conn.client
    tables = [("tcp6", shost, chost)] if _family(shost) == socket.AF_INET6 else [("tcp", shost, chost)]
    if _family(shost) == socket.AF_INET:
        tables.append(("tcp6", f"::ffff:{shost}", f"::ffff:{chost}"))
    for table, server, client in tables:
        wanted = f"{_hex_address(server, sport)} {_hex_address(client, cport)} "
        with open(f"{proc}/net/{table}", encoding="ascii", errors="replace") as f:
            text = f.read()
        at = text.find(wanted)
        if at >= 0:
            fields = text[at : text.find("\n", at)].split()
            return SocketEnd(int(fields[6]), int(fields[8]), None, "/proc/net/tcp")
    return None


def cgroup2_root(proc: str = procscan.PROC) -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, ``/sys/fs/cgroup/unified``
    on a hybrid host); None without one."""
    try:
        with open(f"{proc}/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and tail.split()[:1] == ["cgroup2"] and len(fields) >= 5 and fields[3] == "/":
            return _unescape(fields[4])
    return None


def _unescape(path: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def cgroup_of(pid: int, proc: str = procscan.PROC) -> str:
    """A process's cgroup path in the unified hierarchy (``0::`` line); on a host without one, in
    systemd's ``name=systemd`` hierarchy; "" when it cannot be read."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    found = ""
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            return path
        if controllers == "name=systemd":
            found = path
    return found


def _dirs(base: str, limit: int) -> Iterator[tuple[str, int]]:
    """(path, inode) of ``base`` and every cgroup directory below it, at most ``limit``."""
    stack, seen = [base], 0
    while stack and seen < limit:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        seen += 1
                        yield e.path, e.inode()
        except OSError:
            continue


class PeerFinder:
    """:class:`~gpushift.backends.served.PeerCheck` from the kernel's socket tables and ``/proc``.

    Args:
        proc: where ``/proc`` is.
        accept_wait_s: how long to wait for a server to accept (see :data:`ACCEPT_WAIT_S`).
    """

    def __init__(self, proc: str = procscan.PROC, accept_wait_s: float = ACCEPT_WAIT_S) -> None:
        self.proc = proc
        self.accept_wait_s = accept_wait_s
        self._root: str | None | bool = False  # False: not looked up yet
        self._diag = True  # socket diagnostics work here (False once they failed)

    @property
    def cgroup_root(self) -> str | None:
        if self._root is False:
            self._root = cgroup2_root(self.proc)
        return self._root if isinstance(self._root, str) else None

    def server_end(self, conn: Connection) -> SocketEnd | None:
        """The server end of ``conn``: socket diagnostics, else ``/proc/net/tcp``."""
        if self._diag:
            try:
                return diag_end(conn)
            except OSError:
                self._diag = False
        try:
            return proc_net_end(conn, self.proc)
        except (OSError, ValueError, IndexError):
            return None

    def check(self, conn: Connection, expect_cgroup: str, deadline: float) -> Served:
        end = self.server_end(conn)
        if end is None:
            return judge(conn, expect_cgroup, None, (), why="the kernel lists no socket for this connection")
        inside = self._socket_within(end, expect_cgroup)
        if inside:
            return judge(conn, expect_cgroup, True, ())
        end = self._accepted(conn, end, min(deadline, time.monotonic() + self.accept_wait_s))
        peers = self._holders(end.inode, expect_cgroup) if end.inode else []
        made_in = ""
        if inside is False and not peers and end.cgroup_id is not None:
            made_in = self._cgroup_path(end.cgroup_id)
        why = "the server has not accepted the connection" if not end.inode else ""
        return judge(conn, expect_cgroup, inside, peers, end.uid, made_in, why)

    def _socket_within(self, end: SocketEnd, expected: str) -> bool | None:
        """Whether the kernel's cgroup of the socket is ``expected`` or below (None: cannot say)."""
        root = self.cgroup_root
        if end.cgroup_id is None or root is None:
            return None
        if not expected:
            return False
        base = root + expected.rstrip("/")
        try:
            if os.stat(base).st_ino == end.cgroup_id:
                return True
        except OSError:
            return False  # the unit's cgroup is gone: nothing of it can hold a socket
        return any(inode == end.cgroup_id for _path, inode in _dirs(base, CGROUP_WALK_LIMIT))

    def _accepted(self, conn: Connection, end: SocketEnd, until: float) -> SocketEnd:
        """``end`` once the server accepted (its inode set), or as it is at ``until``."""
        pause = 0.0002  # a server accepts within microseconds; a busy one may take a while
        while end.inode == 0 and time.monotonic() < until:
            time.sleep(min(pause, max(0.0, until - time.monotonic())))
            pause = min(pause * 2, 0.05)
            again = self.server_end(conn)
            if again is None:
                break
            end = again
        return end

    def _holders(self, inode: int, expected: str) -> list[Peer]:
        """The processes holding socket ``inode``: the unit's own first, else every process."""
        target = f"socket:[{inode}]"
        own = [pid for pid in self._unit_pids(expected) if self._holds(pid, target)]
        pids = own or [info.pid for info in procscan.scan_holders({0: target}).holders_of(0)]
        return [p for p in (self._peer(pid) for pid in pids) if p is not None]

    def _unit_pids(self, expected: str) -> list[int]:
        root = self.cgroup_root
        if root is None or not expected:
            return []
        base = root + expected.rstrip("/")
        pids: list[int] = []
        for path in [base, *(p for p, _ in _dirs(base, CGROUP_WALK_LIMIT))]:
            try:
                with open(f"{path}/cgroup.procs", encoding="ascii") as f:
                    pids += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
        return pids

    def _holds(self, pid: int, target: str) -> bool:
        fd_dir = f"{self.proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return True
            except OSError:
                continue
        return False

    def _peer(self, pid: int) -> Peer | None:
        info = procscan.process_info(pid)
        if info is None:
            return None
        command = " ".join(info.cmdline) if info.cmdline else info.command
        return Peer(pid, info.user, command, cgroup_of(pid, self.proc))

    def _cgroup_path(self, cgroup_id: int) -> str:
        """The path of the cgroup with id ``cgroup_id`` (a walk of the hierarchy); "" if not found."""
        root = self.cgroup_root
        if root is None:
            return ""
        if cgroup_id == _inode(root):
            return "/"
        for path, inode in _dirs(root, CGROUP_WALK_LIMIT):
            if inode == cgroup_id:
                return path[len(root) :] or "/"
        return ""


def _inode(path: str) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1
