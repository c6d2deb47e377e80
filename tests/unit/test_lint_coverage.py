"""The checks that keep the layout honest cover every module, also one added later: each module is
in a feature's layer, is either a pure rule (the "no system library" contract, checked strictly by
mypy) or an effect (``[tool.gpushift.layout] effects``), never both, and the top of the package
holds only the shared vocabulary (docs/design.md "Layers")."""

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
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]


def modules() -> list[str]:
    out = []
    for f in sorted((ROOT / "gpushift").rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def layers() -> list[list[str]]:
    (c,) = [c for c in CONTRACTS if c["type"] == "layers"]
    return [[m.strip() for m in line.split("|")] for line in c["layers"]]


def pure() -> set[str]:
    (c,) = [c for c in CONTRACTS if c["name"].startswith("The pure rules")]
    assert c.get("as_packages") is False, "the pure list names modules, not packages with all below them"
    return set(c["source_modules"])


def effects() -> set[str]:
    return set(PYPROJECT["tool"]["gpushift"]["layout"]["effects"])


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


def test_every_module_is_a_pure_rule_or_an_effect_never_both() -> None:
    p, e = pure(), effects()
    assert not p & e, f"modules both pure and an effect (pyproject.toml): {sorted(p & e)}"
    unsorted = [m for m in modules() if m not in p | e]
    assert not unsorted, (
        f"modules neither in the pure contract nor in [tool.gpushift.layout] effects: {unsorted}"
    )
    gone = sorted((p | e) - set(modules()))
    assert not gone, f"pyproject.toml names modules that do not exist: {gone}"


def test_every_pure_module_is_type_checked_strictly() -> None:
    patterns = strict_patterns()
    loose = [m for m in sorted(pure()) if not strict(m, patterns)]
    assert not loose, f"pure modules missing from mypy's strict list (pyproject.toml): {loose}"


def test_the_top_of_the_package_holds_only_the_shared_vocabulary() -> None:
    top = sorted(p.name for p in (ROOT / "gpushift").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 3, f"top-level modules besides __init__.py: {top}"
    assert not (ROOT / "gpushift" / "adapters").exists()
