"""Every function (and method) longer than a limit, longest first: where a module still holds a
function to split where its meaning splits (tests/test_layers.py holds hydrappo/ to 120 lines).

    python tools/lab/long_functions.py                  # hydrappo/, over 120 lines
    python tools/lab/long_functions.py --limit 80 tools

Lengths are the function's lines as ruff formats them, from `def` to its last line (decorators
excluded, its docstring and nested functions included)."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def long_functions(folder: Path, limit: int) -> list[tuple[int, str, str]]:
    """(lines, path:line, name) of every function in folder's .py files longer than `limit` lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append((length, f"{path.relative_to(folder.parent)}:{node.lineno}", node.name))
    return sorted(found, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "hydrappo"), help="default: hydrappo/")
    parser.add_argument("--limit", type=int, default=120, help="list functions longer than this (default 120)")
    args = parser.parse_args(argv)
    found = long_functions(Path(args.folder).resolve(), args.limit)
    for length, where, name in found:
        print(f"{length:5d}  {name:<32} {where}")
    print(f"{len(found)} function(s) over {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
