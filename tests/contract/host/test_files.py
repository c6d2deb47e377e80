"""The one atomic write (``gpushift/host/files.py``) on real files: the whole new content or the old,
the mode asked for whatever the umask, fsyncs only when durable, nothing left behind on failure."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gpushift.host import files


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_write_atomic_replaces_the_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"old")
    files.write_atomic(str(path), b"new" * 100_000)
    assert path.read_bytes() == b"new" * 100_000
    assert os.listdir(tmp_path) == ["a.json"]


def test_write_atomic_gives_the_mode_asked_for_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        files.write_atomic(str(tmp_path / "world.prom"), b"x", mode=0o644)
        files.write_atomic(str(tmp_path / "group"), b"x", mode=0o640)
        files.write_atomic(str(tmp_path / "umask"), b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "world.prom") == 0o644
    assert _mode(tmp_path / "group") == 0o640
    assert _mode(tmp_path / "umask") == 0o600  # no mode: what open() gives, 0666 less the umask


def test_write_atomic_replaces_an_existing_file_of_another_mode(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"old")
    path.chmod(0o600)
    files.write_atomic(str(path), b"new", mode=0o644)
    assert _mode(path) == 0o644 and path.read_bytes() == b"new"


def test_write_atomic_durable_fsyncs_the_file_and_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_fsyncs(monkeypatch)
    files.write_atomic(str(tmp_path / "x"), b"x")
    assert len(calls) == 2  # the file before the rename, the directory after it


def test_write_atomic_not_durable_never_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_fsyncs(monkeypatch)
    files.write_atomic(str(tmp_path / "x"), b"x", durable=False)
    assert calls == []


def test_write_atomic_makes_the_directory_only_when_asked(tmp_path: Path) -> None:
    made = tmp_path / "made" / "x"
    files.write_atomic(str(made), b"x")
    assert made.read_bytes() == b"x" and _mode(made.parent) & 0o777 <= files.DIR_MODE
    with pytest.raises(FileNotFoundError):
        files.write_atomic(str(tmp_path / "missing" / "x"), b"x", make_dir=False)
    assert not (tmp_path / "missing").exists()


def test_write_atomic_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.mkdir()  # a directory in its place: the rename fails
    with pytest.raises(OSError):
        files.write_atomic(str(path), b"new")
    assert path.is_dir() and os.listdir(tmp_path) == ["x"]


def test_write_atomic_from_many_threads_leaves_one_whole_content(tmp_path: Path) -> None:
    path = tmp_path / "x"
    contents = [bytes([65 + i]) * 50_000 for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                files.write_atomic(str(path), data, durable=False)
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=write, args=(c,)) for c in contents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() in contents
    assert os.listdir(tmp_path) == ["x"]


def test_apply_group_of_a_missing_group_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x"
    files.write_atomic(str(path), b"x", group="no-such-group-gpushift")
    assert path.read_bytes() == b"x"


def test_fsync_dir_of_a_missing_directory_is_no_error(tmp_path: Path) -> None:
    files.fsync_dir(str(tmp_path / "missing"))
