"""A blocking PostgreSQL connection over asyncpg, for the mirror's thread and the fleet commands.

asyncpg (docs/fleet.md, "The driver") is an asyncio library; gpushift's callers are plain threads and
short commands, so :class:`Connection` owns a private event loop and runs each call to the end on
it.  One connection is used by one thread at a time (the mirror's own thread, or a command).

What the callers rely on, kept the way a DB-API driver keeps it:

* ``%s`` placeholders (``%%`` for a literal ``%``), turned into asyncpg's ``$1, $2, ...``;
* transactions opened by the first statement and ended by :meth:`Connection.commit` or
  :meth:`Connection.rollback` (``autocommit=True`` runs each statement on its own), and
  :meth:`Connection.transaction` for a block that commits as a whole;
* ``jsonb`` values read back parsed, and written from a JSON text or a value;
* every failure of the driver, the server or the network is a :class:`DatabaseError` whose text is
  the driver's one line (the caller adds where and masks the password, ``db.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

#: What a failed call can raise below this module: the server's errors and the driver's
#: (``asyncpg.PostgresError``, ``asyncpg.InterfaceError``, filled in on first use), the network's
#: (``OSError``) and a deadline (``asyncio.TimeoutError``).
_FAILURES: tuple[type[BaseException], ...] = ()
_MARK = re.compile(r"%[s%]")


#: SQLSTATE of a statement naming a table that does not exist.
UNDEFINED_TABLE = "42P01"


class DatabaseError(Exception):
    """A statement, a connect or the connection itself failed (the driver's text, one line);
    ``sqlstate`` is the server's error code, or None for a failure that is not the server's."""

    def __init__(self, text: str, sqlstate: str | None = None) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


def _driver() -> Any:
    global _FAILURES
    import asyncpg

    if not _FAILURES:
        _FAILURES = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError, EOFError)
    return asyncpg


@lru_cache(maxsize=512)
def dollar(sql: str) -> str:
    """``sql`` with ``%s`` as ``$1, $2, ...`` and ``%%`` as ``%`` (any other ``%`` stays)."""
    n = itertools.count(1)
    return _MARK.sub(lambda m: "%" if m.group() == "%%" else f"${next(n)}", sql)


def _json_in(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


class Result:
    """The rows of one statement, as tuples (none for a statement that returns none)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class Connection:
    """One server connection; see the module's text."""

    def __init__(self, loop: asyncio.AbstractEventLoop, raw: Any, autocommit: bool) -> None:
        self._loop = loop
        self._raw = raw
        self.autocommit = autocommit
        self._in_transaction = False

    @classmethod
    def open(cls, *, autocommit: bool = False, **connect: Any) -> Connection:
        """Connect (``connect``: asyncpg.connect's arguments: ``dsn``, ``password``, ``timeout``,
        ``command_timeout``, ``server_settings``, ``host``, ...).

        Raises:
            DatabaseError: the server cannot be reached, refuses the login, or the deadline passed.
        """
        asyncpg = _driver()
        loop = asyncio.new_event_loop()

        async def go() -> Any:
            raw = await asyncpg.connect(**connect)
            try:
                # gpushift's tables have jsonb columns only.
                await raw.set_type_codec(
                    "jsonb", schema="pg_catalog", encoder=_json_in, decoder=json.loads, format="text"
                )
            except BaseException:
                raw.terminate()
                raise
            return raw

        try:
            raw = loop.run_until_complete(go())
        except BaseException as e:
            loop.close()
            if isinstance(e, _FAILURES):
                raise DatabaseError(_text(e), getattr(e, "sqlstate", None)) from None
            raise
        return cls(loop, raw, autocommit)

    def _run(self, coro: Any) -> Any:
        if self._loop.is_closed():
            coro.close()
            raise DatabaseError("the connection is closed")
        try:
            return self._loop.run_until_complete(coro)
        except _FAILURES as e:
            raise DatabaseError(_text(e), getattr(e, "sqlstate", None)) from None

    def _begin(self) -> None:
        if not self.autocommit and not self._in_transaction:
            self._run(self._raw.execute("BEGIN"))
            self._in_transaction = True

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Result:
        """Run one statement (``%s`` placeholders, ``params`` in order); its rows."""
        self._begin()
        rows = self._run(self._raw.fetch(dollar(sql), *(params or ())))
        return Result([tuple(r) for r in rows])

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        """One statement for each parameter tuple (sent together; a failure fails them all)."""
        self._begin()
        self._run(self._raw.executemany(dollar(sql), list(params)))

    def commit(self) -> None:
        if self._in_transaction:
            self._in_transaction = False
            self._run(self._raw.execute("COMMIT"))

    def rollback(self) -> None:
        if self._in_transaction:
            self._in_transaction = False
            self._run(self._raw.execute("ROLLBACK"))

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A block that commits as a whole (or rolls back on an exception); inside an open
        transaction, a savepoint."""
        outer = self._in_transaction
        if outer:
            self._run(self._raw.execute("SAVEPOINT gpushift_block"))
        else:
            self._begin()
        try:
            yield self
        except BaseException:
            if outer:
                self._run(self._raw.execute("ROLLBACK TO SAVEPOINT gpushift_block"))
            else:
                self.rollback()
            raise
        if outer:
            self._run(self._raw.execute("RELEASE SAVEPOINT gpushift_block"))
        else:
            self.commit()

    @property
    def closed(self) -> bool:
        return self._loop.is_closed() or bool(self._raw.is_closed())

    def close(self) -> None:
        """Close the connection as libpq's ``PQfinish`` does: the Terminate message, then the
        socket, without waiting for the server to end its side (an open transaction is rolled
        back by the server); then the loop."""
        if self._loop.is_closed():
            return
        if self._loop.is_running():
            # Another thread is inside a call (the daemon stopping while its mirror waits on the
            # server): drop the socket under it, and that call ends as a DatabaseError.
            self._loop.call_soon_threadsafe(self._raw.terminate)
            return
        try:
            self._raw.terminate()
            self._loop.run_until_complete(asyncio.sleep(0))  # the transport's own close callbacks
        finally:
            self._loop.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        try:
            if not self.closed and kind is None:
                self.commit()
            elif not self.closed:
                self.rollback()
        finally:
            self.close()


def _text(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, asyncio.TimeoutError) and not text:
        return "no answer before the deadline (timeout)"
    return text or type(e).__name__
