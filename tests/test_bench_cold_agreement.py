"""benchmarks/bench_cold_agreement.py's `--recipe` help names the cases it runs without it."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


def test_the_recipe_help_lists_every_default_case(capsys, monkeypatch):
    bench = load_benchmark("bench_cold_agreement")
    monkeypatch.setenv("COLUMNS", "1000")  # one help line per option
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.lstrip().startswith("--recipe RECIPE")]
    cases = ", ".join(f"{r} at scale {s:g} for {n} steps" for r, s, n in bench.DEFAULT_CASES)
    assert line.endswith(f"one recipe (default: {cases})")
    assert [r for r, _, _ in bench.DEFAULT_CASES] == ["tiny", "mixtral-8x7b", "deepseek-v2-lite"]
