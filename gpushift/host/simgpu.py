"""The simulated GPU provider, for hosts without an NVIDIA GPU (CI, the demo).

A simulated GPU is a plain file, ``<simulated_dir>/nvidiaN``.  A process holds simulated VRAM on GPU N
while it has that file open — found by the very same ``/proc/*/fd`` scan as on a real GPU
(:mod:`gpushift.host.procscan`) and named the same way, so the holder-finding code is exercised
on real processes.  How much a holder holds:

* a process in a configured backend's systemd unit: that backend's ``simulated_vram_mib`` on each
  GPU whose file it has open (split evenly among the unit's processes there, so a server with
  worker processes is counted once, as a real server's memory would be);
* any other process: ``gpu.simulated_foreign_mib``.

Memory comes back ``gpu.simulated_release_delay_s`` after holders close the file, as a real driver
frees memory a moment after the process ends.  Everything a person sees says SIMULATED.

A GPU "falls off the bus" while a file ``<simulated_dir>/nvidiaN.gone`` exists: the provider then
does not list GPU N (as NVML stops listing a GPU whose driver is reloading or that fell off the
bus), and asking for it gives an unknown reading.  ``touch``/``rm`` that file to simulate it.

Also a tiny holder program for tests and the demo::

    python -m gpushift.host.simgpu hold PATH [PATH ...]

opens the files read-only, prints one ``holding …`` line, and sleeps until SIGTERM or SIGINT
(then exits 0).
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.config.schema import Config
from gpushift.host import procscan
from gpushift.host.procscan import ScanResult
from gpushift.values import GpuInfo, GpuReading, Holder, HostGpuFacts

log = logging.getLogger(__name__)

SIMULATED = "SIMULATED"

#: Directory and device files: any local user's process may open the files read-only (a backend
#: unit may run as its own user), only the owner (the daemon) may change them.
DIR_MODE = 0o755
FILE_MODE = 0o644


def device_file_name(index: int) -> str:
    """The file name of simulated GPU ``index`` inside the simulated directory (``nvidia0``)."""
    return f"nvidia{index}"


@dataclass
class _GpuState:
    """What one simulated GPU showed last, for the release delay."""

    shown_mib: float = 0.0
    drop_since: float | None = None  # assumed time of the close whose memory is not back yet
    last_read_at: float | None = None


class SimulatedGpuProbe:
    """The ``GpuProbe`` port for a host without NVIDIA GPUs.

    Creates its device files at construction (idempotently; a process without write access to the
    directory, such as a CLI run by an ordinary user, still reads — files that do not exist give
    UNKNOWN readings).

    Args:
        config: The gpushift config (``gpu.simulated_*``, ``backends``, ``simulated_dir``).
        clock: Monotonic seconds (a callable, or an object with ``monotonic()`` such as a Clock).
        unit_of: How a holder's systemd unit is found; tests inject a fake.
        exclude_pids: PIDs besides our own to leave out of the scan.
        scan: The holder scan (``procscan.scan_holders``).
    """

    simulated = True

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] | Any = time.monotonic,
        unit_of: Callable[[int], str | None] = procscan.unit_of,
        exclude_pids: Collection[int] = (),
        scan: Callable[..., ScanResult] = procscan.scan_holders,
    ) -> None:
        self.config = config
        self._now: Callable[[], float] = clock.monotonic if hasattr(clock, "monotonic") else clock
        self._unit_of = unit_of
        self._exclude = tuple(exclude_pids)
        self._scan = scan
        self._lock = threading.Lock()
        self._state: dict[int, _GpuState] = {}
        self.create_error: str | None = None
        try:
            self.ensure_device_files()
        except OSError as e:
            self.create_error = (
                f"{SIMULATED}: cannot create device files in {config.simulated_dir}: {e.strerror or e}"
            )
            log.warning("simgpu_create_failed dir=%s error=%s", config.simulated_dir, e)

    # ---------------------------------------------------------------- files

    @property
    def directory(self) -> str:
        """Where the simulated device files live."""
        return self.config.simulated_dir

    @property
    def count(self) -> int:
        """How many simulated GPUs the host has."""
        return int(self.config.gpu.simulated_gpus)

    @property
    def total_mib(self) -> float:
        return float(self.config.gpu.simulated_total_mib)

    def device_path(self, index: int) -> str:
        """The device file of simulated GPU ``index``."""
        return os.path.join(self.directory, device_file_name(index))

    def device_paths(self) -> dict[int, str]:
        """Every simulated GPU's device file, by index."""
        return {i: self.device_path(i) for i in range(self.count)}

    def visible(self) -> list[int]:
        """The GPUs the provider lists (not those whose ``nvidiaN.gone`` marker exists)."""
        return [i for i in range(self.count) if not os.path.exists(self.device_path(i) + ".gone")]

    def ensure_device_files(self) -> None:
        """Create the directory and device files if missing and give them their modes.

        Raises:
            OSError: When the directory or a file cannot be created.
        """
        os.makedirs(self.directory, mode=DIR_MODE, exist_ok=True)
        _chmod_if_owner(self.directory, DIR_MODE)
        for path in self.device_paths().values():
            fd = os.open(path, os.O_CREAT | os.O_RDONLY | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{path} exists and is not a regular file")
            finally:
                os.close(fd)
            _chmod_if_owner(path, FILE_MODE)

    # ---------------------------------------------------------------- facts

    def _name(self) -> str:
        gb = round(self.total_mib / 1024)
        return f"{SIMULATED} Tesla V100-PCIE-{gb}GB"

    def uuid(self, index: int) -> str:
        """The UUID of simulated GPU ``index`` (``GPU-SIMULATED-0000-0000-0000-000000000000``)."""
        return f"GPU-{SIMULATED}-0000-0000-0000-{index:012d}"

    def facts(self) -> HostGpuFacts:
        """Facts of a simulated host of V100s (compute capability 7.0), all marked SIMULATED."""
        gpus = tuple(
            GpuInfo(
                index=i,
                name=self._name(),
                uuid=self.uuid(i),
                total_mib=self.total_mib,
                compute_capability=(7, 0),
                ecc_enabled=True,
                ecc_uncorrected=0,
                ecc_corrected=0,
            )
            for i in self.visible()
        )
        return HostGpuFacts(
            simulated=True,
            driver_version=SIMULATED,
            cuda_version=SIMULATED,
            gpus=gpus,
            error=self.create_error,
        )

    # ---------------------------------------------------------------- readings

    def read(self, indices: Sequence[int] | None = None, holders: bool = True) -> list[GpuReading]:
        """One reading per simulated GPU, holders from the fd scan of the device files.

        Args:
            indices: GPU indices to read; None for all.
            holders: ignored: simulated memory is its holders' memory, so every read scans.

        Returns:
            The readings in the order asked; a GPU that does not exist or whose device file is
            missing comes back UNKNOWN.
        """
        visible = self.visible()
        wanted = visible if indices is None else list(indices)
        with self._lock:
            missing: dict[int, str] = {}
            for i in wanted:
                if not 0 <= i < self.count:
                    missing[i] = f"{SIMULATED}: no GPU {i} on this simulated host ({self.count} GPUs)"
                elif i not in visible:
                    missing[i] = (
                        f"{SIMULATED}: GPU {i} is not listed (fell off the bus: nvidia{i}.gone exists)"
                    )
            paths = {i: self.device_path(i) for i in wanted if i not in missing}
            if any(not os.path.exists(p) for p in paths.values()):
                try:
                    self.ensure_device_files()
                except OSError as e:
                    for i, p in paths.items():
                        if not os.path.exists(p):
                            missing[i] = f"{SIMULATED}: device file {p} missing and cannot be created: {e}"
            scan = self._scan(paths, exclude_pids=self._exclude, unit_of=self._unit_of)
            now = self._now()
            readings = []
            for i in wanted:
                who = self._attribute(scan.holders_of(i)) if i in paths else ()
                if i in missing:
                    readings.append(
                        GpuReading(
                            index=i,
                            name=self._name(),
                            total_mib=self.total_mib,
                            used_mib=None,
                            holders=who,
                            holders_complete=scan.complete,
                            error=missing[i],
                            unreadable_pids=scan.unreadable,
                        )
                    )
                    continue
                # Simulated memory IS the holders' memory: a holder that cannot be seen (another
                # user's process, a hidden /proc) makes the figure unknown, never "free".
                error = None if scan.hidden is None else f"{SIMULATED}: memory unknown: {scan.hidden}"
                if error is None and not scan.complete:
                    pids = ", ".join(str(p) for p in scan.unreadable[:5])
                    error = f"{SIMULATED}: memory unknown: the open files of pid {pids} cannot be read"
                current = float(min(self.total_mib, sum(h.used_mib or 0.0 for h in who)))
                readings.append(
                    GpuReading(
                        index=i,
                        name=self._name(),
                        total_mib=self.total_mib,
                        used_mib=None if error else self._delayed(i, current, now),
                        holders=who,
                        holders_complete=scan.complete,
                        error=error,
                        unreadable_pids=scan.unreadable,
                    )
                )
            return readings

    def _attribute(self, infos: Sequence[procscan.ProcInfo]) -> tuple[Holder, ...]:
        """Give each holder of one GPU its simulated memory."""
        per_unit: dict[str, int] = {}
        backend_of: dict[int, str | None] = {}
        for info in infos:
            backend = self.config.backend_for_unit(info.unit) if info.unit else None
            backend_of[info.pid] = backend
            if backend is not None and info.unit is not None:
                per_unit[info.unit] = per_unit.get(info.unit, 0) + 1
        holders = []
        for info in infos:
            backend = backend_of[info.pid]
            if backend is not None and info.unit is not None:
                amount = float(self.config.backends[backend].simulated_vram_mib) / per_unit[info.unit]
            else:
                amount = float(self.config.gpu.simulated_foreign_mib)
            holders.append(info.to_holder(amount))
        holders.sort(key=lambda h: (-(h.used_mib or 0.0), h.pid))
        return tuple(holders)

    def _delayed(self, index: int, current: float, now: float) -> float:
        """The figure to show: memory freed by a closing holder comes back only after the delay.

        The close happened at some moment since the previous read; the earliest, the previous
        read itself, is taken as its time.  So while the gate polls, memory comes back about
        ``simulated_release_delay_s`` after the close, and a read long after the close (a status
        check, a preflight) does not show memory that a real driver would long have freed.
        """
        st = self._state.setdefault(index, _GpuState())
        delay = float(self.config.gpu.simulated_release_delay_s)
        previous_read = st.last_read_at
        st.last_read_at = now
        if current >= st.shown_mib:
            st.shown_mib = current
            st.drop_since = None
            return current
        if st.drop_since is None:
            st.drop_since = previous_read if previous_read is not None else now
        if now - st.drop_since >= delay:
            st.shown_mib = current
            st.drop_since = None
        return st.shown_mib


def _chmod_if_owner(path: str, mode: int) -> None:
    """Set the mode where we own the path (another owner's dir is theirs to configure)."""
    try:
        st = os.stat(path)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
    except OSError as e:
        log.warning("simgpu_chmod_failed path=%s error=%s", path, e)


# -------------------------------------------------------------------- the holder program


def hold(paths: Sequence[str]) -> int:
    """Open ``paths`` read-only and keep them open until SIGTERM or SIGINT.

    Args:
        paths: Simulated (or any) device files.

    Returns:
        0 after a SIGTERM/SIGINT; 1 when a file cannot be opened.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    files = []
    try:
        for p in paths:
            files.append(open(p, "rb"))  # noqa: SIM115 - kept open on purpose until the signal
    except OSError as e:
        print(f"cannot open {e.filename}: {e.strerror}", file=sys.stderr, flush=True)
        return 1
    print(f"holding {' '.join(paths)} pid {os.getpid()}", flush=True)
    while not stop.wait(3600):
        pass
    for f in files:
        f.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpushift.host.simgpu hold PATH [PATH ...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "hold":
        print("usage: python -m gpushift.host.simgpu hold PATH [PATH ...]", file=sys.stderr)
        return 2
    return hold(args[1:])


if __name__ == "__main__":
    sys.exit(main())
