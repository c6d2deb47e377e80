"""`gpushift check` with a [frontdoor] table against a real systemd user manager: the socket unit's
Listen (read from systemd) against [frontdoor] listen, each backend's model names against its
running server's /v1/models, a backend without model names."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from gpushift_env import GPUSHIFT, Backend, GpushiftEnv, free_port


class FrontDoorEnv(GpushiftEnv):
    listen = ""

    def config_text(self) -> str:
        return super().config_text() + f'\n[frontdoor]\nlisten = ["{self.listen}"]\n'


def run_check(env: GpushiftEnv, *args: str) -> subprocess.CompletedProcess[str]:
    e = dict(env.sb.env, GPUSHIFT_CONFIG=str(env.config_path))
    if env.product_path:  # a red/green check: the CLI of another checkout
        e["PYTHONPATH"] = env.product_path
    return subprocess.run([GPUSHIFT, "check", *args], env=e, capture_output=True, text=True, timeout=120)


def test_check_names_the_socket_units_and_the_configs_addresses(sandbox: Any) -> None:
    day = Backend("day", free_port(), [0, 1], extra_config=['models = ["day-model"]'])
    night = Backend("night", free_port(), [1])  # generic, no models = [...]
    env = FrontDoorEnv(sandbox, Path(sandbox.base_dir) / "gs", [day, night])
    env.listen = f"127.0.0.1:{free_port()}"
    theirs = f"127.0.0.1:{free_port()}"
    env.up()  # the daemon makes the simulated GPUs the stand-ins hold
    env.cli("switch", "day", "--reason", "check test", check=True)
    sandbox.install_unit(
        "gpushift-frontdoor.socket",
        f"[Unit]\nDescription=front door sockets (test)\n\n[Socket]\nListenStream={theirs}\n"
        "FileDescriptorName=frontdoor\n",
    )
    sandbox.daemon_reload()

    r = run_check(env, "--json")
    report = json.loads(r.stdout)
    fd = report["frontdoor"]
    assert fd["socket"] == {
        "unit": "gpushift-frontdoor.socket",
        "load_state": "loaded",
        "listen": [theirs],
        "error": None,
    }
    assert fd["models"] == {"day": ["day-model"], "night": []}
    assert "day" in fd["listed"] and "night" not in fd["listed"], (
        fd,
        report["units"],
        r.stderr,
    )  # only a running one
    codes = {(f["code"], f["backend"]) for f in fd["findings"]}
    assert ("frontdoor-socket-listen", "frontdoor") in codes
    assert ("frontdoor-models-unknown", "night") in codes
    # the stand-in lists no model called day-model (or has no /v1/models at all)
    assert codes & {("frontdoor-model-mismatch", "day"), ("frontdoor-models-unreadable", "day")}, codes
    (listen,) = [f for f in fd["findings"] if f["code"] == "frontdoor-socket-listen"]
    assert theirs in listen["message"] and env.listen in listen["message"], listen
    assert report["warnings"] >= 3
    text = run_check(env).stdout
    assert f"front door (listen {env.listen})" in text
    assert f"gpushift-frontdoor.socket: listens on {theirs}" in text
    assert "[frontdoor-socket-listen]" in text

    # the same addresses: no finding; a socket unit that is not installed: none either
    env.listen = theirs
    env.write_config()
    fd = json.loads(run_check(env, "--json").stdout)["frontdoor"]
    assert "frontdoor-socket-listen" not in {f["code"] for f in fd["findings"]}
    (Path(sandbox.unit_dir) / "gpushift-frontdoor.socket").unlink()
    sandbox.daemon_reload()
    fd = json.loads(run_check(env, "--json").stdout)["frontdoor"]
    assert fd["socket"]["load_state"] == "not-found"
    assert "not-found (the front door binds [frontdoor] listen)" in run_check(env).stdout
