"""The careful reader's ``within=`` (a state file: no symlink out of its directory) and
:func:`gpushift.config.textfile.set_aside` (a bad state file renamed beside itself, the newest few
kept), on real files (gpushift/config/textfile.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpushift.config import textfile
from gpushift.host import safefile


def test_within_reads_a_file_of_the_directory_and_a_link_inside_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "real.json").write_bytes(b"{}")
    (tmp_path / "run.json").symlink_to(tmp_path / "sub" / "real.json")
    assert safefile.read_bounded(str(tmp_path / "run.json"), 10, within=str(tmp_path)) == b"{}"


def test_within_refuses_a_symlink_out_of_the_directory(tmp_path: Path) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside.json"
    state.mkdir()
    outside.write_bytes(b"{}")
    (state / "run.json").symlink_to(outside)
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(state / "run.json"), 10, within=str(state))
    assert e.value.reason == f"a symbolic link out of {state} (to {outside})"
    assert safefile.read_bounded(str(state / "run.json"), 10) == b"{}"  # without within: followed


def test_within_refuses_dev_zero_without_reading_it(tmp_path: Path) -> None:
    (tmp_path / "run.json").symlink_to("/dev/zero")
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(tmp_path / "run.json"), within=str(tmp_path))
    assert "a symbolic link out of" in e.value.reason and "/dev/zero" in e.value.reason


def test_within_a_fifo_in_the_directory_is_skipped_as_a_fifo(fifos: Callable[[str], Path]) -> None:
    f = fifos("state/run.json")
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(f), within=str(f.parent))
    assert e.value.reason == "not a regular file (FIFO)"


def test_within_a_directory_that_is_itself_a_link_is_resolved_first(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "run.json").write_bytes(b"[]")
    (tmp_path / "state").symlink_to(tmp_path / "real")  # /var/lib/gpushift -> /srv/gpushift
    assert (
        safefile.read_bounded(str(tmp_path / "state" / "run.json"), within=str(tmp_path / "state")) == b"[]"
    )


def test_set_aside_renames_whatever_it_is_and_keeps_the_newest_few(fifos: Callable[[str], Path]) -> None:
    f = fifos("state/run.json")
    folder = f.parent
    (folder / "run.json.other").write_bytes(b"kept")  # another name: never touched
    moved = []
    for i in range(textfile.SET_ASIDE_KEEP + 2):
        if i:
            (folder / "run.json").symlink_to("/dev/zero")
        m = textfile.set_aside(str(folder / "run.json"))
        assert m is not None and m.startswith(f"{folder / 'run.json'}.bad-"), m
        assert not os.path.lexists(folder / "run.json")
        moved.append(m)
    left = sorted(str(p) for p in folder.glob("run.json.bad-*"))
    assert left == moved[-textfile.SET_ASIDE_KEEP :]
    assert (folder / "run.json.other").read_bytes() == b"kept"


def test_set_aside_of_a_missing_file_says_none(tmp_path: Path) -> None:
    assert textfile.set_aside(str(tmp_path / "gone.json")) is None
