"""List every function longer than a limit (default 80 lines, docstring and decorators' def line included).

    python scripts/check_function_length.py trl_groupopt scripts      # exit 1 and one line per offender
    python scripts/check_function_length.py --max-lines 60 benchmarks

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (nested functions are counted on their own too).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

DEFAULT_MAX_LINES = 80


def python_files(paths: list[str]) -> Iterator[Path]:
    """The ``.py`` files named, or found below the folders named, in sorted order."""
    for name in paths:
        path = Path(name)
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def long_functions(path: Path, max_lines: int) -> Iterator[tuple[int, str, int]]:
    """(line, qualified name, length) of each function in `path` longer than `max_lines`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, prefix)
                continue
            name = prefix + child.name
            length = child.end_lineno - child.lineno + 1
            if not isinstance(child, ast.ClassDef) and length > max_lines:
                yield child.lineno, name, length
            yield from visit(child, name + ".")

    yield from visit(tree, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="files or folders to check")
    parser.add_argument("--max-lines", type=int, default=DEFAULT_MAX_LINES)
    args = parser.parse_args(argv)
    offenders = [
        f"{path}:{line}: {name} has {length} lines (> {args.max_lines})"
        for path in python_files(args.paths)
        for line, name, length in long_functions(path, args.max_lines)
    ]
    print("\n".join(offenders) if offenders else f"no function over {args.max_lines} lines")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
