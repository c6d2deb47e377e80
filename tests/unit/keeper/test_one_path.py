"""One path for every switch request: only the keeper's executor calls the switcher's ``request``.

A person's switch (``SwitchTo``), the schedule's, the backend watcher's (a relaunch) and recovery's
at daemon start are all decisions of :func:`gpushift.keeper.decide` that the executor
(``Keeper._start``) carries out.  The scan reads every module of the package (its syntax tree) for
a call of an attribute named ``request``; the second test follows each kind of request through a
switcher that records who called it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import gpushift
from gpushift.keeper import Keeper
from gpushift.keeper.decide import Ask
from gpushift.values import Caller, Trigger

PACKAGE = Path(gpushift.__file__).parent


def _calls_of_request() -> set[tuple[str, str, str]]:
    """(module path, enclosing function's qualified name, receiver) of every ``<x>.request(...)``."""
    found: set[tuple[str, str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

        def visit(node: ast.AST, scope: tuple[str, ...], path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                inner = scope
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = (*scope, child.name)
                if (
                    isinstance(child, ast.Call)
                    and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "request"
                ):
                    where = path.relative_to(PACKAGE.parent).as_posix()
                    found.add((where, ".".join(scope), ast.unparse(child.func.value)))
                visit(child, inner)

        visit(tree, ())
    return found


#: ``.request(`` calls that are not a switcher's: http.client connections and the front door's aiohttp
#: client session, by the names they have.
HTTP_CONNECTIONS = {"conn", "connection", "http", "session"}


def test_only_the_keepers_executor_calls_the_switchers_request() -> None:
    calls = _calls_of_request()
    switchers = {c for c in calls if c[2].rsplit(".", 1)[-1] not in HTTP_CONNECTIONS}
    assert switchers == {("gpushift/keeper/keeper.py", "Keeper._start", "self.switcher")}
    # every other one is an HTTP client (the warm-up's exchange, the webhook's POST, the front door's forward)
    others = calls - switchers
    where = ("gpushift/backends/", "gpushift/notify/", "gpushift/frontdoor/")
    assert others and all(p.startswith(where) for p, _f, _r in others), others


class RecordingSwitcher:
    """A switcher that notes which function of gpushift asked it for each switch."""

    def __init__(self) -> None:
        self.callers: list[tuple[str, Trigger]] = []

    def add_listener(self, listener: Any) -> None:
        pass

    def snapshot(self) -> tuple[bool, str | None]:
        return False, "day"

    def unit_states(self) -> dict[str, Any]:
        return {}

    def take_finished(self) -> list[Any]:
        return []

    def adopt(self, backend: str, force: bool = False) -> None:
        pass

    def request(self, target: str, reason: str, caller: Caller, trigger: Trigger = Trigger.MANUAL,
                *args: Any, **kw: Any) -> str:  # fmt: skip
        frame = inspect.stack()[1]
        self.callers.append((f"{Path(frame.filename).name}:{frame.function}", trigger))
        return f"t{len(self.callers)}"


class Store:
    def load(self) -> None:
        return None

    def save(self, override: Any) -> None:
        pass


def test_every_kind_of_request_reaches_the_switcher_through_the_executor() -> None:
    from datetime import datetime, timezone

    from gpushift.schedule import parse_schedule

    sched = parse_schedule(
        "TZ=UTC\n0 8 * * * day\n0 20 * * * night\n", "t.schedule", backends={"day", "night"}
    )
    sw = RecordingSwitcher()
    now = datetime(2026, 3, 2, 21, tzinfo=timezone.utc)  # the schedule wants night; day "runs"
    k = Keeper(sw, sched, Store(), now=lambda: now, monotonic=lambda: 100.0)  # type: ignore[arg-type]
    assert k.ask(Ask("night", "by hand", Caller(1000, "alice")))[0] == "t1"  # a person's
    k.recover("day", "recovery after the daemon's restart", 1)  # recovery's
    k.override = None
    k.attempts = None
    sw.snapshot = lambda: (False, "day")  # type: ignore[method-assign]
    sw.unit_states = lambda: {"day": _running("day")}  # type: ignore[method-assign]
    k.tick(Trigger.SCHEDULE)  # the schedule's
    assert sw.callers == [
        ("keeper.py:_start", Trigger.MANUAL),
        ("keeper.py:_start", Trigger.RECOVERY),
        ("keeper.py:_start", Trigger.SCHEDULE),
    ]


def _running(unit: str) -> Any:
    from gpushift.values import UnitState

    return UnitState(name=unit, load_state="loaded", active_state="active", sub_state="running")
