"""``make lint``'s size rule fails on a module over 500 lines or a function over 80, and passes the
package as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import lint_sizes

ROOT = Path(__file__).resolve().parents[2]


def test_lint_sizes_names_a_long_module_and_a_long_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "long_module.py").write_text("x = 1\n" * 501)
    body = "".join(f"    y{i} = {i}\n" for i in range(80))
    (tmp_path / "long_function.py").write_text(f"def too_long():\n{body}")
    (tmp_path / "fine.py").write_text("def short():\n    return 1\n")
    assert lint_sizes.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "long_module.py:1: 501 lines (at most 500)" in out
    assert "long_function.py:1: function too_long is 81 lines (at most 80)" in out
    assert "fine.py" not in out


def test_the_package_keeps_the_size_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_sizes.main([str(ROOT / "gpushift")]) == 0, capsys.readouterr().out
