"""The one opener of paths from outside (``gpushift/host/safefile.py``) on real files: only a
regular file is opened, symlinks to one are followed, anything else is skipped with its type named
and without being opened, and reads are bounded."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpushift.config import textfile
from gpushift.errors import ConfigError
from gpushift.host import safefile


@pytest.fixture
def fifo(fifos: Callable[[str], Path]) -> Path:
    return fifos("fifo")


def _skip_reason(path: str | Path) -> str:
    t0 = time.monotonic()
    with pytest.raises(safefile.Skipped) as e:
        safefile.open_regular(str(path))
    assert time.monotonic() - t0 < 1.0
    return e.value.reason


def test_safefile_regular_file_is_read(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_bytes(b'{"a": 1}')
    with safefile.open_regular(str(p)) as f:
        assert f.read() == b'{"a": 1}'
    assert safefile.read_bounded(str(p), 8) == b'{"a": 1}'


def test_safefile_symlink_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    # The Hugging Face cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"weights")
    link = tmp_path / "model.safetensors"
    link.symlink_to(blob)
    assert safefile.read_bounded(str(link)) == b"weights"


def test_safefile_fifo_is_skipped_without_blocking(fifo: Path) -> None:
    assert _skip_reason(fifo) == "not a regular file (FIFO)"


def test_safefile_symlink_to_a_fifo_is_skipped(tmp_path: Path, fifo: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert _skip_reason(link) == "not a regular file (FIFO)"


def test_safefile_devices_sockets_and_directories_are_skipped(tmp_path: Path) -> None:
    assert _skip_reason("/dev/zero") == "not a regular file (character device)"
    assert _skip_reason("/dev/null") == "not a regular file (character device)"
    assert _skip_reason(tmp_path) == "not a regular file (directory)"
    sock = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert _skip_reason(sock) == "not a regular file (socket)"


def test_safefile_missing_file_is_an_oserror_not_a_skip(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safefile.open_regular(str(tmp_path / "missing"))


def test_safefile_read_is_bounded_whatever_the_size(tmp_path: Path) -> None:
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.truncate(64 * 1024**3)  # 64 GiB of hole: reading it whole would take minutes
    t0 = time.monotonic()
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(huge), 1024)
    assert time.monotonic() - t0 < 1.0 and "larger than 1024 bytes" in e.value.reason
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 1024)
    assert len(safefile.read_bounded(str(exact), 1024)) == 1024


def test_safefile_opened_descriptor_is_nonblocking_and_not_inherited(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x")
    import fcntl

    with safefile.open_regular(str(p)) as f:
        flags = fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
        assert flags & os.O_NONBLOCK and flags & os.O_ACCMODE == os.O_RDONLY
        assert not os.get_inheritable(f.fileno())


def test_safefile_skipped_is_an_oserror_so_existing_handlers_catch_it(fifo: Path) -> None:
    with pytest.raises(OSError):
        safefile.open_regular(str(fifo))


def test_safefile_is_the_opener_the_config_reads_its_files_with(fifo: Path, tmp_path: Path) -> None:
    """One opener (gpushift/config/textfile.py, below the host in the layers): what the config says
    about a FIFO or a large file comes from the same skip, which carries the file's mode."""
    assert safefile.open_regular is textfile.open_regular and safefile.read_bounded is textfile.read_bounded
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(fifo))
    assert e.value.mode is not None and stat.S_ISFIFO(e.value.mode)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    with pytest.raises(safefile.Skipped) as e:
        safefile.read_bounded(str(big), 10)
    assert e.value.mode is None
    with pytest.raises(ConfigError, match="the config file is a FIFO, not a regular file"):
        textfile.read_text(str(fifo), "config file", "")
