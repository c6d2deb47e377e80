"""The checks that keep the layers honest cover every module of the pure core, also one split out
of a package later: mypy's strict list and the import-linter contracts are keyed so that a new
module cannot silently lose them."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def modules() -> list[str]:
    out = []
    for f in sorted((ROOT / "gpushift").rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def layers() -> list[list[str]]:
    (c,) = [c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in line.split("|")] for line in c["layers"]]


def pure_core_layers() -> set[str]:
    """The top-level names below the adapters' layer (L0–L3)."""
    lines = layers()
    below = next(i for i, line in enumerate(lines) if "gpushift.adapters" in line) + 1
    return {m for line in lines[below:] for m in line}


def strict_patterns() -> list[str]:
    return [m for o in PYPROJECT["tool"]["mypy"]["overrides"] if o.get("strict") for m in o["module"]]


def strict(module: str, patterns: list[str]) -> bool:
    """mypy's pattern rule: ``a.b.*`` matches ``a.b`` itself and every module below it."""
    return any(fnmatch.fnmatchcase(module, p) or (p.endswith(".*") and module == p[:-2]) for p in patterns)


def covered(module: str, names: set[str]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def test_every_module_of_the_package_is_in_a_layer() -> None:
    named = {m for line in layers() for m in line}
    missing = [m for m in modules() if m != "gpushift" and not covered(m, named)]
    assert not missing, f"modules in no import-linter layer (pyproject.toml): {missing}"


def test_every_pure_core_module_is_type_checked_strictly() -> None:
    core = pure_core_layers()
    patterns = strict_patterns()
    loose = [m for m in modules() if covered(m, core) and not strict(m, patterns)]
    assert not loose, f"pure-core modules missing from mypy's strict list (pyproject.toml): {loose}"


def test_every_pure_core_module_is_under_the_no_system_library_contract() -> None:
    (c,) = [
        c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["name"].startswith("The pure core")
    ]
    sources = set(c["source_modules"])
    missing = [m for m in modules() if covered(m, pure_core_layers()) and not covered(m, sources)]
    assert not missing, f"pure-core modules outside the 'no system library' contract: {missing}"
