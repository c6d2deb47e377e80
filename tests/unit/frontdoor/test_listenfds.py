"""sd_listen_fds(3) as the front door reads it: LISTEN_PID must be ours, LISTEN_FDS sockets from the
first descriptor on, LISTEN_FDNAMES their names; the variables are unset once read; a descriptor that
is not a listening stream socket is an error naming it.

Real sockets, placed on a block of free descriptors the test picks (``start=``: systemd's is 3,
which pytest's own files may hold); ``tests/contract/frontdoor/test_listenfds_activate.py`` runs the
real thing under ``systemd-socket-activate``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

from gpushift.frontdoor.listenfds import ListenFdsError, listen_fds, sockname


def _free_block(n: int) -> int:
    """The first of ``n`` consecutive descriptor numbers nobody holds (above 100)."""
    fd = 100
    while True:
        if all(not _open(fd + i) for i in range(n)):
            return fd
        fd += n


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def placed(*made: socket.socket) -> Iterator[int]:
    """The sockets dup'ed onto consecutive descriptors from a free block; yields the first; closes all."""
    start = _free_block(len(made))
    try:
        for i, s in enumerate(made):
            os.dup2(s.fileno(), start + i)
            s.close()
        yield start
    finally:
        for i in range(len(made)):
            with contextlib.suppress(OSError):
                os.close(start + i)


def listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(8)
    return s


def env(count: int, names: str | None = None, pid: int | None = None) -> dict[str, str]:
    e = {"LISTEN_PID": str(os.getpid() if pid is None else pid), "LISTEN_FDS": str(count), "OTHER": "kept"}
    if names is not None:
        e["LISTEN_FDNAMES"] = names
    return e


def test_two_named_sockets_are_taken_in_order_and_the_variables_unset() -> None:
    a, b = listener(), listener(socket.AF_INET6, "::1")
    want = [sockname(a), sockname(b)]
    with placed(a, b) as start:
        e = env(2, "frontdoor:frontdoor")
        got = listen_fds(e, start=start)
        assert [(s.fd, s.name, s.address) for s in got] == [
            (start, "frontdoor", want[0]),
            (start + 1, "frontdoor", want[1]),
        ]
        assert e == {"OTHER": "kept"}  # the three variables gone, nothing else touched
        for s in got:
            assert s.sock.getblocking() is False and s.sock.get_inheritable() is False
            assert s.sock.family in (socket.AF_INET, socket.AF_INET6)
        assert got[1].address.startswith("[::1]:")
        for s in got:
            s.sock.detach()  # placed() closes the descriptors


def test_without_fdnames_each_socket_is_named_unknown() -> None:
    with placed(listener()) as start:
        got = listen_fds(env(1), start=start)
        assert [s.name for s in got] == ["unknown"]
        got[0].sock.detach()


def test_another_process_s_sockets_are_not_taken_but_the_variables_still_go() -> None:
    with placed(listener()) as start:
        e = env(1, "frontdoor", pid=os.getpid() + 1)
        assert listen_fds(e, start=start) == []
        assert e == {"OTHER": "kept"}
        assert _open(start)  # left alone: not ours to close


@pytest.mark.parametrize("e", [{}, {"LISTEN_FDS": "1"}, {"LISTEN_PID": "x", "LISTEN_FDS": "1"}])
def test_no_sockets_when_the_variables_are_absent_or_not_ours(e: dict[str, str]) -> None:
    assert listen_fds(dict(e), start=_free_block(1)) == []


def test_nothing_is_unset_when_asked_not_to() -> None:
    with placed(listener()) as start:
        e = env(1, "frontdoor")
        got = listen_fds(e, start=start, unset=False)
        assert len(got) == 1 and set(e) == {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "OTHER"}
        got[0].sock.detach()


@pytest.mark.parametrize(
    ("count", "names", "says"),
    [
        ("-1", None, "LISTEN_FDS='-1'"),
        ("two", None, "LISTEN_FDS='two'"),
        ("65", None, "LISTEN_FDS='65'"),
        ("2", "frontdoor", "names 1 sockets, LISTEN_FDS says 2"),
        ("1", "a:b", "names 2 sockets, LISTEN_FDS says 1"),
    ],
)
def test_malformed_variables_are_errors_naming_them(count: str, names: str | None, says: str) -> None:
    e = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": count}
    if names is not None:
        e["LISTEN_FDNAMES"] = names
    with pytest.raises(ListenFdsError) as err:
        listen_fds(e, start=_free_block(2))
    assert says in str(err.value)
    assert "LISTEN_FDS" not in e  # unset even so


def test_a_descriptor_that_is_not_open_is_named() -> None:
    start = _free_block(1)
    with pytest.raises(ListenFdsError, match=rf"descriptor {start} \('frontdoor'\) .* is not open"):
        listen_fds(env(1, "frontdoor"), start=start)


def test_a_file_is_not_a_socket() -> None:
    r, w = os.pipe()
    start = _free_block(1)
    os.dup2(r, start)
    try:
        with pytest.raises(ListenFdsError, match=rf"descriptor {start} .* is not a socket"):
            listen_fds(env(1, "frontdoor"), start=start)
        assert _open(start)  # not closed behind systemd's back
    finally:
        for fd in (r, w, start):
            os.close(fd)


def test_a_datagram_socket_and_a_socket_that_does_not_listen_are_refused() -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    with placed(udp) as start:
        with pytest.raises(ListenFdsError, match="not a stream socket"):
            listen_fds(env(1), start=start)
        assert _open(start)
    quiet = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    quiet.bind(("127.0.0.1", 0))
    with placed(quiet) as start, pytest.raises(ListenFdsError, match="is not listening"):
        listen_fds(env(1), start=start)


def test_an_adopted_socket_accepts_a_connection() -> None:
    with placed(listener()) as start:
        (got,) = listen_fds(env(1, "frontdoor"), start=start)
        host, port = got.sock.getsockname()
        with socket.create_connection((host, port), timeout=5):
            got.sock.setblocking(True)
            conn, _ = got.sock.accept()
            conn.close()
        got.sock.detach()
