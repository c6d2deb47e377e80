"""One connection to the fleet's central database, with its deadlines.

Every connection — the daemon's mirror and each ``gpushift fleet`` command — is made here (over
``pg.py``, asyncpg): ``timeout`` (``[mirror] connect_timeout_s``) bounds the connect and its login,
``statement_timeout`` and ``lock_timeout`` (``statement_timeout_s``) every statement on the server,
``idle_in_transaction_session_timeout`` a transaction left open by a client that died, and a
client-side deadline on every call (``statement_timeout_s`` plus ``connect_timeout_s``) ends a wait
on a server that vanished without a word.  The password (``secret.py``) goes to the driver only.
Every failure is a :class:`~gpushift.errors.FleetError` of one line that names the server as
``USER@HOST:PORT/DB`` (the URL holds no password: the config refuses one) and never carries a
traceback or the password.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gpushift import __version__
from gpushift.config.mirror import MirrorConfig, url_problem
from gpushift.errors import FleetError
from gpushift.fleet import secret
from gpushift.fleet.pg import UNDEFINED_TABLE, Connection, DatabaseError

__all__ = ["UNDEFINED_TABLE", "Connection", "DatabaseError", "connect", "one_line", "where"]


def where(url: str) -> str:
    """``user@host:port/db`` of a mirror URL (what messages name)."""
    try:
        p = urlsplit(url)
        port = p.port or 5432
    except ValueError:
        return "(an unreadable URL)"
    return f"{p.username or '?'}@{p.hostname or '?'}:{port}/{p.path.strip('/')}"


def connect(
    m: MirrorConfig, url: str | None = None, application: str = "gpushift", autocommit: bool = False
) -> Connection:
    """A connection (``autocommit``: each statement on its own; else transactions as ``pg.py`` says) to ``url`` (default ``[mirror] url``).

    Raises:
        FleetError: no URL, a bad one, the password unreadable, or the server unreachable/refusing.
    """
    target = url if url is not None else m.url
    if not target:
        raise FleetError("no central database: set [mirror] url in the config, or give --url")
    problem = url_problem(target)
    if problem is not None:
        raise FleetError(f"the central database URL: {problem}")
    password = secret.password(m)
    statement_ms = max(1, int(m.statement_timeout_s * 1000))
    try:
        return Connection.open(
            autocommit=autocommit,
            dsn=target,
            password=password,
            timeout=m.connect_timeout_s,
            command_timeout=m.statement_timeout_s + m.connect_timeout_s,
            server_settings={
                "application_name": f"{application} {__version__}"[:63],
                "statement_timeout": str(statement_ms),
                "lock_timeout": str(statement_ms),
                "idle_in_transaction_session_timeout": str(statement_ms * 6),
            },
        )
    except DatabaseError as e:
        raise FleetError(
            f"cannot reach the central database {where(target)}: {one_line(e, password)}"
        ) from None


def one_line(e: BaseException, password: str | None = None) -> str:
    """The first line of a driver error, the password (should a server ever echo it) masked."""
    text = str(e).strip().split("\n", 1)[0] or type(e).__name__
    if password:
        text = text.replace(password, "***")
    return text[:300]
