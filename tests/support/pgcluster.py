"""A private PostgreSQL cluster for the fleet tests: ``initdb`` + ``pg_ctl`` in a temporary directory.

Debian's ``postgresql`` package creates and may start its own cluster (``15/main`` on port 5432); the
tests never use it.  :class:`PgCluster` makes a cluster of its own under a fresh temporary
directory, owned by an unprivileged user (``initdb`` refuses to run as root: as root the commands
run as ``nobody`` through ``runuser``), listening on a loopback port of its own (``127.0.0.1``, a
free port, password authentication with SCRAM) and on a Unix socket inside that directory (the
superuser ``postgres``, trusted, for the tests' own SQL).  :meth:`PgCluster.stop` ends it again
(``pg_ctl stop -m fast``, then the postmaster by its PID from ``postmaster.pid``) and removes the
directory; :func:`private_cluster` does so even when the test fails.

The binaries are looked up under ``/usr/lib/postgresql/<version>/bin`` (Debian's layout; the highest
version there wins).  When they are missing, :class:`PgMissing` names what is missing and how to get
it; the fixtures turn that into a failure (tests never skip).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .procs import alive, proc_starttime

if TYPE_CHECKING:
    from gpushift.fleet.pg import Connection

#: Where Debian installs each PostgreSQL version's server binaries.
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: The path the failure message names (Debian 12's version).
EXPECTED_INITDB = "/usr/lib/postgresql/15/bin/initdb"
#: The unprivileged user the cluster runs as when the tests run as root.
RUN_AS = "nobody"
#: The superuser of the private cluster (reached over its Unix socket, trusted).
SUPERUSER = "postgres"


class PgMissing(RuntimeError):
    """The PostgreSQL server binaries (or the tools to run them as another user) are not there."""


class PgError(RuntimeError):
    """The private cluster could not be made, started or stopped (the message shows its log)."""


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(p) for p in name.split(".") if p.isdigit()) or (0,)


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has ``initdb``, ``pg_ctl`` and ``postgres``.

    Raises:
        PgMissing: naming the missing binary and the package that brings it.
    """
    dirs = sorted(glob.glob(PG_BIN_GLOB), key=_version_key, reverse=True)
    for d in dirs:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    raise PgMissing(
        f"the fleet tests need a PostgreSQL server: {EXPECTED_INITDB} (initdb, pg_ctl, postgres) is "
        "missing (Debian/Ubuntu: apt-get install postgresql; `make deps` installs it)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One private cluster.  ``url(user, db)`` is what a gpushift config names (no password in it)."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self.bin = find_bin_dir()
        self._made_base = base is None
        self.base = Path(base) if base is not None else Path(tempfile.mkdtemp(prefix="gpushift-pg."))
        self.data = self.base / "data"
        self.sock = self.base / "sock"
        self.log = self.base / "postgres.log"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        self._postmaster: tuple[int, int | None] | None = None  # (PID, start time) of the running one
        if self.as_root and shutil.which("runuser") is None:
            raise PgMissing("runuser (util-linux) is needed to run initdb as a non-root user")

    # ------------------------------------------------------------ commands

    def _run(self, argv: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = ["runuser", "-u", RUN_AS, "--", *argv] if self.as_root else argv
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, cwd=self.base, env=self._env()
        )

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        env["HOME"] = str(self.base)
        return env

    def _check(self, r: subprocess.CompletedProcess[str], what: str) -> None:
        if r.returncode != 0:
            raise PgError(f"{what} failed ({r.returncode}): {r.stderr.strip()}\n--- log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------ life cycle

    def init(self) -> PgCluster:
        """``initdb`` (UTF-8, the superuser trusted on the socket, SCRAM passwords on loopback)."""
        self.sock.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.sock, 0o755)
        if self.as_root:
            pw = pwd.getpwnam(RUN_AS)
            for p in (self.base, self.sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        r = self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ]
        )
        self._check(r, "initdb")
        return self

    def start(self, timeout_s: float = 60) -> PgCluster:
        """Start the server (again, after :meth:`stop_server`) on the same port and socket."""
        opts = (
            f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        r = self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                opts,
                "-w",
                "-t",
                str(int(timeout_s)),
                "start",
            ],  # fmt: skip
            timeout_s=timeout_s + 30,
        )
        self._check(r, "pg_ctl start")
        pid = self._pid_from_file()
        if pid is not None:
            self._postmaster = (pid, proc_starttime(pid))
        return self

    def _pid_from_file(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def stop_server(self, timeout_s: float = 60) -> None:
        """Stop the server (the data stay): ``pg_ctl stop -m fast``, then SIGKILL the postmaster by PID."""
        if self._postmaster is None:
            return
        pid, start = self._postmaster
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._run(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"],
                timeout_s=timeout_s + 10,
            )  # fmt: skip
        if alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while alive(pid, start) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._postmaster = None

    @property
    def running(self) -> bool:
        return self._postmaster is not None and alive(*self._postmaster)

    def stop(self) -> None:
        """Stop the server and remove the directory this cluster made."""
        try:
            self.stop_server()
        finally:
            if self._made_base:
                shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------ using it

    def url(self, user: str, db: str) -> str:
        """``postgresql://USER@127.0.0.1:PORT/DB`` (the password comes from elsewhere)."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def admin(self, db: str = "postgres") -> Connection:
        """A connection as the superuser, over the socket (autocommit), made the way gpushift makes
        its own (``gpushift.fleet.pg``: ``%s`` placeholders, ``execute(...).fetchall()``)."""
        from gpushift.fleet.pg import Connection

        return Connection.open(
            autocommit=True, host=str(self.sock), port=self.port, user=SUPERUSER, database=db, timeout=10
        )

    def sql(self, statement: str, params: Any = None, db: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as the superuser; its rows (empty for a statement that returns none)."""
        with self.admin(db) as conn:
            return conn.execute(statement, params).fetchall()

    def make_db(self, db: str, user: str, password: str) -> str:
        """A login role ``user`` with ``password`` owning a new database ``db``; returns :meth:`url`."""
        with self.admin() as conn:
            # The server quotes the names and the password (format's %I and %L).
            for template, args in (
                ("CREATE ROLE %%I LOGIN PASSWORD %%L", (user, password)),
                ("CREATE DATABASE %%I OWNER %%I", (db, user)),
            ):
                row = conn.execute(f"SELECT format('{template}', %s::text, %s::text)", args).fetchone()
                assert row is not None
                conn.execute(str(row[0]))
        return self.url(user, db)


@contextlib.contextmanager
def private_cluster() -> Iterator[PgCluster]:
    """A started private cluster, stopped and removed afterwards whatever happens."""
    pg = PgCluster()
    try:
        pg.init().start()
        yield pg
    finally:
        pg.stop()
