"""``gpushift --version``: one line each for gpushift, Python, every dependency and the NVIDIA driver,
read from installed metadata and /proc without importing a dependency (a bug report can ask for it
even on a host where PyGObject or NVML is broken)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from gpushift import __version__
from gpushift.cli import main
from gpushift.cli import version as version_mod

# The line the NVIDIA kernel module writes to /proc/driver/nvidia/version (its NVRM id, printed by
# kernel-open/nvidia/nv-procfs.c in https://github.com/NVIDIA/open-gpu-kernel-modules), for the
# proprietary and the open module.
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  (dvs-builder@U16-I3-A03-3-3)  Thu Feb 22 01:25:25 UTC 2024\n"


def test_version_lists_gpushift_python_dependencies_and_driver(tmp_path: Path, monkeypatch) -> None:
    driver = tmp_path / "version"
    driver.write_text(PROPRIETARY)
    monkeypatch.setattr(version_mod, "DRIVER_FILE", driver)
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"gpushift {__version__}"
    assert lines[1].startswith(f"Python {platform.python_version()} ")
    assert lines[-1] == "NVIDIA driver 535.104.05"
    names = {line.split()[0].lower(): line.split()[1] for line in lines[2:-1]}
    for dep in ("pydbus", "pygobject", "apscheduler", "nvidia-ml-py", "psutil", "click", "structlog"):
        assert dep in names, lines
    assert "jeepney" in names and "prometheus-client" in names, lines
    from importlib import metadata

    for line in lines[2:-1]:  # each as its installed metadata says (test-pythons' venvs lack some)
        dist, shown = line.split()[0], line.split(maxsplit=1)[1]
        try:
            assert shown == metadata.version(dist), line
        except metadata.PackageNotFoundError:
            assert shown == "NOT INSTALLED", line
    assert names["click"] == metadata.version("click")


def test_driver_line_of_either_module_and_its_absence(tmp_path: Path) -> None:
    f = tmp_path / "version"
    f.write_text(PROPRIETARY)
    assert version_mod.driver(f) == "535.104.05"
    f.write_text(OPEN)
    assert version_mod.driver(f) == "550.54.14"
    f.write_text("something else\n")
    assert version_mod.driver(f).startswith("unknown (")
    assert version_mod.driver(tmp_path / "absent") == f"not loaded ({tmp_path / 'absent'} absent)"


def test_version_imports_no_dependency() -> None:
    """In a fresh interpreter: after --version none of the heavy or system libraries was imported."""
    code = textwrap.dedent(
        """
        import sys
        from gpushift.cli import main
        try:
            main(["--version"])
        except SystemExit as e:
            assert e.code in (0, None), e.code
        heavy = ("gi", "pydbus", "pynvml", "apscheduler", "psutil", "structlog", "sqlite3", "_sqlite3",
                 "jeepney", "prometheus_client", "asyncpg")
        print("IMPORTED", sorted(m for m in heavy if m in sys.modules))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("gpushift ")
    assert "IMPORTED []" in r.stdout, r.stdout
