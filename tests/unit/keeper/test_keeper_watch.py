"""What happened to the serving backend between switches: :func:`gpushift.keeper.watch.observe`."""

from __future__ import annotations

from dataclasses import replace

from gpushift.keeper.watch import Seen, observe
from gpushift.values import Outcome, UnitState

ACTIVE = UnitState(
    "gs-day.service", "loaded", "active", "running", main_pid=100, main_start_us=5, n_restarts=0
)
SEEN = Seen.of("day", ACTIVE)


def look(
    st: UnitState, foreign: bool | None = False, unhealthy: float | None = None, seen: Seen | None = SEEN
):
    return observe("day", st, seen, foreign, unhealthy, unhealthy_after_s=60)


def test_watch_exit_zero_without_a_stop_job_is_a_crash() -> None:
    # vLLM can exit 0 when its engine dies (vllm#48966): inactive, Result=success, nobody stopped it.
    gone = replace(ACTIVE, active_state="inactive", sub_state="dead", main_pid=0, exec_main_code=1)
    inc = look(gone).incident
    assert inc is not None and inc.outcome is Outcome.CRASHED and not inc.serving_again
    assert "exited by itself (exit status 0, Result=success)" in inc.detail


def test_watch_exit_after_a_stop_job_of_a_person_is_no_incident() -> None:
    gone = replace(ACTIVE, active_state="inactive", sub_state="dead", main_pid=0)
    assert look(gone, foreign=True).incident is None


def test_watch_without_job_information_only_failed_counts_as_a_crash() -> None:
    inactive = replace(ACTIVE, active_state="inactive", sub_state="dead", main_pid=0)
    failed = replace(
        inactive,
        active_state="failed",
        sub_state="failed",
        result="exit-code",
        exec_main_code=1,
        exec_main_status=3,
    )
    assert look(inactive, foreign=None).incident is None
    inc = look(failed, foreign=None).incident
    assert inc is not None and "exit status 3, Result=exit-code" in inc.exit


def test_watch_restart_by_systemd_is_a_crash_that_serves_again() -> None:
    restarted = replace(ACTIVE, main_pid=200, main_start_us=9, n_restarts=1)
    obs = look(restarted)
    assert obs.incident is not None and obs.incident.serving_again and obs.relaunched is None
    assert obs.seen == Seen.of("day", restarted)


def test_watch_new_main_process_without_a_restart_is_a_relaunch_behind_our_back() -> None:
    obs = look(replace(ACTIVE, main_pid=300, main_start_us=11))
    assert obs.incident is None and obs.relaunched is not None and "100 -> 300" in obs.relaunched


def test_watch_failing_health_is_unhealthy_only_past_the_limit() -> None:
    assert look(ACTIVE, unhealthy=59).incident is None
    inc = look(ACTIVE, unhealthy=61).incident
    assert inc is not None and inc.outcome is Outcome.UNHEALTHY and "61s" in inc.detail


def test_watch_first_look_after_a_switch_only_remembers() -> None:
    obs = look(replace(ACTIVE, main_pid=999), seen=None)
    assert obs.incident is None and obs.relaunched is None and obs.seen is not None
