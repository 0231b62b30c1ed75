"""benchmarks/bench_policies.py's `fitted hot sets` line: how far apart the two tasks' fitted hot
sets are per layer (docs/simulate.md quotes it)."""

from __future__ import annotations

import numpy as np

from tests.conftest import load_benchmark


def test_the_fitted_hot_sets_line_counts_per_layer_differences(monkeypatch, capsys):
    bench = load_benchmark("bench_policies")
    monkeypatch.setattr(bench, "HOT_EXPERTS", 4)
    intent, law = np.ones((2, 4)), np.ones((2, 4))
    intent[0, [0, 1, 2]] = intent[1, 0] = 10  # fit: layer 0 {0, 1, 2}, layer 1 {0}
    law[0, 1] = law[1, [1, 2, 3]] = 10  # fit: layer 0 {1}, layer 1 {1, 2, 3}
    bench.fitted_distance({"intent": intent[None], "law": law[None]}, 1000)
    assert capsys.readouterr().out.splitlines() == [
        "fitted hot sets, intent vs law, per layer (min-max over 2 layers): 2-4 experts hot in one fit and "
        "not the other (1-2 intent only, 0-3 law only); hot experts per layer 1-3 intent, 1-3 law"]
