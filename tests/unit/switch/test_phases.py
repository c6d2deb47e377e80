"""The transition table (gpushift/switch/phases.py) walked on the stateful fakes.

Every phase change of a run goes through :meth:`SwitchRun.advance`; the recorder below wraps it and
keeps each transition taken.  The scenarios — a switch with every hook and a warm-up, one without,
refusals, cancels at each point, failed stops and starts, a gate that never opens, rollbacks, a
target found running, and a bug injected in every phase — together take every transition the table
allows, and nothing else; a transition the table forbids raises (or, in the daemon's switcher, is
logged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpushift.config.schema import parse
from gpushift.errors import GpushiftError
from gpushift.switch import Switcher, SwitchRun
from gpushift.switch.phases import TRANSITIONS, TransitionError, allowed, edges
from gpushift.values import OFF, Caller, Outcome, Phase, Trigger, WarmupResult

P = Phase
CAROL = Caller(uid=1001, user="carol")
HOOKS = """
[hooks]
user = "gpuhook"
before_stop = ["/hooks/before"]
after_ready = ["/hooks/ready"]
on_failure = ["/hooks/failed"]
"""
WARMUP = 'warmup = { path = "/v1/completions", body = { prompt = "hi" } }\n'  # the world's [backends.night] is its last table

Edge = tuple[Phase, Phase]


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[Edge]]:
    """Every transition any run takes while the test runs."""
    seen: set[Edge] = set()
    real = SwitchRun.advance

    def advance(self: SwitchRun, phase: Phase, detail: str, force: bool = False) -> bool:
        was = self.phase
        moved = real(self, phase, detail, force)
        if moved:
            seen.add((was, phase))
        return moved

    monkeypatch.setattr(SwitchRun, "advance", advance)
    yield seen


def setup(make_world: Callable[..., Any], fakes: Any, hooks: bool = False, warmup: bool = False,
          running: tuple[str, ...] = ("day",), **settings: Any) -> Any:  # fmt: skip
    w = make_world(**settings)
    if hooks or warmup:
        cfg = parse(w.toml + (WARMUP if warmup else "") + (HOOKS if hooks else ""), "/etc/gpushift/t.toml")
        w.config = cfg
        w.switcher.reconfigure(cfg)
    if hooks:
        w.hooks = fakes.FakeHookRunner(w.log, w.clock)
        w.ports.hooks = w.hooks
    for b in running:
        w.units.set_running(w.unit(b))
    w.log.entries.clear()
    return w


def cancel_in(w: Any, phase: Phase, detail: str = "") -> None:
    """A person cancels as the switch reports ``phase`` (with ``detail`` in its line)."""
    done: list[str] = []

    def listen(e: Any) -> None:
        if e.kind == "progress" and e.phase == phase and detail in e.detail and not done:
            done.append(w.switcher.cancel(CAROL))

    w.switcher.listeners.append(listen)


def breaks_after_one(calls: list[int]) -> Callable[..., int | None]:
    """A drain probe that answers once (requests in flight), then fails (an adapter's error)."""

    def in_flight(backend: Any, expect_cgroup: str | None = None) -> int | None:
        calls.append(1)
        if len(calls) > 1:
            raise GpushiftError("the probe broke")
        return 2

    return in_flight


def scenarios(mk: Callable[..., Any], fakes: Any) -> None:
    """Every way through a switch the table knows (each asserts how it ended)."""
    for hooks in (False, True):
        assert setup(mk, fakes, hooks=hooks, warmup=hooks).switch("night").ok  # the whole way
        assert setup(mk, fakes, hooks=hooks, running=()).switch("night").ok  # nothing to stop
        assert setup(mk, fakes, hooks=hooks).switch("day").already  # nothing to do
        w = setup(mk, fakes, hooks=hooks)
        w.units.behave(w.unit("night"), load_state="not-found")
        assert w.switch("night").outcome is Outcome.REFUSED
        for phase in (P.INTENT, P.DRAIN):  # cancelled before anything was stopped
            w = setup(mk, fakes, hooks=hooks)
            w.probe.set_in_flight("day", 2, step=0)
            cancel_in(w, phase)
            assert w.switch("night").outcome is Outcome.CANCELLED
        w = setup(mk, fakes, hooks=hooks)  # the drain's probe fails (an adapter's error: nothing stopped)
        w.probe.in_flight = breaks_after_one([])
        assert w.switch("night").failed_phase is P.DRAIN
        w = setup(mk, fakes, hooks=hooks)
        w.units.behave(w.unit("day"), stop_job_result="failed")
        assert w.switch("night").failed_phase is P.STOP
        w = setup(mk, fakes, hooks=hooks)  # night never answers: rolled back
        w.probe.set_health(w.url("night"), ok_after=None, before=503)
        assert w.switch("night").outcome is Outcome.ROLLED_BACK
        for policy in ("rollback", "stay"):
            w = setup(mk, fakes, hooks=hooks, on_failure=policy)  # the gate never opens
            w.gpu.orphan_on_stop(w.unit("day"), gpu=1, pid=5151, mib=9318, command="python", user="svc")
            assert w.switch("night").failed_phase is P.RELEASE
            w = setup(mk, fakes, hooks=hooks, on_failure=policy)  # the start job fails
            w.units.behave(w.unit("night"), start_job_result="failed")
            assert w.switch("night").failed_phase is P.START
        w = setup(mk, fakes, hooks=hooks, running=("night",))  # recovery: the target runs alone
        t = w.switcher.request("night", "t", CAROL, Trigger.RECOVERY, verify_running=True)
        assert w.wait(t).ok
    w = setup(mk, fakes, running=("day", "night"))  # the target runs beside the other
    assert w.switch("night").ok
    w = setup(mk, fakes)  # a cancel after the version probe, no after_ready hook
    cancel_in(w, P.VERSION)
    assert w.switch("night").outcome is Outcome.ROLLED_BACK
    w = setup(mk, fakes, hooks=True)  # a cancel during after_ready
    cancel_in(w, P.HOOKS, "after_ready")
    assert w.switch("night").outcome is Outcome.ROLLED_BACK
    w = setup(mk, fakes, warmup=True)  # the warm-up request fails
    w.probe.warmup = lambda req, expect_cgroup=None: WarmupResult(False, 500, "boom", 0.0, 0.0, 0)
    assert w.switch("night").failed_phase is P.WARMUP


def test_every_transition_the_table_allows_is_taken_and_no_other(
    make_world: Callable[..., Any], fakes: Any, taken: set[Edge], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenarios(make_world, fakes)
    # A bug in any phase ends the switch there (an internal error, the row closed as failed).
    real = SwitchRun.advance  # the recorder
    for phase in [p for p in Phase if p is not P.DONE]:
        state = {"hit": False}

        def advance(
            self: SwitchRun,
            to: Phase,
            detail: str,
            force: bool = False,
            at: Phase = phase,
            state: Any = state,
        ) -> bool:
            if self.phase is at and to not in (at, P.DONE) and not state["hit"]:
                state["hit"] = True
                raise RuntimeError(f"a bug in phase {at}")
            return real(self, to, detail, force)

        monkeypatch.setattr(SwitchRun, "advance", advance)
        if phase is P.ROLLBACK:
            w = setup(make_world, fakes)
            w.probe.set_health(w.url("night"), ok_after=None, before=503)
        else:
            w = setup(make_world, fakes, hooks=True, warmup=True)
        res = w.switch("night")
        assert state["hit"] and res.internal_error and res.failed_phase is phase, (phase, res)
        monkeypatch.setattr(SwitchRun, "advance", real)
    missing = edges() - taken
    assert not missing, f"allowed but never taken: {sorted((a.value, b.value) for a, b in missing)}"
    assert taken <= edges()


def test_a_transition_the_table_forbids_raises() -> None:
    run = SwitchRun("t1", "night", Trigger.MANUAL, "carol", "", started_at=None, started_mono=0.0)  # type: ignore[arg-type]
    with pytest.raises(TransitionError, match="preflight -> start"):
        run.advance(P.START, "starting")
    assert run.phase is P.PREFLIGHT, "a refused transition changes nothing"
    assert run.advance(P.PREFLIGHT, "again") is False  # the same phase: a new detail, no transition
    for was in Phase:
        for to in Phase:
            assert allowed(was, to) == (was is to or to in TRANSITIONS[was])
    run.advance(P.DONE, "ended")
    for to in Phase:
        if to is not P.DONE:
            with pytest.raises(TransitionError):
                run.advance(to, "after the end")


def test_the_daemons_switcher_logs_a_forbidden_transition_and_goes_on(world: Any) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def __getattr__(self, level: str) -> Callable[..., None]:
            return lambda event, **kw: logged.append((event, kw))

    sw = Switcher(world.config, world.ports, log=Log(), strict_transitions=False)
    run = SwitchRun("t2", OFF, Trigger.MANUAL, "carol", "", started_at=None, started_mono=0.0)  # type: ignore[arg-type]
    sw._report(run, P.START, "a bug's jump")
    assert run.phase is P.START
    (bad,) = [kw for event, kw in logged if event == "switch_transition_invalid"]
    assert (bad["was"], bad["to"]) == ("preflight", "start")
    strict = Switcher(world.config, world.ports)
    with pytest.raises(TransitionError):
        strict._report(
            SwitchRun("t3", OFF, Trigger.MANUAL, "c", "", started_at=None, started_mono=0.0), P.START, ""
        )  # type: ignore[arg-type]


def test_every_transition_is_an_event_to_the_listeners(world: Any) -> None:
    res = world.switch("night")
    moves = [(e.was, e.phase) for e in world.events_of(res.ticket) if e.was is not None]
    assert moves[0] == (P.PREFLIGHT, P.INTENT) and moves[-1][1] is P.DONE
    assert all(allowed(a, b) for a, b in moves)
    phases = [P.PREFLIGHT] + [b for _a, b in moves]
    assert [p.value for p in phases[:-1]] == world.phases(res.ticket), "one event per new phase"
