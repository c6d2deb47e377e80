"""``make lint``'s size rule: no module over 500 lines, no function over 80 (docs/design.md).

A long file is a feature with two jobs, a long function a step with two decisions; both are where a
newcomer gets lost.  Run as ``python -m tests.support.lint_sizes gpushift``; it prints every breach
as ``path:line: ...`` and exits 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def breaches(path: Path) -> Iterator[str]:
    """Every size breach in one Python file, as ``path:line: what``."""
    text = path.read_text(encoding="utf-8")
    n = len(text.splitlines())
    if n > MAX_FILE_LINES:
        yield f"{path}:1: {n} lines (at most {MAX_FILE_LINES})"
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{path}:{node.lineno}: function {node.name} is {length} lines (at most {MAX_FUNCTION_LINES})"


def main(argv: list[str]) -> int:
    found = [
        b for root in argv or ["gpushift"] for p in sorted(Path(root).rglob("*.py")) for b in breaches(p)
    ]
    for b in found:
        print(b)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
