"""The Ansible role (contrib/ansible) against two throwaway Debian 12 hosts.

What is real and what is recorded:

* Real: ``ansible-playbook`` (ansible-core 2.19 from PyPI, the test extras) running the example
  playbook ``contrib/ansible/playbook.yml`` with the role, against two roots of
  ``tests/support/debroot.py`` (a cached ``debootstrap --variant=minbase bookworm`` under an
  overlay each, with no Python until the role's first, raw task installs it), reached through a
  small connection plugin of the test support (``nsenter`` + ``chroot``:
  ``tests/support/ansible_plugins/connection/gpushift_nsroot.py``).  The role installs the
  ``make deb`` package with apt (its Depends from the Debian mirror, archives cached), renders each
  host's ``gpushift.toml`` and schedule from its own variables, checks both with the installed
  ``gpushift check``/``gpushift schedule check``, enables ``gpushift.service`` (a real link in the
  root's ``/etc``) and starts it.
* The daemon: each host's ``gpushift.service`` is a unit of a real systemd user manager of the
  project's sandbox (``tests/support/sandbox.py``), one per host, whose ``ExecStart=`` enters that
  host's root and runs the installed ``/opt/gpushift/bin/gpushift daemon`` (its venv, the rendered
  config: session bus, simulated GPUs, as the host's variables say); ``ExecReload=`` runs the
  installed ``gpushift reload``.  The root's diverted ``systemctl`` hands what would ask a running
  systemd (``show``, ``start``, ``reload``...) to that manager (``systemctl --user``), so Ansible's
  ``systemd_service`` module starts and reloads the real daemon, and records every call.
* Recorded: the calls (the diverted ``systemctl``'s log per host), from which "a reload, not a
  restart, on that host only" is read; the daemon's own PID staying the same and its status showing
  the new schedule show the same thing from the daemon's side.

Needs root, debootstrap, unshare/nsenter, systemd and dbus-daemon (the sandbox), and the network
to the Debian mirror once per machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from debpkg import REPO, build

from tests.support.debroot import DebRootError, ThrowawayRoot
from tests.support.debroot import missing_tools as root_missing_tools
from tests.support.sandbox import Sandbox
from tests.support.sandbox import missing_tools as sandbox_missing_tools

PLAYBOOK = REPO / "contrib/ansible/playbook.yml"
PLUGINS = REPO / "tests/support/ansible_plugins/connection"

#: Each host's own variables (beside what every test host shares, in ``inventory``).
HOST_VARS: dict[str, dict[str, Any]] = {
    "host-a": {
        "gpushift_zone": "Asia/Shanghai",
        "gpushift_backends": {
            "vllm": {
                "kind": "vllm",
                "unit": "gpushift-vllm.service",
                "health_url": "http://127.0.0.1:8000/health",
                "gpus": [0, 1],
            },
            "llama": {
                "kind": "llama-server",
                "unit": "gpushift-llama.service",
                "health_url": "http://127.0.0.1:8080/health",
                "gpus": [0, 1],
            },
        },
        # off every day from midnight; a calendar exception in 2031 is the next switch status shows
        "gpushift_schedule": ["0 0 * * * off"],
        "gpushift_exceptions": [
            {"start": "2031-03-01", "end": "2031-03-02", "backend": "vllm", "name": "demo"}
        ],
    },
    "host-b": {
        "gpushift_zone": "America/New_York",
        "gpushift_backends": {
            "llama": {
                "kind": "llama-server",
                "unit": "gpushift-llama.service",
                "health_url": "http://127.0.0.1:8081/health",
                "gpus": [0],
            },
        },
        "gpushift_schedule": ["0 0 * * * off"],
    },
}


@dataclass
class Host:
    name: str
    root: ThrowawayRoot
    sandbox: Sandbox


def _daemon_unit(root: ThrowawayRoot, sandbox: Sandbox) -> str:
    enter = f"/usr/bin/nsenter --target={root.pid} --mount /usr/sbin/chroot {root.merged}"
    return f"""[Unit]
Description=gpushift installed in the throwaway root {root.merged} (the package's venv)

[Service]
Type=notify
ExecStart={enter} /opt/gpushift/bin/gpushift daemon
ExecReload={enter} /opt/gpushift/bin/gpushift reload
Environment=DBUS_SESSION_BUS_ADDRESS={sandbox.bus_address}
TimeoutStopSec=20
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Host]]:
    missing = root_missing_tools() + sandbox_missing_tools()
    if missing or not shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)):
        pytest.fail(
            f"missing: {', '.join(missing) or 'ansible-playbook'} (apt-get install debootstrap systemd "
            "dbus-daemon; ansible-core is in the test extras: make venv)",
            pytrace=False,
        )
    made: dict[str, Host] = {}
    try:
        for name in HOST_VARS:
            base = tmp_path_factory.mktemp(name)
            root = ThrowawayRoot(base / "root").start()
            sandbox = Sandbox(base / "sandbox")
            made[name] = Host(name, root, sandbox)
            sandbox.start()
            root.install_recorders()
            root.bridge(sandbox.runtime_dir, sandbox.exports)  # type: ignore[arg-type]
            sandbox.install_unit("gpushift.service", _daemon_unit(root, sandbox))
            sandbox.daemon_reload()
        yield made
    except DebRootError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        for h in made.values():
            h.sandbox.stop()
            h.root.stop()


def inventory(
    path: Path, hosts: dict[str, Host], deb: Path, changes: dict[str, dict[str, Any]] | None = None
) -> Path:
    """The test's inventory (JSON is YAML): the connection to each root, the shared variables (session
    bus and simulated GPUs: the sandbox's daemon), each host's own, and ``changes`` on top."""
    shared = {
        "ansible_connection": "gpushift_nsroot",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,
        "gpushift_deb": str(deb),
        "gpushift_daemon": {"bus": "session", "on_failure": "stay"},
        "gpushift_gpu": {"provider": "simulated", "simulated_gpus": 2},
    }
    per_host = {}
    for name, h in hosts.items():
        per_host[name] = {
            "gpushift_nsroot_pid": h.root.pid,
            "gpushift_nsroot_dir": str(h.root.merged),
            **HOST_VARS[name],
            **(changes or {}).get(name, {}),
        }
    path.write_text(json.dumps({"gpushift": {"hosts": per_host, "vars": shared}}, indent=1))
    return path


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]


def playbook(inv: Path, workdir: Path, *flags: str) -> PlaybookRun:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_CONNECTION_PLUGINS": str(PLUGINS),
        "ANSIBLE_HOME": str(workdir / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    }
    # one host at a time (--forks 1): the roots share one apt archive cache, which apt locks
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "--forks",
        "1",
        "-i",
        str(inv),
        str(PLAYBOOK),
        *flags,
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, cwd=REPO)
    out = r.stdout + r.stderr
    recap = {
        m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", out, re.M)
    }
    return PlaybookRun(r.returncode, out, recap)


def must_pass(run: PlaybookRun) -> PlaybookRun:
    assert (
        run.rc == 0
        and run.recap
        and all(v["failed"] == 0 and v["unreachable"] == 0 for v in run.recap.values())
    ), f"ansible-playbook exit {run.rc}:\n{run.output[-8000:]}"
    return run


def in_root(h: Host, script: str) -> str:
    env = f"DBUS_SESSION_BUS_ADDRESS={h.sandbox.bus_address}"
    return h.root.must(f"export {env}; {script}")


def status(h: Host) -> dict[str, Any]:
    return json.loads(in_root(h, "gpushift status --json"))  # type: ignore[no-any-return]


def main_pid(h: Host) -> str:
    return h.sandbox.show("gpushift.service", "MainPID", "ActiveState")["MainPID"]


def calls(h: Host) -> list[tuple[str, ...]]:
    """What was asked of systemd about gpushift.service on this host (not by a maintainer script)."""
    return [
        c.argv
        for c in h.root.record("")
        if c.tool == "systemctl" and "gpushift.service" in c.argv and c.argv[0] not in ("show", "is-enabled")
    ]


def wait_active(h: Host, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while h.sandbox.show("gpushift.service", "ActiveState")["ActiveState"] != "active":
        assert time.monotonic() < deadline, h.sandbox.journal_text("-u", "gpushift.service")
        time.sleep(0.2)


# Its own deadline, not the suite's 300 s: four playbook runs on two hosts, the first installing
# Python, the package and its Depends on each (293 s measured on 2 shared cores under load).
@pytest.mark.timeout(1500)
def test_role_configures_two_hosts_idempotently_and_reloads_only_what_changed(
    hosts: dict[str, Host], tmp_path: Path
) -> None:
    deb = build()
    a, b = hosts["host-a"], hosts["host-b"]
    for h in (a, b):
        assert not (h.root.path / "usr/bin/python3").exists()  # minbase: the role's raw task brings it

    # ---- first run: python, the package, both files rendered and checked, the daemon enabled and running
    first = must_pass(playbook(inventory(tmp_path / "inv.json", hosts, deb), tmp_path))
    for h in (a, b):
        assert first.recap[h.name]["changed"] > 0
        wait_active(h)
        assert h.root.must("systemctl is-enabled gpushift.service").strip() == "enabled"
        toml = (h.root.path / "etc/gpushift/gpushift.toml").read_text()
        assert "Ansible (role gpushift) for " + h.name in toml
        for backend in HOST_VARS[h.name]["gpushift_backends"]:
            assert f"\n[backends.{backend}]\n" in toml
        schedule = (h.root.path / "etc/gpushift/schedule").read_text()
        assert f"\nTZ={HOST_VARS[h.name]['gpushift_zone']}\n" in schedule
        # validated on the host by the installed gpushift: the config and schedule are good
        report = json.loads(h.root.run("gpushift check --json").stdout)
        assert report["config"]["ok"] is True and report["schedule"]["ok"] is True, report
        assert report["schedule"]["tz"] == HOST_VARS[h.name]["gpushift_zone"]
        # the daemon runs from the installed venv with this host's own configuration
        s = status(h)
        assert sorted(s["backends"]) == sorted(HOST_VARS[h.name]["gpushift_backends"]), s
        # enabled (a link in the root), started (the sandbox's daemon), then the handler's reload
        assert calls(h) == [
            ("enable", "gpushift.service"),
            ("start", "gpushift.service"),
            ("reload", "gpushift.service"),
        ], calls(h)
    assert "except 2031-03-01 .. 2031-03-02 vllm demo" in (a.root.path / "etc/gpushift/schedule").read_text()
    coming = status(a)["schedule"]["next"]
    assert coming["target"] == "vllm" and coming["at_local"].startswith("2031-03-01"), coming

    # ---- second run: nothing changes, nothing is started or reloaded
    pids = {h.name: main_pid(h) for h in (a, b)}
    for h in (a, b):
        h.root.clear_record()
    second = must_pass(playbook(tmp_path / "inv.json", tmp_path))
    assert {n: v["changed"] for n, v in second.recap.items()} == {"host-a": 0, "host-b": 0}, second.output[
        -6000:
    ]
    assert calls(a) == [] and calls(b) == []

    # ---- a changed schedule variable on host-a: its schedule is rewritten and its daemon reloaded
    changed = {
        "host-a": {"gpushift_schedule": ["0 0 * * * off", {"minute": 30, "hour": 6, "backend": "off"}]}
    }
    reloaded = status(a)["daemon"]["reloaded_at"]
    b_reloaded = status(b)["daemon"]["reloaded_at"]
    b_schedule = (b.root.path / "etc/gpushift/schedule").read_text()
    third = must_pass(playbook(inventory(tmp_path / "inv.json", hosts, deb, changed), tmp_path))
    assert third.recap["host-a"]["changed"] == 2, third.output[-6000:]  # the schedule, the handler
    assert third.recap["host-b"]["changed"] == 0, third.output[-6000:]
    assert "\n30 6 * * * off\n" in (a.root.path / "etc/gpushift/schedule").read_text()
    assert (b.root.path / "etc/gpushift/schedule").read_text() == b_schedule
    assert calls(a) == [("reload", "gpushift.service")], calls(a)  # a reload, not a restart
    assert calls(b) == []
    # the daemons' side: the same processes (nothing restarted); host-a's re-read its files
    assert {h.name: main_pid(h) for h in (a, b)} == pids
    after = status(a)["daemon"]
    assert after["pid"] == int(pids["host-a"]) and after["reloaded_at"] > reloaded, (after, reloaded)
    assert status(b)["daemon"]["reloaded_at"] == b_reloaded

    # ---- --check --diff: what a change on host-b would do, doing nothing
    before = (b.root.path / "etc/gpushift/schedule").read_text()
    for h in (a, b):
        h.root.clear_record()
    zone = {"host-b": {"gpushift_zone": "Europe/Lisbon"}}
    dry = must_pass(
        playbook(
            inventory(tmp_path / "inv-dry.json", hosts, deb, {**changed, **zone}),
            tmp_path,
            "--check",
            "--diff",
        )
    )
    assert dry.recap["host-b"]["changed"] >= 1 and dry.recap["host-a"]["changed"] == 0, dry.output[-6000:]
    assert "-TZ=America/New_York" in dry.output and "+TZ=Europe/Lisbon" in dry.output, dry.output[-6000:]
    assert (b.root.path / "etc/gpushift/schedule").read_text() == before
    assert calls(a) == [] and calls(b) == []


def test_the_example_inventory_renders_configs_gpushift_accepts(tmp_path: Path) -> None:
    """contrib/ansible/inventory's two hosts, rendered by the role's render tasks on this machine
    (connection local, the hosts untouched) and checked by this checkout's gpushift."""
    inv = REPO / "contrib/ansible/inventory/hosts.yml"
    names = ["gpu-a.example.org", "gpu-b.example.org"]
    for name in names:
        (tmp_path / name).mkdir()
    play = tmp_path / "render.yml"
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "gpushift",
                    "connection": "local",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {"name": "gpushift", "tasks_from": "render"},
                            "vars": {"gpushift_render_dir": f"{tmp_path}/{{{{ inventory_hostname }}}}"},
                        }
                    ],
                }
            ]
        )
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_ROLES_PATH": str(REPO / "contrib/ansible/roles"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(play)]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    gpushift = str(Path(sys.executable).parent / "gpushift")
    for name in names:
        config = tmp_path / name / "gpushift.toml"
        c = subprocess.run(
            [gpushift, "--config", str(config), "check", "--json"], capture_output=True, text=True
        )
        assert c.returncode in (0, 1), f"{name}: {c.stdout}{c.stderr}\n{config.read_text()}"
        report = json.loads(c.stdout)
        assert report["config"]["ok"] and report["schedule"]["ok"], report
        s = subprocess.run(
            [gpushift, "--config", str(config), "schedule", "check"], capture_output=True, text=True
        )
        assert s.returncode == 0, s.stdout + s.stderr
    a = (tmp_path / "gpu-a.example.org/gpushift.toml").read_text()
    assert (
        "\n[backends.vllm]\n" in a
        and "gpus = [0, 1]" in a
        and '\n[metrics]\nlisten = "127.0.0.1:9840"\n' in a
    )
    b = (tmp_path / "gpu-b.example.org/schedule").read_text()
    assert "\nTZ=America/New_York\n" in b and "\n0 22 * * 1-5 off\n" in b
    assert "[mirror]" not in a  # no mirror url among the example's variables: no table

    # with a mirror (the [mirror] table of docs/fleet.md; rendered, not checked: this gpushift may predate it)
    mirror = {
        "url": "postgresql://gpushift@ledger.example.org/gpushift",
        "password_file": "/etc/gpushift/mirror.password",
    }
    r = subprocess.run(
        [*argv, "--limit", names[0], "-e", json.dumps({"gpushift_mirror": mirror})],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-6000:]
    a = (tmp_path / "gpu-a.example.org/gpushift.toml").read_text()
    assert (
        '\n[mirror]\nurl = "postgresql://gpushift@ledger.example.org/gpushift"\npassword_file = "/etc/gpushift/mirror.password"\n'
        in a
    ), a
