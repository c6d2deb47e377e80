"""Pre-warm as a look-ahead consumer (gpushift/prewarm/consumer.py): which files it reads for a
coming switch, what it skips, when it ends its reader, and what the switch's row records.  The
files are real (tmp_path); systemd's answer and the reader process are stand-ins (the real reader
is tests/contract/prewarm/test_prewarm_reader.py, the whole daemon tests/integration/test_prewarm_e2e.py)."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpushift.config.schema import Config, parse
from gpushift.keeper import Coming
from gpushift.prewarm.consumer import Prewarming
from gpushift.prewarm.plan import MARGIN_BYTES
from gpushift.values import UnitState

AT = datetime(2026, 12, 1, 20, 0, tzinfo=timezone.utc)


class Job:
    """The reader as the consumer sees it: started, abandoned, a summary."""

    made: list[Job] = []

    def __init__(self, backend: str, paths: list[str], rate: float) -> None:
        self.backend, self.paths, self.rate = backend, paths, rate
        self.started = self.abandoned = False
        self.pid = 4242
        Job.made.append(self)

    def start(self) -> None:
        self.started = True

    def abandon(self) -> None:
        self.abandoned = True

    def summary(self) -> dict[str, Any]:
        return {"backend": self.backend, "paths": self.paths, "abandoned": self.abandoned, "bytes": 7}


class Units:
    def __init__(self, exec_start: tuple[str, ...], environment: tuple[str, ...] = ()) -> None:
        self.exec_start, self.environment = exec_start, environment

    def state(self, unit: str) -> UnitState:
        return UnitState(unit, "loaded", "inactive", "dead", exec_start=self.exec_start,
                         environment=self.environment)  # fmt: skip


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((event, kw))


def config(night: str = "", rate: str = "") -> Config:
    return parse(
        f"""
[daemon]
{rate}
[backends.day]
unit = "day.service"
health_url = "http://127.0.0.1:8000/health"
prewarm_lead_s = 0

[backends.night]
unit = "night.service"
kind = "llama-server"
health_url = "http://127.0.0.1:8080/health"
{night}
""",
        "/etc/gpushift/prewarm-test.toml",
    )


def make(
    cfg: Config, units: Units, meminfo: int = 64 * 1024**3, switching: str | None = None
) -> tuple[Prewarming, Log]:
    Job.made = []
    log = Log()
    p = Prewarming(lambda: cfg, units, log, job=Job, meminfo=lambda: meminfo,
                   switching_to=lambda: switching)  # fmt: skip
    return p, log


def coming(target: str = "night") -> Coming:
    return Coming(at=AT, target=target, from_backend="day", why="0 20 * * * night", line=3)


def test_the_lead_is_the_target_backends_own_and_zero_turns_it_off() -> None:
    p, _ = make(config("prewarm_lead_s = 900"), Units(()))
    assert p.lead_s(coming("night")) == 900.0
    assert p.lead_s(coming("day")) is None  # prewarm_lead_s = 0
    assert p.lead_s(coming("gone")) is None  # not configured (a reload removed it)
    default, _ = make(config(), Units(()))
    assert default.lead_s(coming("night")) == 120.0


def test_it_reads_the_model_the_units_exec_start_names_with_its_environment_expanded(tmp_path: Path) -> None:
    model = tmp_path / "qwen.Q4_K_M.gguf"
    model.write_bytes(b"\0" * 4096)
    units = Units(("/usr/bin/llama-server", "-m", "${MODEL}", "-c", "32768"), (f"MODEL={model}",))
    p, log = make(config(rate="prewarm_rate_mib_s = 64"), units)
    p.act(coming())
    (job,) = Job.made
    assert job.started and job.backend == "night" and job.paths == [str(model)]
    assert job.rate == 64 * 1024 * 1024
    started = dict(log.lines)["prewarm_started"]
    assert started["bytes"] == 4096 and started["pid"] == 4242


def test_a_fifo_is_skipped_and_files_beyond_the_memory_budget_are_left_out(tmp_path: Path) -> None:
    d = tmp_path / "model"
    d.mkdir()
    (d / "small.bin").write_bytes(b"x" * 1000)
    (d / "large.bin").write_bytes(b"x" * 5000)
    os.mkfifo(d / "pipe")
    p, _ = make(config(f'prewarm_paths = ["{d}"]'), Units(()), meminfo=MARGIN_BYTES + 3000)
    p.act(coming())
    (job,) = Job.made
    assert job.paths == [str(d / "small.bin")]  # whole files, smallest first, within MemAvailable - margin
    facts = p.row_facts("night")["prewarm"]
    why = {Path(f["path"]).name: f["why"] for f in facts["skipped_files"]}
    assert why["pipe"] == "FIFO"
    assert "over the memory budget" in why["large.bin"]
    assert facts["for_boundary"] == AT.isoformat()


def test_nothing_to_read_starts_no_reader(tmp_path: Path) -> None:
    p, log = make(config(f'prewarm_paths = ["{tmp_path / "absent.gguf"}"]'), Units(()))
    p.act(coming())
    assert Job.made == [] and "prewarm_nothing" in dict(log.lines)
    assert p.row_facts("night") == {}


def test_the_row_of_the_next_switch_to_that_backend_records_it_once(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"y" * 10)
    p, _ = make(config(f'prewarm_paths = ["{f}"]'), Units(()))
    p.act(coming())
    assert p.row_facts("day") == {}  # a switch elsewhere takes nothing
    assert p.row_facts("night")["prewarm"]["bytes"] == 7
    assert p.row_facts("night") == {}  # once


def test_a_boundary_called_off_ends_the_reader(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"y" * 10)
    p, log = make(config(f'prewarm_paths = ["{f}"]'), Units(()))
    p.act(coming())
    other = Coming(at=AT.replace(hour=21), target="night", from_backend="day", why="moved")
    p.abandon(other)  # not the switch it read for: nothing happens
    assert not Job.made[0].abandoned
    p.abandon(coming())
    assert Job.made[0].abandoned and "prewarm_abandoned" in dict(log.lines)
    assert p.row_facts("night") == {}


def test_called_off_by_a_switch_to_that_very_backend_now_it_keeps_the_pre_warm_for_the_row(
    tmp_path: Path,
) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"y" * 10)
    p, _ = make(config(f'prewarm_paths = ["{f}"]'), Units(()), switching="night")
    p.act(coming())
    p.abandon(coming())  # a person ran `gpushift switch night` before the boundary
    assert not Job.made[0].abandoned
    assert p.row_facts("night")["prewarm"]["abandoned"] is False


def test_a_second_boundary_replaces_the_reader_and_stop_ends_every_reader(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"y" * 10)
    p, _ = make(config(f'prewarm_paths = ["{f}"]'), Units(()))
    p.act(coming())
    p.act(Coming(at=AT.replace(day=2), target="night", from_backend="day", why="tomorrow"))
    first, second = Job.made
    assert first.abandoned and not second.abandoned
    p.stop()
    assert second.abandoned
