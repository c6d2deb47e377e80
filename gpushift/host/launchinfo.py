"""What a launch looked like, for the ledger (``SwitchRecord.extra["launch"]``).

``collect_launch_info`` describes the unit (Environment, WorkingDirectory, User, unit file and
drop-ins with their sha256), the model files named in the argv (path, size, mtime, a fast
fingerprint) and the host (name, kernel).  GPU facts and versions are recorded elsewhere
(``gpu_facts``, ``backend_version``).

The model fingerprint is sha256 over the size, the first 16 MiB and the last 16 MiB: a 15 GB GGUF
must not be read on every switch.  The trade-off: a change that keeps the size and touches neither
end (a byte in the middle) is NOT detected; a re-download, a different quantisation, a truncated
copy or a file re-written from its start is.  The mtime is recorded beside it as a second hint.

Every path here comes from outside (the backend's command line, systemd's unit paths): files are
opened only through :mod:`gpushift.host.safefile` (a regular file, checked on the descriptor,
never a FIFO or a device), and an entry that is not a regular file is recorded with ``skipped``
(``"not a regular file (FIFO)"``) instead of being read.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import stat
import time
from collections.abc import MutableMapping, Sequence
from datetime import datetime, timezone
from typing import Any

from gpushift.backends import cmdline
from gpushift.host import safefile
from gpushift.safetext import redact
from gpushift.values import UnitState

#: The key the switcher stores the result under, in ``SwitchRecord.extra``.
LAUNCH_KEY = "launch"

#: Format of this dict; bump when a key changes meaning.
LAUNCH_INFO_FORMAT = 1

#: Bytes read from each end of a model file for its fingerprint.
EDGE_BYTES = 16 * 1024 * 1024
FINGERPRINT_PREFIX = "fp1:"

#: A model directory (vLLM's Hugging Face layout) is fingerprinted file by file, up to this many.
MAX_DIR_FILES = 256
#: A model directory's walk stops after this many entries (a command line naming ``/`` must not
#: make a switch walk the whole filesystem).
MAX_DIR_ENTRIES = 4096
#: Unit files and drop-ins are hashed up to this size; a larger one is not hashed.
MAX_UNIT_FILE_BYTES = 1024 * 1024


def fingerprint_file(path: str, size: int | None = None) -> str:
    """``fp1:`` + sha256(size as 8 bytes, first 16 MiB, last 16 MiB) — at most 32 MiB read.

    A file of at most 32 MiB is read once, whole.

    Raises:
        safefile.Skipped: ``path`` is not a regular file (it is never opened as a FIFO or device).
        OSError: it cannot be read.
    """
    h = hashlib.sha256()
    with safefile.open_regular(path) as f:
        if size is None:
            size = os.fstat(f.fileno()).st_size
        h.update(b"gpushift-fp1\0")
        h.update(size.to_bytes(8, "big"))
        if size <= 2 * EDGE_BYTES:
            _copy(f, h, size)
        else:
            _copy(f, h, EDGE_BYTES)
            f.seek(size - EDGE_BYTES)
            _copy(f, h, EDGE_BYTES)
    return FINGERPRINT_PREFIX + h.hexdigest()


def _copy(f: Any, h: Any, n: int) -> None:
    while n > 0:
        chunk = f.read(min(n, 1024 * 1024))
        if not chunk:
            break
        h.update(chunk)
        n -= len(chunk)


def _mtime_iso(st: os.stat_result) -> str:
    return datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat()


def _cached_fingerprint(path: str, st: os.stat_result, cache: MutableMapping[Any, str] | None) -> str:
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if cache is not None and key in cache:
        return cache[key]
    fp = fingerprint_file(path, st.st_size)
    if cache is not None:
        cache[key] = fp
    return fp


def describe_model(
    flag: str, value: str, working_directory: str = "", cache: MutableMapping[Any, str] | None = None
) -> dict[str, Any]:
    """One model argument: what it points at, how big, how old, and its fingerprint."""
    info: dict[str, Any] = {"flag": flag, "path": value}
    path = value
    if not os.path.isabs(path) and working_directory:
        path = os.path.join(working_directory, path)
    info["resolved"] = os.path.abspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        # vLLM also takes a hub id ("Qwen/Qwen2.5-7B-Instruct"); nothing local to fingerprint then.
        info["kind"] = "missing"
        info["error"] = "no such file (a hub id, or a path that does not exist on this host)"
        return info
    except OSError as e:
        info["kind"] = "unreadable"
        info["error"] = f"{e.strerror or e}"
        return info
    info["mtime"] = _mtime_iso(st)
    skip = None if stat.S_ISDIR(st.st_mode) else safefile.not_regular(st.st_mode)
    if skip is not None:  # a FIFO, a device, a socket: never opened
        info["kind"] = "skipped"
        info["skipped"] = skip
        return info
    try:
        if stat.S_ISDIR(st.st_mode):
            info.update(_describe_dir(path, cache))
        else:
            info["kind"] = "file"
            info["size_bytes"] = st.st_size
            info["fingerprint"] = _cached_fingerprint(path, st, cache)
    except safefile.Skipped as e:  # swapped for a FIFO or device since the stat
        info["kind"] = "skipped"
        info["skipped"] = e.reason
        info.pop("size_bytes", None)
    except OSError as e:
        info["error"] = f"{e.strerror or e}"
    return info


def _describe_dir(path: str, cache: MutableMapping[Any, str] | None) -> dict[str, Any]:
    """A model directory: every regular file under it (names, sizes, per-file fingerprints)."""
    files: list[tuple[str, os.stat_result]] = []
    seen = 0
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            full = os.path.join(root, n)
            seen += 1
            try:
                st = os.stat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):  # a FIFO or device inside is left out, never opened
                files.append((os.path.relpath(full, path), st))
        if seen >= MAX_DIR_ENTRIES:
            break
    files.sort()
    h = hashlib.sha256(b"gpushift-dir-fp1\0")
    total = 0
    truncated = len(files) > MAX_DIR_FILES
    for rel, st in files[:MAX_DIR_FILES]:
        total += st.st_size
        try:
            fp = _cached_fingerprint(os.path.join(path, rel), st, cache)
        except safefile.Skipped as e:  # swapped for a FIFO or device since the walk
            fp = f"skipped: {e.reason}"
        h.update(f"{rel}\0{st.st_size}\0{fp}\n".encode())
    for _rel, st in files[MAX_DIR_FILES:]:
        total += st.st_size
    out: dict[str, Any] = {
        "kind": "dir",
        "size_bytes": total,
        "files": len(files),
        "fingerprint": FINGERPRINT_PREFIX + h.hexdigest(),
    }
    notes = []
    if truncated:
        notes.append(f"only the first {MAX_DIR_FILES} files are fingerprinted")
    if seen >= MAX_DIR_ENTRIES:
        notes.append(f"the walk stopped after {seen} entries")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def sha256_file(path: str) -> tuple[str | None, str | None]:
    """(sha256 hex, None) or (None, why not) — for small files (unit files, drop-ins): a regular
    file of at most :data:`MAX_UNIT_FILE_BYTES`."""
    if not path:
        return None, "no path"
    try:
        return hashlib.sha256(safefile.read_bounded(path, MAX_UNIT_FILE_BYTES)).hexdigest(), None
    except safefile.Skipped as e:
        return None, e.reason
    except OSError as e:
        return None, f"{e.strerror or e}"


def parse_environment(entries: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``KEY=value`` strings → dict, with credential-looking values replaced by a digest."""
    env: dict[str, str] = {}
    redacted: list[str] = []
    for item in entries:
        key, sep, value = item.partition("=")
        if not sep:
            continue
        if redact.is_secret_name(key):
            # kept as a digest: the ledger is readable by the gpushift group, and a diff still
            # shows that the value changed
            value = redact.digest(value)
            redacted.append(key)
        env[key] = value
    return env, redacted


def host_facts() -> dict[str, Any]:
    """Host name, kernel release, OS name."""
    facts: dict[str, Any] = {"hostname": socket.gethostname(), "kernel": platform.release()}
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    facts["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return facts


def collect_launch_info(
    unit_state: UnitState, argv: Sequence[str], cache: MutableMapping[Any, str] | None = None
) -> dict[str, Any]:
    """Describe one launch for the ledger.

    Args:
        unit_state: systemd's view of the backend unit (after it started).
        argv: the command as it runs (``/proc/MainPID/cmdline``), or as configured.
        cache: optional dict the caller keeps between switches; fingerprints of unchanged files
            (same inode, size and mtime) are taken from it instead of reading the file again.

    Returns:
        A JSON-ready dict: ``format``, ``collected_at``, ``collect_s``, ``host``, ``unit``
        (name, path, sha256, drop_ins, environment, working_directory, user), ``models`` and
        ``redacted_env`` (names whose values were replaced by a digest).  Never raises for a
        missing or unreadable file: the entry carries ``error`` instead.
    """
    t0 = time.monotonic()
    unit_sha, unit_err = sha256_file(unit_state.fragment_path)
    drop_ins = []
    for p in unit_state.drop_in_paths:
        sha, err = sha256_file(p)
        drop_ins.append({"path": p, "sha256": sha, "error": err})
    env, redacted = parse_environment(unit_state.environment)
    models = [
        describe_model(flag, value, unit_state.working_directory, cache)
        for flag, value in cmdline.model_files(argv)
    ]
    return {
        "format": LAUNCH_INFO_FORMAT,
        "collected_at": datetime.now(timezone.utc).isoformat(),
        "host": host_facts(),
        "unit": {
            "name": unit_state.name,
            "path": unit_state.fragment_path or None,
            "sha256": unit_sha,
            "error": unit_err if unit_state.fragment_path else None,
            "drop_ins": drop_ins,
            "environment": env,
            "working_directory": unit_state.working_directory or None,
            "user": unit_state.user or None,
        },
        "models": models,
        "redacted_env": redacted,
        "collect_s": round(time.monotonic() - t0, 4),
    }
