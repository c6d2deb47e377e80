"""The Debian packages the package tests install: ``make deb`` for real, once per test run.

Built with ``make deb`` from the checkout (the wheel from a copy of only its sources, as ``make
build`` always does), pip offline from the wheelhouse the install tests share (``wheelhouse.py``),
into a temporary ``BUILDDIR``; the checkout is not written to.  :func:`build` keeps each version's
package for the rest of the test run, so the life-cycle and the Ansible tests build each once.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from wheelhouse import gather, offline

REPO = Path(__file__).resolve().parents[2]
INSTALL_PYTHON = "/usr/bin/python3"
_BUILT: dict[str, Path] = {}
_BUILDDIR: list[Path] = []


def debian_version(revision: int = 1) -> str:
    """The version ``make deb`` gives by default (revision 1), or with another Debian revision."""
    from gpushift import __version__

    return re.sub(r"\.?(a|b|rc|dev)(\d*)", r"~\1\2", __version__) + f"-{revision}"


def arch() -> str:
    r = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def builddir() -> Path:
    if not _BUILDDIR:
        _BUILDDIR.append(Path(tempfile.mkdtemp(prefix="gpushift-deb-")))
        atexit.register(shutil.rmtree, _BUILDDIR[0], True)
    return _BUILDDIR[0]


def make_deb(*extra: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    """``make deb`` into this run's BUILDDIR, offline from the wheelhouse, with ``extra`` variables."""
    for tool in ("dpkg-deb", "dpkg-shlibdeps", "make"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing (Debian: apt-get install dpkg-dev make)", pytrace=False)
    house = gather(INSTALL_PYTHON)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "DESTDIR", "PREFIX")}
    argv = [
        "make",
        "--no-print-directory",
        "-C",
        str(REPO),
        "deb",
        f"BUILDDIR={builddir()}",
        f"INSTALL_PYTHON={INSTALL_PYTHON}",
        f"PIP_ARGS={' '.join(offline(house))}",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)


def build(version: str | None = None) -> Path:
    """The .deb of ``version`` (``DEB_VERSION=``; None: make deb's default), built once per run."""
    key = version or ""
    if key not in _BUILT:
        r = make_deb(*([f"DEB_VERSION={version}"] if version else []))
        if r.returncode != 0:
            pytest.fail(f"make deb {key} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False)
        want = builddir() / f"gpushift_{version or debian_version()}_{arch()}.deb"
        if not want.is_file():
            pytest.fail(f"make deb did not write {want}:\n{r.stdout}", pytrace=False)
        keep = builddir() / "debs"
        keep.mkdir(exist_ok=True)
        _BUILT[key] = Path(shutil.copy2(want, keep / want.name))
    return _BUILT[key]


def tree_copy(dest: Path) -> Path:
    """A copy of what packaging/deb.sh reads of the tree (units/, etc/, packaging/, LICENSE), to edit."""
    src = dest / "src"
    for part in ("units", "etc", "packaging", "LICENSE"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, src / part)
    return src


def deb_sh(src: Path, version: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``src/packaging/deb.sh`` (a :func:`tree_copy`) on this run's build (wheel, man page,
    completions of :func:`build`), writing ``out/gpushift_VERSION_ARCH.deb``."""
    build()  # the build directory's wheel, man page and completions
    env = {
        **os.environ,
        "BUILDDIR": str(builddir()),
        "DEB_OUTDIR": str(out),
        "DEB_VERSION": version,
        "DEB_MAINTAINER": "gpushift tests <tests@gpushift.invalid>",
        "PYTHON": INSTALL_PYTHON,
        "BUILD_PYTHON": str(REPO / ".venv/bin/python"),
        "PIP_ARGS": " ".join(offline(gather(INSTALL_PYTHON))),
    }
    return subprocess.run(
        ["bash", str(src / "packaging/deb.sh")], capture_output=True, text=True, timeout=900, env=env
    )


def tree_places() -> dict[str, str]:
    """Where each file of the tree's units/ and etc/ belongs in the package, by the rule
    docs/install.md states ("The Debian package"), restated here so the test checks deb.sh's."""
    own = re.compile(r"^Exec[A-Za-z]*=[-@:+!]*/opt/gpushift/bin/gpushift( |$)", re.M)
    places = {}
    for f in sorted(p for p in (REPO / "units").iterdir() if p.is_file()):
        backend = f.suffix == ".service" and not own.search(f.read_text())
        places[f"units/{f.name}"] = (
            f"/usr/share/doc/gpushift/examples/{f.name}" if backend else f"/usr/lib/systemd/system/{f.name}"
        )
    for sub, dest in (
        ("gpushift", "/etc/gpushift"),
        ("dbus-1/system.d", "/usr/share/dbus-1/system.d"),
        ("sysusers.d", "/usr/lib/sysusers.d"),
        ("tmpfiles.d", "/usr/lib/tmpfiles.d"),
    ):
        for f in sorted((REPO / "etc" / sub).iterdir()):
            places[f"etc/{sub}/{f.name}"] = f"{dest}/{f.name}"
    return places


def own_units() -> tuple[list[str], list[str]]:
    """gpushift's own units (those the package puts in the vendor directory), sorted as the
    maintainer scripts list them: the services, and all of them."""
    units = sorted(Path(p).name for p in tree_places().values() if p.startswith("/usr/lib/systemd/system/"))
    return [u for u in units if u.endswith(".service")], units
