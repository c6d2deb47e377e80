"""The ``[mirror]`` table: where every host's ledger is copied to (one PostgreSQL), and how.

Read by ``config/reader.py`` with its :class:`~gpushift.config.keys.KeyReader` (the same error
format and number checks as every other key), like ``config/hooks.py``; docs/config.md lists every
key with its range, docs/fleet.md what the mirror does.

* ``url``: ``postgresql://USER@HOST:PORT/DB`` (``postgres://`` too; ``""``: no mirror).  The
  password is never in it: a URL with ``user:password@`` or a ``password=`` parameter is refused
  (without repeating the URL), and so is any query parameter but the TLS ones.
* ``password_file`` (an absolute path, read at each connect) or ``password_credential`` (the name
  of a systemd credential, ``LoadCredential=NAME:PATH`` in the unit: read from
  ``$CREDENTIALS_DIRECTORY/NAME``); at most one of them, none for a server that needs no password.
* ``host_name``: how this host is named in the central database (default: the machine's host name,
  looked up when the daemon starts); also what ``[daemon] stagger_s`` derives the offset from.
* ``stale_after_s``, ``connect_timeout_s``, ``statement_timeout_s``, ``batch_size``, ``retry_s``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpushift.config import validate
from gpushift.config.keys import KeyReader

#: The query parameters a mirror URL may carry (libpq's TLS settings); nothing that could hold a secret.
URL_PARAMS = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "target_session_attrs"})

#: A host name as the fleet shows it: letters, digits, '.', '-', '_' (up to 253 characters).
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
#: A systemd credential's name (systemd.exec(5) ``LoadCredential=``): a plain file name.
_CREDENTIAL = re.compile(r"[A-Za-z0-9_.:-]{1,255}")


@dataclass(frozen=True)
class MirrorConfig:
    url: str = ""  # "": no mirror
    password_file: str | None = None
    password_credential: str | None = None  # a LoadCredential= name, read from $CREDENTIALS_DIRECTORY
    host_name: str | None = None  # None: the machine's host name
    stale_after_s: float = 120.0  # fleet status marks a host stale when its state is older
    connect_timeout_s: int = 5  # libpq's connect_timeout (whole seconds, at least 2)
    statement_timeout_s: float = 10.0  # every statement's deadline (SET statement_timeout)
    batch_size: int = 100  # ledger rows sent per transaction
    retry_s: float = 5.0  # after a failure the mirror waits this long before it connects again

    @property
    def enabled(self) -> bool:
        return bool(self.url)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a ``postgresql://USER@HOST[:PORT]/DB`` without a password, or None.

    The message never repeats the URL (it may carry a password by mistake)."""
    if any(c.isspace() or ord(c) < 32 or 127 <= ord(c) < 160 for c in url):
        return "expected a URL without spaces or control characters (the URL is not shown)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "expected postgresql://USER@HOST:PORT/DB with a valid host and port (the URL is not shown)"
    if parts.scheme not in ("postgresql", "postgres"):
        return "expected a postgresql:// URL (the URL is not shown)"
    if parts.password is not None:
        return (
            "the URL holds a password: it must never be in the config's text; put it in a file "
            "(password_file) or a systemd credential (password_credential); the URL is not shown"
        )
    if not parts.username:
        return "expected a user name before '@' (postgresql://USER@HOST:PORT/DB)"
    if not parts.hostname:
        return "expected a host after '@' (postgresql://USER@HOST:PORT/DB)"
    if port == 0:
        return "expected a port 1-65535"
    if not parts.path.strip("/") or "/" in parts.path.strip("/"):
        return "expected a database name after the host (postgresql://USER@HOST:PORT/DB)"
    if parts.fragment:
        return "expected no '#' fragment"
    for key, _value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ("password", "passfile"):
            return (
                f"the URL holds a {key}= parameter: the password must never be in the config's text; "
                "use password_file or password_credential (the URL is not shown)"
            )
        if key not in URL_PARAMS:
            return f"unknown URL parameter {key!r} (allowed: {', '.join(sorted(URL_PARAMS))})"
    return None


def read_mirror(r: KeyReader, data: Mapping[str, Any]) -> MirrorConfig:
    m = r.table(data, "mirror")
    r.no_unknown(m, "mirror", set(MirrorConfig.__dataclass_fields__))
    url = m.get("url", "")
    if not isinstance(url, str):
        raise r.err("mirror.url", f"expected a postgresql:// URL string, got a {type(url).__name__}")
    if url:
        problem = url_problem(url)
        if problem is not None:
            raise r.err("mirror.url", problem)
    password_file = m.get("password_file")
    if password_file is not None and (
        not isinstance(password_file, str)
        or not password_file.startswith("/")
        or validate.line_problem(password_file, 4096) is not None
    ):
        raise r.err("mirror.password_file", f"expected an absolute path, got {validate.shown(password_file)}")
    credential = m.get("password_credential")
    if credential is not None and (not isinstance(credential, str) or not _CREDENTIAL.fullmatch(credential)):
        raise r.err(
            "mirror.password_credential",
            f"expected the name of a systemd credential (LoadCredential=NAME:...), got {validate.shown(credential)}",
        )
    if password_file is not None and credential is not None:
        raise r.err("mirror.password_credential", "give password_file or password_credential, not both")
    host_name = m.get("host_name")
    if host_name is not None and (not isinstance(host_name, str) or not HOST_NAME.fullmatch(host_name)):
        raise r.err(
            "mirror.host_name",
            f"expected letters, digits, '.', '-', '_' (up to 253, e.g. 'gpu-3'), got {validate.shown(host_name)}",
        )
    return MirrorConfig(
        url=url,
        password_file=password_file,
        password_credential=credential,
        host_name=host_name,
        stale_after_s=float(r.number(m, "mirror", "stale_after_s", 120.0, minimum=5, maximum=86400)),
        connect_timeout_s=int(
            r.number(m, "mirror", "connect_timeout_s", 5, minimum=2, integer=True, maximum=300)
        ),
        statement_timeout_s=float(
            r.number(m, "mirror", "statement_timeout_s", 10.0, minimum=0.1, maximum=300)
        ),
        batch_size=int(r.number(m, "mirror", "batch_size", 100, minimum=1, integer=True, maximum=10000)),
        retry_s=float(r.number(m, "mirror", "retry_s", 5.0, minimum=0.1, maximum=3600)),
    )
