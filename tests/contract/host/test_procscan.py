"""Contract tests of the fd scan that finds GPU holders, on real processes holding real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpushift.host import procscan

# A CUDA server that forks: the child inherits the device file, the parent dies (FACTS.md).
FORKING_HOLDER = textwrap.dedent(
    """
    import os, sys, time
    f = open(sys.argv[1], "rb")
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
    """
)

#: Runs a command as user nobody without root's groups (the tests themselves run as root).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

SCAN_AS_JSON = textwrap.dedent(
    """
    import json, sys
    from gpushift.host import procscan
    r = procscan.scan_holders({0: sys.argv[1]})
    print(json.dumps({
        "holders": [[h.pid, h.user] for h in r.holders_of(0)],
        "unreadable": list(r.unreadable),
        "complete": r.complete,
    }))
    """
)


def _device(tmp: str | Path, name: str = "nvidia0") -> str:
    path = os.path.join(str(tmp), name)
    Path(path).touch()
    os.chmod(path, 0o644)
    return path


def test_scan_holders_names_live_process_with_device_open(procs, tmp_path):
    dev0, dev1 = _device(tmp_path, "nvidia0"), _device(tmp_path, "nvidia1")
    p = procs.hold(dev0)

    r = procscan.scan_holders({0: dev0, 1: dev1})

    assert [h.pid for h in r.holders_of(0)] == [p.pid]
    h = r.holders_of(0)[0]
    assert h.user == "root"
    assert h.command.startswith("python")
    assert h.cmdline[-1] == dev0 and "hold" in h.cmdline
    assert r.holders_of(1) == ()
    assert r.complete


def test_scan_holders_counts_a_process_on_every_gpu_it_opened(procs, tmp_path):
    dev0, dev1 = _device(tmp_path, "nvidia0"), _device(tmp_path, "nvidia1")
    p = procs.hold(dev0, dev1)

    r = procscan.scan_holders({0: dev0, 1: dev1})

    assert [h.pid for h in r.holders_of(0)] == [p.pid]
    assert [h.pid for h in r.holders_of(1)] == [p.pid]


def test_scan_holders_leaves_out_own_process_and_excluded_pids(procs, tmp_path):
    dev = _device(tmp_path)
    p = procs.hold(dev)
    with open(dev, "rb"):  # gpushift itself has the file open, as NVML opens /dev/nvidia*
        mine = procscan.scan_holders({0: dev})
        excluded = procscan.scan_holders({0: dev}, exclude_pids=[p.pid])

    assert [h.pid for h in mine.holders_of(0)] == [p.pid]
    assert excluded.holders_of(0) == ()


def test_scan_holders_forgets_a_holder_once_it_exited(procs, tmp_path):
    dev = _device(tmp_path)
    p = procs.hold(dev)
    assert [h.pid for h in procscan.scan_holders({0: dev}).holders_of(0)] == [p.pid]

    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0

    r = procscan.scan_holders({0: dev})
    assert r.holders_of(0) == ()
    assert p.pid not in r.unreadable


def test_scan_holders_finds_child_that_inherited_the_file_after_parent_killed(procs, tmp_path):
    dev = _device(tmp_path)
    parent = procs.start([sys.executable, "-c", FORKING_HOLDER, dev])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    procs.adopt(child)
    parent.kill()
    parent.wait(timeout=10)  # reaped: the parent's PID no longer exists

    r = procscan.scan_holders({0: dev})

    assert [h.pid for h in r.holders_of(0)] == [child]
    assert parent.pid not in r.unreadable


def test_scan_holders_matches_device_path_through_a_symlink(procs, tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    dev = _device(real_dir)
    (tmp_path / "link").symlink_to(real_dir)
    via_link = str(tmp_path / "link" / "nvidia0")
    p = procs.hold(via_link)

    r = procscan.scan_holders({0: via_link})

    assert [h.pid for h in r.holders_of(0)] == [p.pid]
    assert os.path.exists(dev)


def test_scan_holders_still_finds_holder_of_a_recreated_device_node(procs, tmp_path):
    # The old node stays mapped in the holder after nvidia-modprobe/udev recreate /dev/nvidiaN.
    dev = _device(tmp_path)
    p = procs.hold(dev)
    os.unlink(dev)
    _device(tmp_path)

    r = procscan.scan_holders({0: dev})

    assert [h.pid for h in r.holders_of(0)] == [p.pid]


def test_scan_holders_as_non_root_reports_other_users_processes_unreadable(procs, shared_dir):
    procs.require_setpriv()
    dev = _device(shared_dir)
    root_holder = procs.hold(dev)
    # A holder of nobody's own: a non-root scan can still read that one.
    own = procs.start([*AS_NOBODY, sys.executable, "-m", "gpushift.host.simgpu", "hold", dev])
    assert own.stdout is not None and own.stdout.readline().startswith("holding")

    out = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", SCAN_AS_JSON, dev],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    r = json.loads(out.stdout)

    assert root_holder.pid in r["unreadable"]
    assert r["complete"] is False
    assert [own.pid, "nobody"] in r["holders"]
    assert all(pid != root_holder.pid for pid, _ in r["holders"])


def test_process_info_is_none_for_a_zombie(procs):
    p = procs.start([sys.executable, "-c", "pass"])
    # Not waited for: once it has exited it stays a zombie until reaped.
    assert procs.wait_until(lambda: procscan.process_info(p.pid) is None, timeout_s=20)
    assert procs.pid_alive(p.pid)  # the PID still exists (a zombie), yet it holds nothing


def test_process_info_is_none_for_a_pid_that_does_not_exist(procs):
    p = procs.start([sys.executable, "-c", "pass"])
    p.wait(timeout=20)
    assert procscan.process_info(p.pid) is None


@pytest.mark.parametrize(
    ("cgroup", "unit"),
    [
        ("0::/system.slice/gpushift-vllm.service\n", "gpushift-vllm.service"),
        (
            "0::/user.slice/user-0.slice/user@0.service/app.slice/gpushift-a.service\n",
            "gpushift-a.service",
        ),
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1234.scope\n", "run-r1234.scope"),
        ("0::/system.slice/docker.service/payload\n", "docker.service"),
        (
            "12:memory:/\n1:name=systemd:/system.slice/gpushift-llama.service\n0::/\n",
            "gpushift-llama.service",
        ),
        ("0::/\n", None),
        ("0::/user.slice/user-0.slice\n", None),
    ],
)
def test_unit_of_reads_the_unit_from_the_cgroup_path(monkeypatch, tmp_path, cgroup, unit):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(cgroup)
    monkeypatch.setattr(procscan, "PROC", str(tmp_path))

    assert procscan.unit_of(4242) == unit
    assert procscan.unit_of(4243) is None  # no such process
