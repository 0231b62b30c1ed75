"""No function of the runtime (nested ones included) is longer than MAX_LINES: a longer one is
doing more than one job and is split where its steps are."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_thin_commands import MAX_LINES, function_lengths

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_no_runtime_function_is_longer_than_the_limit():
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) > 20  # the runtime is where this test looks
    long = [f"{p.relative_to(RUNTIME)}:{name} ({n} lines)" for p in files
            for name, n in function_lengths(p.read_text()).items() if n > MAX_LINES]
    assert long == []
