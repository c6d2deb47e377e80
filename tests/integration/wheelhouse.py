"""The wheels gpushift needs to build and run, gathered once and reused offline by the tests that
install it (test_packaging.py: a wheel into a fresh venv; test_install.py: ``make install``).

They live under ``/var/cache/gpushift/wheelhouse`` (``GPUSHIFT_WHEELHOUSE_DIR``), one directory per
(Python version, machine, requirements); PyGObject and pycairo compile for a minute the first time
(pip's own wheel cache makes even that fast), later runs install offline from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Built dependency wheels, reused between runs (PyGObject and pycairo compile for a minute).
WHEELHOUSE_ROOT = Path(os.environ.get("GPUSHIFT_WHEELHOUSE_DIR", "/var/cache/gpushift/wheelhouse"))


def requirements() -> list[str]:
    """What building (``[build-system] requires``, plus ``wheel`` for setuptools before 70.1) and
    running (``[project] dependencies``) gpushift needs, from pyproject.toml."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return sorted({*meta["build-system"]["requires"], "wheel", *meta["project"]["dependencies"]})


def python_version(python: str) -> list[int]:
    if python == sys.executable:
        return list(sys.version_info[:2])
    r = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        pytest.fail(f"{python} does not run: {r.stderr}", pytrace=False)
    return [int(x) for x in r.stdout.split()]


def gather(python: str = sys.executable) -> Path:
    """Wheels of everything gpushift needs, for ``python`` and this machine: built once (from pip's
    cache or the network), then reused offline until pyproject.toml's requirements change."""
    reqs = requirements()
    key = hashlib.sha256(json.dumps([python_version(python), platform.machine(), reqs]).encode()).hexdigest()[
        :16
    ]
    house = WHEELHOUSE_ROOT / key
    if (house / ".complete").exists():
        return house
    WHEELHOUSE_ROOT.mkdir(parents=True, exist_ok=True)
    building = WHEELHOUSE_ROOT / f".building-{key}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    target = [] if python == sys.executable else ["--python", python]
    r = subprocess.run(
        [sys.executable, "-m", "pip", *target, "wheel", "-q", "-w", str(building), *reqs],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if r.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.fail(
            f"could not gather the wheels gpushift needs into {WHEELHOUSE_ROOT} (pip's cache or the "
            f"network is needed once):\n{r.stderr[-3000:]}",
            pytrace=False,
        )
    (building / ".complete").touch()
    try:
        building.rename(house)
    except OSError:  # another run finished first: use its wheelhouse
        shutil.rmtree(building, ignore_errors=True)
    return house


def offline(house: Path) -> list[str]:
    """pip's arguments that install from ``house`` only."""
    return ["--no-index", "--find-links", str(house)]
