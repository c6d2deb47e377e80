"""The pending spool: records the database could not take, kept until it can.

One JSON file per record under ``<runtime dir>/ledger-pending/`` (another filesystem than the
database: ``/run``), written atomically and fsynced, and the same entries in memory.  An entry carries
the record's key (the ``uuid`` column) so that landing it twice updates one row, and ``seq``, the
time of its first attempt, which orders the replay.  A file that is not an entry this code wrote, or
a record the database refuses for what it is, is set aside as ``<name>.bad`` for a person, out of the
replay's way; the log line says where.  The files are read with the one careful reader
(:func:`gpushift.host.safefile.read_bounded`): a regular file of the spool directory only (a FIFO
would block the daemon's start, a symlink to ``/dev/zero`` fill its memory), at most ``max_bytes``;
anything else is such a damaged file, never opened as what it is.  :attr:`Spool.bad_files` names
the newest of them (what the ledger's health can show).

The spool is bounded (``max_records``, ``max_bytes``): a record that does not fit is not kept, and
its one log line (``ledger_record_lost``) carries the whole record.  Every record kept has such a
line too (``ledger_pending``), so a spool lost with ``/run`` at a reboot is still in the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpushift.host import safefile
from gpushift.ledger.files import DIR_MODE, fsync_dir, write_file_atomic
from gpushift.ledger.rows import now_iso, record_json, redacted

#: Subdirectory of the runtime directory holding one JSON file per pending record.
SPOOL_SUBDIR = "ledger-pending"

#: ``emit(level, event, **fields)``: one structured log line.
Emit = Callable[..., None]

#: At most this many records wait in the spool (months of switches at a few a day).
DEFAULT_MAX_RECORDS = 1000
#: ... and at most this many bytes of record files (``/run`` is memory).
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

#: How many set-aside spool files :attr:`Spool.bad_files` names (the newest).
BAD_FILES_KEPT = 10

#: The ``op`` of the first record of a new chain (``breaks.py``): it replays before every other.
CHAIN_BREAK_OP = "chain_break"


class Spool:
    """Pending records, in memory and (when there is a runtime directory) on disk.

    Args:
        runtime_dir: the runtime directory (``/run/gpushift``); ``None`` keeps records in memory only.
        group: the group given to the spool files.
        emit: where log lines go (``emit(level, event, **fields)``).
        readonly: a reader's view (``gpushift ledger``): the files are read afresh at every look,
            never written, removed or set aside.
        max_records, max_bytes: the bound; a record beyond it is logged (``ledger_record_lost``)
            and not kept.
    """

    def __init__(
        self,
        runtime_dir: str | None,
        group: str | None,
        emit: Emit,
        readonly: bool,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = os.path.join(runtime_dir, SPOOL_SUBDIR) if runtime_dir is not None else None
        self.group = group
        self.readonly = readonly
        self.max_records = max_records
        self.max_bytes = max_bytes
        #: Records not kept because the spool was full (since this process started).
        self.lost = 0
        #: ``"<path>: why"`` of the newest spool files found damaged and set aside as ``.bad`` (since
        #: this process started; at most :data:`BAD_FILES_KEPT`).
        self.bad_files: list[str] = []
        self._emit = emit
        self._pending: dict[str, dict[str, Any]] = {}  # key -> entry
        self._sizes: dict[str, int] = {}  # key -> bytes of its file
        self._next_provisional = -1
        # Guards _pending against readers on other threads (status): they must never wait for the
        # ledger's write lock, which a write holds while SQLite waits up to its lock timeout.
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- in memory

    def load(self) -> list[dict[str, Any]]:
        """Read the spool directory (oldest first); a writer keeps the entries as pending."""
        entries = self.read_dir()
        if not self.readonly:
            with self._lock:
                for entry in entries:
                    self._pending[entry["uuid"]] = entry
                    self._sizes[entry["uuid"]] = len(record_json(entry).encode("utf-8"))
                    pid = entry.get("provisional_id")
                    if isinstance(pid, int) and pid < 0:
                        self._next_provisional = min(self._next_provisional, pid - 1)
        return entries

    def new_provisional_id(self) -> int:
        """The id of a record that is only here: negative, unique within the spool."""
        pid = self._next_provisional
        self._next_provisional -= 1
        return pid

    def entries(self) -> list[dict[str, Any]]:
        """The pending entries, oldest first (a reader reads the directory afresh)."""
        if self.readonly:
            return self.read_dir()  # the daemon may land them any moment
        with self._lock:
            return sorted(self._pending.values(), key=lambda e: e["seq"])

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        """``(key, entry)`` of every pending record, in no particular order."""
        with self._lock:
            return list(self._pending.items())

    def get(self, key: str) -> dict[str, Any] | None:
        return self._pending.get(key)

    def pending_break(self) -> dict[str, Any] | None:
        """The first record of a new chain, while it waits to be written (None when none does)."""
        with self._lock:
            return next((e for e in self._pending.values() if e.get("op") == CHAIN_BREAK_OP), None)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def queue(
        self,
        key: str,
        d: Mapping[str, Any],
        row_id: int | None,
        provisional_id: int | None,
        op: str,
        error: BaseException | None,
    ) -> bool:
        """Keep record ``d`` that could not be written: in memory, in its file, and in the log.

        It replaces an earlier entry of the same key and keeps that entry's place in the replay.
        ``op`` ``chain_break`` (the first row of a new chain) goes before every other entry and is
        kept whatever the bound.  Returns False when the record did not fit: it is then only in the
        log (``ledger_record_lost``, with the whole record), and an earlier state of it is dropped.
        """
        prev = self._pending.get(key)
        if op == CHAIN_BREAK_OP:
            seq = min([e["seq"] for e in self._pending.values()] + [time.time_ns()]) - 1
        else:
            seq = prev["seq"] if prev else time.time_ns()  # keeps the order of first attempts
        entry = {
            "format": 1,
            "uuid": key,
            "seq": seq,
            "op": op,
            "row_id": row_id,
            "provisional_id": provisional_id,
            "queued_at": now_iso(),
            "error": f"{type(error).__name__}: {error}" if error is not None else (prev or {}).get("error"),
            "record": redacted(d),  # never a credential in /run or the log
        }
        data = record_json(entry).encode("utf-8")
        if op != CHAIN_BREAK_OP and not self._fits(key, len(data)):
            self._lose(key, entry)
            return False
        with self._lock:
            self._pending[key] = entry
            self._sizes[key] = len(data)
        spooled = self._write_file(key, data)
        # The journal line carries the whole record: the last resort if /run is lost too.
        self._emit(
            "warning",
            "ledger_pending",
            ticket=d.get("ticket"),
            uuid=key,
            op=op,
            id=row_id or provisional_id,
            error=entry["error"],
            pending=len(self._pending),
            spool=spooled,
            record=entry["record"],
        )
        return True

    def _fits(self, key: str, size: int) -> bool:
        with self._lock:
            records = len(self._pending) + (0 if key in self._pending else 1)
            total = sum(self._sizes.values()) - self._sizes.get(key, 0) + size
        return records <= self.max_records and total <= self.max_bytes

    def _lose(self, key: str, entry: Mapping[str, Any]) -> None:
        """The spool is full: the record's one line in the journal is all that remains of it."""
        with self._lock:
            dropped = self._pending.pop(key, None) is not None  # an earlier state of the same record
            self._sizes.pop(key, None)
            self.lost += 1
        if dropped:
            self._unlink(key)
        self._emit(
            "error",
            "ledger_record_lost",
            uuid=key,
            op=entry["op"],
            id=entry["row_id"] or entry["provisional_id"],
            error=entry["error"],
            why=f"the pending spool is full (at most {self.max_records} records, {self.max_bytes} bytes)",
            lost=self.lost,
            record=entry["record"],
        )

    def flush(
        self,
        write: Callable[[str, dict[str, Any]], int],
        landed: Callable[[str, dict[str, Any], int], None],
        unavailable: Callable[[BaseException], bool],
    ) -> int:
        """Write every pending record through ``write``, oldest first; return how many were set aside.

        ``landed(key, entry, row_id)`` is told of each record that is in the database; it is then
        no longer pending and its file is removed.  When ``unavailable(error)`` says the database
        cannot be written at all, the error is raised and the rest stays pending; a record it
        refuses for what it is (retrying will not help) is set aside so that it does not stall the
        records after it.
        """
        quarantined = 0
        for key, entry in sorted(self.items(), key=lambda kv: kv[1]["seq"]):
            try:
                row_id = write(key, entry)
            except Exception as e:  # noqa: BLE001 - sorted below: unavailable, or this record
                if unavailable(e):
                    raise
                self._set_aside(key, e)
                quarantined += 1
                continue
            landed(key, entry, row_id)
            with self._lock:
                del self._pending[key]
                self._sizes.pop(key, None)
            self._unlink(key)
        return quarantined

    def _set_aside(self, key: str, e: BaseException) -> None:
        with self._lock:
            entry = self._pending.pop(key)
            self._sizes.pop(key, None)
        path = self._file(key)
        kept = None
        if path is not None and os.path.exists(path):
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
                kept = path + ".bad"
        self._emit(
            "error",
            "ledger_record_quarantined",
            ticket=(entry.get("record") or {}).get("ticket"),
            uuid=key,
            error=f"{type(e).__name__}: {e}",
            kept=kept,
            record=entry.get("record"),
        )

    # ----------------------------------------------------------------- files

    def _file(self, key: str) -> str | None:
        return os.path.join(self.dir, f"{key}.json") if self.dir else None

    def _write_file(self, key: str, data: bytes) -> str | None:
        """Write an entry's ``data`` to its file; return the path (None: no spool directory, or it
        failed)."""
        path = self._file(key)
        if path is None or self.dir is None:
            return None
        try:
            os.makedirs(self.dir, mode=DIR_MODE, exist_ok=True)
            write_file_atomic(path, data, self.group)
        except OSError as e:
            self._emit("error", "ledger_spool_failed", path=path, error=str(e))
            return None
        return path

    def _unlink(self, key: str) -> None:
        path = self._file(key)
        if path is None or self.dir is None:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            # Harmless for correctness (a replay updates the same row), but say so.
            self._emit("warning", "ledger_spool_unlink_failed", path=path, error=str(e))
        fsync_dir(self.dir)

    def read_dir(self) -> list[dict[str, Any]]:
        """Every entry in the spool directory, oldest first; damaged files are set aside."""
        if not self.dir:
            return []
        try:
            names = os.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            self._emit("error", "ledger_spool_unreadable", path=self.dir, error=str(e))
            return []
        out = []
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(self.dir, name)
            try:
                entry = json.loads(safefile.read_bounded(path, self.max_bytes, within=self.dir))
                check_entry(entry, name[: -len(".json")])
                out.append(entry)
            except FileNotFoundError:
                continue  # landed (and removed) by the daemon since the listing
            except (OSError, ValueError, RecursionError) as e:  # Skipped (a FIFO...) is an OSError
                self._bad_file(path, str(e)[:300])
        out.sort(key=lambda e: e["seq"])
        return out

    def _bad_file(self, path: str, why: str) -> None:
        """Kept for a person, out of the replay's way; the log line says where."""
        kept = None
        if not self.readonly:
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
                kept = path + ".bad"
            self.bad_files = [*self.bad_files, f"{path}: {why}"][-BAD_FILES_KEPT:]
        self._emit("error", "ledger_spool_bad_file", path=path, error=why, kept=kept)


def check_entry(entry: Any, key: str) -> None:
    """Raise ValueError unless ``entry`` is a spool entry this code wrote."""
    if not isinstance(entry, dict) or not isinstance(entry.get("record"), dict):
        raise ValueError("not a pending ledger record")
    if entry.setdefault("uuid", key) != key:
        raise ValueError(f"its uuid {entry.get('uuid')!r} does not match the file name")
    entry.setdefault("seq", 0)
    for k in ("seq",):
        if not isinstance(entry[k], int) or isinstance(entry[k], bool):
            raise ValueError(f"{k} is not an integer")
    for k in ("row_id", "provisional_id"):
        v = entry.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise ValueError(f"{k} is not an integer")
