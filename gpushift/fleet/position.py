"""What the mirror has sent, kept under ``state_dir`` (``mirror.json``), so a restart resumes there.

``chain`` (the key of the chain's first row), ``sent`` (the highest row id the central table holds
from this host's chain, as this host sent it), ``pending`` (ids sent while their switch was still
pending: their finish or interruption is still to be carried) and ``audit`` (where the next
comparison of central rows with the host's resumes).  Written with the one atomic write
(``host/files.py``: a temporary file renamed over it, fsynced) after every committed batch; a
crash between the commit and the write only sends those rows again, which the central table takes
as the same rows (``ON CONFLICT``).  A file that cannot be read is set aside and the mirror starts
from the beginning of the chain, comparing what the central table already holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from gpushift.config.textfile import set_aside
from gpushift.host import safefile
from gpushift.host.files import write_atomic

FILE_NAME = "mirror.json"
MAX_BYTES = 1024 * 1024


@dataclass
class Position:
    chain: str | None = None
    sent: int = 0
    pending: list[int] = field(default_factory=list)
    audit: int = 0

    def to_json(self) -> bytes:
        d = {"chain": self.chain, "sent": self.sent, "pending": sorted(self.pending), "audit": self.audit}
        return (json.dumps(d, indent=1) + "\n").encode()

    @classmethod
    def from_dict(cls, d: Any) -> Position:
        if not isinstance(d, dict):
            raise ValueError("not an object")
        chain, sent, audit = d.get("chain"), d.get("sent", 0), d.get("audit", 0)
        pending = d.get("pending", [])
        ints = [sent, audit, *pending] if isinstance(pending, list) else None
        if (chain is not None and not isinstance(chain, str)) or ints is None:
            raise ValueError("bad fields")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ints):
            raise ValueError("bad numbers")
        return cls(chain, sent, list(pending), audit)


class PositionFile:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        #: Where an unreadable file was moved (shown in status), if one was.
        self.set_aside: str | None = None

    def load(self) -> Position:
        try:
            raw = safefile.read_bounded(self.path, MAX_BYTES)
            return Position.from_dict(json.loads(raw.decode("utf-8")))
        except FileNotFoundError:
            return Position()
        except (OSError, ValueError, safefile.Skipped):
            self.set_aside = set_aside(self.path) or self.path
            return Position()

    def save(self, pos: Position) -> None:
        """Raises OSError (the state directory is full or read-only): the mirror goes on from memory."""
        write_atomic(self.path, pos.to_json(), mode=0o640)
