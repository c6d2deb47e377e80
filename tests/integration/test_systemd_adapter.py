"""SystemdUnits against a real systemd user manager on a real session bus (the ``sandbox`` fixture)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpushift.errors import SystemdError
from gpushift.host.dbus import connect
from gpushift.host.systemd import SystemdUnits
from tests.support.sandbox import Sandbox, SandboxError

SLEEPER = "[Service]\nType=simple\nExecStart=/bin/sleep 300\nKillMode=control-group\nTimeoutStopSec=3\n"


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0")[:-1]]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] != b"Z"


@pytest.fixture
def units(bus: Any) -> SystemdUnits:
    return SystemdUnits(bus)


def test_systemd_units_start_and_stop_jobs_end_done(sandbox, install_standin, units, wait_for):
    a = install_standin("standin-a.service", "--version", "1.0")

    started = units.start(a.name, timeout_s=10)
    assert started.result == "done" and started.ok
    assert started.unit == a.name and started.job.startswith("/org/freedesktop/systemd1/job/")
    st = units.state(a.name)
    assert st.active_state == "active" and st.sub_state == "running", a.log_text()
    assert st.main_pid > 0 and _alive(st.main_pid)

    stopped = units.stop(a.name, timeout_s=10)
    assert stopped.result == "done" and stopped.ok
    assert stopped.job != started.job
    assert units.state(a.name).active_state == "inactive"
    assert not _alive(st.main_pid)


def test_systemd_units_start_of_an_active_unit_is_done_at_once(sandbox, units):
    # The job ends immediately, so its JobRemoved may be sent before StartUnit's reply: the
    # subscription made before the call must still catch it.
    sandbox.install_unit("sleeper.service", SLEEPER)
    sandbox.daemon_reload()
    units.start("sleeper.service", timeout_s=10)
    for _ in range(5):
        assert units.start("sleeper.service", timeout_s=10).result == "done"


def test_systemd_units_exit_at_once_start_done_then_failed_with_exit_code(
    sandbox, install_standin, units, wait_for
):
    b = install_standin("standin-b.service", "--exit-at-once")

    # Type=simple: the start job only means "forked", so it is done even though the binary fails.
    assert units.start(b.name, timeout_s=10).result == "done"
    st = wait_for(
        lambda: (s := units.state(b.name)).failed and s,
        5,
        "the unit to be failed",
        lambda: b.log_text(),
    )
    assert st.active_state == "failed"
    assert st.result == "exit-code"
    assert "exiting at once" in b.log_text()


def test_systemd_units_exec_start_is_as_written_and_cmdline_as_run(sandbox, install_standin, units):
    a = install_standin(
        "standin-a.service", "--version", "${STANDIN_VERSION}", environment=["STANDIN_VERSION=7.7.7"]
    )
    units.start(a.name, timeout_s=10)
    st = units.state(a.name)

    # As configured: systemd returns the argv with ${VAR} NOT expanded.
    assert "${STANDIN_PORT}" in st.exec_start
    assert "${STANDIN_VERSION}" in st.exec_start
    assert st.exec_start[1:3] == ("-m", "tests.support.standin")
    # As run: /proc/MainPID/cmdline has the values.
    running = _cmdline(st.main_pid)
    assert str(a.port) in running and "7.7.7" in running
    assert "${STANDIN_PORT}" not in running
    assert f"STANDIN_PORT={a.port}" in st.environment
    assert "STANDIN_VERSION=7.7.7" in st.environment


def test_systemd_units_state_reports_unit_file_dropins_and_kill_settings(sandbox, install_standin, units):
    a = install_standin("standin-a.service", unit_lines=["Conflicts=standin-b.service"], timeout_stop_s=3)
    dropin = sandbox.install_dropin(a.name, "50-test.conf", "[Service]\nEnvironment=EXTRA=1\n")
    sandbox.daemon_reload()

    st = units.state(a.name)
    assert st.load_state == "loaded"
    assert st.active_state == "inactive"
    assert st.fragment_path == str(a.path)
    assert st.drop_in_paths == (str(dropin),)
    assert "EXTRA=1" in st.environment
    assert st.kill_mode == "control-group"
    assert st.send_sigkill is True
    assert st.timeout_stop_usec == 3_000_000
    assert "standin-b.service" in st.conflicts


def test_systemd_units_state_reports_environment_files_and_whether_each_may_be_missing(
    sandbox, install_standin, units, tmp_path
):
    a = install_standin("standin-a.service")
    must, may = tmp_path / "a.env", tmp_path / "gone.env"
    must.write_text("PORT=1\n")
    sandbox.install_dropin(
        a.name, "50-env.conf", f"[Service]\nEnvironmentFile={must}\nEnvironmentFile=-{may}\n"
    )
    sandbox.daemon_reload()

    st = units.state(a.name)
    assert st.environment_files == ((str(must), False), (str(may), True))


def test_systemd_units_state_of_a_unit_without_file_is_not_found(sandbox, units):
    st = units.state("no-such-backend.service")
    assert st.load_state == "not-found"
    assert st.active_state == "inactive"
    assert st.exec_start == ()


@pytest.mark.parametrize("verb", ["start", "stop"])
def test_systemd_units_missing_unit_raises_systemd_error(sandbox, units, verb):
    with pytest.raises(SystemdError) as err:
        getattr(units, verb)("no-such-backend.service", timeout_s=5)
    msg = str(err.value)
    assert "no-such-backend.service" in msg
    assert "NoSuchUnit" in msg


def test_systemd_units_invalid_unit_name_raises_systemd_error(sandbox, units):
    with pytest.raises(SystemdError, match="not valid"):
        units.state("not a unit name")


def test_systemd_units_processes_lists_every_pid_in_the_cgroup(sandbox, units, wait_for):
    # A parent with a child, as vLLM's API server with its EngineCore.
    sandbox.install_unit(
        "family.service",
        "[Service]\nExecStart=/bin/sh -c '/bin/sleep 301 & exec /bin/sleep 300'\nKillMode=control-group\n",
    )
    sandbox.daemon_reload()
    units.start("family.service", timeout_s=10)

    def both_sleeping() -> list[int] | None:
        # Until both have exec'd, one of them is still the shell (whose cmdline is empty for an
        # instant while it forks or execs).
        pids = units.processes("family.service")
        return pids if sorted((_cmdline(p) or [""])[-1] for p in pids) == ["300", "301"] else None

    pids = wait_for(both_sleeping, 5, "both processes of the unit")
    assert units.state("family.service").main_pid in pids

    units.stop("family.service", timeout_s=10)
    assert units.processes("family.service") == []
    assert not any(_alive(p) for p in pids)


def test_systemd_units_reset_failed_clears_the_failed_state(sandbox, install_standin, units, wait_for):
    b = install_standin("standin-b.service", "--exit-at-once")
    units.start(b.name, timeout_s=10)
    wait_for(lambda: units.state(b.name).failed, 5, "the unit to fail", b.log_text)

    units.reset_failed(b.name)
    st = units.state(b.name)
    assert st.active_state == "inactive"
    assert st.result == "success"
    units.reset_failed("never-loaded.service")  # nothing to reset is not an error


def test_systemd_units_stop_of_a_sigterm_ignoring_unit_ends_after_sigkill(
    sandbox, install_standin, units, wait_for
):
    a = install_standin("stubborn.service", "--ignore-sigterm", timeout_stop_s=2)
    units.start(a.name, timeout_s=10)
    wait_for(lambda: "ignoring SIGTERM" in a.log_text(), 10, "the stand-in to ignore SIGTERM", a.log_text)
    pid = units.state(a.name).main_pid

    job = units.stop(a.name, timeout_s=30)
    assert job.result == "done"
    st = units.state(a.name)
    assert not _alive(pid)
    # systemd says why: the stop timed out and it had to SIGKILL.
    assert st.result == "timeout"
    assert st.active_state in ("failed", "inactive")


def test_systemd_units_job_that_outlasts_the_timeout_raises(sandbox, units):
    sandbox.install_unit("slowstart.service", "[Service]\nType=oneshot\nExecStart=/bin/sleep 60\n")
    sandbox.daemon_reload()
    with pytest.raises(SystemdError, match="did not finish within"):
        units.start("slowstart.service", timeout_s=1)
    assert units.state("slowstart.service").active_state == "activating"


def test_systemd_units_failed_dependency_result_comes_from_job_removed(sandbox, units):
    # JobRemoved says "dependency"; the polling fallback can only infer "failed".  Both are failures.
    sandbox.install_unit("prereq.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    sandbox.install_unit(
        "needs-prereq.service",
        "[Unit]\nRequires=prereq.service\nAfter=prereq.service\n[Service]\nExecStart=/bin/sleep 300\n",
    )
    sandbox.daemon_reload()
    job = units.start("needs-prereq.service", timeout_s=10)
    assert job.result == "dependency"
    assert not job.ok


def test_systemd_units_poll_mode_reports_the_same_outcomes(sandbox, install_standin, bus, wait_for):
    polling = SystemdUnits(bus, wait="poll")
    a = install_standin("standin-a.service")
    b = install_standin("standin-b.service", "--exit-at-once")
    sandbox.install_unit("prereq.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    sandbox.install_unit(
        "needs-prereq.service",
        "[Unit]\nRequires=prereq.service\nAfter=prereq.service\n[Service]\nExecStart=/bin/sleep 300\n",
    )
    sandbox.daemon_reload()

    assert polling.start(a.name, timeout_s=10).result == "done"
    assert polling.state(a.name).active_state == "active"
    assert polling.stop(a.name, timeout_s=10).result == "done"
    assert polling.state(a.name).active_state == "inactive"
    # Forked, then failed: done, as JobRemoved says for Type=simple.
    assert polling.start(b.name, timeout_s=10).result == "done"
    wait_for(lambda: polling.state(b.name).failed, 5, "b to fail", b.log_text)
    # Never got going: inferred as failed.
    job = polling.start("needs-prereq.service", timeout_s=10)
    assert job.result == "failed" and not job.ok


def test_systemd_units_jobs_from_a_worker_thread_while_a_glib_loop_runs(sandbox, install_standin, bus):
    """The daemon's case: the GLib main loop runs in one thread, a switch worker calls start/stop."""
    from gi.repository import GLib

    a = install_standin("standin-a.service")
    units = SystemdUnits(bus)
    # The daemon's own subscription on the default context, dispatched by the main loop: it keeps
    # working beside the adapter's private one.
    seen_by_loop: list[str] = []
    sub = bus.con.signal_subscribe(
        "org.freedesktop.systemd1",
        "org.freedesktop.systemd1.Manager",
        "JobRemoved",
        "/org/freedesktop/systemd1",
        None,
        0,
        lambda *args: seen_by_loop.append(args[5].unpack()[1]),
    )
    loop = GLib.MainLoop()
    results: list[Any] = []

    def worker() -> None:
        try:
            results.append(units.start(a.name, timeout_s=15))
            results.append(units.stop(a.name, timeout_s=15))
        except BaseException as e:  # reported by the assertions below
            results.append(e)
        finally:
            GLib.idle_add(loop.quit)

    guard = GLib.timeout_add_seconds(60, loop.quit)  # a hung worker must not hang the suite
    thread = threading.Thread(target=worker)
    GLib.idle_add(lambda: thread.start() and False)
    try:
        loop.run()
    finally:
        GLib.source_remove(guard)
        thread.join(30)
    # Let the loop dispatch what the bus delivered for its own subscription.
    ctx = GLib.MainContext.default()
    while ctx.pending():
        ctx.iteration(False)
    bus.con.signal_unsubscribe(sub)

    assert [getattr(r, "result", r) for r in results] == ["done", "done"]
    assert results[0].job in seen_by_loop and results[1].job in seen_by_loop


def test_systemd_units_jobs_from_the_loop_thread_itself(sandbox, install_standin, bus):
    from gi.repository import GLib

    a = install_standin("standin-a.service")
    units = SystemdUnits(bus)
    loop = GLib.MainLoop()
    results: list[Any] = []

    def in_loop() -> bool:
        try:
            results.append(units.start(a.name, timeout_s=15).result)
            results.append(units.stop(a.name, timeout_s=15).result)
        except BaseException as e:
            results.append(e)
        loop.quit()
        return False

    guard = GLib.timeout_add_seconds(60, loop.quit)
    GLib.idle_add(in_loop)
    loop.run()
    GLib.source_remove(guard)
    assert results == ["done", "done"]


def test_systemd_units_concurrent_jobs_from_two_threads_get_their_own_results(
    sandbox, install_standin, units
):
    a = install_standin("standin-a.service", reload=False)
    b = install_standin("standin-b.service", "--exit-at-once", reload=False)
    sandbox.daemon_reload()
    out: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            out[name] = units.start(name, timeout_s=15)
        except BaseException as e:
            out[name] = e

    threads = [threading.Thread(target=run, args=(n,)) for n in (a.name, b.name)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out[a.name].unit == a.name and out[b.name].unit == b.name
    assert out[a.name].job != out[b.name].job
    assert out[a.name].result == out[b.name].result == "done"


def test_connect_session_reads_the_address_at_call_time(sandbox, monkeypatch):
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", sandbox.bus_address)
    b = connect("session")
    try:
        assert SystemdUnits(b).state("init.scope").active_state == "active"
    finally:
        b.con.close_sync(None)


def test_systemd_units_calls_on_a_dead_manager_raise_systemd_error(sandbox, bus):
    units = SystemdUnits(bus, call_timeout_s=3)
    units.state("init.scope")
    sandbox.stop()  # the manager AND the bus go away
    with contextlib.suppress(Exception):
        bus.con.flush_sync(None)
    with pytest.raises(SystemdError):
        units.state("init.scope")


# ---------------------------------------------------------------------------------------------
# The sandbox these tests stand on (tests.support.sandbox): its promises are what make them trustworthy.


def _own_cgroup(pid: int | str) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    return next((ln[3:] for ln in lines if ln.startswith("0::")), lines[-1].split(":", 2)[2])


def test_sandbox_manager_runs_in_its_own_cgroup_and_moves_nobody_else():
    # A user manager that starts in the root cgroup migrates EVERY process of the machine into
    # /init.scope (measured); the sandbox gives it a private cgroup first.
    before = (_own_cgroup(1), _own_cgroup("self"))
    with Sandbox() as sb:
        assert (_own_cgroup(1), _own_cgroup("self")) == before
        assert sb.runtime_dir is not None and sb.runtime_dir.name in _own_cgroup(sb.manager_pid)
        sb.install_unit("sleeper.service", SLEEPER)
        sb.daemon_reload()
        sb.systemctl("start", "sleeper.service")
        cg = sb.show("sleeper.service", "ControlGroup")["ControlGroup"]
        assert cg.startswith(_own_cgroup(sb.manager_pid).rsplit("/", 1)[0] + "/")


def test_sandbox_stop_ends_every_process_and_is_idempotent():
    sb = Sandbox().start()
    try:
        sb.install_unit("sleeper.service", SLEEPER)
        sb.daemon_reload()
        sb.systemctl("start", "sleeper.service")
        unit_pid = int(sb.show("sleeper.service", "MainPID")["MainPID"])
        pids = [sb.manager_pid, sb.dbus_pid, unit_pid]
        assert all(p and _alive(p) for p in pids)
    finally:
        sb.stop()
    assert not any(_alive(p) for p in pids if p)
    assert sb.runtime_dir is not None and not sb.runtime_dir.exists()
    sb.stop()  # a second stop is harmless


def test_sandbox_stop_after_the_manager_was_killed_ends_its_leftovers():
    sb = Sandbox().start()
    try:
        sb.install_unit("sleeper.service", SLEEPER)
        sb.daemon_reload()
        sb.systemctl("start", "sleeper.service")
        unit_pid = int(sb.show("sleeper.service", "MainPID")["MainPID"])
        assert sb.manager_pid is not None
        os.kill(sb.manager_pid, signal.SIGKILL)  # nobody is left to stop the unit
    finally:
        sb.stop()
    assert not _alive(unit_pid)
    assert sb.dbus_pid is not None and not _alive(sb.dbus_pid)


def test_sandbox_failed_start_cleans_up_what_it_started(monkeypatch):
    def give_up(self: Sandbox, deadline: float) -> None:
        raise SandboxError("gave up on purpose")

    monkeypatch.setattr(Sandbox, "_wait_for_manager", give_up)
    sb = Sandbox()
    with pytest.raises(SandboxError, match="on purpose"):
        sb.start()
    assert sb.manager_pid is not None
    assert not _alive(sb.manager_pid)
    assert sb.runtime_dir is not None and not sb.runtime_dir.exists()


def test_sandbox_command_line_start_writes_env_and_stop_ends_it(tmp_path: Path):

    d = tmp_path / "sb"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tests.support.sandbox", "start", "--dir", str(d)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        exports = {}
        for line in (d / "env").read_text().splitlines():
            if line.startswith("export "):
                key, value = line[len("export ") :].split("=", 1)
                exports[key] = shlex.split(value)[0] if value else ""
        env = {**os.environ, **exports}
        answer = subprocess.run(
            ["systemctl", "--user", "show", "--property=Version", "--value"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr
        state = Sandbox.attach(d)
        pids = [state.manager_pid, state.dbus_pid]
        assert all(p and _alive(p) for p in pids)
        r = subprocess.run(
            [sys.executable, "-m", "tests.support.sandbox", "stop", "--dir", str(d)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert not any(_alive(p) for p in pids if p)
        assert not (d / "env").exists()
    finally:
        if (d / "sandbox.json").exists():
            Sandbox.attach(d).stop()  # ends them by PID if the test failed half-way
