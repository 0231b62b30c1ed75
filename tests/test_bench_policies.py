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


def test_pairs_cover_every_task_pair_and_both_kinds():
    bench = load_benchmark("bench_policies")
    a, b = np.ones((4, 1, 2)), 2 * np.ones((6, 1, 2))
    got = {(name, kind): (fit.tolist(), len(c)) for name, kind, fit, c in bench.pairs({"a": a, "b": b})}
    assert got == {
        ("a -> b", "drift"): ([[4.0, 4.0]], 6), ("a -> a then b", "drift"): ([[4.0, 4.0]], 10),
        ("b -> a", "drift"): ([[12.0, 12.0]], 4), ("b -> b then a", "drift"): ([[12.0, 12.0]], 10),
        ("a -> a", "stationary"): ([[4.0, 4.0]], 4), ("a first half -> second half", "stationary"): ([[2.0, 2.0]], 2),
        ("b -> b", "stationary"): ([[12.0, 12.0]], 6), ("b first half -> second half", "stationary"): ([[6.0, 6.0]], 3),
    }


def test_the_verdict_needs_both_bytes_and_hits_on_drift_and_half_a_point_on_stationary():
    from types import SimpleNamespace as S

    bench = load_benchmark("bench_policies")
    mib = 1 << 20

    def row(dyn, lfu, static=(0.5, 0)):
        return {"dynamic": S(hit_rate=dyn[0], pcie_bytes_per_step=dyn[1] * mib),
                "lfu": S(hit_rate=lfu[0], pcie_bytes_per_step=lfu[1] * mib),
                "static": S(hit_rate=static[0], pcie_bytes_per_step=static[1] * mib)}
    assert bench.judge("drift", row((0.5, 10), (0.49, 11))) == "yes: hit +1.00 points, -1.0 MiB/step vs lfu"
    assert bench.judge("drift", row((0.5, 12), (0.49, 11))).startswith("NO")  # more bytes
    assert bench.judge("drift", row((0.48, 10), (0.49, 11))).startswith("NO")  # fewer hits
    assert bench.judge("stationary", row((0.496, 0), (0, 0))) == "yes: -0.40 points vs static"
    assert bench.judge("stationary", row((0.494, 0), (0, 0))) == "NO: -0.60 points vs static"
