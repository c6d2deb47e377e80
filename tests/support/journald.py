"""A private ``systemd-journald`` in a mount namespace of its own, for the sandbox.

What production has and a container lacks: a journal that units log into and ``journalctl`` reads.
The recipe (measured on Debian 12, systemd 252, in a container that runs no journald):

* ``unshare --mount`` (private propagation) and, inside, a tmpfs on ``/run/systemd`` (with
  ``/run/systemd/system``, which ``systemd --user`` also needs) and one on ``/run/log``: journald's
  sockets (``/run/systemd/journal/{socket,stdout,dev-log}``) and its runtime journal live there, so
  the host's ``/run`` is not touched beyond two empty mount-point directories;
* the sandbox's journal directory bind-mounted on ``/run/log/journal`` and ``Storage=volatile``: the
  files land in the sandbox, where ``journalctl -D DIR`` reads them from outside the namespace, also
  after journald has stopped;
* the settings in a drop-in inside that tmpfs (``/run/systemd/journald.conf.d/``, read after the
  host's ``/etc`` ones): no kernel log (``ReadKMsg=no``, the host's), no audit, no forwarding, no
  rate limit (a test must not lose a line);
* ``systemd-journald`` started with ``$NOTIFY_SOCKET`` pointing at a socket of ours: its
  ``READY=1`` says its sockets are listening;
* the user manager then joins that namespace (``nsenter --mount=/proc/PID/ns/mnt``), so its units'
  ``StandardOutput=journal`` and a native ``sd_journal_send`` reach this journald, whose PID the
  sandbox ends again.

``journalctl --sync`` (run inside the namespace) returns once journald has written everything sent
before it, so a reader sees every entry a test has caused.

journald names an entry's unit (``_SYSTEMD_UNIT``) from the sender's cgroup, read when it handles
the entry: a process that has exited by then (a oneshot, a daemon refusing to start) leaves entries
without it (measured: about 1 run in 6 for ``sh -c 'echo ...'``).  Match such lines by
``SYSLOG_IDENTIFIER`` (``SyslogIdentifier=``, by default the command's name).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from .procs import alive, end_pid, first_executable, proc_starttime

_CANDIDATES = ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald")

#: What a booted host has and a unit's mount-namespace hardening needs (``ProtectHome=``,
#: ``ProtectProc=``...): ``/run`` a mount of its own, a tmpfs ``/run/systemd`` and the nodes PID 1
#: makes under ``/run/systemd/inaccessible/`` to mount over what a unit may not see.
BOOTED_RUN = (
    "mount --rbind /run /run && mkdir -p /run/systemd && mount -t tmpfs -o mode=0755 tmpfs /run/systemd"
    " && mkdir -p /run/systemd/system /run/systemd/inaccessible && cd /run/systemd/inaccessible"
    " && touch reg && mkdir dir && mkfifo fifo && mknod chr c 0 0 && mknod blk b 0 0"
    " && chmod 0 reg dir fifo chr blk && cd /"
)

#: Inside the new mount namespace; "$1" journal dir, "$2" settings file, "$3" journald.
_SETUP = f"""\
set -e
{BOOTED_RUN}
mkdir -p /run/log /run/systemd/journald.conf.d
mount -t tmpfs -o mode=0755 tmpfs /run/log
mkdir /run/log/journal
mount --bind "$1" /run/log/journal
cp "$2" /run/systemd/journald.conf.d/zz-gpushift-sandbox.conf
exec "$3"
"""

SETTINGS = """\
# the gpushift test sandbox's private journald (tests/support/journald.py)
[Journal]
Storage=volatile
RuntimeMaxUse=64M
ReadKMsg=no
Audit=no
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
RateLimitIntervalSec=0
MaxLevelStore=debug
"""


class JournaldError(RuntimeError):
    """journald did not come up (the message says why and carries its output)."""


def find_journald() -> str | None:
    return first_executable(_CANDIDATES)


def missing_tools() -> list[str]:
    """What a private journal needs that this machine lacks."""
    missing = []
    if find_journald() is None:
        missing.append("systemd-journald (" + " or ".join(_CANDIDATES) + ")")
    for tool in ("journalctl", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


class PrivateJournal:
    """One journald, its namespace and its directory.

    Attributes:
        directory: the journal files (``<machine-id>/system.journal``), for ``journalctl -D``.
        pid: journald's PID (also the holder of the mount namespace the manager joins).
    """

    def __init__(self, directory: Path, work_dir: Path) -> None:
        self.directory = directory
        self.work_dir = work_dir  # its settings file, its output, its notify socket
        self.pid: int | None = None
        self.starttime: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """journald's own stdout/stderr (it logs into its journal; this catches a failed start)."""
        return self.work_dir / "journald.log"

    def start(self, timeout_s: float = 15.0) -> PrivateJournal:
        """Start journald in a new mount namespace; return when it is READY.

        Raises:
            JournaldError: it exited or did not say READY=1 within ``timeout_s`` (whatever started is
                ended again).
        """
        journald = find_journald()
        if journald is None:
            raise JournaldError("systemd-journald is not installed (apt-get install systemd)")
        self.directory.mkdir(parents=True, exist_ok=True)
        settings = self.work_dir / "journald.conf"
        settings.write_text(SETTINGS)
        notify_path = self.work_dir / "journald-notify"
        notify_path.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(notify_path))
            env = {
                k: v for k, v in os.environ.items() if k not in ("LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC")
            }
            env.update(NOTIFY_SOCKET=str(notify_path), SYSTEMD_LOG_TARGET="console", SYSTEMD_LOG_COLOR="0")
            with open(self.log, "ab") as out:
                self._proc = subprocess.Popen(
                    ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SETUP, "sh"]
                    + [str(self.directory), str(settings), journald],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=env,
                    start_new_session=True,
                )
            # unshare and sh exec in place: this PID becomes journald's.
            self.pid = self._proc.pid
            self.starttime = proc_starttime(self.pid)
            try:
                self._wait_ready(notify, time.monotonic() + timeout_s)
            except BaseException:
                self.stop()
                raise
            finally:
                notify_path.unlink(missing_ok=True)
        return self

    def _wait_ready(self, notify: socket.socket, deadline: float) -> None:
        notify.settimeout(0.1)
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise JournaldError(
                    f"systemd-journald exited with {self._proc.returncode}:\n{self._output()}"
                )
            try:
                if b"READY=1" in notify.recv(4096).split(b"\n"):
                    self.starttime = proc_starttime(self.pid or 0)
                    return
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                raise JournaldError(f"systemd-journald did not say READY=1:\n{self._output()}")

    def _output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:] or "(no output)"
        except OSError:
            return "(no output)"

    @property
    def running(self) -> bool:
        return self.pid is not None and alive(self.pid, self.starttime)

    def enter(self) -> list[str]:
        """The command prefix that runs a program in journald's mount namespace."""
        if self.pid is None:
            raise JournaldError("the private journald has not been started")
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt"]

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until journald has written every entry sent so far (no-op once it has stopped)."""
        if not self.running:
            return
        r = subprocess.run(
            self.enter() + ["journalctl", "--sync"], capture_output=True, text=True, timeout=timeout_s
        )
        if r.returncode != 0 and self.running:
            raise JournaldError(f"journalctl --sync failed: {r.stderr.strip()}")

    def read(self, *matches: str, sync: bool = True) -> list[dict[str, Any]]:
        """``journalctl -D DIR -o json MATCHES...``: the entries, oldest first, as dicts.

        Matches are journalctl's (``FIELD=value``; ``+`` between groups for OR).  A field holding
        binary data comes back as a list of byte values, one set more than once as a list.
        """
        if sync:
            self.sync()
        r = subprocess.run(
            ["journalctl", "-D", str(self.directory), "-o", "json", "--no-pager", "--all", *matches],
            capture_output=True,
            text=True,
            timeout=30,
        )
        # journalctl exits 1 with "-- No entries --" on stderr when nothing matches; that is no entry.
        if r.returncode != 0 and r.stdout.strip():
            raise JournaldError(f"journalctl -D {self.directory} failed: {r.stderr.strip()}")
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]

    def stop(self) -> None:
        """SIGTERM journald (it writes and closes its files), SIGKILL if it lingers; by PID."""
        if self.pid is not None:
            end_pid(self.pid, self.starttime, self._proc, grace_s=5.0)
