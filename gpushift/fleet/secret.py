"""The mirror's password: read from ``password_file`` or the systemd credential ``password_credential``.

Never from the config's text (``config/mirror.py`` refuses a URL with one).  It is read at each
connection (a rotated password needs no restart) and handed to the driver only: never logged,
never part of an error message (an error names the file or the credential, not its content).
A credential is ``$CREDENTIALS_DIRECTORY/NAME`` (systemd.exec(5), ``LoadCredential=``); the
directory is private to the service and exists only while it runs.
"""

from __future__ import annotations

import os

from gpushift.config.mirror import MirrorConfig
from gpushift.errors import FleetError
from gpushift.host import safefile

#: The largest password file read.
MAX_BYTES = 4096
#: The variable systemd sets for a service with credentials.
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


def source(m: MirrorConfig) -> str | None:
    """Where the password comes from, for messages (``file /etc/...``, ``credential NAME``), or None."""
    if m.password_file:
        return f"file {m.password_file}"
    if m.password_credential:
        return f"systemd credential {m.password_credential}"
    return None


def password(m: MirrorConfig) -> str | None:
    """The password (its first line), or None when the config names no source.

    Raises:
        FleetError: the source cannot be read (naming it, never its content).
    """
    if m.password_file:
        path = m.password_file
    elif m.password_credential:
        cdir = os.environ.get(CREDENTIALS_ENV)
        if not cdir:
            raise FleetError(
                f"[mirror] password_credential {m.password_credential!r}: ${CREDENTIALS_ENV} is not set "
                f"(add LoadCredential={m.password_credential}:/path/to/password to gpushift.service)"
            )
        path = os.path.join(cdir, m.password_credential)
    else:
        return None
    try:
        raw = safefile.read_bounded(path, MAX_BYTES)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise FleetError(f"the mirror's password {source(m)}: no such file {path}") from None
    except (OSError, UnicodeDecodeError, safefile.Skipped) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise FleetError(f"the mirror's password {source(m)} cannot be read ({why})") from None
    first = text.split("\n", 1)[0].rstrip("\r")
    if not first:
        raise FleetError(f"the mirror's password {source(m)} is empty")
    return first
