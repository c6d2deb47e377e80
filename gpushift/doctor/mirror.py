"""``gpushift check``'s rule for the ledger mirror (``[mirror]``, docs/fleet.md).

Pure: what one connection attempt to the central database found comes in as :class:`MirrorFacts`
(made by ``cli/check_mirror.py``, which connects with ``[mirror] connect_timeout_s`` and
``statement_timeout_s`` as the daemon's mirror does); findings come out:

* ``mirror-unreachable`` (warning): the central database cannot be reached or refuses the login,
  or the password cannot be read.  A warning, not an error: the mirror never gates a switch (the
  local ledger stays the truth and the mirror catches up once the database is back), so a database
  that is down must not make ``check`` fail — a role or a deployment that runs ``check`` before it
  puts a config in place would otherwise refuse a good config because of another host's outage.
* ``mirror-not-checked`` (warning): the password is a systemd credential (``password_credential``)
  and this process is not the service that has it (``$CREDENTIALS_DIRECTORY`` unset, as in a
  shell): the connection is not tried, and the hint says how to run ``check`` with the credential.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushift.doctor.findings import WARNING, Finding

#: The stable code of ``gpushift check --json``.
MIRROR_UNREACHABLE = "mirror-unreachable"
MIRROR_NOT_CHECKED = "mirror-not-checked"
#: The name the mirror's findings carry as their ``backend``.
MIRROR = "mirror"


@dataclass(frozen=True)
class MirrorFacts:
    """One connection attempt to the central database.

    Attributes:
        where: the server as ``USER@HOST:PORT/DB`` (never with a password).
        reachable: connected and logged in, and the schema's version was read.
        schema_version: the central schema's version (0: no gpushift tables yet); None: not read.
        error: why it is not reachable (one line, the password masked), None when reachable.
        elapsed_s: how long the attempt took.
        connect_timeout_s: the deadline it ran under (``[mirror] connect_timeout_s``).
        credential: the systemd credential's name when the attempt was not made because this
            process cannot read it (then ``reachable`` is False and ``error`` says why).
    """

    where: str
    reachable: bool
    schema_version: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0
    connect_timeout_s: int = 5
    credential: str | None = None


def findings(facts: MirrorFacts) -> list[Finding]:
    """The mirror's findings: one warning when the central database cannot be reached."""
    if facts.reachable:
        return []
    if facts.credential is not None:
        return [
            Finding(
                WARNING,
                MIRROR_NOT_CHECKED,
                MIRROR,
                f"the central database {facts.where} was not tried: {facts.error}",
                hint=(
                    "run check with the credential, as the service gets it: systemd-run --pipe --wait "
                    f"-p LoadCredential={facts.credential}:/path/to/password gpushift check"
                ),
            )
        ]
    return [
        Finding(
            WARNING,
            MIRROR_UNREACHABLE,
            MIRROR,
            f"the central database {facts.where} is not reachable: {facts.error or 'unknown error'}",
            hint=(
                "switches are not affected: the mirror lags and catches up once the database is back "
                "(gpushift status shows the lag); check the server, the URL, the password source and "
                f"connect_timeout_s ({facts.connect_timeout_s} s)"
            ),
        )
    ]


def summary(facts: MirrorFacts, code_version: int) -> str:
    """One line for the report: reachable with the schema's version, or not reachable and why."""
    if facts.credential is not None:
        return f"{facts.where}: NOT CHECKED: {facts.error}"
    if not facts.reachable:
        return f"{facts.where}: NOT REACHABLE: {facts.error or 'unknown error'}"
    v = facts.schema_version
    if not v:
        schema = "no gpushift schema yet (the daemon's mirror creates it when it first connects)"
    elif v > code_version:
        schema = f"schema version {v} (newer than this gpushift's {code_version}: used as it is)"
    elif v < code_version:
        schema = f"schema version {v} (the daemon's mirror migrates it to {code_version})"
    else:
        schema = f"schema version {v}"
    return f"{facts.where}: reachable, {schema} ({facts.elapsed_s:.2f} s)"
