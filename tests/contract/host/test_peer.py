"""Contract tests of the peer check (gpushift/host/peer.py) on real sockets held by real processes.

A listener in a child process (the test's own cgroup) stands for a backend when the cgroup the
check expects is the test's, and for an impostor when it is another; a listener handed to a child
that moves into a cgroup of its own stands for systemd's socket activation.  The tests run as root
(they make a cgroup and run a listener as user nobody).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushift.backends.served import Answered, Connection, RefusedForeign, RefusedUnknown
from gpushift.host import peer
from gpushift.host.peer import PeerFinder, cgroup2_root, cgroup_of

#: argv: host mode [fd].  Listens (or takes the listening socket ``fd``), prints its port, then
#: accepts every connection and keeps it ("accept") or never accepts ("hold").  With a fourth
#: argument, a cgroup directory, it first moves itself there.
LISTENER = textwrap.dedent(
    """
    import os, socket, sys, time
    host, mode = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 4:
        with open(os.path.join(sys.argv[4], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if len(sys.argv) > 3 and sys.argv[3] != "-":
        s = socket.socket(fileno=int(sys.argv[3]))
    else:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.bind((host, 0))
        s.listen(16)
    print(s.getsockname()[1], flush=True)
    kept = []
    while mode == "accept":
        kept.append(s.accept()[0])
    time.sleep(3600)
    """
)

OTHER = "/gpushift-test-nowhere.slice/other.service"


def listener(
    procs: Any, host: str = "127.0.0.1", mode: str = "accept", *extra: str, **kw: Any
) -> tuple[Any, int]:
    p = procs.start([sys.executable, "-c", LISTENER, host, mode, *extra], **kw)
    line = p.stdout.readline()
    if not line.strip().isdigit():
        raise AssertionError(f"the listener did not start: {line!r} {p.stderr.read()!r}")
    return p, int(line)


@contextlib.contextmanager
def connected(host: str, port: int) -> Iterator[Connection]:
    with socket.create_connection((host, port), timeout=10) as s:
        yield Connection(s.getsockname()[:2], s.getpeername()[:2])


def mine() -> str:
    cg = cgroup_of(os.getpid())
    assert cg, "the test's own cgroup cannot be read from /proc/self/cgroup"
    return cg


def deadline(s: float = 5.0) -> float:
    return time.monotonic() + s


def test_a_listener_of_the_expected_cgroup_is_answered_from_the_kernel_s_word(procs: Any) -> None:
    _p, port = listener(procs)
    finder = PeerFinder()
    with connected("127.0.0.1", port) as conn:
        assert finder.check(conn, mine(), deadline()) == Answered(f"127.0.0.1:{port}", "socket")
        end = finder.server_end(conn)
        assert end is not None and end.source == "sock_diag" and end.cgroup_id is not None
        # The id is the inode of the cgroup's directory: what the check compares.
        root = cgroup2_root()
        assert root is not None, "no cgroup2 file system is mounted"
        assert end.cgroup_id == os.stat(root + mine().rstrip("/")).st_ino


def test_a_listener_outside_the_expected_cgroup_is_foreign_and_named(procs: Any) -> None:
    if os.geteuid() != 0:
        raise AssertionError("this test must run as root: it runs its listener as user nobody")
    p, port = listener(procs)
    nobody = procs.start(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            LISTENER,
            "127.0.0.1",
            "accept",
        ]
    )
    nport = int(nobody.stdout.readline())
    finder = PeerFinder()
    for pid, lport, user in ((p.pid, port, "root"), (nobody.pid, nport, "nobody")):
        with connected("127.0.0.1", lport) as conn:
            v = finder.check(conn, OTHER, deadline())
        assert isinstance(v, RefusedForeign), v
        assert [x.pid for x in v.peers] == [pid] and v.peers[0].user == user, v
        assert (
            v.peers[0].cgroup == mine()
            and "python" in v.peers[0].command
            and LISTENER[:20] in v.peers[0].command
        )
        assert v.uid == (0 if user == "root" else 65534) and v.expected_cgroup == OTHER
        assert f"PID {pid}" in v.message() and f"user {user}" in v.message() and OTHER in v.message()


def test_a_unit_without_a_cgroup_or_whose_cgroup_is_gone_owns_nothing(procs: Any) -> None:
    _p, port = listener(procs)
    finder = PeerFinder()
    with connected("127.0.0.1", port) as conn:
        assert isinstance(finder.check(conn, "", deadline()), RefusedForeign)
        assert isinstance(
            finder.check(conn, "/gone-" + uuid.uuid4().hex + ".service", deadline()), RefusedForeign
        )


def test_a_server_that_never_accepts_is_judged_by_the_kernel_without_waiting_when_it_is_the_unit(
    procs: Any,
) -> None:
    _p, port = listener(procs, "127.0.0.1", "hold")
    finder = PeerFinder(accept_wait_s=0.3)
    with connected("127.0.0.1", port) as conn:
        t0 = time.monotonic()
        assert finder.check(conn, mine(), deadline()).ok
        assert time.monotonic() - t0 < 0.3  # the kernel's word comes before any accept
        v = finder.check(conn, OTHER, deadline())
    # Outside the unit and not accepted: foreign on the kernel's word, by uid and cgroup alone.
    assert isinstance(v, RefusedForeign) and v.peers == () and v.uid == os.geteuid()
    assert v.socket_cgroup == mine(), v


def test_without_socket_diagnostics_the_proc_table_and_the_holders_decide(procs: Any) -> None:
    p, port = listener(procs)
    finder = PeerFinder()
    finder._diag = False  # as on a kernel without NETLINK_SOCK_DIAG
    with connected("127.0.0.1", port) as conn:
        end = finder.server_end(conn)
        assert end is not None and end.source == "/proc/net/tcp" and end.cgroup_id is None
        assert finder.check(conn, mine(), deadline()) == Answered(f"127.0.0.1:{port}", "holder")
        v = finder.check(conn, OTHER, deadline())
    assert isinstance(v, RefusedForeign) and [x.pid for x in v.peers] == [p.pid]


def test_ipv6_loopback_is_checked_too(procs: Any) -> None:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        raise AssertionError(f"this host has no IPv6 loopback (::1): {e}") from None
    p, port = listener(procs, "::1")
    finder = PeerFinder()
    with connected("::1", port) as conn:
        assert finder.check(conn, mine(), deadline()) == Answered(f"[::1]:{port}", "socket")
        v = finder.check(conn, OTHER, deadline())
        assert isinstance(v, RefusedForeign) and [x.pid for x in v.peers] == [p.pid]
        finder._diag = False
        end = finder.server_end(conn)
        assert end is not None and end.source == "/proc/net/tcp" and end.inode != 0


def test_a_connection_the_kernel_does_not_list_cannot_be_told() -> None:
    ghost = Connection(("127.0.0.1", 1), ("127.0.0.1", 9))  # nothing has this four-tuple
    v = PeerFinder().check(ghost, mine(), deadline())
    assert isinstance(v, RefusedUnknown) and "lists no socket" in v.why
    assert peer.diag_end(ghost) is None and peer.proc_net_end(ghost) is None


@pytest.fixture
def own_cgroup() -> Iterator[str]:
    """A cgroup of its own below the test's (its path as systemd would name a unit's)."""
    root = cgroup2_root()
    if root is None:
        raise AssertionError("no cgroup2 file system is mounted: the peer check needs one")
    if os.geteuid() != 0:
        raise AssertionError("this test must run as root: it makes a cgroup")
    path = mine().rstrip("/") + f"/gpushift-peer-{uuid.uuid4().hex[:8]}.service"
    os.mkdir(root + path)
    try:
        yield path
    finally:
        deadline_s = time.monotonic() + 10
        while True:  # the processes in it are ended by then (procs): the group can go
            try:
                os.rmdir(root + path)
                break
            except OSError:
                if time.monotonic() > deadline_s:
                    raise
                time.sleep(0.05)


def test_a_listener_made_elsewhere_and_handed_to_the_unit_is_the_unit_s(procs: Any, own_cgroup: str) -> None:
    # systemd's socket activation: the manager makes the listener, the service accepts on it.
    root = cgroup2_root()
    assert root is not None
    made = socket.socket()
    made.bind(("127.0.0.1", 0))
    made.listen(16)
    try:
        p, port = listener(
            procs, "127.0.0.1", "accept", str(made.fileno()), root + own_cgroup, pass_fds=(made.fileno(),)
        )
    finally:
        made.close()
    assert cgroup_of(p.pid) == own_cgroup
    with connected("127.0.0.1", port) as conn:
        v = PeerFinder().check(conn, own_cgroup, deadline())
        assert v == Answered(f"127.0.0.1:{port}", "holder"), v
        assert isinstance(PeerFinder().check(conn, OTHER, deadline()), RefusedForeign)
    procs.stop_all()


def test_an_ipv4_connection_to_a_dual_stack_listener_is_checked_both_ways(procs: Any) -> None:
    p, port = listener(procs, "::")  # [::] takes IPv4 too (net.ipv6.bindv6only=0, the default)
    finder = PeerFinder()
    with connected("127.0.0.1", port) as conn:
        assert finder.check(conn, mine(), deadline()).ok
        finder._diag = False  # its line is in /proc/net/tcp6, with IPv4-mapped addresses
        end = finder.server_end(conn)
        assert end is not None and end.source == "/proc/net/tcp"
        assert finder.check(conn, mine(), deadline()).ok
        v = finder.check(conn, OTHER, deadline())
        assert isinstance(v, RefusedForeign) and [x.pid for x in v.peers] == [p.pid]
