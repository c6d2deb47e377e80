"""The reader of the config file's keys — one error format and one set of type and range checks.

:class:`KeyReader` reads the values of one table's keys (a string, a number in its range, a list of
strings, a list of GPU indices, a URL...) and refuses unknown keys; every refusal is a
:class:`~gpushift.errors.ConfigError` that reads ``path:LINE: key: what was expected``, the line of
the key (or of the table it is missing from).  ``config/schema.py``'s reader is one (the daemon,
GPU, backend and metrics tables), and it hands itself to ``config/hooks.py`` for the ``[hooks]``
and ``[notify]`` tables, and ``config/instances.py`` for a backend's instances.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpushift.config import textfile, validate
from gpushift.errors import ConfigError

#: Longest path, URL or other string value.
STRING_MAX = 4096


class KeyReader:
    """Args:
    path: the config file's path (the errors name it).
    lines: the line of each key and table (:func:`gpushift.config.textfile.key_lines`).
    """

    def __init__(self, path: str, lines: dict[str, int] | None = None) -> None:
        self.path = path
        self.lines = lines or {}

    def err(self, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.path}:{textfile.line_of(self.lines, key)}: {key}: {msg}")

    def one_line(self, key: str, v: str) -> str:
        problem = validate.line_problem(v, STRING_MAX)
        if problem is not None:
            raise self.err(key, f"{validate.shown(v)}: {problem}")
        return v

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        v = data.get(key.split(".")[-1], {})
        if not isinstance(v, dict):
            raise self.err(key, f"expected a table [{key}], got {type(v).__name__}")
        return v

    def no_unknown(self, data: Mapping[str, Any], where: str, allowed: set[str]) -> None:
        for k in data:
            if k not in allowed:
                raise self.err(
                    f"{where}.{k}" if where else k,
                    f"unknown key (expected one of: {', '.join(sorted(allowed))})",
                )

    def string(
        self, d: Mapping[str, Any], where: str, key: str, default: Any, choices: tuple[str, ...] = ()
    ) -> Any:
        if key not in d:
            return default
        v = d[key]
        if not isinstance(v, str) or not v:
            raise self.err(f"{where}.{key}", f"expected a non-empty string, got {validate.shown(v)}")
        self.one_line(f"{where}.{key}", v)
        if choices and v not in choices:
            raise self.err(f"{where}.{key}", f"expected one of {', '.join(map(repr, choices))}, got {v!r}")
        return v

    def number(
        self,
        d: Mapping[str, Any],
        where: str,
        key: str,
        default: float,
        minimum: float = 0.0,
        integer: bool = False,
        maximum: float | None = None,
    ) -> Any:
        """A number in [minimum, maximum] (every key has a maximum: docs/config.md)."""
        if key not in d:
            return default
        v = d[key]
        ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok_type:
            kind = "an integer" if integer else "a number"
            raise self.err(f"{where}.{key}", f"expected {kind}, got {validate.shown(v)}")
        # An int is compared exactly (one of hundreds of digits has no float: no OverflowError).
        if isinstance(v, float) and not math.isfinite(v):
            # A NaN or infinite timeout never compares as expired: a wait would never end.
            raise self.err(f"{where}.{key}", f"expected a finite number, got {v!r}")
        if v < minimum:
            raise self.err(f"{where}.{key}", f"expected a value >= {minimum:g}, got {validate.shown(v)}")
        if maximum is not None and v > maximum:
            raise self.err(f"{where}.{key}", f"expected a value <= {maximum:g}, got {validate.shown(v)}")
        return v

    def strings(self, d: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise self.err(
                f"{where}.{key}", f'expected a list of strings (e.g. ["GPU-1a2b…"]), got {validate.shown(v)}'
            )
        for x in v:
            self.one_line(f"{where}.{key}", x)
        return tuple(v)

    def absolute_paths(self, d: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
        paths = self.strings(d, where, key)
        for p in paths:
            if not p.startswith("/"):
                raise self.err(f"{where}.{key}", f"expected absolute paths, got {p!r}")
        return paths

    def url(self, d: Mapping[str, Any], where: str, key: str, required: bool = False) -> str | None:
        if key not in d:
            if required:
                raise self.err(f"{where}.{key}", "missing (expected an http:// URL)")
            return None
        v = d[key]
        if not isinstance(v, str):
            raise self.err(f"{where}.{key}", f"expected an http:// or https:// URL, got {type(v).__name__}")
        problem = validate.url_problem(v)
        if problem is not None:  # the URL is not repeated: it may carry a password
            raise self.err(f"{where}.{key}", problem)
        return v

    def gpu_list(self, d: Mapping[str, Any], where: str) -> tuple[int, ...] | None:
        gpus = d.get("gpus")
        if gpus is None:
            return None
        if (
            not isinstance(gpus, list)
            or not gpus
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= 1023 for i in gpus)
        ):
            raise self.err(
                f"{where}.gpus",
                f"expected a non-empty list of GPU indices 0 - 1023 (e.g. [0, 1]), got {validate.shown(gpus)}",
            )
        if len(set(gpus)) != len(gpus):
            raise self.err(f"{where}.gpus", f"a GPU is listed twice in {gpus!r}")
        return tuple(gpus)
