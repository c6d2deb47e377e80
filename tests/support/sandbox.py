"""A private, real systemd user manager and D-Bus session bus, for tests and the demo.

gpushift's integration tests and ``make demo`` need what production has: a real systemd that starts
and stops units, answers ``org.freedesktop.systemd1`` on a real bus, and kills control groups.  This
module boots one that is private to the caller:

* a runtime directory made under ``/run`` (not ``/tmp``: a unit with ``PrivateTmp=yes`` would not see
  sockets placed under ``/tmp``) becomes ``$XDG_RUNTIME_DIR``;
* a real ``dbus-daemon`` with the session bus's configuration listens on ``$XDG_RUNTIME_DIR/bus``
  (``$DBUS_SESSION_BUS_ADDRESS``), run the way a real user session runs it: as the manager's own
  ``dbus.socket``/``dbus.service`` (the sandbox writes both units, naming this machine's
  dbus-daemon, so the distribution's ``dbus-user-session`` package is not needed); its policy adds
  the front door's shipped one (``<base_dir>/dbus-session.conf``: only the front door's user may
  own ``org.gpushift.FrontDoor1``, only root may send to it; :mod:`tests.support.frontdoor_sandbox`);
* ``systemd --user`` runs with its own ``$XDG_CONFIG_HOME`` (units go to
  ``$XDG_CONFIG_HOME/systemd/user``) and ``XDG_DATA_HOME``/``XDG_STATE_HOME``/``XDG_CACHE_HOME``
  inside the sandbox, so nothing depends on ``$HOME``.

Things learned the hard way (measured on a Debian 12 container, systemd 252):

* A user manager only connects to the session bus once ITS ``dbus.socket`` and ``dbus.service``
  units are running (systemd 252 ``manager_dbus_is_running``).  A bus started beside it with
  ``dbus-daemon --fork`` is never joined, and the distribution's ``dbus.socket`` binds over that
  bus's socket and socket-activates a second bus.  Hence the bus runs as the manager's unit.
* ``systemd --user`` refuses to run unless ``/run/systemd/system`` exists ("not booted with
  systemd").  We give it one inside a private mount namespace (``unshare --mount`` + a tmpfs on
  ``/run/systemd``) so the host's ``/run`` is not touched.  That namespace is the private
  journald's (:mod:`tests.support.journald`): journald starts first, in it, and the manager joins
  it, so every unit's ``StandardOutput=journal`` (the default) and the daemon's native journal
  entries land in ``<base_dir>/journal``, read with :meth:`Sandbox.journal` (``journalctl -D``).
  Both need root (CAP_SYS_ADMIN); a non-root user on a host booted with systemd gets the manager
  without them (its units log into that user's journal, and :meth:`Sandbox.journal` refuses).
* A manager that finds itself in the ROOT cgroup migrates every process of the machine into
  ``/init.scope``, and two managers sharing one cgroup would put same-named units into the same
  cgroup, where ``KillMode=control-group`` of one kills the other's processes.  So the manager is
  moved into a private cgroup (``<current>/gpushift-sandbox.XXXXXX`` in the cgroup v2 and
  ``name=systemd`` hierarchies) before it execs; this also lets :meth:`Sandbox.stop` find and end
  every process the manager started, by PID, even after the manager died.
* The socket, timer and path units the distribution ships for user sessions (gpg-agent,
  pipewire, tmpfiles-clean, ...) are masked, and the manager boots into an empty target
  (``--unit=gpushift-sandbox.target``, which wants only the bus) instead of ``default.target``:
  a test sees only the processes it started.
* The private cgroup's name ends in ``.slice``: journald names a unit after the first
  component of its cgroup path that is not a slice, so the units' entries carry
  ``_SYSTEMD_UNIT=<unit>`` and ``journalctl -D DIR -u gpushift`` works as on a host.
* The manager's own log is ``<base_dir>/systemd.log``, the bus's ``<base_dir>/dbus.log``,
  journald's (only a failed start writes there) ``<base_dir>/journald.log``.
* Mount-namespace hardening of a unit (``ProtectHome=yes``, ``ProtectKernelLogs=``, ``ProtectProc=``)
  fails with 226/NAMESPACE unless the namespace looks like a booted host's: the nodes PID 1 makes
  under ``/run/systemd/inaccessible/`` (mounted over what a unit may not see) and ``/run`` a mount
  of its own (with ``ProtectProc=``, a path bound below a plain ``/run`` directory is not found).
  The private namespace (journald's, which the manager joins) gets both.

Command line (for the demo and for poking at it by hand)::

    python -m tests.support.sandbox start --dir DIR   # writes DIR/env (shell exports) and DIR/sandbox.json
    . DIR/env && systemctl --user status
    journalctl -D DIR/journal -u gpushift             # the units' logs
    python -m tests.support.sandbox stop --dir DIR    # ends the manager, the bus and journald by PID
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import frontdoor_sandbox
from .journald import JournaldError, PrivateJournal
from .journald import missing_tools as journal_missing_tools
from .procs import alive, end_pid, first_executable, proc_starttime

#: The empty target the manager boots into (instead of default.target, which may pull in the
#: desktop's services).
SANDBOX_TARGET = "gpushift-sandbox.target"

#: Variables of the caller's environment that would confuse the manager or the bus: they describe the
#: caller's own service context (a test run from a unit), not the sandbox.
_SCRUBBED_ENV = (
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "MANAGERPID",
    "SYSTEMD_EXEC_PID",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "DBUS_STARTER_ADDRESS",
    "DBUS_STARTER_BUS_TYPE",
)

#: Where systemd looks for user units shipped by the system (whose sockets/timers/paths we mask).
_SYSTEM_USER_UNIT_DIRS = (
    "/etc/systemd/user",
    "/run/systemd/user",
    "/usr/local/lib/systemd/user",
    "/usr/local/share/systemd/user",
    "/usr/lib/systemd/user",
    "/lib/systemd/user",
    "/usr/share/systemd/user",
)

_STATE_FILE = "sandbox.json"
_ENV_FILE = "env"


class SandboxError(RuntimeError):
    """The sandbox could not be started (the message says what is missing and shows the logs)."""


def _find_systemd() -> str | None:
    return first_executable(("/lib/systemd/systemd", "/usr/lib/systemd/systemd"))


def missing_tools() -> list[str]:
    """Name every program the sandbox needs that this machine lacks (empty when all are there)."""
    missing = []
    if _find_systemd() is None:
        missing.append("systemd (/lib/systemd/systemd or /usr/lib/systemd/systemd)")
    for tool in ("dbus-daemon", "systemctl", "busctl"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if os.geteuid() == 0 or not os.path.isdir("/run/systemd/system"):
        missing += journal_missing_tools()
    return missing


def _cgroup_hierarchies() -> list[tuple[str, str]]:
    """(mount point, this process's path in it) for the hierarchies systemd tracks processes in.

    That is the cgroup v2 hierarchy (pure v2 or the hybrid layout's ``unified``) and the v1
    ``name=systemd`` one when it exists.
    """
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            own[controllers] = path
    found: list[tuple[str, str]] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _source, opts = (post.split() + ["", "", ""])[:3]
            mount_point = pre.split()[4].replace("\\040", " ")
            if fstype == "cgroup2" and "" in own:
                found.append((mount_point, own[""]))
            elif fstype == "cgroup" and "name=systemd" in opts.split(",") and "name=systemd" in own:
                found.append((mount_point, own["name=systemd"]))
    return found


def _cgroup_tree_pids(root: str) -> list[int]:
    pids: list[int] = []
    for dirpath, _dirs, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs")) as f:
                pids.extend(int(x) for x in f.read().split())
    return pids


def _remove_cgroup_tree(root: str) -> None:
    if not os.path.isdir(root):
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _mask_names() -> list[str]:
    """Every socket, timer and path unit the system ships for user managers (masked in the sandbox).

    They would only add noise and processes a test did not ask for.  ``dbus.socket`` is not masked
    but replaced by the sandbox's own (see :func:`_bus_units`).
    """
    names: set[str] = set()
    for base in _SYSTEM_USER_UNIT_DIRS:
        for entry in _listdir(base):
            if entry.endswith((".wants", ".requires")):
                names.update(_listdir(os.path.join(base, entry)))
            else:
                names.add(entry)
    names.discard("dbus.socket")
    return sorted(n for n in names if n.endswith((".socket", ".timer", ".path")))


def _bus_units(dbus_daemon: str, log: Path, config: Path) -> dict[str, str]:
    """The manager's session bus: the units a user session has, naming this machine's dbus-daemon.

    The names are systemd's: the manager joins the bus when ``dbus.socket`` and ``dbus.service`` run.
    ``config`` is the bus's configuration: the distribution's session bus and the front door's
    shipped policy (:func:`tests.support.frontdoor_sandbox.bus_config`).
    """
    return {
        "dbus.socket": (
            "[Unit]\nDescription=D-Bus session bus socket (gpushift sandbox)\n\n"
            "[Socket]\nListenStream=%t/bus\n"
        ),
        "dbus.service": (
            "[Unit]\nDescription=D-Bus session bus (gpushift sandbox)\nRequires=dbus.socket\n\n"
            "[Service]\n"
            f"ExecStart={dbus_daemon} --config-file={config} --address=systemd: --nofork --nopidfile "
            "--systemd-activation\n"
            f"StandardOutput=append:{log}\nStandardError=append:{log}\n"
        ),
        SANDBOX_TARGET: (
            "[Unit]\nDescription=gpushift test sandbox (boots only the bus; tests start what they need)\n"
            "Wants=dbus.socket dbus.service\nAfter=dbus.socket\n"
        ),
    }


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class Sandbox:
    """A private systemd user manager on a private D-Bus session bus.

    Example:
        >>> with Sandbox() as sb:                       # doctest: +SKIP
        ...     sb.install_unit("x.service", "[Service]\\nExecStart=/bin/sleep 60\\n")
        ...     sb.daemon_reload()
        ...     sb.systemctl("start", "x.service")
        ...     subprocess.run(["gpushift", "status"], env=sb.env)

    Attributes:
        runtime_dir: ``$XDG_RUNTIME_DIR`` (under ``/run``): the bus socket, systemd's private socket.
        base_dir: config, data and logs (``systemd.log``, ``dbus.log``); the runtime dir unless given.
        unit_dir: ``$XDG_CONFIG_HOME/systemd/user``, where :meth:`install_unit` writes.
        exports: only the variables the sandbox sets (what ``DIR/env`` exports).
        env: the caller's environment plus :attr:`exports`: pass it to subprocesses (``systemctl``,
            ``gpushift``) so they talk to this manager and this bus.
    """

    def __init__(
        self, base_dir: str | os.PathLike[str] | None = None, *, runtime_parent: str | None = None
    ) -> None:
        """Prepare (nothing runs until :meth:`start`).

        Args:
            base_dir: where config, data and logs go; it is kept at :meth:`stop` when given (the caller
                owns it), removed with the runtime dir otherwise.
            runtime_parent: where the runtime dir is made; default ``/run`` when writable, else the
                system temp dir (a non-root developer on a systemd host).
        """
        self._given_base = base_dir is not None
        self._base_arg = Path(base_dir) if base_dir is not None else None
        self._runtime_parent = runtime_parent
        self.runtime_dir: Path | None = None
        self.base_dir: Path | None = None
        self.exports: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.dbus_pid: int | None = None
        self.manager_pid: int | None = None
        self._dbus_start: int | None = None
        self._manager_start: int | None = None
        self._manager_proc: subprocess.Popen[bytes] | None = None
        self._cgroups: list[str] = []  # private cgroup dirs (one per tracking hierarchy)
        self._cgroup_rel: str | None = None  # their path relative to each mount (for v1 controllers)
        self.journald: PrivateJournal | None = None  # None: no private journal (non-root, booted host)
        self._stopped = False
        self._started = False

    # ------------------------------------------------------------------ paths

    @property
    def unit_dir(self) -> Path:
        """``$XDG_CONFIG_HOME/systemd/user``: unit files the manager loads (after daemon_reload)."""
        if self.base_dir is None:
            raise SandboxError("the sandbox has not been started")
        return self.base_dir / "config" / "systemd" / "user"

    @property
    def bus_address(self) -> str:
        """``unix:path=$XDG_RUNTIME_DIR/bus``."""
        return self.exports["DBUS_SESSION_BUS_ADDRESS"]

    @property
    def manager_log(self) -> Path:
        """The manager's own stderr (unit start/stop messages)."""
        assert self.base_dir is not None
        return self.base_dir / "systemd.log"

    @property
    def journal_dir(self) -> Path:
        """The private journal's files (``journalctl -D`` reads them); ``<base_dir>/journal``."""
        if self.base_dir is None:
            raise SandboxError("the sandbox has not been started")
        return self.base_dir / "journal"

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 20.0) -> Sandbox:
        """Start the bus and the manager; return once ``org.freedesktop.systemd1`` answers on the bus.

        Raises:
            SandboxError: a tool is missing, we lack the privileges, or the manager did not come up
                within ``timeout_s`` (the message carries the tail of its log).  Whatever had started is
                stopped again before the error propagates.
        """
        if self._started:
            raise SandboxError("a Sandbox can be started once")
        self._started = True
        missing = missing_tools()
        if missing:
            raise SandboxError("cannot boot a private systemd user manager: missing " + ", ".join(missing))
        private = os.geteuid() == 0
        if not private and not os.path.isdir("/run/systemd/system"):
            raise SandboxError(
                "this host was not booted with systemd, so the sandbox gives systemd --user a private "
                "/run/systemd/system in a new mount namespace, which needs root (CAP_SYS_ADMIN)"
            )
        try:
            self._prepare_dirs()
            if private:
                self._start_journald()
            self._start_manager()
            self._wait_for_manager(deadline=time.monotonic() + timeout_s)
            self._record_bus_pid()
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_dirs(self) -> None:
        parent = self._runtime_parent
        if parent is None:
            parent = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gpushift-sandbox.", dir=parent))
        os.chmod(self.runtime_dir, 0o700)
        self.base_dir = self._base_arg if self._base_arg is not None else self.runtime_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir = self.base_dir.resolve()
        for sub in ("config", "data", "state", "cache"):
            (self.base_dir / sub).mkdir(exist_ok=True)
        self.unit_dir.mkdir(parents=True, exist_ok=True)
        for name in _mask_names():
            link = self.unit_dir / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to("/dev/null")
        dbus_daemon = shutil.which("dbus-daemon")
        assert dbus_daemon is not None  # missing_tools() checked
        bus_conf = self.base_dir / "dbus-session.conf"
        bus_conf.write_text(frontdoor_sandbox.bus_config())
        for name, text in _bus_units(dbus_daemon, self.base_dir / "dbus.log", bus_conf).items():
            (self.unit_dir / name).write_text(text)
        self.exports = {
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={self.runtime_dir}/bus",
            "XDG_CONFIG_HOME": str(self.base_dir / "config"),
            "XDG_DATA_HOME": str(self.base_dir / "data"),
            "XDG_STATE_HOME": str(self.base_dir / "state"),
            "XDG_CACHE_HOME": str(self.base_dir / "cache"),
            # systemctl must not page or ask questions in a test.
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
        }
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(self.exports)
        self.env = env
        self._write_state()

    def _start_journald(self) -> None:
        """The private journald, in the mount namespace the manager will join (see the module doc)."""
        assert self.base_dir is not None
        self.journald = PrivateJournal(self.journal_dir, self.base_dir)
        try:
            self.journald.start()
        except JournaldError as e:
            raise SandboxError(f"could not start the private journald: {e}") from None
        finally:
            self._write_state()

    def _start_manager(self) -> None:
        assert self.base_dir is not None
        systemd = _find_systemd()
        assert systemd is not None
        # The child waits on stdin until it has been moved into its private cgroup, then execs.
        gate = 'read _gate; exec "$0" --user --unit=' + SANDBOX_TARGET
        if self.journald is not None:
            # nsenter execs in place: the manager joins journald's mount namespace (its /run/systemd,
            # and /run a mount of its own with the inaccessible nodes: see the module docstring).
            argv = [*self.journald.enter(), "sh", "-c", gate, systemd]
        else:  # a non-root user on a host booted with systemd: the host's /run is as it should be
            argv = ["sh", "-c", gate, systemd]
        with open(self.manager_log, "ab") as log:
            self._manager_proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                env={**self.env, "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_COLOR": "0"},
                start_new_session=True,
            )
        # nsenter and sh exec in place: this PID becomes systemd's.
        self.manager_pid = self._manager_proc.pid
        self._manager_start = proc_starttime(self.manager_pid)
        self._write_state()
        self._enter_private_cgroup(self.manager_pid)
        assert self._manager_proc.stdin is not None
        try:
            self._manager_proc.stdin.write(b"go\n")
            self._manager_proc.stdin.close()
        except BrokenPipeError:
            pass  # it died already; _wait_for_manager reports it with the log

    def _enter_private_cgroup(self, pid: int) -> None:
        """Move ``pid`` into a fresh child of our cgroup in each hierarchy systemd tracks processes in.

        Best effort: without permission (a non-root user on a systemd host, whose own manager
        delegates the cgroup) the manager stays where it is, which is what that host expects.
        """
        assert self.runtime_dir is not None
        # gpushift-sandbox.XXXXXX.slice: unique on this machine, and a slice to journald (module doc)
        name = self.runtime_dir.name + ".slice"
        try:
            hierarchies = _cgroup_hierarchies()
        except OSError:
            return
        for mount, own in hierarchies:
            target = os.path.join(mount, own.lstrip("/"), name)
            try:
                os.mkdir(target)
            except OSError:
                continue
            try:
                with open(os.path.join(target, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(target)
                continue
            self._cgroups.append(target)
            self._cgroup_rel = os.path.join(own, name)
        self._write_state()

    def _wait_for_manager(self, deadline: float) -> None:
        while True:
            if self._manager_proc is not None and self._manager_proc.poll() is not None:
                raise SandboxError(
                    f"systemd --user exited with {self._manager_proc.returncode}:\n{self._tail('systemd.log')}"
                )
            probe = subprocess.run(
                [
                    "busctl",
                    "--user",
                    "call",
                    "org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "NameHasOwner",
                    "s",
                    "org.freedesktop.systemd1",
                ],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=10,
            )
            # NameHasOwner, not a call to systemd1 itself: a call would make the bus try to activate
            # the name through the distribution's service file (Exec=/bin/false) and fail.
            if probe.returncode == 0 and probe.stdout.strip() == "b true":
                answer = self._busctl_version()
                if answer is not None:
                    return
            if time.monotonic() > deadline:
                raise SandboxError(
                    "systemd --user did not answer as org.freedesktop.systemd1 on the private bus "
                    f"({probe.stdout.strip() or probe.stderr.strip()}):\n{self._tail('systemd.log')}"
                )
            time.sleep(0.05)

    def _record_bus_pid(self) -> None:
        pid = self.show("dbus.service", "MainPID").get("MainPID", "0")
        if pid.isdigit() and int(pid) > 0:
            self.dbus_pid = int(pid)
            self._dbus_start = proc_starttime(self.dbus_pid)
            self._write_state()

    def _busctl_version(self) -> str | None:
        r = subprocess.run(
            [
                "busctl",
                "--user",
                "get-property",
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
                "Version",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return r.stdout.strip() if r.returncode == 0 else None

    def stop(self, unit_timeout_s: float = 30.0) -> None:
        """Stop every unit; end the manager, the bus and journald by PID and wait for them; remove the
        runtime dir (with the journal, unless ``base_dir`` was given).

        Idempotent, and safe after a partial :meth:`start`: each step only undoes what was done.
        """
        if self._stopped:
            return
        self._stopped = True
        if self.manager_pid is not None and self._manager_alive():
            with contextlib.suppress(Exception):
                self._stop_all_units(unit_timeout_s)
            # SIGTERM makes a user manager start exit.target (stopping whatever is left) and exit.
            end_pid(self.manager_pid, self._manager_start, self._manager_proc, grace_s=15.0)
        elif self._manager_proc is not None:
            end_pid(self._manager_proc.pid, None, self._manager_proc, grace_s=1.0)
        self._end_cgroup_leftovers()
        if self.dbus_pid is not None:
            end_pid(self.dbus_pid, self._dbus_start, None, grace_s=5.0)
        if self.journald is not None:
            self.journald.stop()  # last: the units' final lines are in by now
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.base_dir is not None and self._given_base:
            with contextlib.suppress(OSError):
                (self.base_dir / _ENV_FILE).unlink()
            self._write_state()

    def _manager_alive(self) -> bool:
        if self._manager_proc is not None:
            return self._manager_proc.poll() is None
        assert self.manager_pid is not None
        return alive(self.manager_pid, self._manager_start)

    def _stop_all_units(self, timeout_s: float) -> None:
        listed = subprocess.run(
            [
                "systemctl",
                "--user",
                "list-units",
                "--type=service,scope",
                "--state=active,activating,deactivating,reloading",
                "--plain",
                "--no-legend",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            # A healthy manager answers in milliseconds; a dying one (killed, still in the kernel)
            # accepts the connection and never answers: do not wait long for it.
            timeout=3,
        )
        units = [line.split()[0] for line in listed.stdout.splitlines() if line.split()]
        # The bus goes last, with the manager (exit.target), so stop jobs can still report.
        units = [u for u in units if u not in ("init.scope", "dbus.service")]
        if units:
            subprocess.run(
                ["systemctl", "--user", "stop", *units],
                env=self.env,
                capture_output=True,
                timeout=timeout_s,
            )

    def _end_cgroup_leftovers(self) -> None:
        """SIGKILL what is still in the manager's private cgroup (only after the manager is gone)."""
        for root in self._cgroups:
            for _ in range(50):
                pids = _cgroup_tree_pids(root)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
        # systemd also made same-named dirs in the v1 controller hierarchies (cpu, memory, pids...).
        mounts: list[str] = []
        if self._cgroup_rel is not None:
            with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
                for line in f:
                    pre, _, post = line.partition(" - ")
                    if post.split()[:1] in (["cgroup"], ["cgroup2"]):
                        mounts.append(pre.split()[4])
        for root in self._cgroups + [
            os.path.join(m, self._cgroup_rel.lstrip("/")) for m in mounts if self._cgroup_rel
        ]:
            _remove_cgroup_tree(root)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ using it

    def install_unit(self, name: str, text: str) -> Path:
        """Write ``unit_dir/name`` (call :meth:`daemon_reload` before starting it)."""
        path = self.unit_dir / name
        path.write_text(text)
        return path

    def install_dropin(self, unit: str, name: str, text: str) -> Path:
        """Write ``unit_dir/<unit>.d/<name>`` (``name`` should end in ``.conf``)."""
        d = self.unit_dir / f"{unit}.d"
        d.mkdir(exist_ok=True)
        path = d / name
        path.write_text(text)
        return path

    def daemon_reload(self) -> None:
        """``systemctl --user daemon-reload`` (waits until the manager has reloaded)."""
        self.systemctl("daemon-reload")

    def systemctl(
        self, *args: str, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``systemctl --user ARGS`` against this manager; output captured as text.

        Raises:
            subprocess.CalledProcessError: non-zero exit and ``check`` (its ``stderr`` says why).
        """
        return subprocess.run(
            ["systemctl", "--user", "--no-pager", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout_s,
        )

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl --user show -p P ... unit`` as a dict (a quick, bus-independent check)."""
        args = ["show", unit] + [f"--property={p}" for p in props]
        out = self.systemctl(*args).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *matches: str) -> list[dict[str, Any]]:
        """The private journal's entries, oldest first, as ``journalctl -D DIR -o json`` gives them.

        ``matches`` are journalctl's: ``GPUSHIFT_TICKET=abc``, ``_SYSTEMD_UNIT=gpushift.service``,
        ``-u``, ``gpushift.service``, ``+`` between alternatives.  While journald runs it is first
        asked to write everything it was sent (``journalctl --sync``).

        Raises:
            SandboxError: this sandbox has no private journal (it runs without root).
        """
        if self.journald is None:
            raise SandboxError(
                "this sandbox has no private journal: it runs journald in a new mount namespace, "
                "which needs root (CAP_SYS_ADMIN)"
            )
        try:
            return self.journald.read(*matches)
        except JournaldError as e:
            raise SandboxError(str(e)) from None

    def journal_text(self, *matches: str, lines: int = 50) -> str:
        """The last ``lines`` matching entries as ``journalctl`` prints them, for a message to a person
        (never raises: a sandbox without a journal says so instead)."""
        try:
            entries = self.journal(*matches)
        except SandboxError as e:
            return f"(no journal: {e})"
        out = []
        for entry in entries[-lines:]:
            msg = entry.get("MESSAGE", "")
            if isinstance(msg, list) and all(isinstance(x, int) for x in msg):  # binary: byte values
                msg = bytes(msg).decode("utf-8", "replace")
            out.append(f"{entry.get('SYSLOG_IDENTIFIER', '?')}[{entry.get('_PID', '?')}]: {msg}")
        return "\n".join(out) or f"(no journal entries for {' '.join(matches) or 'anything'})"

    def _tail(self, name: str, lines: int = 30) -> str:
        if self.base_dir is None:
            return ""
        try:
            text = (self.base_dir / name).read_text(errors="replace")
        except OSError:
            return f"({name}: no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ command-line state

    def _write_state(self) -> None:
        """Record PIDs and paths in ``base_dir`` so ``python -m tests.support.sandbox stop`` can end them."""
        if not self._given_base or self.base_dir is None:
            return
        state = {
            "runtime_dir": str(self.runtime_dir) if self.runtime_dir else None,
            "base_dir": str(self.base_dir),
            "dbus_pid": self.dbus_pid,
            "dbus_starttime": self._dbus_start,
            "manager_pid": self.manager_pid,
            "manager_starttime": self._manager_start,
            "journald_pid": self.journald.pid if self.journald else None,
            "journald_starttime": self.journald.starttime if self.journald else None,
            "cgroups": self._cgroups,
            "cgroup_rel": self._cgroup_rel,
            "exports": self.exports,
            "stopped": self._stopped,
        }
        tmp = self.base_dir / (_STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.base_dir / _STATE_FILE)
        if self.exports and not self._stopped:
            lines = [f"export {k}={shlex.quote(v)}" for k, v in self.exports.items()]
            (self.base_dir / _ENV_FILE).write_text(
                "# gpushift sandbox: source this file\n" + "\n".join(lines) + "\n"
            )

    @classmethod
    def attach(cls, base_dir: str | os.PathLike[str]) -> Sandbox:
        """Rebuild a Sandbox that another process started with ``base_dir`` (to stop it)."""
        base = Path(base_dir)
        try:
            state = json.loads((base / _STATE_FILE).read_text())
        except (OSError, ValueError) as e:
            raise SandboxError(f"no sandbox state in {base}: {e}") from e
        sb = cls(base)
        sb._started = True
        sb._stopped = bool(state.get("stopped"))
        sb.base_dir = base.resolve()
        sb.runtime_dir = Path(state["runtime_dir"]) if state.get("runtime_dir") else None
        sb.dbus_pid = state.get("dbus_pid")
        sb._dbus_start = state.get("dbus_starttime")
        sb.manager_pid = state.get("manager_pid")
        sb._manager_start = state.get("manager_starttime")
        sb._cgroups = list(state.get("cgroups") or [])
        sb._cgroup_rel = state.get("cgroup_rel")
        if state.get("journald_pid"):
            sb.journald = PrivateJournal(base / "journal", base)
            sb.journald.pid = state["journald_pid"]
            sb.journald.starttime = state.get("journald_starttime")
        sb.exports = dict(state.get("exports") or {})
        sb.env = {**{k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}, **sb.exports}
        return sb


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.sandbox",
        description="Boot or end a private systemd user manager and D-Bus session bus.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start it; write DIR/env (shell exports) and DIR/sandbox.json")
    p_start.add_argument("--dir", required=True, help="directory for config, logs, env and PIDs")
    p_start.add_argument("--timeout", type=float, default=20.0)
    p_stop = sub.add_parser("stop", help="stop the units, end the manager and the bus started with --dir")
    p_stop.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        try:
            sb = Sandbox(args.dir).start(timeout_s=args.timeout)
        except SandboxError as e:
            print(f"sandbox: {e}", file=sys.stderr)
            return 1
        jpid = sb.journald.pid if sb.journald else None
        print(
            f"sandbox: systemd --user pid {sb.manager_pid}, dbus-daemon pid {sb.dbus_pid}, journald pid {jpid}"
        )
        print(f"sandbox: . {Path(args.dir) / _ENV_FILE}   # then systemctl --user ... talks to it")
        print(f"sandbox: python -m tests.support.sandbox stop --dir {args.dir}   # to end it")
        return 0
    try:
        sb = Sandbox.attach(args.dir)
    except SandboxError as e:
        print(f"sandbox: {e}", file=sys.stderr)
        return 1
    sb.stop()
    jpid = sb.journald.pid if sb.journald else None
    print(
        f"sandbox: stopped (manager pid {sb.manager_pid}, dbus-daemon pid {sb.dbus_pid}, journald pid {jpid})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
