"""Who has a GPU's device file open — the one holder-finding code of both GPU providers.

NVML's process lists are not enough to decide who holds a GPU: they can name a process that is
already dead (a CUDA process forked a child that inherited ``/dev/nvidia*``; after the parent was
SIGKILLed and reaped NVML kept listing the dead PID until the child exited — FACTS.md, measured).
The truth is in ``/proc/*/fd``: every live process that has the device file open.  The simulated
provider runs the very same scan on its own device files, so CI exercises this code on real
processes.

Fail closed: a process whose ``/proc/PID/fd`` cannot be read (another user's process while we lack
CAP_SYS_PTRACE) may be a holder, so the scan reports it as unreadable and the reading built from it
is UNKNOWN, never "free".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import psutil

from gpushift.values import Holder

log = logging.getLogger(__name__)

#: Where /proc lives (a parameter only so that nothing else in this module hard-codes it).
PROC = "/proc"

#: How the kernel shows an open file whose path was unlinked since (a device node recreated by
#: nvidia-modprobe/udev while a process kept the old one open still maps the same GPU).
_DELETED_SUFFIX = " (deleted)"


@dataclass(frozen=True)
class ProcInfo:
    """A live process, named for a person.

    Attributes:
        pid: Process id.
        user: User name (the numeric uid as a string when it has no passwd entry).
        command: Short name (comm, as psutil extends it when the kernel truncated it).
        cmdline: Full argv; empty when it could not be read.
        unit: systemd unit from its cgroup (``gpushift-vllm.service``), None outside any unit.
    """

    pid: int
    user: str
    command: str
    cmdline: tuple[str, ...] = ()
    unit: str | None = None

    def to_holder(self, used_mib: float | None = None) -> Holder:
        """The model's :class:`Holder` for this process, with the memory attributed to it."""
        return Holder(
            pid=self.pid,
            user=self.user,
            command=self.command,
            cmdline=self.cmdline,
            unit=self.unit,
            used_mib=used_mib,
        )


@dataclass(frozen=True)
class ScanResult:
    """What one scan of ``/proc/*/fd`` found.

    Attributes:
        holders: For every GPU index asked about (each key present, possibly with an empty
            tuple): the live processes with that GPU's device file open, sorted by pid.
        unreadable: PIDs whose open files could not be read (PermissionError).  Any of them may
            hold any GPU, so a reading built from this scan must be UNKNOWN while it is not empty.
        hidden: Why processes may be missing from ``/proc`` altogether (``hidepid=`` mount option
            while we are not root), else None.  Also makes the scan incomplete.
        ignored: Unreadable PIDs that do not make the scan incomplete: only PID 1 while we are
            root (see :func:`_denied`).
    """

    holders: Mapping[int, tuple[ProcInfo, ...]] = field(default_factory=dict)
    unreadable: tuple[int, ...] = ()
    hidden: str | None = None
    ignored: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every process on the host could be looked at."""
        return not self.unreadable and self.hidden is None

    def holders_of(self, index: int) -> tuple[ProcInfo, ...]:
        """The holders of GPU ``index`` (empty when none or when it was not asked about)."""
        return tuple(self.holders.get(index, ()))


def unit_of(pid: int) -> str | None:
    """The systemd unit a process runs in, read from ``/proc/PID/cgroup``.

    The unit is the last path component ending in ``.service`` or ``.scope``, which also finds
    units of a systemd *user* manager (``/user.slice/user-0.slice/user@0.service/app.slice/
    gpushift-a.service`` → ``gpushift-a.service``) and a service that delegated sub-cgroups.
    On a hybrid cgroup v1 host the ``name=systemd`` hierarchy is asked first, then the unified one.

    Args:
        pid: Process id.

    Returns:
        The unit name, or None when the process is gone or runs in no unit.
    """
    try:
        with open(f"{PROC}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths: list[tuple[int, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, path = parts
        # systemd's own view first: name=systemd (v1/hybrid), then the unified hierarchy.
        rank = 0 if controllers == "name=systemd" else 1 if controllers == "" else 2
        paths.append((rank, path))
    for _rank, path in sorted(paths, key=lambda p: p[0]):
        for component in reversed(path.split("/")):
            if component.endswith((".service", ".scope")):
                return component
    return None


def process_info(pid: int, unit_of: Callable[[int], str | None] = unit_of) -> ProcInfo | None:
    """Name one process with psutil.

    Args:
        pid: Process id.
        unit_of: How to find its systemd unit (tests inject a fake).

    Returns:
        Its :class:`ProcInfo`, or None when it no longer exists or is a zombie (an unreaped
        zombie has closed its files and holds no GPU memory — FACTS.md, measured).
    """
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            if p.status() == psutil.STATUS_ZOMBIE:
                return None
            try:
                command = p.name()
            except psutil.AccessDenied:
                command = "?"
            try:
                user = p.username()
            except (KeyError, psutil.AccessDenied):
                # psutil already falls back to the uid when there is no passwd entry; this covers
                # older versions that raised instead.
                user = str(p.uids().real)
            try:
                cmdline = tuple(p.cmdline())
            except psutil.AccessDenied:
                cmdline = ()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    return ProcInfo(pid=pid, user=user, command=command, cmdline=cmdline, unit=unit_of(pid))


def _targets(device_paths: Mapping[int, str]) -> dict[str, list[int]]:
    """Every spelling a device path can have in a readlink of an fd, mapped to its GPU indices."""
    targets: dict[str, list[int]] = {}
    for index, path in device_paths.items():
        # The kernel shows the resolved path: /var/run/x opened through a symlink reads /run/x.
        for spelling in {path, os.path.realpath(path)}:
            for shown in (spelling, spelling + _DELETED_SUFFIX):
                targets.setdefault(shown, []).append(index)
    return targets


def _denied(pid: int, unreadable: list[int], ignored: list[int]) -> None:
    """Record a PID whose open files we may not read.

    The one exception to "unreadable means unknown": PID 1 while we run as root.  A root process
    with CAP_SYS_PTRACE reads every process of a normal host, PID 1 (systemd) included; where even
    root is refused PID 1, it is a sandbox's own init guarding itself (measured in the CI and GPU
    sandboxes: readlink of /proc/1/fd/N fails with EACCES for root), never a GPU holder.  Counting
    it would make every reading UNKNOWN there.  A non-root daemon still counts PID 1.
    """
    if not os.path.exists(f"{PROC}/{pid}"):
        return  # gone meanwhile: not a holder
    if pid == 1 and os.geteuid() == 0:
        ignored.append(pid)
    else:
        unreadable.append(pid)


def _hidden_by_mount() -> str | None:
    """Say so when /proc hides other users' processes from us (``hidepid=``) and we are not root."""
    if os.geteuid() == 0:
        return None
    try:
        with open(f"{PROC}/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) < 5 or fields[4] != PROC or " - proc " not in line:
            continue
        options = line.split(" - ", 1)[1].split()[-1].split(",")
        for opt in options:
            if opt.startswith("hidepid=") and opt not in ("hidepid=0", "hidepid=off"):
                return f"{PROC} is mounted with {opt}: other users' processes are invisible to uid {os.geteuid()}"
    return None


def scan_holders(
    device_paths: Mapping[int, str],
    exclude_pids: Collection[int] = (),
    unit_of: Callable[[int], str | None] = unit_of,
) -> ScanResult:
    """Find every live process that has one of the given device files open.

    Reads ``os.readlink`` of each ``/proc/PID/fd/N``.  gpushift's own process is always left out:
    NVML opens the device files in our process too.

    Args:
        device_paths: GPU index → device file, e.g. ``{0: "/dev/nvidia0"}`` or
            ``{0: "/var/lib/gpushift/simgpu/nvidia0"}``.
        exclude_pids: More PIDs to leave out.
        unit_of: How to find a holder's systemd unit (tests inject a fake).

    Returns:
        The holders per GPU index and the PIDs that could not be looked at.  A process that
        vanished during the scan is simply gone (neither holder nor unreadable).
    """
    targets = _targets(device_paths)
    excluded = {os.getpid(), *exclude_pids}
    found: dict[int, set[int]] = {}  # pid -> GPU indices
    unreadable: list[int] = []
    ignored: list[int] = []
    try:
        entries = os.listdir(PROC)
    except OSError as e:
        # Without /proc nothing can be known: the caller sees an incomplete scan.
        return ScanResult(
            holders={i: () for i in device_paths},
            unreadable=(),
            hidden=f"cannot list {PROC}: {e.strerror or e}",
        )
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in excluded:
            continue
        fd_dir = f"{PROC}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited between the two listings: gone, not a holder
        except OSError:
            # PermissionError above all; any other failure is treated the same (fail closed).
            _denied(pid, unreadable, ignored)
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except (FileNotFoundError, ProcessLookupError):
                continue  # that fd was closed meanwhile
            except OSError:
                _denied(pid, unreadable, ignored)
                break
            indices = targets.get(target)
            if indices:
                found.setdefault(pid, set()).update(indices)

    holders: dict[int, list[ProcInfo]] = {i: [] for i in device_paths}
    for pid in sorted(found):
        info = process_info(pid, unit_of)
        if info is None:
            continue  # exited after we saw its fds: it holds nothing any more
        for index in sorted(found[pid]):
            holders[index].append(info)
    if unreadable or ignored:
        log.debug("proc_fd_unreadable pids=%s ignored=%s", unreadable, ignored)
    return ScanResult(
        holders={i: tuple(h) for i, h in holders.items()},
        unreadable=tuple(sorted(set(unreadable))),
        hidden=_hidden_by_mount(),
        ignored=tuple(ignored),
    )
