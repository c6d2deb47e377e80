"""Reading a file gpushift is configured by (the config, the schedule) — hostile files included —
and the one careful opener of a regular file that every reader of a file from outside uses.

* :func:`open_regular` / :func:`read_bounded`: a regular file only, never opened as anything else,
  a bounded read (:mod:`gpushift.host.safefile` explains how, and names them for the host's
  readers: they live here, the lowest layer that reads a file, so that the config can use them).
  ``within=DIR``: the file the path resolves to must also lie inside ``DIR`` (a state file: no
  symlink out of the state directory).
* :func:`set_aside`: a state file that could not be used renamed ``<name>.bad-<UTC time>`` beside
  it, out of the way of the next start, the newest :data:`SET_ASIDE_KEEP` such copies kept.
* The path may not hold a NUL; the file must be a regular file (a FIFO would block the reader, a
  directory or ``/dev/zero`` is no config).  At most :data:`MAX_BYTES` are read.
* A UTF-8 byte order mark is skipped; bytes that are not UTF-8 are an error naming the line and
  the byte's offset (``file:LINE: not UTF-8: byte 0xNN at offset N``).
* :func:`parse_toml`: a TOML error reads ``file:LINE:COL: not valid TOML: ...``; nesting deep
  enough to exhaust the parser, or an integer too long to convert, is the same clean error.
* :func:`key_lines`: the line of each key and table in TOML text, for error messages that name
  the line of the key (or of the table it is missing from).

Every problem is a :class:`~gpushift.errors.ConfigError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from datetime import datetime, timezone
from typing import Any, BinaryIO

from gpushift.config import validate
from gpushift.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04)
    import tomli as tomllib

#: Largest config or schedule file read (a real one is a few KiB).
MAX_BYTES = 1024 * 1024
_BOM = b"\xef\xbb\xbf"
#: How much :func:`read_bounded` reads by default (a model's ``config.json`` is a few KiB).
DEFAULT_LIMIT_BYTES = 4 * 1024 * 1024


_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symbolic link"),
)


def kind_of(mode: int) -> str:
    """What a file mode names, in words (``FIFO``, ``character device``...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "unknown file type"


def _kind(mode: int) -> str:
    """``a FIFO``, ``a directory``, ``an unknown file type``: for a sentence."""
    name = kind_of(mode)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


class Skipped(OSError):
    """A path that was not read, and why (``reason``): not a regular file (``mode``: what it is), or
    too large (``mode`` None)."""

    def __init__(self, path: str, reason: str, mode: int | None = None) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason
        self.mode = mode

    def __str__(self) -> str:
        return self.reason


def not_regular(mode: int) -> str | None:
    """The skip reason for a mode that is not a regular file; None for a regular file."""
    return None if stat.S_ISREG(mode) else f"not a regular file ({kind_of(mode)})"


def _check_regular(path: str, fd: int) -> None:
    mode = os.fstat(fd).st_mode
    reason = not_regular(mode)
    if reason is not None:
        raise Skipped(path, reason, mode)


def _check_within(path: str, fd: int, within: str) -> None:
    """Skipped unless the object behind ``fd`` (resolved: symlinks followed) lies inside ``within``."""
    real = os.readlink(f"/proc/self/fd/{fd}")
    root = os.path.realpath(within)
    if os.path.commonpath([root, real]) != root:
        raise Skipped(path, f"a symbolic link out of {within} (to {real[:200]})", stat.S_IFLNK)


def open_regular(path: str, *, within: str | None = None) -> BinaryIO:
    """``path`` opened for reading (binary, buffered) — only when it is a regular file: resolved with
    ``O_PATH`` (nothing opened), its type checked on that descriptor, then the same inode opened
    through ``/proc/self/fd/N`` and checked again (:mod:`gpushift.host.safefile` says why).
    ``within``: a directory the resolved file must lie inside (checked on the same descriptor).

    Raises:
        Skipped: it is a FIFO, a device, a socket, a directory... (never opened as such), or it
            resolves to a place outside ``within``.
        OSError: it does not exist, or may not be read (``FileNotFoundError``, ``PermissionError``).
    """
    where = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if within is not None:
            _check_within(path, where, within)
        _check_regular(path, where)
        fd = os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(where)
    try:
        _check_regular(path, fd)  # cannot fail for the same inode; checked on the open descriptor anyway
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str, limit: int = DEFAULT_LIMIT_BYTES, *, within: str | None = None) -> bytes:
    """The whole content of regular file ``path``, when it has at most ``limit`` bytes.

    Raises:
        Skipped: not a regular file, outside ``within`` (see :func:`open_regular`), or larger than
            ``limit`` (nothing beyond ``limit + 1`` bytes is read, whatever the file claims its
            size is).
        OSError: it does not exist or may not be read.
    """
    with open_regular(path, within=within) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Skipped(path, f"larger than {limit} bytes: not read")
    return data


#: How many set-aside copies of one state file are kept (:func:`set_aside`; the oldest go first).
SET_ASIDE_KEEP = 3
_BAD = ".bad-"


def set_aside(path: str, keep: int = SET_ASIDE_KEEP) -> str | None:
    """Rename ``path`` (whatever it is: a FIFO, a symlink, a huge file — never opened) to
    ``<path>.bad-<UTC time>`` in the same directory, and remove all but the newest ``keep`` such
    copies of it.  Returns the new path; None when it could not be renamed (gone already, or the
    directory cannot be written: the caller ignores the file all the same)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    moved = f"{path}{_BAD}{stamp}"
    try:
        os.rename(path, moved)
    except OSError:
        return None
    folder, name = os.path.split(moved)
    prefix = name[: name.rindex(_BAD) + len(_BAD)]
    with contextlib.suppress(OSError):
        with os.scandir(folder or ".") as it:
            copies = sorted(e.name for e in it if e.name.startswith(prefix))
        for old in copies[: max(0, len(copies) - keep)]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, old))
    return moved


def read_text(path: str, what: str, missing_hint: str) -> str:
    """The text of ``path`` (``what``: "config file", "schedule file"), its BOM removed.

    Raises:
        ConfigError: naming the file: missing (with ``missing_hint``), unreadable, not a regular
            file, larger than :data:`MAX_BYTES`, or not UTF-8 (with the line and offset).
    """
    if "\0" in path:
        raise ConfigError(f"{path!r}: the path of the {what} holds a NUL character")
    try:
        raw = read_bounded(path, MAX_BYTES)
    except Skipped as e:
        if e.mode is None:
            raise ConfigError(f"{path}: the {what} is larger than {MAX_BYTES} bytes") from None
        raise ConfigError(f"{path}: the {what} is {_kind(e.mode)}, not a regular file") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found ({missing_hint})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    return decode(raw, path)


def decode(raw: bytes, path: str) -> str:
    """UTF-8 text of ``raw`` without a leading BOM.

    Raises:
        ConfigError: ``path:LINE: not UTF-8: byte 0xNN at offset N`` (offset in the file).
    """
    skip = len(_BOM) if raw.startswith(_BOM) else 0
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = skip + e.start
        line = raw.count(b"\n", 0, at) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8: byte 0x{raw[at]:02x} at offset {at}") from None


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def parse_toml(text: str, path: str) -> dict[str, Any]:
    """The TOML document ``text`` of file ``path``.

    Raises:
        ConfigError: ``path:LINE:COL: not valid TOML: ...`` (``path:1:1:`` where the parser
            names no place: nesting too deep, an integer too long).
    """
    too_deep = validate.nesting_problem(text, comments=True)
    if too_deep is not None:
        raise ConfigError(f"{path}:1:1: not valid TOML: {too_deep}")
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_AT.search(msg)
        where = f"{m.group(1)}:{m.group(2)}" if m else "1:1"
        msg = msg[: m.start()] if m else msg
        raise ConfigError(f"{path}:{where}: not valid TOML: {msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}:1:1: not valid TOML: nested too deeply") from None
    except ValueError as e:  # an integer beyond Python's conversion limit
        raise ConfigError(f"{path}:1:1: not valid TOML: {str(e)[:200]}") from None


_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_PATH = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER = re.compile(rf"\s*\[\[?\s*({_PATH})\s*\]\]?")
_KEY = re.compile(rf"\s*({_PATH})\s*=")
_ONE_PART = re.compile(_PART)


def _dotted(path: str) -> str:
    return ".".join(p.strip("\"'") for p in _ONE_PART.findall(path))


def key_lines(text: str) -> dict[str, int]:
    """``{"daemon": 1, "daemon.poll_interval_s": 3, "backends.a": 7, ...}``: where each table
    header and each key (as a dotted path) first appears.  A best effort for messages: keys
    inside multi-line strings are skipped, keys of inline tables are not listed."""
    out: dict[str, int] = {}
    table = ""
    in_string: str | None = None
    for n, line in enumerate(text.split("\n"), start=1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        m = _HEADER.match(line)
        if m:
            table = _dotted(m.group(1))
            out.setdefault(table, n)
            continue
        m = _KEY.match(line)
        if m:
            key = _dotted(m.group(1))
            out.setdefault(f"{table}.{key}" if table else key, n)
            rest = line[m.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_string = quote
    return out


def line_of(lines: dict[str, int], key: str) -> int:
    """The line of ``key``, else of the nearest table or key above it that has one, else 1."""
    parts = key.split(".")
    while parts:
        n = lines.get(".".join(parts))
        if n is not None:
            return n
        parts.pop()
    return 1


DEFAULT_CONFIG_PATH = "/etc/gpushift/gpushift.toml"
ENV_CONFIG = "GPUSHIFT_CONFIG"


def config_path(explicit: str | None = None) -> str:
    """``--config`` wins, then ``$GPUSHIFT_CONFIG``, then the default path."""
    return explicit or os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH


def daemon_bus(explicit: str | None = None) -> str | None:
    """``[daemon] bus`` of the config file, read without validating the rest (``None``: the file
    cannot be read or parsed, or the key is not ``system``/``session``; the caller then loads the
    config to report why).  ``gpushift status`` and ``gpushift switch`` need nothing else before
    they ask the daemon, which validated its own config; importing and running the whole
    validation costs them more than the daemon's answer."""
    path = config_path(explicit)
    try:
        data = parse_toml(read_text(path, "config file", ""), path)
    except ConfigError:
        return None
    daemon = data.get("daemon", {})
    bus = daemon.get("bus", "system") if isinstance(daemon, dict) else None
    return bus if bus in ("system", "session") else None
