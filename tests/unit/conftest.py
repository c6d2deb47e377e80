"""Fixtures of the unit layer: a :class:`fakes.World` per test.

The unit tests also run under bare Python 3.10/3.12 venvs that have only pytest and hypothesis (and
tomli on 3.10), without gpushift installed: the repository root is put on ``sys.path`` then.
``fakes.py`` is loaded under a name of its own so that another test directory's helper module of the
same base name can never shadow it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("gpushift") is None:
    sys.path.insert(0, str(REPO_ROOT))


def _load_fakes() -> ModuleType:
    name = "gpushift_unit_fakes"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tests" / "support" / "fakes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()


@pytest.fixture
def make_world() -> Iterator[Callable[..., Any]]:
    """``make_world(drain_reads=2, on_failure="stay", ...)`` → a fresh World (see fakes.World)."""
    worlds: list[Any] = []

    def make(**kw: Any) -> Any:
        w = fakes.World(**kw)
        worlds.append(w)
        return w

    yield make
    # A test that failed mid-switch must not leave a worker thread blocked on a held stop.
    for w in worlds:
        for u in w.units.units.values():
            if u.hold_stop is not None:
                u.hold_stop.set()
        w.switcher.wait(10)


@pytest.fixture
def world(make_world: Callable[..., Any]) -> Any:
    """The default World: "day" (GPUs 0+1) serving, "night" (GPU 1) stopped, VRAM drains at once."""
    w = make_world()
    w.boot("day")
    return w


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(name="fakes")
def fakes_module() -> ModuleType:
    """The fakes module itself (for a fake a test plugs in, e.g. ``fakes.FakeHookRunner``)."""
    return fakes
