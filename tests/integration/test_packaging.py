"""What `pip install .` ships, and that it runs on its own.

The wheel holds the product only: no test or demo machinery (the sandbox, the stand-in backend,
the demo driver live in tests/support/), and every module in it is reached from the product's
entry points.  Installed into a fresh virtualenv outside the checkout, gpushift answers --help,
checks a config, and runs as the shipped gpushift.service under a real systemd user manager.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port
from wheelhouse import gather, offline

REPO = Path(__file__).resolve().parents[2]
# Test and demo machinery that must stay out of the product.
NOT_PRODUCT = {"sandbox", "standin", "demo"}
# Left out of the copy the wheel is built from: what .gitignore keeps out of a clone.
BUILD_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".demo",
    ".whl",
    ".gl",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
)


def run(argv: list[str], timeout_s: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kw)


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """Wheels of everything gpushift needs to build and run, for this Python (see wheelhouse.py)."""
    return gather()


@pytest.fixture(scope="module")
def wheel(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of a copy of the checkout (setuptools builds in the source tree and
    keeps stale files in build/, so the checkout itself is neither used nor touched)."""
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"
    shutil.copytree(REPO, src, ignore=BUILD_IGNORE, symlinks=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *offline(wheelhouse), "-w", str(out)]
    r = run([*argv, str(src)])
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    (whl,) = out.glob("gpushift-*.whl")
    return whl


# ------------------------------------------------------------------ which modules the product reaches


@dataclass(frozen=True)
class Module:
    name: str
    is_package: bool
    tree: ast.Module


def wheel_modules(whl: Path) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    with zipfile.ZipFile(whl) as z:
        for path in z.namelist():
            if not path.endswith(".py"):
                continue
            parts = path[: -len(".py")].split("/")
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            mods[name] = Module(name, is_package, ast.parse(z.read(path), filename=path))
    return mods


def references(mod: Module, known: set[str]) -> set[str]:
    """The wheel's modules ``mod`` imports (anywhere: lazy imports inside functions count) or names in
    a string (``_LAZY``'s sub-command modules, ``python -m gpushift.host.simgpu``)."""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import cli` is a module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found & known


def with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a/__init__ and a/b/__init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def entry_point_modules(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as z:
        (ep,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        lines = z.read(ep).decode().splitlines()
    return {line.split("=", 1)[1].strip().split(":")[0] for line in lines if "=" in line}


def lazy_subcommand_modules(mods: dict[str, Module]) -> set[str]:
    """The modules of ``gpushift.cli._LAZY`` (loaded by name when their sub-command runs)."""
    for node in mods["gpushift.cli"].tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_LAZY" for t in node.targets):
            return {spec[0] for spec in ast.literal_eval(node.value).values()}
    raise AssertionError("gpushift/cli/__init__.py has no _LAZY table")


def reached(roots: set[str], mods: dict[str, Module]) -> set[str]:
    known = set(mods)
    seen: set[str] = set()
    todo = [p for r in roots for p in with_parents(r)]
    while todo:
        name = todo.pop()
        if name in seen or name not in known:
            continue
        seen.add(name)
        todo += [p for ref in references(mods[name], known) for p in with_parents(ref)]
    return seen


def test_wheel_holds_the_product_and_no_test_or_demo_machinery(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"gpushift", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, top
    assert "gpushift/bus/org.gpushift.Switcher1.xml" in names  # the D-Bus interface the daemon exports

    mods = wheel_modules(wheel)
    machinery = sorted(m for m in mods if m.rpartition(".")[2] in NOT_PRODUCT)
    assert not machinery, f"test/demo machinery in the wheel: {machinery} (it belongs in tests/support/)"

    lazy = lazy_subcommand_modules(mods)
    entry = entry_point_modules(wheel)
    assert entry == {"gpushift.cli"}, entry
    assert lazy and lazy <= set(mods), f"_LAZY names modules the wheel lacks: {lazy - set(mods)}"
    roots = entry | {"gpushift.daemon"} | lazy  # gpushift daemon: what units/gpushift.service runs
    product = reached(roots, mods)
    assert "gpushift.host.simgpu" in product  # the simulated GPU provider is a product feature
    orphans = sorted(set(mods) - product)
    assert not orphans, (
        f"modules in the wheel that no entry point reaches (only tests or the demo use them?): {orphans}"
    )


def test_wheel_carries_an_spdx_license_and_its_file(wheel: Path) -> None:
    """PEP 639's form (``license = "MIT"``, ``license-files``): the table form ``{ text = ... }`` draws
    setuptools' deprecation warning and stops working after 2027-02-18."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
        licenses = [n for n in z.namelist() if "/licenses/" in n]
    assert "License-Expression: MIT" in text.splitlines(), text[:800]
    assert "License-File: LICENSE" in text.splitlines(), text[:800]
    assert any(n.endswith("/licenses/LICENSE") for n in licenses), licenses


def test_reachability_sees_lazy_imports_and_module_names_in_strings() -> None:
    """The analysis itself: a module imported inside a function, one named in a string, a relative
    `from . import x`, and one nobody names."""
    src = {
        "p": "",
        "p.main": "from . import a\ndef f():\n    from .sub import b\nLAZY = ['p.c']\n",
        "p.a": "",
        "p.sub": "",
        "p.sub.b": "import p.sub.d\n",
        "p.sub.d": "",
        "p.c": "",
        "p.orphan": "import p.a\n",
    }
    mods = {n: Module(n, n in ("p", "p.sub"), ast.parse(s)) for n, s in src.items()}
    assert reached({"p.main"}, mods) == set(src) - {"p.orphan"}


# ------------------------------------------------------------------ installed, without the checkout


@dataclass(frozen=True)
class Installed:
    venv: Path
    gpushift: Path
    python: Path


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment minus anything that could lead Python back to the checkout."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def installed(wheel: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel installed into a fresh virtualenv (no pip in it), offline from the wheelhouse."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    r = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert r.returncode == 0, r.stderr
    r = run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            *offline(wheelhouse),
            str(wheel),
        ],
        env=clean_env(),
    )
    assert r.returncode == 0, f"installing the wheel into a fresh venv failed:\n{r.stdout}\n{r.stderr}"
    return Installed(venv, venv / "bin" / "gpushift", venv / "bin" / "python")


def under_checkout(path: str | Path) -> bool:
    p = Path(path).resolve()
    return p == REPO or REPO in p.parents


def test_installed_gpushift_imports_nothing_from_the_checkout(installed: Installed, tmp_path: Path) -> None:
    probe = (
        "import importlib.util, json, sys, gpushift, gpushift.cli, gpushift.daemon\n"
        "spec = importlib.util.find_spec('tests')\n"
        "print(json.dumps({'path': sys.path, 'file': gpushift.__file__,"
        " 'tests': spec.origin if spec else None}))\n"
    )
    r = run([str(installed.python), "-c", probe], cwd=tmp_path, env=clean_env())
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert not under_checkout(tmp_path)
    assert Path(seen["file"]).is_relative_to(installed.venv), seen["file"]
    inside = [p for p in seen["path"] if under_checkout(p or tmp_path)]
    assert not inside, f"the installed gpushift's sys.path reaches into the checkout: {inside}"
    assert seen["tests"] is None or not under_checkout(seen["tests"]), seen["tests"]


def test_installed_gpushift_checks_and_runs_as_the_shipped_unit(
    installed: Installed, wheel: Path, sandbox, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = run([str(installed.gpushift), "--help"], cwd=outside, env=clean_env())
    assert r.returncode == 0, r.stderr
    for command in ("status", "switch", "daemon", "ledger", "schedule", "check"):  # lazy ones too
        assert f"  {command} " in r.stdout, r.stdout

    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [Backend("a", free_port(), [0])])
    env.gpushift = str(installed.gpushift)
    env.install()
    # the daemon runs away from the checkout, with nothing on PYTHONPATH
    sandbox.install_dropin(
        "gpushift.service",
        "60-installed.conf",
        f"[Service]\nWorkingDirectory={outside}\nUnsetEnvironment=PYTHONPATH PYTHONHOME\n",
    )
    sandbox.daemon_reload()
    cli_env = clean_env({**sandbox.exports, "GPUSHIFT_CONFIG": str(env.config_path)})

    def gpushift(*args: str) -> subprocess.CompletedProcess[str]:
        return run([str(installed.gpushift), *args], 120, cwd=outside, env=cli_env)

    check = gpushift("check", "--json")
    report = json.loads(check.stdout)
    assert check.returncode == 0 and report["ok"] is True, check.stdout + check.stderr
    assert report["units"]["a"]["exec_start"][0] == sys.executable  # the stand-in, found in systemd

    env.start_daemon()
    r = gpushift("status", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    status = json.loads(r.stdout)
    pid = env.main_pid("gpushift.service")
    assert status["daemon"]["running"] is True and status["daemon"]["pid"] == pid, status
    assert status["daemon"]["version"] == wheel.name.split("-")[1]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    # <venv>/bin/python <venv>/bin/gpushift daemon
    assert [c.decode() for c in cmdline[:3]] == [str(installed.python), str(installed.gpushift), "daemon"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [e for e in environ if e.startswith((b"PYTHONPATH=", b"PYTHONHOME="))]
    assert not under_checkout(os.readlink(f"/proc/{pid}/cwd"))
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    # the path column, "(deleted)" taken off (libffi maps a memfd for its closures)
    mapped = {line.split(None, 5)[5].removesuffix(" (deleted)") for line in maps if "/" in line}
    from_checkout = sorted(m for m in mapped if under_checkout(m))
    assert not from_checkout, f"the daemon loaded files from the checkout: {from_checkout}"
    assert [m for m in mapped if m.startswith(str(installed.venv))], "no library of the fresh venv loaded?"
