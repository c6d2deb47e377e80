"""A reader of the journal's native protocol, written from its description
(https://systemd.io/JOURNAL_NATIVE_PROTOCOL/) independently of gpushift's encoder, so that tests can
check what the encoder sends without trusting it; and a datagram socket that stands in for journald's."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator


def parse_entry(data: bytes) -> list[tuple[str, bytes]]:
    """The fields of one entry, in order: ``NAME=value\\n``, or ``NAME\\n`` + the value's length
    (64-bit little-endian) + the value + ``\\n``.

    Raises:
        AssertionError: the bytes do not follow the format.
    """
    fields = []
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        eq = data.find(b"=", i, nl)
        if eq >= 0:
            fields.append((data[i:eq].decode("ascii"), data[eq + 1 : nl]))
            i = nl + 1
            continue
        (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
        end = nl + 9 + size
        assert data[end : end + 1] == b"\n", "a length-prefixed value must be followed by \\n"
        fields.append((data[i:nl].decode("ascii"), data[nl + 9 : end]))
        i = end + 1
    return fields


@contextlib.contextmanager
def stand_in_socket(path: str, timeout_s: float = 5.0) -> Iterator[socket.socket]:
    """A datagram socket bound at ``path`` where journald's would be (closed afterwards)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind(path)
        s.settimeout(timeout_s)
        yield s
    finally:
        s.close()
