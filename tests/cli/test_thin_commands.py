"""Commands stay thin: each parses its options, calls the library and renders. No function in
hotsplit_cli/commands/ (nested ones included) is longer than MAX_LINES; logic that grows past
that belongs in the library, where tests reach it without the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

COMMANDS = Path(__file__).resolve().parents[2] / "hotsplit_cli" / "commands"
MAX_LINES = 60


def function_lengths(source: str) -> dict[str, int]:
    """Every function of `source` (nested ones as outer.inner) -> its lines, decorators included."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                lengths[prefix + child.name] = child.end_lineno - first + 1
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_function_lengths_are_counted_with_nesting():
    source = "def a():\n    def b():\n        pass\n    return b\n\n\n@dec\ndef c():\n    pass\n"
    assert function_lengths(source) == {"a": 4, "a.b": 2, "c": 3}


def test_no_command_function_is_longer_than_the_limit():
    files = sorted(COMMANDS.glob("*.py"))
    assert len(files) > 5  # the commands are where this test looks
    long = [f"{p.name}:{name} ({n} lines)" for p in files
            for name, n in function_lengths(p.read_text()).items() if n > MAX_LINES]
    assert not long, f"move the logic of {long} into the library (limit {MAX_LINES} lines)"


PACKAGES = [COMMANDS.parents[1] / name for name in ("hotsplit_cli", "runtime", "probes")]


def test_no_product_function_is_longer_than_the_limit():
    """The same limit everywhere the product's code lives: a longer function is split into
    named steps (the library, the runtime and the probes alike)."""
    files = sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py"))
    assert len(files) > 100
    long = [f"{p.relative_to(COMMANDS.parents[1])}:{name} ({n} lines)" for p in files
            for name, n in function_lengths(p.read_text()).items() if n > MAX_LINES]
    assert not long, f"split {long} into named steps (limit {MAX_LINES} lines)"
