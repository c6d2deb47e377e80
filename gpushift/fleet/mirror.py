"""The daemon's mirror: every ledger row of this host into the central table, and the host's state.

One thread (``mirror``) with one connection of its own; nothing on the switch's path waits on it.
A switch only pokes it (:meth:`Mirror.poke`, an ``Event.set``); the thread reads the host's ledger on
a read-only connection of its own (``local.py``), so a PostgreSQL that is down, slow or refusing only
makes the mirror lag: :meth:`Mirror.status` (memory only) says by how many rows and since when,
and the mirror catches up when the database is back.  Every cycle:

1. the chain: row 1's key names it; a new chain whose first row records no break is reported
   (the host's ledger was replaced), and mirrored as a chain of its own — nothing is overwritten;
2. the rows sent while pending, and the rows a carried change re-linked, are compared again and
   their known changes carried (``compare.py``);
3. new rows, in id order, ``batch_size`` per transaction, ``ON CONFLICT DO NOTHING``; the position
   (``position.py``) is written after each commit, so a restart resumes there;
4. an audit of ``batch_size`` rows already sent (a cursor that goes round the chain): a central row
   edited or deleted is reported (log ``mirror_mismatch``, ``gpushift_reports``, status), never
   overwritten or sent again;
5. the host's state row, when it changed or at every reconcile.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpushift import __version__
from gpushift.config.mirror import MirrorConfig
from gpushift.errors import FleetError, LedgerError
from gpushift.fleet import compare, db, schema
from gpushift.fleet.central import central_values, self_check
from gpushift.fleet.local import LocalRows
from gpushift.fleet.position import Position, PositionFile
from gpushift.fleet.store import CentralStore
from gpushift.ledger.breaks import recorded_break
from gpushift.values import Outcome

#: Without a poke, the thread looks at the ledger this often.
POLL_S = 2.0
#: Batches sent in one cycle before the thread looks at its other work (state, stop).
BATCHES_PER_CYCLE = 20
#: Problems kept for status (the newest).
KEEP_PROBLEMS = 20


class Mirror:
    """Args:
    config: ``[mirror]``.
    host: this host's name in the central database; ``machine_id`` its machine-id.
    db_path: the ledger database; ``state_dir``: where ``mirror.json`` is kept.
    state: the host's state for its central row (called on the mirror thread: memory only).
    log: the daemon's structlog logger.
    """

    def __init__(
        self,
        config: MirrorConfig,
        host: str,
        machine_id: str | None,
        db_path: str,
        state_dir: str,
        state: Callable[[], Mapping[str, Any]],
        log: Any,
    ) -> None:
        self.config = config
        self.host = host
        self.machine_id = machine_id
        self.local = LocalRows(db_path)
        self.file = PositionFile(state_dir)
        self.pos = self.file.load()
        self.state_source = state
        self.log = log
        self._wake = threading.Event()
        self._state_due = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._next_try = 0.0
        self._reported: set[tuple[Any, ...]] = set()
        self._last_state: Any = None
        self._check_from: int | None = None  # rows from here to ``sent`` are compared again
        self._behind_since: float | None = None
        self._status: dict[str, Any] = {"state": "starting", "lag_rows": None, "lag_s": None}
        self.problems: list[dict[str, Any]] = []
        self.shared_machine_id: list[str] = []
        self.error: str | None = None
        if self.file.set_aside:
            self._problem(
                "position", None, f"{self.file.path} was unreadable (moved to {self.file.set_aside})"
            )

    # ------------------------------------------------------------ the daemon's side (never blocks)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mirror", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self.local.close()

    def poke(self, state: bool = False) -> None:
        """Something changed (a ledger write; ``state``: a reconcile): look now, on the thread."""
        if state:
            self._state_due.set()
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """The mirror as ``status`` and ``/metrics`` show it (memory only)."""
        out = dict(self._status)
        behind = self._behind_since
        out["lag_s"] = round(time.monotonic() - behind, 1) if behind is not None else 0.0
        out.update(
            host=self.host,
            database=db.where(self.config.url),
            error=self.error,
            problems=len(self.problems),
            last_problems=self.problems[-3:],
            machine_id_shared_with=list(self.shared_machine_id),
        )
        return out

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._cycle()
            except Exception as e:  # noqa: BLE001 - the thread must live on; log it
                self.log.exception("mirror_failed", error=repr(e))
                self._drop(repr(e))
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _cycle(self) -> None:
        self._measure()
        if time.monotonic() < self._next_try:
            return
        try:
            conn = self._connection()
            store = CentralStore(conn, self.host)
            caught_up = self._sync(conn, store)
            self._audit(conn, store)
            if self.error is not None:
                self.log.info("mirror_reachable", database=db.where(self.config.url))
            self.error = None
            self._measure()
            self._put_state(conn, store)
            if not caught_up:
                self._wake.set()  # more to send: the next cycle at once
        except (FleetError, LedgerError) as e:
            self._drop(str(e))
        except db.DatabaseError as e:
            self._drop(db.one_line(e))

    def _drop(self, why: str) -> None:
        if self.error != why:
            self.log.warning("mirror_unavailable", database=db.where(self.config.url), error=why,
                             detail="the mirror lags; switches do not wait on it")  # fmt: skip
        self.error = why
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self._next_try = time.monotonic() + self.config.retry_s
        self._status["state"] = "unavailable"

    def _connection(self) -> Any:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn = db.connect(self.config, application="gpushift-mirror")
        try:
            schema.ensure(conn)
            self.shared_machine_id = CentralStore(conn, self.host).register(self.machine_id, __version__)
            if self.shared_machine_id:
                self._problem("machine_id", None, f"machine-id {self.machine_id} is also recorded by host(s) "
                              f"{', '.join(self.shared_machine_id)} (a cloned image?)", conn)  # fmt: skip
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self._conn = conn
        return conn

    # ------------------------------------------------------------ rows

    def _sync(self, conn: Any, store: CentralStore) -> bool:
        """Steps 1-3 of the module's docstring; True when every row is sent."""
        first = self.local.first()
        if first is None:
            return True
        chain = str(first["uuid"])
        if self.pos.chain != chain:
            self._new_chain(conn, store, chain, first)
        self._carry_pending(conn, store)
        for _ in range(BATCHES_PER_CYCLE):
            if self._stop.is_set():
                return False
            if self._check_from is not None:
                self._recheck(conn, store)
                continue
            rows = self.local.rows_from(self.pos.sent + 1, self.config.batch_size)
            if not rows:
                return True
            self._send(conn, store, rows)
        return False

    def _new_chain(self, conn: Any, store: CentralStore, chain: str, first: Mapping[str, Any]) -> None:
        brk = recorded_break(first)
        if self.pos.chain is not None and brk is None:
            self._problem("replaced", chain, f"the ledger now begins with another row 1 (chain {chain[:12]}) "
                          f"than the chain mirrored ({self.pos.chain[:12]}) and records no chain break: the "
                          "host's ledger was replaced; it is mirrored as a chain of its own", conn)  # fmt: skip
        store.note_chain(chain, brk)
        conn.commit()
        self.log.info("mirror_chain", chain=chain, previous=self.pos.chain, chain_break=brk is not None)
        self.pos = Position(chain=chain, sent=store.max_id(chain))
        self._check_from = 1 if self.pos.sent else None  # what the central table has: compared first
        self._save()

    def _carry_pending(self, conn: Any, store: CentralStore) -> None:
        """Rows sent while pending that are no longer: their finish or interruption is carried."""
        if not self.pos.pending:
            return
        still = set(self.local.pending_ids(self.pos.pending))
        done = [i for i in self.pos.pending if i not in still]
        if not done:
            return
        for row_id in done:
            self._compare_range(conn, store, row_id, row_id)
        self.pos.pending = sorted(still)
        conn.commit()
        self._save()

    def _recheck(self, conn: Any, store: CentralStore) -> None:
        lo = self._check_from or 1
        hi = min(lo + self.config.batch_size - 1, self.pos.sent)
        if lo <= hi:
            self._compare_range(conn, store, lo, hi)
            conn.commit()
        self._check_from = hi + 1 if hi < self.pos.sent else None

    def _send(self, conn: Any, store: CentralStore, rows: list[dict[str, Any]]) -> None:
        chain = self.pos.chain
        assert chain is not None
        there = store.rows(chain, rows[0]["id"], rows[-1]["id"])
        fresh = [r for r in rows if r["id"] not in there]
        store.insert(central_values(self.host, chain, r) for r in fresh)
        for r in rows:
            if r["id"] in there:  # sent before (a restart before the position was written)
                self._judge(conn, store, r, there[r["id"]])
        conn.commit()
        self.pos.sent = rows[-1]["id"]
        pending = [r["id"] for r in rows if r["outcome"] == Outcome.PENDING.value]
        self.pos.pending = sorted({*self.pos.pending, *pending})
        self._save()

    def _compare_range(self, conn: Any, store: CentralStore, lo: int, hi: int) -> None:
        chain = self.pos.chain
        assert chain is not None
        local = {r["id"]: r for r in self.local.rows_between(lo, hi)}
        there = store.rows(chain, lo, hi)
        for row_id in range(lo, hi + 1):
            mine, theirs = local.get(row_id), there.get(row_id)
            if theirs is None and mine is not None:
                self._problem("missing", chain, f"row {row_id} was mirrored but is missing from the central "
                              "table (deleted there); it is not sent again", conn, row_id)  # fmt: skip
            elif mine is None and theirs is not None:
                self._problem("replaced", chain, f"the central table holds row {row_id} of this chain but the "
                              "host's ledger has no such row (the host's ledger was replaced?)", conn, row_id)  # fmt: skip
            elif mine is not None and theirs is not None:
                self._judge(conn, store, mine, theirs)

    def _judge(self, conn: Any, store: CentralStore, mine: Mapping[str, Any], theirs: Any) -> None:
        ok = self_check(
            theirs.chain_row, theirs.hash, theirs.prev_hash, theirs.id, theirs.record, theirs.columns
        )
        v = compare.compare(mine, theirs.chain_row, ok)
        chain = self.pos.chain
        if v.kind == compare.CARRY:
            assert chain is not None
            store.carry(central_values(self.host, chain, mine))
            if v.what == "relinked" or mine["id"] < self.pos.sent:
                nxt = int(mine["id"]) + 1
                self._check_from = nxt if self._check_from is None else min(self._check_from, nxt)
        elif v.kind == compare.MISMATCH:
            self._problem("mismatch", chain, f"row {mine['id']}: {v.what}; the central row is left as it is",
                          conn, int(mine["id"]))  # fmt: skip

    def _audit(self, conn: Any, store: CentralStore) -> None:
        if not self.pos.sent or self.pos.chain is None:
            return
        lo = self.pos.audit + 1 if 0 < self.pos.audit < self.pos.sent else 1
        hi = min(lo + self.config.batch_size - 1, self.pos.sent)
        self._compare_range(conn, store, lo, hi)
        conn.commit()
        self.pos.audit = hi
        self._save()

    # ------------------------------------------------------------ state, problems, position

    def _put_state(self, conn: Any, store: CentralStore) -> None:
        state = dict(self.state_source())
        state["mirror"] = {k: v for k, v in self.status().items() if k not in ("lag_s", "last_problems")}
        state["machine_id"] = self.machine_id
        if state == self._last_state and not self._state_due.is_set():
            return
        self._state_due.clear()
        store.put_state(state)
        conn.commit()
        self._last_state = state

    def _problem(
        self, kind: str, chain: str | None, what: str, conn: Any = None, row_id: int | None = None
    ) -> None:
        key = (kind, chain, row_id, what)
        if key in self._reported:
            return
        self._reported.add(key)
        self.log.error("mirror_mismatch" if kind != "machine_id" else "mirror_machine_id_shared",
                       kind=kind, chain=chain, row=row_id, what=what)  # fmt: skip
        self.problems = [*self.problems, {"kind": kind, "chain": chain, "row": row_id, "what": what}][
            -KEEP_PROBLEMS:
        ]
        if conn is not None:
            CentralStore(conn, self.host).report(chain, row_id, kind, what)

    def _save(self) -> None:
        try:
            self.file.save(self.pos)
        except OSError as e:
            self.log.warning("mirror_position_not_saved", path=self.file.path, error=str(e))

    def _measure(self) -> None:
        """How far the central table is behind the host's ledger (local reads only)."""
        try:
            head = self.local.head()
            first = self.local.first() if head is not None else None
        except LedgerError as e:
            self._status["local_error"] = str(e)
            return
        self._status.pop("local_error", None)
        if head is None:
            lag = 0
        elif first is None or str(first["uuid"]) != self.pos.chain:
            lag = head[0]
        else:
            lag = max(0, head[0] - self.pos.sent) + (1 if self._check_from is not None else 0)
            done = set(self.pos.pending) - set(self.local.pending_ids(self.pos.pending))
            lag += len(done)
        now = time.monotonic()
        if lag and self._behind_since is None:
            self._behind_since = now
        elif not lag:
            self._behind_since = None
        self._status.update(
            lag_rows=lag,
            sent=self.pos.sent,
            chain=self.pos.chain,
            state=("lagging" if lag else "ok") if self.error is None else "unavailable",
        )
