"""``gpushift --version``: gpushift, Python, every dependency and the NVIDIA driver, one line each.

Nothing here imports a dependency: versions come from the installed distributions' metadata
(``importlib.metadata``), so ``--version`` stays fast and answers even when a dependency is broken.
The driver's version is read from ``/proc/driver/nvidia/version`` (the kernel module's own line),
not through NVML, whose initialisation can take seconds on a busy host.
"""

from __future__ import annotations

import platform
import re
from importlib import metadata
from pathlib import Path

from gpushift import __version__

DRIVER_FILE = Path("/proc/driver/nvidia/version")

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." (or "Open Kernel Module")
_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def dependencies() -> list[str]:
    """gpushift's run-time requirements, in the order its metadata lists them (extras left out;
    a requirement for other Python versions left out when it is not installed)."""
    try:
        requires = metadata.requires("gpushift") or []
    except metadata.PackageNotFoundError:
        return []
    names = []
    for req in requires:
        req_name, _sep, marker = req.partition(";")
        if "extra" in marker:
            continue
        m = _NAME.match(req_name)
        if m and m.group(1) not in names:
            if marker.strip() and _installed(m.group(1)) is None:
                continue  # e.g. tomli on a Python that has tomllib
            names.append(m.group(1))
    return names


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def driver(path: Path | None = None) -> str:
    """The NVIDIA kernel driver's version, or why it is not known."""
    path = path or DRIVER_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"not loaded ({path} absent)"
    except OSError as e:
        return f"unknown ({path}: {e.strerror or e})"
    m = _DRIVER.search(text)
    return m.group(1) if m else f"unknown ({path} has no version line)"


def lines(driver_file: Path | None = None) -> list[str]:
    out = [
        f"gpushift {__version__}",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
    ]
    deps = dependencies()
    if not deps:
        out.append("dependencies: unknown (gpushift's installed metadata is missing)")
    for name in deps:
        out.append(f"{name} {_installed(name) or 'NOT INSTALLED'}")
    out.append(f"NVIDIA driver {driver(driver_file)}")
    return out
