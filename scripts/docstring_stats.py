#!/usr/bin/env python3
"""Print how much of src/dpone is docstring: words per line of code, the share of them in
module docstrings, and the longest module docstrings.

A line of code is a non-blank line that is neither a comment nor part of a docstring. Run
``python scripts/docstring_stats.py [ROOT] [--top N]``; ROOT defaults to src/dpone.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "dpone"

_Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class ModuleStats:
    """The figures of one module."""

    path: Path
    code_lines: int
    docstring_words: int
    module_words: int
    module_lines: int
    module_paragraphs: int


def _docstring_node(node: _Documented) -> ast.Constant | None:
    """The string constant that is ``node``'s docstring, if it has one."""
    if not node.body:
        return None
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.value
    return None


def _paragraphs(text: str) -> int:
    """The number of blank-line-separated blocks in ``text`` (its summary line is one)."""
    return len([block for block in text.strip().split("\n\n") if block.strip()])


def module_stats(path: Path) -> ModuleStats:
    """Count one module's code lines and docstring words."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    docstring_lines: set[int] = set()
    words = 0
    module_words = 0
    module_lines = 0
    module_paragraphs = 0
    for node in ast.walk(tree):
        if not isinstance(node, _Documented):
            continue
        constant = _docstring_node(node)
        if constant is None:
            continue
        end = constant.end_lineno or constant.lineno
        docstring_lines.update(range(constant.lineno, end + 1))
        count = len(str(constant.value).split())
        words += count
        if isinstance(node, ast.Module):
            module_words = count
            module_lines = end - constant.lineno + 1
            module_paragraphs = _paragraphs(str(constant.value))
    code = 0
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number not in docstring_lines:
            code += 1
    return ModuleStats(path, code, words, module_words, module_lines, module_paragraphs)


def main(argv: list[str]) -> int:
    """Print the figures for the tree named in ``argv`` (src/dpone by default)."""
    top = 30
    args = list(argv)
    if "--top" in args:
        at = args.index("--top")
        top = int(args[at + 1])
        del args[at : at + 2]
    root = Path(args[0]) if args else ROOT
    stats = [module_stats(path) for path in sorted(root.rglob("*.py"))]
    code = sum(s.code_lines for s in stats)
    words = sum(s.docstring_words for s in stats)
    module_words = sum(s.module_words for s in stats)
    print(f"modules: {len(stats)}")
    print(f"code lines: {code}")
    print(f"docstring words: {words}")
    print(f"words per line of code: {words / code:.2f}")
    print(f"in module docstrings: {module_words} words ({module_words / words:.0%})")
    print(f"module docstrings over 8 lines: {sum(s.module_lines > 8 for s in stats)}")
    longer = sum(s.module_paragraphs > 2 for s in stats)
    print(f"module docstrings of more than a summary and one paragraph: {longer}")
    print(f"\nlongest module docstrings (lines, words), top {top}:")
    longest = sorted(stats, key=lambda s: (-s.module_lines, str(s.path)))[:top]
    for s in longest:
        print(f"{s.module_lines:5d} {s.module_words:6d}  {s.path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
