"""The watchdog's rules (gpushift/daemon/watchdog.py) on a faked clock: WATCHDOG=1 goes out while the
loop shows progress — its own turn, or a call the bus service handled — and the switch worker is
well; it is withheld (and said so, once a minute) when the loop has been silent for more than one
interval, and resumes when it turns again."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpushift.daemon.watchdog import LOG_EVERY_S, Watchdog, worker_silence


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    info = error


def make(progress: Any = lambda: 0.0, problem: Any = lambda: None) -> tuple[Watchdog, Clock, list[int], Log]:
    clock, pings, log = Clock(), [], Log()
    wd = Watchdog(lambda: pings.append(1), 15.0, progress=progress, problem=problem, log=log, clock=clock)
    return wd, clock, pings, log


def test_pings_while_the_loop_turns():
    wd, clock, pings, _ = make()
    for _ in range(10):
        clock.t += 7.5  # the thread's period: half an interval
        wd.loop_turn()
        assert wd.tick()
    assert len(pings) == 10


def test_a_loop_silent_for_more_than_an_interval_gets_no_ping_and_it_is_said_once():
    wd, clock, pings, log = make()
    wd.loop_turn()
    clock.t += 15.0
    assert wd.tick()  # exactly one interval: still alive
    clock.t += 0.5
    assert not wd.tick()
    clock.t += 7.5
    assert not wd.tick()
    assert len(pings) == 1
    assert [e for e, _ in log.lines] == ["watchdog_withheld"]
    assert "main loop silent for 15.5s" in log.lines[0][1]["detail"]
    clock.t += LOG_EVERY_S
    assert not wd.tick()
    assert [e for e, _ in log.lines] == ["watchdog_withheld", "watchdog_withheld"]  # again a minute later
    wd.loop_turn()
    assert wd.tick()
    assert log.lines[-1][0] == "watchdog_resumed"


def test_a_loop_busy_answering_calls_counts_as_alive():
    """GLib runs every queued call in one iteration, so the loop's own timer does not turn during a
    flood; each call the service handled is progress."""
    last_call = [0.0]
    wd, clock, pings, _ = make(progress=lambda: last_call[0])
    wd.loop_turn()
    for _ in range(20):  # 150 s of one long iteration
        clock.t += 7.5
        last_call[0] = clock.t - 0.01
        assert wd.tick()
    assert len(pings) == 20
    clock.t += 16  # the calls stop too: the loop is wedged
    assert not wd.tick()


def test_a_failing_progress_source_falls_back_to_the_loops_turn():
    def broken() -> float:
        raise RuntimeError("gone")

    wd, clock, pings, log = make(progress=broken)
    wd.loop_turn()
    assert wd.tick()
    assert log.lines[0][0] == "watchdog_progress_failed"
    clock.t += 16
    assert not wd.tick()


def test_a_problem_withholds_the_ping():
    why: list[str | None] = ["switch worker silent for 200s"]
    wd, clock, pings, log = make(problem=lambda: why[0])
    wd.loop_turn()
    assert not wd.tick()
    assert log.lines == [("watchdog_withheld", {"detail": "switch worker silent for 200s"})]
    why[0] = None
    assert wd.tick() and pings == [1]


def test_the_loop_stamps_at_most_every_second_and_a_quarter_interval_when_shorter():
    assert Watchdog(lambda: None, 15.0).turn_ms == 1000
    assert Watchdog(lambda: None, 2.5).turn_ms == 625
    assert Watchdog(lambda: None, 0.1).turn_ms == 50


def test_worker_silence_allows_the_longest_job_plus_a_minute():
    backend = SimpleNamespace(start_timeout_s=120.0, drain_timeout_s=30.0)
    config = SimpleNamespace(
        daemon=SimpleNamespace(stop_timeout_s=90.0),
        gpu=SimpleNamespace(release_timeout_s=60.0),
        backends={"a": backend},
    )

    def switcher(health: Any) -> Any:
        return SimpleNamespace(worker_health=lambda: health)

    assert worker_silence(switcher(None), config) is None  # no switch
    assert worker_silence(switcher((True, 180.0)), config) is None
    assert worker_silence(switcher((True, 181.0)), config) == "switch worker silent for 181s"
    assert worker_silence(switcher((False, 1.0)), config) == "switch worker silent for 1s"
