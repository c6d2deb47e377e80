"""The journal's native protocol (gpushift.host.journal) against real datagram sockets.

A receiving socket of the test's own stands in for journald; ``tests.support.journal_format`` reads
the entries back the way the protocol is written down, independently of the encoder.  tests/integration/test_journal.py checks the same entries against a real journald.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushift.host import journal
from tests.support.journal_format import parse_entry as parse
from tests.support.journal_format import stand_in_socket


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket (journald's side) and its path."""
    path = str(tmp_path / "journal.sock")
    with stand_in_socket(path) as s:
        yield s, path


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("ticket", "GPUSHIFT_TICKET"),
        ("failed-phase", "GPUSHIFT_FAILED_PHASE"),
        ("durations.s", "GPUSHIFT_DURATIONS_S"),
        ("über", "GPUSHIFT__BER"),
        ("a" * 100, "GPUSHIFT_" + "A" * 55),
    ],
)
def test_journal_field_name_follows_the_journal_rules(key: str, name: str) -> None:
    got = journal.field_name(key, "GPUSHIFT_")
    assert got == name
    assert journal.valid_name(got) and len(got) <= 64


def test_journal_field_name_never_starts_with_underscore_or_digit() -> None:
    # journald drops a client's field that starts with "_" (its trusted fields) or a digit
    assert journal.field_name("_pid") == "X_PID"
    assert journal.field_name("9lives") == "X9LIVES"
    assert journal.field_name("") == "X"


@pytest.mark.parametrize("name", ["", "_PID", "9A", "message", "A-B", "A" * 65, "ÄB"])
def test_journal_valid_name_rejects_what_journald_rejects(name: str) -> None:
    assert not journal.valid_name(name)


def test_journal_encode_plain_and_length_prefixed_forms() -> None:
    data = journal.encode([("MESSAGE", "one line"), ("DETAIL", "two\nlines"), ("RAW", b"\x00\xff")])
    assert data == (
        b"MESSAGE=one line\n" + b"DETAIL\n" + struct.pack("<Q", 9) + b"two\nlines\n" + b"RAW=\x00\xff\n"
    )
    assert parse(data) == [("MESSAGE", b"one line"), ("DETAIL", b"two\nlines"), ("RAW", b"\x00\xff")]


def test_journal_encode_refuses_an_invalid_field_name() -> None:
    with pytest.raises(ValueError, match="_PID"):
        journal.encode([("_PID", "1")])


def test_journal_socket_sends_one_datagram_per_entry(receiver: tuple[socket.socket, str]) -> None:
    rx, path = receiver
    js = journal.JournalSocket(path)
    try:
        js.send([("MESSAGE", "first"), ("PRIORITY", "6")])
        js.send([("MESSAGE", "second\nwith a newline"), ("GPUSHIFT_TICKET", "abc")])
    finally:
        js.close()
    assert parse(rx.recv(65536)) == [("MESSAGE", b"first"), ("PRIORITY", b"6")]
    assert parse(rx.recv(65536)) == [("MESSAGE", b"second\nwith a newline"), ("GPUSHIFT_TICKET", b"abc")]


def test_journal_socket_sends_a_large_entry_as_a_sealed_memfd(receiver: tuple[socket.socket, str]) -> None:
    rx, path = receiver
    big = ("y" * 1023 + "\n") * 1024  # 1 MiB: more than one datagram may carry
    js = journal.JournalSocket(path)
    try:
        js.send([("MESSAGE", "big"), ("BIG", big)])
    finally:
        js.close()
    fds = array.array("i")
    data, anc, _flags, _addr = rx.recvmsg(65536, socket.CMSG_SPACE(fds.itemsize))
    assert data == b""  # the entry is in the descriptor, not in the datagram
    level, kind, payload = anc[0]
    assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
    fds.frombytes(payload[: fds.itemsize])
    fd = fds[0]
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        want = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        assert seals & want == want  # journald reads only a memfd nobody can change any more
        content = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    assert parse(content) == [("MESSAGE", b"big"), ("BIG", big.encode())]


def test_journal_socket_without_journald_raises_oserror(tmp_path: Path) -> None:
    js = journal.JournalSocket(str(tmp_path / "nobody"))
    with pytest.raises(OSError):
        js.send([("MESSAGE", "x")])
    js.close()


def test_journal_socket_gives_up_when_journald_stops_reading(receiver: tuple[socket.socket, str]) -> None:
    # A stalled journald fills its queue; a send must then fail within the timeout, not block the daemon.
    _rx, path = receiver
    js = journal.JournalSocket(path, timeout_s=0.2)
    try:
        with pytest.raises(OSError):
            for _ in range(100_000):
                js.send([("MESSAGE", "x" * 1000)])
    finally:
        js.close()


def test_journal_connected_compares_device_and_inode(tmp_path: Path) -> None:
    with open(tmp_path / "stream", "w") as mine, open(tmp_path / "other", "w") as other:
        st = os.fstat(mine.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal.connected(env, fds=(other.fileno(), mine.fileno()))
        # inherited from a parent whose stream this is not: not connected
        assert not journal.connected(env, fds=(other.fileno(),))
        assert not journal.connected({}, fds=(mine.fileno(),))
        assert not journal.connected({"JOURNAL_STREAM": "garbage"}, fds=(mine.fileno(),))
        assert not journal.connected(env, fds=(9999,))  # a closed descriptor
