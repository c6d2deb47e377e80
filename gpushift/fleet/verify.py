"""``gpushift fleet verify``: each host's chain checked in the central copy alone (pure).

The rows of one (host, chain) come in id order; each must be what its host wrote (``central.self_check``:
its content matches its hash, its columns and record what it hashed), link to the row before it
(``prev_hash``; row 1 to the genesis hash), follow it without a gap, and have reached the central
table after it (``seq``).  The host's state row says up to which id the mirror sent: rows missing
after the last one are named too.  Each problem names the host, the chain and the rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpushift.fleet.central import self_check
from gpushift.ledger.chain import GENESIS_HASH


@dataclass(frozen=True)
class Row:
    id: int
    seq: int
    prev_hash: str
    hash: str
    chain_row: str
    record: Any
    columns: dict[str, Any]


@dataclass
class ChainReport:
    host: str
    chain: str
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    last_id: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "chain": self.chain, "rows": self.rows, "last_id": self.last_id,
                "ok": self.ok, "problems": list(self.problems)}  # fmt: skip


def _ids(a: int, b: int) -> str:
    return f"row {a}" if a == b else f"rows {a}-{b}"


def check_chain(host: str, chain: str, rows: Iterable[Row], sent_through: int | None = None) -> ChainReport:
    """Every problem of one chain's central rows (``rows`` in id order)."""
    rep = ChainReport(host, chain)
    prev: Row | None = None
    for r in rows:
        rep.rows += 1
        want = prev.id + 1 if prev is not None else 1
        if r.id > want:
            rep.problems.append(
                f"{_ids(want, r.id - 1)} missing (deleted from the central table, or never sent)"
            )
        why = self_check(r.chain_row, r.hash, r.prev_hash, r.id, r.record, r.columns)
        if why is not None:
            rep.problems.append(f"row {r.id} altered: {why}")
        elif r.id == 1 and r.prev_hash != GENESIS_HASH:
            rep.problems.append(
                "row 1 out of order: it does not start the chain (its prev_hash is not the genesis)"
            )
        elif prev is not None and prev.id == r.id - 1 and r.prev_hash != prev.hash:
            rep.problems.append(f"row {r.id} out of order: it does not link to row {prev.id}")
        if prev is not None and r.seq < prev.seq:
            rep.problems.append(f"row {r.id} out of order: it reached the central table before row {prev.id}")
        prev = r
    rep.last_id = prev.id if prev is not None else 0
    if sent_through is not None and sent_through > rep.last_id:
        rep.problems.append(
            f"{_ids(rep.last_id + 1, sent_through)} missing: the host's mirror sent up to row {sent_through}"
        )
    return rep
