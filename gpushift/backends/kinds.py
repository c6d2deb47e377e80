"""The table of backend kinds: the config's ``kind = "..."`` → what gpushift knows about it.

One module a kind (``vllm.py``, ``llama.py``, ``generic.py``), each building one
:class:`gpushift.backends.kind.Kind`; one line for it here.  Everything that depends on a kind
asks this table (the config reader, the drain probe, the warm-up, the pre-warm, the doctor), so
adding a kind is writing its module and adding its line.  The order is the one the config's
error message lists them in.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushift.backends import generic, llama, vllm
from gpushift.backends.kind import Kind

#: Every kind a config may name, by that name.
KINDS: Mapping[str, Kind] = {
    k.name: k
    for k in (
        generic.KIND,
        vllm.KIND,
        llama.KIND,
    )
}

#: The kind of a backend whose config names none.
DEFAULT = generic.NAME


def kind_of(name: str) -> Kind:
    """The kind a config names (one of :data:`KINDS`: the config reader accepts no other)."""
    return KINDS[name]


def any_in_flight(text: str) -> int | None:
    """The requests in flight on a page of any kind's form (a ``generic`` backend's
    ``metrics_url``): the first kind that can read it says; None when none can."""
    for k in KINDS.values():
        n = k.in_flight(text) if k.in_flight is not None else None
        if n is not None:
            return n
    return None
