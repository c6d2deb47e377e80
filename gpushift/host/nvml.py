"""The real GPU provider — NVML (nvidia-ml-py, imported as ``pynvml``) plus the fd scan.

The only module of gpushift that imports pynvml, and only lazily: nothing happens at import, NVML
is initialised on the first call and initialised again after any failure (NVML can fail after
having worked — "Failed to initialize NVML: Unknown Error" after a daemon-reload re-applied the
device cgroup rules, nvidia-docker#1650).

Fail closed everywhere: an NVML error gives a reading with ``used_mib=None`` and ``error`` set
(state UNKNOWN).  The fd scan names who holds memory; a ``/proc/PID/fd`` we cannot read makes the
holder list incomplete (said in the reading), but NVML's memory figure decides the gate.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.host import procscan
from gpushift.host.procscan import ScanResult
from gpushift.values import GpuInfo, GpuReading, Holder, HostGpuFacts

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: NVML error codes (stable across driver versions; used when the module lacks the constant).
_ERR_NOT_SUPPORTED = 3
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_ARGUMENT_VERSION_MISMATCH = 25


@dataclass(frozen=True)
class _Raw:
    """What NVML said about one GPU in one read."""

    index: int
    name: str
    total_mib: float
    used_mib: float
    minor: int
    per_pid_mib: dict[int, float | None]


class _NvmlFailure(Exception):
    """An NVML call failed; ``str()`` is the message for the reading (``NVML: …``)."""


class NvmlGpuProbe:
    """The ``GpuProbe`` port on a real NVIDIA host.

    Args:
        device_path_pattern: How a GPU's device file is named; ``{index}`` is NVML's index and
            ``{minor}`` the device's minor number (``/dev/nvidiaN`` is named after the minor
            number, which usually but not always equals the index).  Tests point it at temp files.
        nvml: The pynvml module (or a fake with its interface); imported on first use when None.
        v1_baseline_mib: Driver-reserved memory an idle GPU shows through the v1 memory call; only
            used on drivers without the v2 call (< 510), where used = v1 used − this baseline.
        exclude_pids: PIDs besides our own to leave out of the fd scan.
        scan: The holder scan (``procscan.scan_holders``); replaceable for tests.
        unit_of: How a holder's systemd unit is found (``procscan.unit_of``).
    """

    simulated = False

    def __init__(
        self,
        device_path_pattern: str = "/dev/nvidia{minor}",
        nvml: Any = None,
        v1_baseline_mib: float = 600.0,
        exclude_pids: Collection[int] = (),
        scan: Callable[..., ScanResult] = procscan.scan_holders,
        unit_of: Callable[[int], str | None] = procscan.unit_of,
    ) -> None:
        self.device_path_pattern = device_path_pattern
        self.v1_baseline_mib = float(v1_baseline_mib)
        self._nvml: Any = nvml
        self._exclude = tuple(exclude_pids)
        self._scan = scan
        self._unit_of = unit_of
        self._lock = threading.RLock()
        self._initialized = False
        self._v2_missing = False
        # Last known name/total per index, so an UNKNOWN reading still says which GPU it is.
        self._known: dict[int, tuple[str, float]] = {}
        self._minor: dict[int, int] = {}
        self._stale: dict[int, frozenset[int]] = {}

    # ---------------------------------------------------------------- NVML plumbing

    @property
    def uses_v1_fallback(self) -> bool:
        """True once the driver turned out to lack the v2 memory call."""
        return self._v2_missing

    def _module(self) -> Any:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as e:
                raise _NvmlFailure(f"NVML: cannot import pynvml (install nvidia-ml-py): {e}") from None
        return self._nvml

    def _ensure(self) -> Any:
        """Initialise NVML if needed and return the module; raise _NvmlFailure when it cannot."""
        nvml = self._module()
        if not self._initialized:
            try:
                nvml.nvmlInit()
            except Exception as e:  # NVMLError, or OSError/ctypes errors from a broken library
                raise _NvmlFailure(f"NVML: init failed: {_message(e)}") from None
            self._initialized = True
        return nvml

    def _reset(self) -> None:
        """Forget the NVML session so that the next call initialises again."""
        if self._initialized and self._nvml is not None:
            # Shutting down a broken session may fail too; there is nothing more to do then.
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._initialized = False
        self._v2_missing = False  # a driver that came back may be a newer one: ask again

    def close(self) -> None:
        """Shut NVML down (the next call would initialise it again)."""
        with self._lock:
            self._reset()

    def _is_error(self, e: BaseException) -> bool:
        cls = getattr(self._nvml, "NVMLError", None)
        return isinstance(cls, type) and isinstance(e, cls)

    def _code(self, name: str, default: int) -> int:
        return int(getattr(self._nvml, name, default))

    # ---------------------------------------------------------------- facts

    def facts(self) -> HostGpuFacts:
        """Driver and CUDA versions and every GPU's static facts (for the ledger and the doctor).

        Returns:
            The facts; on an NVML failure ``error`` says why and ``gpus`` holds what was read
            before it.
        """
        with self._lock:
            try:
                nvml = self._ensure()
            except _NvmlFailure as e:
                return HostGpuFacts(False, None, None, (), error=str(e))
            gpus: list[GpuInfo] = []
            driver: str | None = None
            cuda: str | None = None
            try:
                driver = _text(nvml.nvmlSystemGetDriverVersion())
                cuda = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
                for index in range(int(nvml.nvmlDeviceGetCount())):
                    gpus.append(self._gpu_info(nvml, index))
            except Exception as e:
                if not self._is_error(e):
                    raise
                self._reset()
                return HostGpuFacts(False, driver, cuda, tuple(gpus), error=f"NVML: {_message(e)}")
            return HostGpuFacts(False, driver, cuda, tuple(gpus))

    def _gpu_info(self, nvml: Any, index: int) -> GpuInfo:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(h))
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        total_mib = nvml.nvmlDeviceGetMemoryInfo(h).total / MIB
        self._known[index] = (name, total_mib)
        cc = self._optional(lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)))
        mode = self._optional(lambda: nvml.nvmlDeviceGetEccMode(h))
        ecc_enabled = None if mode is None else bool(mode[0])
        ecc_unc = ecc_cor = None
        if ecc_enabled:
            agg = self._code("NVML_AGGREGATE_ECC", 1)
            ecc_unc = self._optional(
                lambda: int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        h, self._code("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), agg
                    )
                )
            )
            ecc_cor = self._optional(
                lambda: int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        h, self._code("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), agg
                    )
                )
            )
        return GpuInfo(
            index=index,
            name=name,
            uuid=uuid,
            total_mib=total_mib,
            compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
            ecc_enabled=ecc_enabled,
            ecc_uncorrected=ecc_unc,
            ecc_corrected=ecc_cor,
        )

    def _optional(self, call: Callable[[], Any]) -> Any:
        """A call whose NotSupported (boards without ECC, say) means "no such fact": None."""
        try:
            return call()
        except Exception as e:
            if self._is_error(e) and getattr(e, "value", None) == self._code(
                "NVML_ERROR_NOT_SUPPORTED", _ERR_NOT_SUPPORTED
            ):
                return None
            raise

    # ---------------------------------------------------------------- readings

    def read(self, indices: Sequence[int] | None = None, holders: bool = True) -> list[GpuReading]:
        """One reading per GPU (all when ``indices`` is None); never raises for NVML faults.

        Used memory is NVML's v2 figure (without the driver-reserved part).  Holders are every live
        process with the GPU's device file open (fd scan) plus the live processes of NVML's
        compute and graphics lists, with NVML's per-process memory where it has one.  A PID that
        NVML lists but that no longer exists is not a holder (NVML keeps listing a dead parent
        whose child inherited the device files).

        Args:
            indices: GPU indices to read; None for every GPU NVML sees.
            holders: False for memory only (no fd scan, no process lists: about 10 µs a GPU on an
                H200, the gate's fast polls); the readings then name no holder.

        Returns:
            The readings, in the order asked.  When NVML cannot be used at all, one UNKNOWN
            reading per asked (or last known) GPU — never an empty list, which a caller could
            mistake for "nothing held".
        """
        with self._lock:
            raws: dict[int, _Raw] = {}
            errors: dict[int, str] = {}
            try:
                nvml = self._ensure()
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as e:
                if not isinstance(e, _NvmlFailure) and not self._is_error(e):
                    raise
                msg = str(e) if isinstance(e, _NvmlFailure) else f"NVML: {_message(e)}"
                self._reset()
                wanted = list(indices) if indices is not None else sorted(self._known) or [0]
                return self._finish(wanted, raws, dict.fromkeys(wanted, msg), holders)
            wanted = list(indices) if indices is not None else list(range(count))
            failed = False
            for index in wanted:
                if index < 0 or index >= count:
                    errors[index] = f"NVML: no GPU {index} on this host (NVML sees {count})"
                    continue
                try:
                    raws[index] = self._read_one(nvml, index, holders)
                except Exception as e:
                    if not self._is_error(e):
                        raise
                    errors[index] = f"NVML: {_message(e)}"
                    failed = True
            if failed:
                # Start afresh next time: a session that failed once may stay broken.
                self._reset()
            return self._finish(wanted, raws, errors, holders)

    def _read_one(self, nvml: Any, index: int, processes: bool = True) -> _Raw:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(h))
        total_mib, used_mib = self._memory(nvml, h)
        self._known[index] = (name, total_mib)
        try:
            minor = int(nvml.nvmlDeviceGetMinorNumber(h))
        except Exception as e:
            if not self._is_error(e):
                raise
            minor = index  # NotSupported on some platforms: the index is the usual minor number
        self._minor[index] = minor
        per_pid: dict[int, float | None] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")[
            : 2 if processes else 0
        ]:
            fn = getattr(nvml, getter, None)
            if fn is None:
                continue
            procs = self._optional(functools.partial(fn, h)) or []
            for p in procs:
                pid = int(p.pid)
                mem = getattr(p, "usedGpuMemory", None)
                mib = None if mem is None else mem / MIB
                # A process in both lists has one context: keep the larger figure, do not add.
                old = per_pid.get(pid)
                per_pid[pid] = mib if old is None else (old if mib is None else max(old, mib))
        return _Raw(index, name, total_mib, used_mib, minor, per_pid)

    def _memory(self, nvml: Any, h: Any) -> tuple[float, float]:
        """(total, used) in MiB: v2 used (no driver-reserved part), else v1 used − baseline."""
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if not self._v2_missing:
            if v2 is not None:
                try:
                    m = nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
                    return m.total / MIB, m.used / MIB
                except TypeError:
                    pass  # an old pynvml whose function takes no version argument
                except Exception as e:
                    if not self._is_error(e) or getattr(e, "value", None) not in (
                        self._code("NVML_ERROR_FUNCTION_NOT_FOUND", _ERR_FUNCTION_NOT_FOUND),
                        self._code("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", _ERR_ARGUMENT_VERSION_MISMATCH),
                    ):
                        raise
            # Only a missing v2 call falls back; any other failure above stays an error (UNKNOWN).
            self._v2_missing = True
            log.info("nvml_memory_v2_missing fallback=v1 baseline_mib=%s", self.v1_baseline_mib)
        m = nvml.nvmlDeviceGetMemoryInfo(h)
        return m.total / MIB, max(0.0, m.used / MIB - self.v1_baseline_mib)

    def _device_path(self, index: int) -> str:
        minor = self._minor.get(index, index)
        return self.device_path_pattern.format(index=index, minor=minor)

    def _finish(
        self, wanted: list[int], raws: dict[int, _Raw], errors: dict[int, str], name_holders: bool = True
    ) -> list[GpuReading]:
        """Scan the device files once for every asked GPU (unless ``name_holders`` is False) and
        build the readings."""
        paths = {i: self._device_path(i) for i in wanted if i >= 0} if name_holders else {}
        scan = (
            self._scan(paths, exclude_pids=self._exclude, unit_of=self._unit_of)
            if name_holders
            else ScanResult()
        )
        complete = scan.complete and scan.hidden is None
        unreadable = scan.unreadable
        readings: list[GpuReading] = []
        for index in wanted:
            raw = raws.get(index)
            holders = self._holders(index, scan, raw)
            if raw is None:
                name, total = self._known.get(index, ("unknown GPU", 0.0))
                readings.append(
                    GpuReading(
                        index=index,
                        name=name,
                        total_mib=total,
                        used_mib=None,
                        holders=holders,
                        holders_complete=complete,
                        error=errors.get(index, "NVML: no reading"),
                        unreadable_pids=unreadable,
                    )
                )
                continue
            # A hidden /proc only makes the holder list incomplete: NVML's memory figure decides.
            readings.append(
                GpuReading(
                    index=index,
                    name=raw.name,
                    total_mib=raw.total_mib,
                    used_mib=raw.used_mib,
                    holders=holders,
                    holders_complete=complete,
                    error=None,
                    unreadable_pids=unreadable,
                )
            )
        return readings

    def _holders(self, index: int, scan: ScanResult, raw: _Raw | None) -> tuple[Holder, ...]:
        per_pid = dict(raw.per_pid_mib) if raw is not None else {}
        holders: list[Holder] = []
        for seen in scan.holders_of(index):
            holders.append(seen.to_holder(per_pid.pop(seen.pid, None)))
        own = {os.getpid(), *self._exclude}
        stale: list[int] = []
        for pid, mib in per_pid.items():
            if pid in own:
                continue
            # NVML names it but the scan did not see it with the device open: name it only when
            # it is alive (a dead PID would point the user at a process that no longer exists).
            info = procscan.process_info(pid, self._unit_of)
            if info is None:
                stale.append(pid)
                continue
            holders.append(info.to_holder(mib))
        # Logged when the set changes, not on every poll of the gate.
        if frozenset(stale) != self._stale.get(index, frozenset()):
            self._stale[index] = frozenset(stale)
            if stale:
                log.info(
                    "nvml_stale_pids gpu=%d pids=%s (listed by NVML, no such live process)", index, stale
                )
        holders.sort(key=lambda h: (h.used_mib is None, -(h.used_mib or 0.0), h.pid))
        return tuple(holders)


def _message(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:  # pynvml's __str__ itself calls NVML, which may be gone
        text = ""
    return text or type(e).__name__


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: Any) -> str | None:
    """NVML's integer CUDA driver version (13000) as people write it ("13.0")."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return f"{n // 1000}.{(n % 1000) // 10}"
