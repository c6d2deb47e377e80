"""The requests a server has in flight, read from the page its metrics endpoint answers.

Two forms: a Prometheus text page whose gauges count the requests running and queued (vLLM's
``/metrics``, llama-server's ``/metrics`` with ``--metrics``), and llama-server's ``/slots``
(a JSON list, one object a slot, ``is_processing`` for a slot serving a request).  Pure: the
page comes in as text (:mod:`gpushift.backends.probe` fetches it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEInfa]+)")


def prometheus_sum(metrics_text: str, names: Collection[str]) -> int | None:
    """Sum of the gauges ``names`` found in a Prometheus text page; None when none is present."""
    total = 0.0
    seen = False
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in names:
            try:
                total += float(m.group(3))
                seen = True
            except ValueError:
                continue
    return int(total) if seen else None


def processing_slots(text: str) -> int | None:
    """llama-server's ``/slots``: how many slots are processing a request."""
    try:
        slots = json.loads(text)
    except ValueError:
        return None
    if not isinstance(slots, list):
        return None
    return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
