"""``gpushift check`` reads a unit's ``EnvironmentFile=``s (doctor/facts.py ``unit_environment``):
the shipped template unit ``units/gpushift-llama@.service`` takes ``$PORT`` and ``$MODEL`` from
``/etc/gpushift/llama@N.env``, so with those files read there is no false ``env-undefined``, and
each instance's ``--port ${PORT}`` is compared with its health URL's port.  Against real files
(copies of the shipped ``etc/gpushift/llama@N.env``), read bounded and only as regular files."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, cast

from gpushift.config.schema import parse
from gpushift.doctor.facts import run_checks, unit_environment
from gpushift.ports import GpuProbe, UnitControl
from gpushift.values import HostGpuFacts, UnitState

ROOT = Path(__file__).resolve().parents[3]
FACTS = HostGpuFacts(simulated=True, driver_version=None, cuda_version=None, gpus=())


def _template_argv() -> tuple[str, ...]:
    """The template unit's ExecStart= as systemd hands it over (${VAR} unexpanded)."""
    text = (ROOT / "units" / "gpushift-llama@.service").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    return tuple(shlex.split(line.partition("=")[2]))


class _Units:
    """systemd's answer for each instance of the template (only ``state`` is asked)."""

    def __init__(self, files: dict[str, tuple[tuple[str, bool], ...]]) -> None:
        self.files = files

    def state(self, unit: str) -> UnitState:
        n = unit.split("@")[1].split(".")[0]
        return UnitState(
            unit,
            "loaded",
            "inactive",
            "dead",
            exec_start=_template_argv(),
            fragment_path="/etc/systemd/system/gpushift-llama@.service",
            environment=("CUDA_DEVICE_ORDER=PCI_BUS_ID", f"CUDA_VISIBLE_DEVICES={n}"),
            environment_files=self.files.get(unit, ()),
            kill_mode="control-group",
            timeout_stop_usec=30_000_000,
        )


CONFIG = """[backends.night]
kind = "llama-server"
instances = [
  { unit = "gpushift-llama@0.service", health_url = "http://127.0.0.1:8081/health", gpus = [0] },
  { unit = "gpushift-llama@1.service", health_url = "http://127.0.0.1:8082/health", gpus = [1] },
]
"""


def _shipped(tmp_path: Path) -> dict[str, tuple[tuple[str, bool], ...]]:
    """Copies of the shipped environment files, one per instance, as EnvironmentFiles names them."""
    out = {}
    for n in (0, 1):
        dest = tmp_path / f"llama@{n}.env"
        dest.write_text((ROOT / "etc" / "gpushift" / f"llama@{n}.env").read_text())
        out[f"gpushift-llama@{n}.service"] = ((str(dest), False),)
    return out


def _check(files: dict[str, tuple[tuple[str, bool], ...]]) -> list[Any]:
    cfg = parse(CONFIG, "/etc/gpushift/t.toml")
    units = cast(UnitControl, _Units(files))
    findings, _facts, _states = run_checks(cfg, units, cast(GpuProbe, None), None, facts=FACTS)
    return findings


def _codes(findings: list[Any]) -> list[str]:
    return [f.code for f in findings]


def test_check_the_shipped_template_with_its_environment_files_has_no_env_undefined(tmp_path: Path) -> None:
    findings = _check(_shipped(tmp_path))
    assert "env-undefined" not in _codes(findings), [f.message for f in findings]
    assert "health-url-port" not in _codes(findings), [f.message for f in findings]


def test_check_an_instance_whose_port_is_not_its_health_urls_is_named(tmp_path: Path) -> None:
    files = _shipped(tmp_path)
    (tmp_path / "llama@1.env").write_text("# moved\nPORT=9090\nMODEL=/models/x.gguf\n")
    (f,) = [f for f in _check(files) if f.code == "health-url-port"]
    assert f.severity == "warning" and "gpushift-llama@1.service" in f.message
    assert "8082" in f.message and "9090" in f.message


def test_check_without_the_files_still_warns_and_says_which_file_was_not_read(tmp_path: Path) -> None:
    missing = str(tmp_path / "llama@0.env")
    (f,) = [f for f in _check({"gpushift-llama@0.service": ((missing, False),)}) if f.code == "env-undefined"]
    assert "$MODEL" in f.message and "$PORT" in f.message and f"{missing}: does not exist" in f.message
    # one systemd may do without ("-" prefix) is not named
    (g,) = [f for f in _check({"gpushift-llama@0.service": ((missing, True),)}) if f.code == "env-undefined"]
    assert "not read" not in g.message


def test_unit_environment_reads_regular_files_only_and_lets_a_file_win(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.env"
    os.mkfifo(fifo)  # opening it would block: it is skipped, never opened for reading
    env_file = tmp_path / "a.env"
    env_file.write_text('PORT=8081\nMODEL="/models/a b.gguf"\n; comment\n')
    st = UnitState(
        "x.service",
        "loaded",
        "inactive",
        "dead",
        environment=("PORT=1", "KEEP=yes"),
        environment_files=((str(env_file), False), (str(fifo), False), (str(tmp_path / "*.env"), True)),
    )
    env, unread = unit_environment(st)
    assert env == {"PORT": "8081", "MODEL": "/models/a b.gguf", "KEEP": "yes"}
    assert [u.split(":")[0] for u in unread] == [str(fifo), str(fifo)]  # named, and through the wildcard
    assert "FIFO" in unread[0]
