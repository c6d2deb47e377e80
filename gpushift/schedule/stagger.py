"""Staggered boundaries: this host's stable offset within ``[daemon] stagger_s`` (pure).

Hosts that load their models from one shared store must not all start at a boundary's same second.
Each host therefore shifts every scheduled boundary by an offset in ``[0, stagger_s)`` whole
seconds, derived from its host name alone (``[mirror] host_name``): the first 8 bytes of
``sha256("gpushift-stagger\\0" + name)`` as an integer, scaled to the range.  The same name always
gets the same offset (across restarts, versions and hosts), and different names spread evenly; two
hosts collide with probability 1/``stagger_s``.  :meth:`gpushift.schedule.Schedule.staggered` does
the shift.
"""

from __future__ import annotations

import hashlib
from typing import Any

_TAG = b"gpushift-stagger\0"


def offset_s(host_name: str, stagger_s: int) -> int:
    """The offset (whole seconds, ``0 <= offset < stagger_s``; 0 when ``stagger_s`` is 0)."""
    if stagger_s <= 0:
        return 0
    digest = hashlib.sha256(_TAG + host_name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") * stagger_s >> 64


def describe(host_name: str, stagger_s: int) -> dict[str, Any] | None:
    """What status, ``schedule`` and the ledger row say of it (``extra.stagger``); None without one."""
    if stagger_s <= 0:
        return None
    return {"host_name": host_name, "stagger_s": stagger_s, "offset_s": offset_s(host_name, stagger_s)}
