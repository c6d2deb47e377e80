"""run.json on real files (gpushift/switch/runstore.py): what save writes, load reads back (the newer
of the state and runtime directories' copies); a FIFO, a symlink to /dev/zero or out of the
directory, a file past the bound or damaged is never opened as such, is moved aside and said so,
and load goes on as if no switch had been in flight."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpushift.switch.runstore import MAX_BYTES, JsonRunStore


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    run.mkdir()
    return state, run


def store(dirs: tuple[Path, Path], log: Log) -> JsonRunStore:
    return JsonRunStore(str(dirs[0]), str(dirs[1]), log=log)


def test_runstore_save_then_load_and_clear(dirs: tuple[Path, Path]) -> None:
    log = Log()
    s = store(dirs, log)
    s.save({"ticket": "t1", "phase": "stopping"})
    assert s.load() == {"ticket": "t1", "phase": "stopping"}
    s.clear()
    assert s.load() is None and s.ignored is None and log.lines == []


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _outside(p: Path) -> None:
    other = p.parent.parent / "elsewhere.json"
    other.write_text('{"ticket": "planted"}')
    p.symlink_to(other)


def _too_big(p: Path) -> None:
    p.write_bytes(b'{"ticket": "t", "pad": "' + b"x" * MAX_BYTES + b'"}')


def _damaged(p: Path) -> None:
    p.write_bytes(b"[" * 100_000)


def _no_ticket(p: Path) -> None:
    p.write_text('{"phase": "stopping"}')


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_fifo, "not a regular file (FIFO)"),
        (_dev_zero, "a symbolic link out of"),
        (_outside, "a symbolic link out of"),
        (_too_big, f"larger than {MAX_BYTES} bytes"),
        (_damaged, "not valid JSON: nested deeper than"),
        (_no_ticket, "not a run gpushift wrote"),
    ],
    ids=["fifo", "dev-zero", "outside", "too-big", "damaged", "no-ticket"],
)
def test_runstore_a_bad_file_is_set_aside_and_said_so(dirs: tuple[Path, Path], make: Any, why: str) -> None:
    log = Log()
    path = dirs[0] / "run.json"
    make(path)
    t0 = time.monotonic()
    s = store(dirs, log)
    assert s.load() is None
    assert time.monotonic() - t0 < 5
    assert not os.path.lexists(path)
    (moved,) = dirs[0].glob("run.json.bad-*")
    ((event, fields),) = log.lines
    assert event == "run_store_set_aside" and fields["path"] == str(path) and fields["moved_to"] == str(moved)
    assert why in fields["error"], fields
    assert s.ignored and why in s.ignored and str(moved) in s.ignored
    s.save({"ticket": "t2"})  # the next switch writes its run as ever
    assert s.load() == {"ticket": "t2"} and s.ignored is None


def test_runstore_a_bad_fallback_does_not_hide_the_state_directory_s_run(dirs: tuple[Path, Path]) -> None:
    log = Log()
    s = store(dirs, log)
    s.save({"ticket": "t1"})
    os.mkfifo(dirs[1] / "run.json")
    assert s.load() == {"ticket": "t1"}
    assert [e for e, _ in log.lines] == ["run_store_set_aside"]
    assert list(dirs[1].glob("run.json.bad-*"))
