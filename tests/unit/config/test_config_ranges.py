"""Every number in docs/config.md has a documented range with a maximum, and the code accepts
exactly that range: both ends are accepted, a value just beyond either end is refused naming the
key.  (The table is the documentation users read; the code must not drift from it.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpushift.config.schema import parse
from gpushift.errors import ConfigError

DOC = Path(__file__).resolve().parents[3] / "docs" / "config.md"
BACKEND = '[backends.x]\nunit = "x.service"\nhealth_url = "http://127.0.0.1:8001/health"\n'
_SECTION = re.compile(r"^## `\[([a-z.A-Z]+)\]`", re.M)
_ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", re.M)
_RANGE = re.compile(r"^(-?[\d.]+) – ([\d.]+)")


def documented_numbers() -> list[tuple[str, str, bool, str]]:
    """(table, key, integer, range cell) of every number row of docs/config.md."""
    text = DOC.read_text(encoding="utf-8")
    out = []
    sections = list(_SECTION.finditer(text))
    for i, sec in enumerate(sections):
        body = text[sec.end() : sections[i + 1].start() if i + 1 < len(sections) else len(text)]
        for row in _ROW.finditer(body):
            key, typ, _default, rng = (c.strip() for c in row.groups())
            if typ.startswith(("number", "integer")):
                out.append((sec.group(1), key, typ.startswith("integer"), rng))
    return out


def config_with(table: str, key: str, value: float) -> str:
    if key == "min_ready":  # at most the number of instances: the most a backend may have
        many = ", ".join(
            f'{{ unit = "x@{n}.service", health_url = "http://127.0.0.1:{9000 + n}/health" }}'
            for n in range(64)
        )
        return f"[backends.x]\ninstances = [{many}]\n{key} = {value!r}\n"
    if table == "backends.NAME":
        return f"{BACKEND}{key} = {value!r}\n"
    return f"[{table}]\n{key} = {value!r}\n{BACKEND}"


ROWS = documented_numbers()


def test_the_doc_lists_the_numbers() -> None:
    keys = {f"{t}.{k}" for t, k, _i, _r in ROWS}
    assert {"daemon.poll_interval_s", "gpu.residual_mib", "backends.NAME.start_timeout_s"} <= keys
    assert len(ROWS) >= 25, ROWS


@pytest.mark.parametrize(("table", "key", "integer", "rng"), ROWS, ids=[f"{r[0]}.{r[1]}" for r in ROWS])
def test_documented_range_is_the_code_s_range(table: str, key: str, integer: bool, rng: str) -> None:
    m = _RANGE.match(rng)
    assert m, f"{table}.{key}: the range {rng!r} must read 'MIN – MAX' (every number has a maximum)"
    lo_text, hi_text = m.groups()
    lo: float = int(lo_text) if integer else float(lo_text)
    hi: float = int(hi_text) if integer else float(hi_text)
    for ok in (lo, hi):
        parse(config_with(table, key, ok), "/t.toml")  # both ends are accepted
    step_lo = 1 if integer else max(lo * 0.1, 0.001)
    step_hi = 1 if integer else max(hi * 0.001, 0.001)
    for bad in (lo - step_lo, hi + step_hi):
        with pytest.raises(
            ConfigError, match=rf":\d+: {table.replace('NAME', 'x')}\.{key}: expected a value"
        ):
            parse(config_with(table, key, bad), "/t.toml")
