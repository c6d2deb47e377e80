"""One connection to the fleet's central database, with its deadlines.

Every connection — the daemon's mirror and each ``gpushift fleet`` command — is made here:
``connect_timeout`` (``[mirror] connect_timeout_s``) bounds the connect, ``statement_timeout``
(``statement_timeout_s``) every statement on the server, and ``idle_in_transaction_session_timeout``
a transaction left open by a client that died; TCP keepalives and ``tcp_user_timeout`` end a
connection whose peer vanished.  The password (``secret.py``) goes to the driver only.  Every
failure is a :class:`~gpushift.errors.FleetError` of one line that names the server as
``USER@HOST:PORT/DB`` (the URL holds no password: the config refuses one) and never carries a
traceback or the password.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from gpushift import __version__
from gpushift.config.mirror import MirrorConfig, url_problem
from gpushift.errors import FleetError
from gpushift.fleet import secret


def where(url: str) -> str:
    """``user@host:port/db`` of a mirror URL (what messages name)."""
    try:
        p = urlsplit(url)
        port = p.port or 5432
    except ValueError:
        return "(an unreadable URL)"
    return f"{p.username or '?'}@{p.hostname or '?'}:{port}/{p.path.strip('/')}"


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as e:
        raise FleetError(f"the fleet needs psycopg 3 (pip install 'psycopg>=3.1', and libpq5): {e}") from None
    return psycopg


def connect(m: MirrorConfig, url: str | None = None, application: str = "gpushift") -> Any:
    """A psycopg connection (not autocommit) to ``url`` (default ``[mirror] url``).

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
    psycopg = _driver()
    statement_ms = max(1, int(m.statement_timeout_s * 1000))
    kwargs: dict[str, Any] = {
        "connect_timeout": m.connect_timeout_s,
        "application_name": f"{application} {__version__}"[:63],
        "options": (
            f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms} "
            f"-c idle_in_transaction_session_timeout={statement_ms * 6}"
        ),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": (m.connect_timeout_s + int(m.statement_timeout_s) + 5) * 1000,
    }
    if password is not None:
        kwargs["password"] = password
    try:
        return psycopg.connect(target, **kwargs)
    except psycopg.Error as e:
        raise FleetError(
            f"cannot reach the central database {where(target)}: {one_line(e, password)}"
        ) from None


def one_line(e: BaseException, password: str | None = None) -> str:
    """The first line of a driver error, the password (should a server ever echo it) masked."""
    text = str(e).strip().split("\n", 1)[0] or type(e).__name__
    if password:
        text = text.replace(password, "***")
    return text[:300]
